"""Values read off round records (audit.round_record.RoundRecord) for plots, pages and CSV files: curves, AUCs, TPR at
a tolerance, formatting.

Records of another schema version are refused where they are read (audit.round_record.RecordSchemaError), so a value
missing here is one the attack did not report (e.g. a plug-in's attack without intervals): readers give NaN, shown as
"–".
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np

from audit.config.fields import is_int
from audit.config.vocabulary import tpr_statistic
from audit.reporting.csv_cells import spreadsheet_safe
from audit.round_record import AttackKey, RoundRecord

__all__ = ["MODEL_ORDER", "ordered_models", "float_or_nan", "curve", "auc_of", "exact_auc_of", "tpr_at",
           "resolvable_at", "unresolvable_metrics", "exact_auc_band", "rates_at", "tpr_band_at", "epsilon_lb_of",
           "advantage_of", "confidence_of", "unresolvable", "tolerances_of", "series_keys", "fmt", "fmt_interval",
           "csv_cell", "population_sizes"]

MODEL_ORDER = ("local", "global", "update", "rmia", "cross_round")


def ordered_models(models: Iterable[str]) -> list[str]:
    models = set(models)
    return [m for m in MODEL_ORDER if m in models] + sorted(models - set(MODEL_ORDER))




def float_or_nan(value: Any) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) else math.nan


def curve(result: Mapping) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) points with None/invalid dropped, sorted by fpr then tpr."""
    fpr = np.array([float_or_nan(v) for v in result.get("fpr") or []], dtype=float)
    tpr = np.array([float_or_nan(v) for v in result.get("tpr") or []], dtype=float)
    if fpr.shape != tpr.shape:
        return np.empty(0), np.empty(0)
    keep = np.isfinite(fpr) & np.isfinite(tpr)
    fpr, tpr = fpr[keep], tpr[keep]
    order = np.lexsort((tpr, fpr))
    return fpr[order], tpr[order]


def auc_of(result: Mapping) -> float:
    """Privacy Meter's grid AUC ("auc"); from the grid curve if it is missing."""
    auc = float_or_nan(result.get("auc"))
    if math.isnan(auc):
        fpr, tpr = curve(result)
        if fpr.size >= 2:
            auc = float(np.trapezoid(tpr, fpr))
    return auc


def exact_auc_of(result: Mapping) -> float:
    """The members-vs-non-members AUC over every threshold ("exact_auc"); NaN for an attack without it (the grid
    curve cannot give it)."""
    return float_or_nan(result.get("exact_auc"))


def tpr_at(result: Mapping, tol: float) -> float:
    """TPR at FPR tolerance ``tol``: the attack's own ``tpr_at_fpr`` entry (keys are f"{tol:g}"
    strings), else the best TPR on the curve with FPR <= tol."""
    table = result.get("tpr_at_fpr")
    if isinstance(table, Mapping):
        for key, value in table.items():
            try:
                k = float(key)
            except (TypeError, ValueError):
                continue
            if math.isclose(k, tol, rel_tol=1e-9, abs_tol=1e-15):
                return float_or_nan(value)
    fpr, tpr = curve(result)
    ok = fpr <= tol * (1 + 1e-9)
    return float(tpr[ok].max()) if ok.any() else math.nan


def resolvable_at(result: Mapping, tol: float) -> bool:
    """Whether the attack's sets were large enough to resolve tolerance ``tol`` (its ``resolvable`` entry, see
    audit.config.resolution); True for an attack without the entry."""
    table = result.get("resolvable")
    if isinstance(table, Mapping):
        for key, value in table.items():
            if math.isclose(float_or_nan(key), tol, rel_tol=1e-9, abs_tol=1e-15):
                return value is not False
    return True


def unresolvable_metrics(record: RoundRecord) -> set[str]:
    """The record's TPR-at-FPR metric names read at a tolerance its sets could not resolve."""
    names = set()
    for attack, result in record.attacks.items():
        table = result.get("resolvable") if isinstance(result, Mapping) else None
        if not isinstance(table, Mapping):
            continue
        for key, ok in table.items():
            if ok is False:
                names.add(attack.metric(tpr_statistic(float_or_nan(key))))
    return names


def _uncertainty(result: Mapping) -> Mapping:
    u = result.get("uncertainty") if isinstance(result, Mapping) else None
    return u if isinstance(u, Mapping) else {}


def _bounds(entry: Any) -> tuple[float, float]:
    if not isinstance(entry, Mapping):
        return math.nan, math.nan
    return float_or_nan(entry.get("lower")), float_or_nan(entry.get("upper"))


def exact_auc_band(result: Mapping) -> tuple[float, float]:
    """The exact AUC's confidence interval (lower, upper); NaNs for records without one."""
    return _bounds(_uncertainty(result).get("exact_auc"))


def rates_at(result: Mapping, tol: float) -> Mapping | None:
    """The rates at tolerance `tol`'s threshold (audit.membership.uncertainty.RatesAtThreshold.to_dict: "tpr" and
    "fpr" with rate, lower, upper, k, n; "population_fpr", "n_population", "resolvable"), or None."""
    table = _uncertainty(result).get("at_fpr")
    if isinstance(table, Mapping):
        for key, value in table.items():
            if math.isclose(float_or_nan(key), tol, rel_tol=1e-9, abs_tol=1e-15) and isinstance(value, Mapping):
                return value
    return None


def unresolvable(records: list[RoundRecord], tol: float) -> int | None:
    """The population size when no attack of any record can resolve tolerance `tol` (every one's threshold flags
    none of its population, audit.config.resolution), else None (also for attacks without uncertainty)."""
    sizes = []
    for r in records:
        for result in r.attacks.values():
            rates = rates_at(result, tol)
            if rates is None or rates.get("resolvable") is not False:
                return None
            sizes.append(rates.get("n_population"))
    return max((n for n in sizes if is_int(n)), default=None) if sizes else None


def tpr_band_at(result: Mapping, tol: float) -> tuple[float, float]:
    rates = rates_at(result, tol)
    return _bounds(rates.get("tpr")) if rates is not None else (math.nan, math.nan)


def epsilon_lb_of(result: Mapping) -> float:
    entry = _uncertainty(result).get("epsilon_lb")
    return float_or_nan(entry.get("epsilon")) if isinstance(entry, Mapping) else math.nan


def advantage_of(result: Mapping) -> tuple[float, float, float]:
    """(advantage, lower, upper); NaNs for records without it."""
    entry = _uncertainty(result).get("advantage")
    if not isinstance(entry, Mapping):
        return math.nan, math.nan, math.nan
    return (float_or_nan(entry.get("value")), *_bounds(entry))


def confidence_of(records: list[RoundRecord]) -> float:
    """The intervals' confidence level in these records (the newest record's), NaN if none states it."""
    for r in reversed(records):
        for result in r.attacks.values():
            level = float_or_nan(_uncertainty(result).get("confidence"))
            if not math.isnan(level):
                return level
    return math.nan


def tolerances_of(records: list[RoundRecord]) -> list[float]:
    """Every FPR tolerance the records were audited at (their typed settings, audit.record_parts), each once."""
    return sorted({t for r in records for t in r.settings.fpr_tolerance})


def series_keys(records: list[RoundRecord]) -> list[AttackKey]:
    """Every attack of the records, by model kind (MODEL_ORDER) then signal."""
    keys = {key for r in records for key in r.attacks}
    order = {m: i for i, m in enumerate(ordered_models(k.model for k in keys))}
    return sorted(keys, key=lambda k: (order[k.model], k.signal))


def fmt(value: Any, digits: int = 4) -> str:
    f = float_or_nan(value)
    if math.isnan(f):
        return "–"
    if is_int(value):
        return str(value)
    return f"{f:.{digits}g}"


def fmt_interval(value: Any, lower: Any, upper: Any, digits: int = 4) -> str:
    """"0.6123 [0.551, 0.674]" (bounds one digit shorter); the estimate alone when the interval is unknown."""
    text = fmt(value, digits)
    if math.isnan(float_or_nan(lower)) or math.isnan(float_or_nan(upper)):
        return text
    return f"{text} [{fmt(lower, max(2, digits - 1))}, {fmt(upper, max(2, digits - 1))}]"


def csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):  # text (e.g. a name from a plan); a number below stays a number, sign and all
        return spreadsheet_safe(value)
    if is_int(value):
        return str(int(value))
    return repr(float(value))  # shortest string that round-trips exactly




def population_sizes(record: RoundRecord) -> dict[AttackKey, int]:
    """Each attack's population size, the one its thresholds were set on: what the aggregator needs to mark the TPR
    figures this party's population cannot resolve. The attacks as the stored record holds them (dicts) or as the
    audit made them (AttackResult)."""
    out = {}
    for key, result in record.attacks.items():
        n = result.get("n_population") if isinstance(result, Mapping) else getattr(result, "n_population", None)
        if is_int(n):
            out[key] = int(n)
    return out
