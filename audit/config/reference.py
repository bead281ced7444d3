"""The plan reference's rows, read off the settings declarations (audit.config.fields): each declared key, dotted,
with what its check takes, its default as a plan writes it and its one-line doc. tools/plan_reference.py renders them
into docs/plan-reference.md. Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from audit.config.fields import declared, default_of, to_dict

__all__ = ["reference_rows", "yaml_text"]


def yaml_text(value) -> str:
    """A default as a plan writes it (YAML flow style)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return yaml_text(to_dict(value))
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(yaml_text(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {yaml_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return value if value.strip() else repr(value)
    text = repr(value)
    if isinstance(value, float) and "e" in text and "." not in text.split("e")[0]:
        text = text.replace("e", ".0e", 1)  # YAML reads 1e-05 as a string, 1.0e-05 as a number
    return text


def reference_rows(cls, key: str, seen: dict | None = None) -> list[tuple[str, str, str, str]]:
    """(dotted key, what it takes, default, doc) of every declared field of `cls` under `key`, with the fields of
    its sections (and of a mapping's section values, under "<key>.<name>") after each section's own row; a section
    class met before is referred to, not listed again. A class's `plan_sections()` (name -> settings class) adds
    sections that are not fields (the audit steps')."""
    seen = {} if seen is None else seen
    rows = []

    def add_section(dotted: str, section_class: type, doc: str) -> None:
        if not dataclasses.is_dataclass(section_class):  # a plug-in's settings of another kind: no fields to list
            rows.append((dotted, "a section", "", doc))
            return
        if section_class in seen:
            rows.append((dotted, f"a section: the keys of {seen[section_class]}", "", doc))
            return
        seen[section_class] = dotted
        rows.append((dotted, "a section", "", doc))
        rows.extend(reference_rows(section_class, dotted, seen))

    for f in declared(cls):
        check, doc = f.metadata["check"], f.metadata["doc"]
        dotted = f"{key}.{f.name}"
        if check.section_class is not None:
            add_section(dotted, check.section_class, doc)
        elif check.values is not None and check.values.section_class is not None:
            rows.append((dotted, f"a mapping of {check.key_name} -> a section", yaml_text(default_of(f)), doc))
            entry = f"one {check.key_name.strip('<>')}'s entry"
            add_section(f"{dotted}.{check.key_name}", check.values.section_class, entry)
        else:
            rows.append((dotted, check.describe(), yaml_text(default_of(f)), doc))
    extra = getattr(cls, "plan_sections", None)
    for name, section_class in (extra() if extra is not None else {}).items():
        summary = (section_class.__doc__ or "").strip().split("\n\n")[0]  # its docstring's first paragraph
        add_section(f"{key}.{name}", section_class, " ".join(summary.split()).rstrip("."))
    return rows
