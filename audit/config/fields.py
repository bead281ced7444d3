"""Settings declared once: each field of a settings dataclass carries its default, its check and a one-line doc.

    @dataclass(frozen=True)
    class ToySettings:
        enabled: bool = setting(False, boolean(), "run the toy audit")
        scale: float = setting(1.0, real(gt=0), "what the toy metric is multiplied by")

    parse(ToySettings, {"scale": 2}, "task_runner.settings.audit.toy")   # ToySettings(enabled=False, scale=2.0)

`parse` is the one parser: None or a missing key gives the default, an unknown key is refused with the nearest
known name, each value passes its field's check, and a class's static `validate(values, key, given)` (if it has
one) then checks the rules across fields on the values (name -> value; `given`: the keys the plan set), before the
instance is built. Every error is a `SettingsError` (a ValueError)
whose message starts with the full dotted key, e.g. "task_runner.settings.audit.toy.scale: expected a finite
number > 0, got -1". A check is built from the builders below, composes (`optional(integer(min=2))`), is callable as
`check(key, value)` on its own (a table of checks, a function argument), and describes itself ("an integer >= 2 or
null"): the plan reference (audit.config.reference, docs/plan-reference.md) prints those descriptions, so it is
generated from the declarations themselves. Torch-free.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Callable, Iterable

__all__ = ["SettingsError", "Mismatch", "Check", "is_int", "is_real", "setting", "subsection", "declared", "parse",
           "check_fields", "to_dict", "reject_unknown", "did_you_mean", "default_of",
           "boolean", "integer", "real", "choice", "choices", "optional", "either", "literal", "text", "module_name",
           "path", "mapping", "section", "anything", "custom"]


class SettingsError(ValueError):
    """An invalid plan setting; the message starts with the setting's full dotted key (e.g.
    "task_runner.settings.audit.fpr_tolerance: ..."), so a bad plan entry can be found at once."""


class Mismatch(Exception):
    """Raised inside a check for a value it does not take: the check turns it into "<key>: expected <what the check
    takes>, got <value>" (composed checks, e.g. `optional`, catch it and say what they take as a whole)."""


def _is_bool(value) -> bool:
    """Python's bool or numpy's (numpy.bool_, named "bool" from numpy 2), without importing numpy."""
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"))


def is_int(value) -> bool:
    """An integer, not a bool (Python's or numpy's)."""
    return isinstance(value, Integral) and not _is_bool(value)


def is_real(value) -> bool:
    """A real number, not a bool (Python's or numpy's)."""
    return isinstance(value, Real) and not _is_bool(value)


def did_you_mean(name, known: Iterable, count: int = 1) -> str:
    """"; did you mean X?" for the nearest of `known` to `name` (difflib), or "". `count` > 1: up to that many
    nearest names ("; did you mean X, Y or Z?"), case ignored in the comparison (a typed "adam" finds "Adam")."""
    if not isinstance(name, str):
        return ""
    known = [str(k) for k in known]
    if count == 1:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    else:
        lowered = {}
        for k in known:
            lowered.setdefault(k.lower(), k)
        close = [lowered[k] for k in difflib.get_close_matches(name.lower(), list(lowered), n=count, cutoff=0.6)]
    if not close:
        return ""
    return "; did you mean " + (close[0] if len(close) == 1 else ", ".join(close[:-1]) + " or " + close[-1]) + "?"


# ------------------------------------------------------------------------------------------------ checks


@dataclass(frozen=True)
class Check:
    """What a field takes: `check(key, value)` returns the value as the settings hold it (ints -> floats, lists ->
    tuples), or raises SettingsError naming `key`; `describe()` says what it takes, as the plan reference prints it.

    `run(key, value)` is the check's own test: it raises Mismatch for the generic message (which a composed check
    replaces with its own) or SettingsError for a message of its own."""

    text: str
    run: Callable[[str, Any], Any]
    section_class: type | None = None     # a section's settings class (the reference lists its fields)
    values: "Check | None" = None         # a mapping's check of each value
    key_name: str = "<name>"              # how the reference names a mapping's keys

    def __call__(self, key: str, value):
        try:
            return self.run(key, value)
        except Mismatch:
            raise SettingsError(f"{key}: expected {self.text}, got {value!r}") from None

    def describe(self) -> str:
        return self.text


def custom(text: str, run: Callable[[str, Any], Any]) -> Check:
    """A check of one's own: `run(key, value)` returns the value, raises Mismatch ("expected <text>, got ...") or a
    SettingsError of its own."""
    return Check(text, run)


def _noted(text: str, note: str | None) -> str:
    return f"{text} ({note})" if note else text


def boolean() -> Check:
    def run(_key, value):
        if _is_bool(value):
            return bool(value)
        raise Mismatch
    return Check("true or false", run)


def _bounds_text(low, low_closed, high, high_closed) -> str:
    if low is not None and high is not None:
        return f"in {'[' if low_closed else '('}{low:g}, {high:g}{']' if high_closed else ')'}"
    if low is not None:
        return f"{'>=' if low_closed else '>'} {low:g}"
    if high is not None:
        return f"{'<=' if high_closed else '<'} {high:g}"
    return ""


def _within(value, low, low_closed, high, high_closed) -> bool:
    if low is not None and (value < low or (value == low and not low_closed)):
        return False
    return not (high is not None and (value > high or (value == high and not high_closed)))


def integer(min: int | None = None, max: int | None = None, *, noun: str = "an integer",  # noqa: A002
            note: str | None = None) -> Check:
    """An integer (not a bool) in [min, max] (either may be None: unbounded)."""
    bounds = _bounds_text(min, True, max, True)

    def run(_key, value):
        if not is_int(value) or not _within(value, min, True, max, True):
            raise Mismatch
        return int(value)
    return Check(_noted(f"{noun} {bounds}".strip(), note), run)


def real(*, gt: float | None = None, ge: float | None = None, lt: float | None = None, le: float | None = None,
         finite: bool = True, noun: str | None = None, note: str | None = None) -> Check:
    """A number (an int or a float, not a bool, never NaN) within the bounds given: `gt`/`ge` below (open/closed),
    `lt`/`le` above; finite unless `finite=False` (then +-inf passes where the bounds allow it). Returns a float."""
    if gt is not None and ge is not None or lt is not None and le is not None:
        raise TypeError("give one lower bound (gt or ge) and one upper bound (lt or le)")
    low, low_closed = (ge, True) if ge is not None else (gt, False)
    high, high_closed = (le, True) if le is not None else (lt, False)
    bounds = _bounds_text(low, low_closed, high, high_closed)
    if noun is None:  # a number between two bounds is finite without saying so
        noun = "a finite number" if finite and (low is None or high is None) else "a number"

    def run(_key, value):
        if not is_real(value) or math.isnan(value) or (finite and math.isinf(value)) \
                or not _within(value, low, low_closed, high, high_closed):
            raise Mismatch
        return float(value)
    return Check(_noted(f"{noun} {bounds}".strip(), note), run)


def choice(names: Iterable[str], what: str | None = None, *, fold: bool = False) -> Check:
    """One of `names`. With `what` ("threshold function") the error says "unknown <what> 'x'; known: ..."; `fold`
    takes a name in any case and with spaces around it, and returns it as listed."""
    names = tuple(names)
    listed = ", ".join(names)

    def run(key, value):
        found = value.strip().lower() if fold and isinstance(value, str) else value
        if isinstance(found, str) and found in names:
            return found
        hint = did_you_mean(value, names)
        if what is None:
            raise SettingsError(f"{key}: expected one of {listed}, got {value!r}{hint}")
        raise SettingsError(f"{key}: unknown {what} {value!r}; known: {listed}{hint}")
    return Check(f"one of {listed}", run)


def choices(names: Iterable[str], what: str, *, one_ok: bool = False) -> Check:
    """A non-empty list of distinct names from `names` (a tuple); `one_ok`: one name alone stands for a list of it."""
    names = tuple(names)
    listed = ", ".join(names)

    def run(key, value):
        items = [value] if one_ok and isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not items:
            raise Mismatch
        seen = []
        for item in items:
            if not isinstance(item, str) or item not in names:
                raise SettingsError(f"{key}: unknown {what} {item!r}; known: {listed}{did_you_mean(item, names)}")
            if item in seen:
                raise SettingsError(f"{key}: {what} {item!r} is listed twice")
            seen.append(item)
        return tuple(seen)
    return Check(f"a non-empty list from {listed}" + (" (or one of them alone)" if one_ok else ""), run)


def literal(value, means: str | None = None) -> Check:
    """Exactly `value` (e.g. "tune", or None for null)."""
    shown = "null" if value is None else repr(value)

    def run(_key, given):
        if given is value or (given == value and type(given) is type(value)):
            return value
        raise Mismatch
    return Check(_noted(shown, means), run)


def either(*checks: Check) -> Check:
    """The first of `checks` that takes the value ("A, B or C")."""
    texts = [c.text for c in checks]
    text = texts[0] if len(texts) == 1 else f"{', '.join(texts[:-1])} or {texts[-1]}"

    def run(key, value):
        for check in checks:
            try:
                return check.run(key, value)
            except Mismatch:
                continue
        raise Mismatch
    return Check(text, run)


def optional(check: Check, means: str | None = None) -> Check:
    """`check`, or null (None); `means` says what null stands for ("every sample")."""
    return either(check, literal(None, means))


def text(noun: str = "a non-empty string") -> Check:
    def run(_key, value):
        if not isinstance(value, str) or not value.strip():
            raise Mismatch
        return value
    return Check(noun, run)


def module_name(example: str = "classifier.0") -> Check:
    """A module's dotted name inside a model (whether the model has it is checked where the model is built)."""
    def run(_key, value):
        if not isinstance(value, str) or not value.strip():
            raise Mismatch
        return value.strip()
    return Check(f"a module name (e.g. {example!r})", run)


def path(what: str = "folder") -> Check:
    """A file system path: a non-empty string (or os.PathLike) without NUL characters; returned as a string."""
    def run(_key, value):
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            raise Mismatch
        return value
    return Check(f"a {what} path", run)


def anything(noun: str = "any value") -> Check:
    """Taken as given (its owner, e.g. OpenFL, checks it)."""
    return Check(noun, lambda _key, value: value)


def mapping(values: Check | None = None, *, key_name: str = "<name>", noun: str = "a mapping") -> Check:
    """A mapping (None: empty) whose keys are non-empty strings and whose values each pass `values` (named
    "<key>.<name>" in errors); any values when `values` is None. Returns a dict."""
    def run(key, value):
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise Mismatch
        out = {}
        for name, item in value.items():
            if not isinstance(name, str) or not name.strip():
                raise SettingsError(f"{key}: names must be non-empty strings, got {name!r}")
            out[name] = item if values is None else values(f"{key}.{name}", item)
        return out
    described = noun if values is None else f"{noun} of {key_name} -> {values.text}"
    return Check(described, run, values=values, key_name=key_name)


def section(cls: type, *, later: bool = False) -> Check:
    """A nested section of settings class `cls`, parsed with `parse` (its errors name "<key>.<field>"). `later`: kept
    as the plan gives it (a mapping or None) for its owner to parse where it knows what the section depends on
    (the gate's metrics depend on the audit); the reference lists its fields all the same."""
    def run(key, value):
        if not later:
            return parse(cls, value, key)
        if value is None or isinstance(value, (Mapping, cls)):
            return value
        raise Mismatch
    return Check("a mapping of settings", run, section_class=cls)


# ------------------------------------------------------------------------------------------------ fields


def setting(default, check: Check, doc: str):
    """A dataclass field declared once: its default, its check and a one-line doc (a dict or list default is
    copied for each instance)."""
    metadata = {"check": check, "doc": doc}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def subsection(cls: type, doc: str):
    """A field holding a nested section of settings class `cls` (default: its defaults)."""
    return dataclasses.field(default_factory=cls, metadata={"check": section(cls), "doc": doc})


def declared(cls) -> list[dataclasses.Field]:
    """The fields of `cls` a plan sets: those declared with `setting` or `subsection`, in order."""
    return [f for f in dataclasses.fields(cls) if "check" in f.metadata]


def default_of(f: dataclasses.Field):
    """A declared field's default value."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def reject_unknown(key: str, value: Mapping, known: Iterable[str]) -> None:
    """SettingsError "<key>.<name>: unknown setting; known: ...; did you mean ...?" for the first key of `value`
    not in `known`."""
    known = list(known)
    for name in value:
        if name not in known:
            raise SettingsError(f"{key}.{name}: unknown setting; known: {', '.join(known)}{did_you_mean(name, known)}")


def parse(cls, value, key: str, *, also: Iterable[str] = ()):
    """Settings class `cls` from a plan's value: a mapping (None: every default), or a `cls` as it is.

    Unknown keys, values a field's check refuses and rules of the class's `validate(values, key, given)` raise
    SettingsError naming the dotted key. `also`: keys the caller reads itself (taken out of `value` before this is
    called), listed among the known ones when a key is unknown."""
    if isinstance(value, cls):
        return value
    if value is None:
        value = {}
    fields = declared(cls)
    names = [f.name for f in fields]
    if not isinstance(value, Mapping):
        raise SettingsError(f"{key}: expected a mapping of settings ({', '.join(names)}), got {value!r}")
    reject_unknown(key, value, [*names, *also])
    given = {f.name: f.metadata["check"](f"{key}.{f.name}", value[f.name]) for f in fields if f.name in value}
    validate = getattr(cls, "validate", None)
    if validate is not None:
        validate({**{f.name: default_of(f) for f in fields if f.name not in given}, **given}, key, frozenset(given))
    return cls(**given)


def check_fields(instance, key: str) -> dict:
    """Check (and normalise, in place) every declared field of a settings instance built directly, as `parse` checks
    a plan's values: call it in `__post_init__` where an invalid instance must not exist. Returns the values (name
    -> value) for the class's `validate`, which is the caller's to call."""
    values = {}
    for f in declared(type(instance)):
        values[f.name] = f.metadata["check"](f"{key}.{f.name}", getattr(instance, f.name))
        object.__setattr__(instance, f.name, values[f.name])
    return values


def _plain(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value.to_dict() if hasattr(value, "to_dict") else to_dict(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def to_dict(instance) -> dict:
    """The declared fields as a plan would give them (JSON-able: tuples as lists, sections as dicts);
    parse(cls, to_dict(x), key) == x."""
    return {f.name: _plain(getattr(instance, f.name)) for f in declared(type(instance))}
