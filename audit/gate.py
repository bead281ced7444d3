"""Gating of leaky updates: the policy a plan sets (`task_runner.settings.gate`) and its decision.

A gate compares a round's audit metrics with the plan's thresholds (metric name -> highest allowed value);
an update is gated if any metric is above its threshold. What then happens to the update (withhold it,
retrain it with DP-SGD, or only report) is the task runner's job; this module knows nothing about OpenFL
or torch.

Every error is a GateSettingsError whose message starts with the dotted key of the offending setting.

Rounds without an audit (audit disabled, or skipped by `audit.interval`) are not gated: there is nothing to
compare. A threshold whose metric is missing from an audited round's metrics is reported in
`GateVerdict.missing` and does not trip the gate; a metric whose value is NaN/Inf trips it (fail closed).
Non-finite *updates* are gated whatever the policy (see `non_finite_tensors`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from numbers import Integral, Real
from types import MappingProxyType

import numpy as np

from audit.fidel import FIDEL_METRICS
from audit.population_attack import tolerance_name
from audit.gate_contract import NON_FINITE_UPDATE
from audit.settings import AuditSettings

__all__ = [
    "ACTIONS",
    "NON_FINITE_UPDATE",
    "GateSettingsError",
    "DPSettings",
    "GatePolicy",
    "GateVerdict",
    "audit_metric_names",
    "register_metric",
    "unregister_metric",
    "registered_metrics",
    "metric_range",
    "non_finite_tensors",
]

ACTIONS = ("withhold", "dp_retrain", "report_only")
GATE_PREFIX = "task_runner.settings.gate"

# Allowed threshold ranges by metric-name suffix: rates and APs are fractions, "AP over chance" is a ratio >= 0,
# a rank starts at 1.
_RANGES_BY_SUFFIX = (
    ("_auc", (0.0, 1.0)),
    ("_fraction", (0.0, 1.0)),
    ("_ap_over_chance", (0.0, math.inf)),
    ("_ap", (0.0, 1.0)),
    ("_top1", (0.0, 1.0)),
    ("_top5", (0.0, 1.0)),
    ("_rank", (1.0, math.inf)),
)
_TPR_MARKER = "_tpr_at_fpr_"

# Metrics that later audits (not audit.round_audit) produce, registered by those audits: name -> range.
_REGISTRY: dict[str, tuple[float, float]] = {}


class GateSettingsError(ValueError):
    """An invalid gate setting; the message starts with the setting's full dotted key."""


def metric_range(name: str) -> tuple[float, float] | None:
    """The allowed threshold range for a metric name, from its suffix (None if no rule applies)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if _TPR_MARKER in name:
        return (0.0, 1.0)
    for suffix, bounds in _RANGES_BY_SUFFIX:
        if name.endswith(suffix):
            return bounds
    return None


def register_metric(name: str, *, low: float | None = None, high: float | None = None) -> None:
    """Let plans gate on `name`, a metric a later audit reports (e.g. "fidel_revealed_fraction").

    The threshold range defaults to the one its suffix implies (`_auc`, `_fraction`, `_tpr_at_fpr_<t>`:
    [0, 1]; `_ap_over_chance`: >= 0); give `low`/`high` for other names.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"register_metric: expected a metric name, got {name!r}")
    if low is None and high is None:
        bounds = metric_range(name)
        if bounds is None:
            raise ValueError(f"register_metric: no range rule for {name!r}; give low= and high=")
    else:
        bounds = (-math.inf if low is None else float(low), math.inf if high is None else float(high))
        if not bounds[0] <= bounds[1]:
            raise ValueError(f"register_metric: low {low!r} is above high {high!r}")
    _REGISTRY[name] = bounds


def unregister_metric(name: str) -> None:
    _REGISTRY.pop(name, None)


def registered_metrics() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def audit_metric_names(settings: AuditSettings) -> tuple[str, ...]:
    """The scalar metric names `audit.round_audit.audit_round` reports under these settings (sorted)."""
    if not settings.enabled:
        return ()
    series = [("local", s) for s in settings.signals]
    if settings.audit_global:
        series += [("global", s) for s in settings.signals]
    if settings.update_attack:
        series.append(("update", "loss_reduction"))
    names = []
    for model, signal in series:
        prefix = f"mia_{model}_{signal}"
        names += [f"{prefix}_auc", f"{prefix}_exact_auc"]  # as scalar_metrics names them
        names += [f"{prefix}_tpr_at_fpr_{tolerance_name(t)}" for t in settings.fpr_tolerance]
    if settings.fidel:
        names += FIDEL_METRICS
    if settings.deanon.enabled:
        names += settings.deanon.metric_names()
    return tuple(sorted(names))


def non_finite_tensors(tensors: Mapping[str, object]) -> list[str]:
    """Names of the tensors holding any NaN or Inf (non-numeric arrays are skipped)."""
    bad = []
    for name, value in tensors.items():
        array = np.asarray(value)
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            bad.append(name)
    return bad


# --------------------------------------------------------------------------------------------------
# settings


def _is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, (bool, np.bool_))


def _is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, (bool, np.bool_))


def _mapping(key: str, value) -> Mapping:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise GateSettingsError(f"{key}: expected a mapping, got {value!r}")
    return value


def _unknown_keys(key: str, mapping: Mapping, known) -> None:
    for name in mapping:
        if name not in known:
            raise GateSettingsError(f"{key}.{name}: unknown setting; known: {', '.join(known)}")


@dataclass(frozen=True)
class DPSettings:
    """DP-SGD settings for `action: dp_retrain`."""

    noise_multiplier: float = 1.0  # of the first retrain; doubled on each further try
    max_grad_norm: float = 1.0  # per-sample clipping norm
    max_retries: int = 2  # DP retrains before the update is withheld
    delta: float = 1e-5  # the accountant's delta for the reported epsilon

    @classmethod
    def from_mapping(cls, mapping, *, prefix: str) -> "DPSettings":
        mapping = _mapping(prefix, mapping)
        known = [f.name for f in fields(cls)]
        _unknown_keys(prefix, mapping, known)
        values = {**{f.name: f.default for f in fields(cls)}, **mapping}
        for name in ("noise_multiplier", "max_grad_norm"):
            value = values[name]
            if not _is_real(value) or not math.isfinite(value) or value <= 0:
                raise GateSettingsError(f"{prefix}.{name}: expected a finite number > 0, got {value!r}")
            values[name] = float(value)
        if not _is_int(values["max_retries"]) or values["max_retries"] < 1:
            raise GateSettingsError(f"{prefix}.max_retries: expected an integer >= 1, got {values['max_retries']!r}")
        values["max_retries"] = int(values["max_retries"])
        delta = values["delta"]
        if not _is_real(delta) or not 0.0 < delta < 1.0:
            raise GateSettingsError(f"{prefix}.delta: expected a number in (0, 1), got {delta!r}")
        values["delta"] = float(delta)
        return cls(**values)

    def noise_for_try(self, attempt: int) -> float:
        """Noise multiplier of DP retrain number `attempt` (1-based): doubled each time."""
        return self.noise_multiplier * 2.0 ** (attempt - 1)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class GateVerdict:
    """The gate's decision on one set of metrics.

    `tripped` maps each metric above its threshold to (value, threshold); `missing` lists thresholded
    metrics absent from the metrics (not evaluated, so they did not trip the gate).
    """

    passed: bool
    tripped: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    missing: tuple[str, ...] = ()

    @classmethod
    def non_finite(cls) -> "GateVerdict":
        """The verdict for an update holding NaN/Inf: gated, whatever the thresholds."""
        return cls(passed=False, tripped={NON_FINITE_UPDATE: (1.0, 0.0)})

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            # JSON has no NaN: a non-finite metric value (which trips the gate) is stored as None.
            "tripped": {
                k: {"value": v if math.isfinite(v) else None, "threshold": t} for k, (v, t) in self.tripped.items()
            },
            "missing": list(self.missing),
        }


@dataclass(frozen=True)
class GatePolicy:
    """What a plan's `gate:` block says; `decide` applies its thresholds to a round's metrics."""

    action: str = "report_only"
    thresholds: Mapping[str, float] = field(default_factory=dict)
    dp: DPSettings = field(default_factory=DPSettings)

    def __post_init__(self):
        object.__setattr__(self, "thresholds", MappingProxyType(dict(self.thresholds)))

    @property
    def enabled(self) -> bool:
        """False without thresholds: no update is ever gated for its metrics (non-finite ones still are)."""
        return bool(self.thresholds)

    @classmethod
    def from_mapping(cls, mapping, *, audit_settings: AuditSettings, prefix: str = GATE_PREFIX) -> "GatePolicy":
        """Parse and validate a plan's `gate:` mapping (None or {} -> report_only without thresholds).

        Threshold names must be metrics the configured audit produces (see `audit_metric_names`) or
        registered with `register_metric`.
        """
        mapping = _mapping(prefix, mapping)
        _unknown_keys(prefix, mapping, ("action", "thresholds", "dp"))
        action = mapping.get("action", "report_only")
        if action not in ACTIONS:
            raise GateSettingsError(f"{prefix}.action: unknown action {action!r}; choose one of {', '.join(ACTIONS)}")
        produced = audit_metric_names(audit_settings)
        thresholds = {}
        for name, value in _mapping(f"{prefix}.thresholds", mapping.get("thresholds")).items():
            key = f"{prefix}.thresholds.{name}"
            if name not in produced and name not in _REGISTRY:
                known = ", ".join(produced) if produced else "nothing (audit.enabled is false)"
                extra = f"; registered by later audits: {', '.join(sorted(_REGISTRY))}" if _REGISTRY else ""
                raise GateSettingsError(f"{key}: unknown metric; the audit produces: {known}{extra}")
            low, high = metric_range(name) or (-math.inf, math.inf)
            if not _is_real(value) or math.isnan(value):
                raise GateSettingsError(f"{key}: expected a number, got {value!r}")
            if not low <= value <= high:
                allowed = f"[{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
                raise GateSettingsError(f"{key}: {value!r} is out of range; allowed: {allowed}")
            thresholds[name] = float(value)
        dp = DPSettings.from_mapping(mapping.get("dp"), prefix=f"{prefix}.dp")
        return cls(action=action, thresholds=thresholds, dp=dp)

    def decide(self, metrics: Mapping[str, float]) -> GateVerdict:
        """Gated if any thresholded metric is above its threshold (or NaN/Inf)."""
        tripped, missing = {}, []
        for name, threshold in self.thresholds.items():
            if name not in metrics:
                missing.append(name)
                continue
            value = float(metrics[name])
            if not math.isfinite(value) or value > threshold:
                tripped[name] = (value, threshold)
        return GateVerdict(passed=not tripped, tripped=tripped, missing=tuple(missing))

    def to_dict(self) -> dict:
        return {"action": self.action, "thresholds": dict(self.thresholds), "dp": self.dp.to_dict()}
