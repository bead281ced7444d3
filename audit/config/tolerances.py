"""FPR tolerances: the one parser of a tolerance list, and the typed value it gives.

A plan's `audit.fpr_tolerance` (and the demo's --fpr_tolerance) is parsed once, into `FprTolerances`, by
`FPR_TOLERANCES`; everything downstream (the membership attacks, the gate's metric names, the round record, the
reports) takes that value as it is. A check run again on an `FprTolerances` returns it untouched, so a settings class
checked again (`check_fields` in `__post_init__`) does not parse it again.
"""

from __future__ import annotations

import math

from audit.config.fields import Mismatch, SettingsError, custom, is_real
from audit.config.vocabulary import tolerance_name_clash

__all__ = ["FprTolerances", "FPR_TOLERANCES"]


class FprTolerances(tuple):
    """FPR tolerances as `FPR_TOLERANCES` parsed them: floats in (0, 1), in the plan's order, no two with one metric
    name. Made only by the parser."""

    __slots__ = ()


def _fpr_tolerances(key: str, value) -> FprTolerances:
    if isinstance(value, FprTolerances):
        return value
    items = [value] if is_real(value) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise Mismatch
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
    return FprTolerances(out)


#: FPR tolerances: one number or a non-empty list of numbers in (0, 1), no two with one metric name.
FPR_TOLERANCES = custom("a non-empty list of numbers in (0, 1) (or one number alone), no two with one metric name",
                        _fpr_tolerances)
