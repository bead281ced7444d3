"""The one settings error and the checks every settings module shares; each message starts with the dotted key."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Callable
from numbers import Integral, Real

from audit.config.vocabulary import tolerance_name_clash

__all__ = ["SettingsError", "did_you_mean", "is_int", "is_real", "check_bool", "check_positive_int", "check_optional_module",
           "with_defaults", "from_checks", "check_fpr_tolerances"]


class SettingsError(ValueError):
    """An invalid plan setting; the message starts with the setting's full dotted key (e.g.
    "task_runner.settings.audit.fpr_tolerance: ..."), so a bad plan entry can be found at once."""


def did_you_mean(name, known) -> str:
    """"; did you mean 'x'?" for the known name closest to a misspelt `name` (difflib's ratio >= 0.6), else ""."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and type(value).__name__ != "bool_"


def is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and type(value).__name__ != "bool_"


def check_bool(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise SettingsError(f"{key}: expected true or false, got {value!r}")
    return value


def check_positive_int(key: str, value) -> int:
    if not is_int(value):
        raise SettingsError(f"{key}: expected an integer >= 1, got {value!r}")
    if value < 1:
        raise SettingsError(f"{key}: expected an integer >= 1, got {value}")
    return int(value)


def check_optional_module(key: str, value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise SettingsError(f"{key}: expected a module name (e.g. 'classifier.0') or null, got {value!r}")
    return value


def with_defaults(cls, mapping, prefix: str) -> dict:
    """A settings dataclass's field values: its defaults updated with a plan's `mapping` (a Mapping whose keys
    must all be fields). Raises SettingsError naming `prefix` or `prefix.key`."""
    if not isinstance(mapping, Mapping):
        raise SettingsError(f"{prefix}: expected a mapping of settings, got {type(mapping).__name__}")
    known = [f.name for f in fields(cls)]
    for key in mapping:
        if key not in known:
            raise SettingsError(f"{prefix}.{key}: unknown setting; known: {', '.join(known)}"
                                f"{did_you_mean(key, known)}")
    values = {f.name: getattr(cls, f.name) for f in fields(cls)}  # class attributes hold the defaults
    values.update(mapping)
    return values


def from_checks(cls, checks: Mapping[str, Callable], value, prefix: str):
    """`cls` built from a plan's mapping, each key passed through its check `checks[key](dotted key, value)`;
    None -> cls(), a `cls` instance as it is. Unknown keys and non-mappings raise SettingsError naming the key."""
    if isinstance(value, cls):
        return value
    if value is None:
        return cls()
    if not isinstance(value, Mapping):
        raise SettingsError(f"{prefix}: expected a mapping of settings ({', '.join(checks)}), got {value!r}")
    for name in value:
        if name not in checks:
            raise SettingsError(f"{prefix}.{name}: unknown setting; known: {', '.join(checks)}"
                                f"{did_you_mean(name, checks)}")
    return cls(**{name: checks[name](f"{prefix}.{name}", v) for name, v in value.items()})


def check_fpr_tolerances(key: str, value) -> tuple[float, ...]:
    """FPR tolerances: one number or a sequence of numbers in (0, 1), no two with one metric name."""
    items = [value] if is_real(value) else value
    if isinstance(items, (str, bytes, Mapping)):
        raise SettingsError(f"{key}: expected a list of numbers in (0, 1), got {value!r}")
    try:
        items = list(items)
    except TypeError:
        raise SettingsError(f"{key}: expected a list of numbers in (0, 1), got {value!r}") from None
    if not items:
        raise SettingsError(f"{key}: empty; give at least one FPR in (0, 1)")
    out = []
    for i, item in enumerate(items):
        if not is_real(item):
            raise SettingsError(f"{key}: item {i} is not a number: {item!r}")
        item = float(item)
        if not (math.isfinite(item) and 0.0 < item < 1.0):
            raise SettingsError(f"{key}: {item!r} is outside (0, 1) (FPR tolerances are fractions)")
        out.append(item)
    clash = tolerance_name_clash(out)
    if clash:
        raise SettingsError(f"{key}: {clash}")
    return tuple(out)
