"""Gating of leaky updates: the policy a plan sets (`task_runner.settings.gate`) and its decision.

A gate compares a round's audit metrics with the plan's thresholds (metric name -> highest allowed value);
an update is gated if any metric is above its threshold. Which value of a metric is compared is the policy's
`bound`: `point` the estimate; `upper` (the default) its confidence interval's upper bound, so an update passes
only when its leakage is significantly below the threshold; `lower` the lower bound, so it is gated only when its
leakage is significantly above. A metric the audit reports without an interval (the grid AUC, the epsilon lower
bound, Fidel's and the deanonymization audit's figures) is compared as it is whatever the bound. What then happens to the update (withhold it,
retrain it with DP-SGD, or only report) is audit.gate_flow's; this module imports neither OpenFL nor torch (a test
checks it: tests/test_audit_steps.py).

Every error is a SettingsError whose message starts with the dotted key of the offending setting.

Rounds without an audit (audit disabled, or skipped by `audit.interval`) are not gated: there is nothing to
compare. A threshold whose metric is missing from an audited round's metrics is reported in
`GateVerdict.missing` and does not trip the gate; a metric whose value is NaN/Inf trips it (fail closed).
Non-finite *updates* are gated whatever the policy (see `non_finite_tensors`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

import numpy as np

from audit.config.audit_settings import AuditSettings
from audit.config.checks import SettingsError, is_int, is_real
from audit.config.gate_contract import NON_FINITE_UPDATE
from audit.config.steps import AFTER_TRAINING, registered
from audit.config.vocabulary import BOUNDS, GATE_ACTIONS, bounded

__all__ = [
    "NON_FINITE_UPDATE",
    "POINT",
    "BOUND_CHOICES",
    "DPSettings",
    "GatePolicy",
    "GateVerdict",
    "audit_metric_names",
    "metric_range",
    "non_finite_tensors",
]

GATE_PREFIX = "task_runner.settings.gate"

# Allowed threshold ranges by metric-name suffix: rates, APs, AUCs and advantages (and their bounds) are fractions,
# "AP over chance" and an epsilon are >= 0, a rank starts at 1. A step's own `metric_ranges` (audit.config.steps) come first.
_RANGES_BY_SUFFIX = (
    ("_auc", (0.0, 1.0)),
    ("_auc_lower", (0.0, 1.0)),
    ("_auc_upper", (0.0, 1.0)),
    ("_advantage", (0.0, 1.0)),
    ("_advantage_lower", (0.0, 1.0)),
    ("_advantage_upper", (0.0, 1.0)),
    ("_epsilon_lb", (0.0, math.inf)),
    ("_fraction", (0.0, 1.0)),
    ("_ap_over_chance", (0.0, math.inf)),
    ("_ap", (0.0, 1.0)),
    ("_top1", (0.0, 1.0)),
    ("_top5", (0.0, 1.0)),
    ("_rank", (1.0, math.inf)),
)
_TPR_MARKER = "_tpr_at_fpr_"

# Which value of a gated metric is compared with its threshold (see the module docstring).
POINT = "point"
BOUND_CHOICES = (POINT, *BOUNDS)
DEFAULT_BOUND = "upper"


def metric_range(name: str) -> tuple[float, float] | None:
    """The allowed threshold range for a metric name: its step's own range, else its suffix's (None if no rule)."""
    for audit_step in registered():
        if name in audit_step.metric_ranges:
            return tuple(audit_step.metric_ranges[name])
    if _TPR_MARKER in name:
        return (0.0, 1.0)
    for suffix, bounds in _RANGES_BY_SUFFIX:
        if name.endswith(suffix):
            return bounds
    return None


def audit_metric_names(settings: AuditSettings) -> tuple[str, ...]:
    """The scalar metric names `audit.round_audit.audit_round` reports under these settings (sorted): the union of
    the enabled steps' names (audit.config.steps), never a list kept by hand. The checks of the received model
    (phase BEFORE_TRAINING) decide before training, so the gate of the trained update does not watch them."""
    names = []
    for audit_step in registered(AFTER_TRAINING):
        if audit_step.enabled(settings):
            names += audit_step.metric_names(audit_step.settings_of(settings), settings)
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


def _mapping(key: str, value) -> Mapping:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SettingsError(f"{key}: expected a mapping, got {value!r}")
    return value


def _unknown_keys(key: str, mapping: Mapping, known) -> None:
    for name in mapping:
        if name not in known:
            raise SettingsError(f"{key}.{name}: unknown setting; known: {', '.join(known)}")


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
            if not is_real(value) or not math.isfinite(value) or value <= 0:
                raise SettingsError(f"{prefix}.{name}: expected a finite number > 0, got {value!r}")
            values[name] = float(value)
        if not is_int(values["max_retries"]) or values["max_retries"] < 1:
            raise SettingsError(f"{prefix}.max_retries: expected an integer >= 1, got {values['max_retries']!r}")
        values["max_retries"] = int(values["max_retries"])
        delta = values["delta"]
        if not is_real(delta) or not 0.0 < delta < 1.0:
            raise SettingsError(f"{prefix}.delta: expected a number in (0, 1), got {delta!r}")
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

    `tripped` maps each metric above its threshold to (value, threshold), the value being the one compared;
    `compared` names, per thresholded metric, the metric whose value was compared (itself, or its `_upper` /
    `_lower` bound); `missing` lists thresholded metrics absent from the metrics (not evaluated, so they did not
    trip the gate).
    """

    passed: bool
    tripped: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    bound: str = POINT
    compared: Mapping[str, str] = field(default_factory=dict)

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
            "bound": self.bound,
            "compared": dict(self.compared),
        }


@dataclass(frozen=True)
class GatePolicy:
    """What a plan's `gate:` block says; `decide` applies its thresholds to a round's metrics."""

    action: str = "report_only"
    thresholds: Mapping[str, float] = field(default_factory=dict)
    dp: DPSettings = field(default_factory=DPSettings)
    bound: str = DEFAULT_BOUND

    def __post_init__(self):
        object.__setattr__(self, "thresholds", MappingProxyType(dict(self.thresholds)))
        if self.bound not in BOUND_CHOICES:
            raise SettingsError(f"{GATE_PREFIX}.bound: unknown bound {self.bound!r}; choose one of "
                                f"{', '.join(BOUND_CHOICES)}")

    @property
    def enabled(self) -> bool:
        """False without thresholds: no update is ever gated for its metrics (non-finite ones still are)."""
        return bool(self.thresholds)

    @classmethod
    def from_mapping(cls, mapping, *, audit_settings: AuditSettings, prefix: str = GATE_PREFIX) -> "GatePolicy":
        """Parse and validate a plan's `gate:` mapping (None or {} -> report_only without thresholds).

        Threshold names must be metrics the configured audit produces (see `audit_metric_names`).
        """
        mapping = _mapping(prefix, mapping)
        _unknown_keys(prefix, mapping, ("action", "thresholds", "bound", "dp"))
        action = mapping.get("action", "report_only")
        if action not in GATE_ACTIONS:
            raise SettingsError(f"{prefix}.action: unknown action {action!r}; choose one of {', '.join(GATE_ACTIONS)}")
        produced = audit_metric_names(audit_settings)
        thresholds = {}
        for name, value in _mapping(f"{prefix}.thresholds", mapping.get("thresholds")).items():
            key = f"{prefix}.thresholds.{name}"
            if name not in produced:
                known = ", ".join(produced) if produced else "nothing (audit.enabled is false)"
                raise SettingsError(f"{key}: unknown metric; the audit produces: {known}")
            low, high = metric_range(name) or (-math.inf, math.inf)
            if not is_real(value) or math.isnan(value):
                raise SettingsError(f"{key}: expected a number, got {value!r}")
            if not low <= value <= high:
                allowed = f"[{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
                raise SettingsError(f"{key}: {value!r} is out of range; allowed: {allowed}")
            thresholds[name] = float(value)
        bound = mapping.get("bound", DEFAULT_BOUND)
        if bound not in BOUND_CHOICES:
            raise SettingsError(f"{prefix}.bound: unknown bound {bound!r}; choose one of {', '.join(BOUND_CHOICES)}")
        dp = DPSettings.from_mapping(mapping.get("dp"), prefix=f"{prefix}.dp")
        return cls(action=action, thresholds=thresholds, dp=dp, bound=bound)

    def compared_name(self, name: str, metrics: Mapping[str, float]) -> str:
        """The metric whose value is compared with `name`'s threshold: its `bound` when the audit reports one
        beside it (<name>_upper, <name>_lower), else `name` itself."""
        if self.bound == POINT:
            return name
        candidate = bounded(name, self.bound)
        return candidate if candidate in metrics else name

    def decide(self, metrics: Mapping[str, float]) -> GateVerdict:
        """Gated if any thresholded metric (the value `bound` says) is above its threshold (or NaN/Inf)."""
        tripped, missing, compared = {}, [], {}
        for name, threshold in self.thresholds.items():
            if name not in metrics:
                missing.append(name)
                continue
            compared[name] = self.compared_name(name, metrics)
            value = float(metrics[compared[name]])
            if not math.isfinite(value) or value > threshold:
                tripped[name] = (value, threshold)
        return GateVerdict(passed=not tripped, tripped=tripped, missing=tuple(missing), bound=self.bound,
                           compared=compared)

    def to_dict(self) -> dict:
        return {"action": self.action, "thresholds": dict(self.thresholds), "bound": self.bound,
                "dp": self.dp.to_dict()}
