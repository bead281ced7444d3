"""Gating of leaky updates: the policy a plan sets (`task_runner.settings.gate`) and its decision.

A gate compares a round's audit metrics with the plan's limits, and an update is gated if any is exceeded:
- `thresholds`: metric name -> highest allowed value. Which value of a metric is compared is the policy's `bound`:
  `point` the estimate; `upper` (the default) its confidence interval's upper bound, so an update passes only when
  its leakage is significantly below the threshold; `lower` the lower bound, so it is gated only when its leakage is
  significantly above. A metric the audit reports no such bound for is compared as it is, whatever `bound` says: a
  bound named as the threshold (`*_exact_auc_lower`: a bound has no bound of its own), an epsilon lower bound
  (`*_epsilon_lb`, a lower confidence bound itself), and the metrics without an interval (the grid `*_auc`,
  Fidel's, the deanonymization audit's, a plug-in's). Which one is compared is decided when the plan is read, from
  the names the configured audit produces, and recorded in each verdict (`GateVerdict.compared`).
- `epsilon_budget`: the highest allowed family-wise epsilon lower bound of the round's attacks (the leak verdict's
  `leak_epsilon_lb`, audit.verdict.leak, at the audit's epsilon_delta and confidence): the update is gated when the
  audit proves more leakage than the budget allows.
What then happens to the update (withhold it, retrain it with DP-SGD, or only report) is audit.gate_flow's; this
module imports neither OpenFL nor torch (a test checks it: tests/test_audit_steps.py).

Fail closed: a watched metric that an audited round did not produce, or whose value is NaN/Inf, trips the gate with
the reason `missing: <metric>` (GateVerdict.missing) or its value. A plan under which a watched metric cannot exist
in every audited round (a step with an `interval` above 1) is refused when the plan is read, naming both keys. Every
error is a SettingsError whose message starts with the dotted key of the offending setting. Rounds without an audit (audit disabled, or skipped by `audit.interval`) are not gated: nothing
was measured. Non-finite *updates* are gated whatever the policy (see `non_finite_tensors`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from audit.config.audit_settings import AuditSettings
from audit.config.fields import (SettingsError, check_fields, choice, integer, mapping, optional, parse, real, setting,
                                 subsection, to_dict)
from audit.config.gate_contract import NON_FINITE_UPDATE
from audit.config.steps import AFTER_TRAINING, metric_prefixes, producer_of, registered
from audit.config.vocabulary import BOUNDS, GATE_ACTIONS, LEAK_EPSILON_LB, LEAK_METRICS, bounded

__all__ = [
    "NON_FINITE_UPDATE",
    "POINT",
    "BOUND_CHOICES",
    "DPSettings",
    "GatePolicy",
    "GateVerdict",
    "MISSING",
    "audit_metric_names",
    "intermittent",
    "metric_range",
    "non_finite_tensors",
]

GATE_PREFIX = "task_runner.settings.gate"
AUDIT_PREFIX = "task_runner.settings.audit"
# The reason of a round gated because a watched metric is missing: "missing: <metric>, ...".
MISSING = "missing: "

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
    the enabled steps' names (audit.config.steps) and the leak verdict's, never a list kept by hand. The checks of the
    received model (phase BEFORE_TRAINING) decide before training, so the gate of the trained update does not watch
    them."""
    if not settings.enabled:
        return ()
    names = list(LEAK_METRICS)
    for audit_step in registered(AFTER_TRAINING):
        if audit_step.enabled(settings):
            names += audit_step.metric_names(audit_step.settings_of(settings), settings)
    return tuple(sorted(names))


def intermittent(name: str, settings: AuditSettings, horizon: int = 10_000) -> tuple[str, int] | None:
    """Why metric `name` can be missing from an audited round although the audit produces it: its step's own
    schedule skips audited rounds. Returns (the step's section, the first audited round it skips) or None. Read off
    the schedules themselves over the first `horizon` rounds (they are periodic, with periods far below that)."""
    producer = producer_of(name)
    if producer is None or producer.section is None:
        return None
    for round_num in range(horizon):
        if settings.due(round_num) and not producer.due(settings, round_num):
            return producer.section, round_num
    return None


def _did_you_mean(name: str, known) -> str:
    """A short hint for an unknown metric name: the nearest known names, never the whole list (hundreds of names)."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    if close:
        return f"did you mean {' or '.join(close)}?"
    families = sorted({next((p for p in metric_prefixes() if k.startswith(p)), k) for k in known})
    return f"the audit's metrics start with {', '.join(families)} ({len(known)} in all)"


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


# Each DP retrain doubles the noise multiplier: the 30th runs at 2^29 (5.4e8) times the first's noise, an update that
# carries nothing of the data (nor of the task); more tries could only overflow the multiplier.
MAX_DP_RETRIES = 30


@dataclass(frozen=True)
class DPSettings:
    """DP-SGD settings for `action: dp_retrain`."""

    noise_multiplier: float = setting(1.0, real(gt=0), "noise multiplier of the first DP retrain; doubled on each "
                                                       "further try")
    max_grad_norm: float = setting(1.0, real(gt=0), "per-sample clipping norm")
    max_retries: int = setting(2, integer(min=1, max=MAX_DP_RETRIES, note="each doubles the noise"),
                               "DP retrains before the update is withheld")
    delta: float = setting(1e-5, real(gt=0, lt=1), "the accountant's delta for the reported epsilon")

    def noise_for_try(self, attempt: int) -> float:
        """Noise multiplier of DP retrain number `attempt` (1-based): doubled each time."""
        return self.noise_multiplier * 2.0 ** (attempt - 1)

    def to_dict(self) -> dict:
        return to_dict(self)


@dataclass(frozen=True)
class GateVerdict:
    """The gate's decision on one set of metrics.

    `tripped` maps each limit exceeded to (value, limit), the value being the one compared (NaN when it is missing or
    not finite); `compared` names, per watched metric, the metric whose value is compared (itself, or its `_upper` /
    `_lower` bound); `missing` lists the watched metrics the round did not produce: they trip the gate too (fail
    closed).
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

    @property
    def reason(self) -> str | None:
        """Why it did not pass: "missing: <metrics>" when every limit it exceeded lacks its value, else None (the
        caller names the over-threshold or non-finite reason)."""
        if self.tripped and self.missing and set(self.tripped) <= set(self.missing):
            return MISSING + ", ".join(self.missing)
        return None

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            # JSON has no NaN: a missing or non-finite metric value (which trips the gate) is stored as None.
            "tripped": {
                k: {"value": v if math.isfinite(v) else None, "threshold": t} for k, (v, t) in self.tripped.items()
            },
            "missing": list(self.missing),
            "bound": self.bound,
            "compared": dict(self.compared),
        }


def _parse_thresholds(mapping, produced, audit_settings: AuditSettings, prefix: str,
                      audit_prefix: str) -> dict[str, float]:
    thresholds = {}
    for name, value in mapping.items():
        key = f"{prefix}.thresholds.{name}"
        if name in LEAK_METRICS:
            raise SettingsError(f"{key}: the leak verdict's figures are not thresholds; set {prefix}.epsilon_budget "
                                "to gate on the family-wise epsilon lower bound")
        if name not in produced:
            hint = _did_you_mean(name, produced) if produced else "the audit produces nothing (audit.enabled is false)"
            raise SettingsError(f"{key}: unknown metric; {hint}")
        low, high = metric_range(name) or (-math.inf, math.inf)
        if not low <= value <= high:
            allowed = f"[{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
            raise SettingsError(f"{key}: {value:g} is out of range; allowed: {allowed}")
        skipped = intermittent(name, audit_settings)
        if skipped is not None:
            section, round_num = skipped
            step_key = f"{audit_prefix}.{section}"
            interval = getattr(audit_settings.sections[section], "interval", None)
            said = f"{step_key}.interval: {interval}" if interval is not None else f"{step_key}'s schedule"
            raise SettingsError(
                f"{key}: the audit does not produce it in every audited round ({said} skips round {round_num}), and a "
                f"gated round without it withholds the update; set {step_key}.interval to 1 (or a divisor of "
                f"{audit_prefix}.interval) or gate a metric every audited round has")
        thresholds[name] = float(value)
    return thresholds


def compared_as_they_are(thresholds, produced, bound: str) -> frozenset[str]:
    """The thresholded metrics whose own value meets the threshold under this `bound`: under `upper` or `lower`,
    those the audit reports no such bound for (a bound itself, an epsilon lower bound, a metric without an
    interval); under `point`, every one."""
    return frozenset(name for name in thresholds if bound == POINT or bounded(name, bound) not in produced)


@dataclass(frozen=True)
class GatePolicy:
    """What a plan's `gate:` block says; `decide` applies its limits to a round's metrics."""

    action: str = setting("report_only", choice(GATE_ACTIONS, "action"),
                          "what happens to an update over a limit: withheld (the received weights are sent), "
                          "retrained with DP-SGD and audited again, or only reported")
    bound: str = setting(DEFAULT_BOUND, choice(BOUND_CHOICES, "bound"),
                         "the value a threshold meets: the upper or lower bound of the metric's confidence interval, "
                         "or its point estimate")
    thresholds: Mapping[str, float] = setting(
        {}, mapping(real(finite=False), key_name="<metric>"),
        "audit metric -> highest allowed value (within the metric's range: [0, 1] for rates, AUCs and advantages, "
        ">= 0 for epsilons and AP over chance); the metric must exist in every audited round")
    epsilon_budget: float | None = setting(None, optional(real(ge=0, note="epsilon at the audit's epsilon_delta")),
                                           "gate when the audit proves a family-wise epsilon above this")
    dp: DPSettings = subsection(DPSettings, "DP-SGD retraining for action: dp_retrain")
    run_epsilon_budget: float | None = setting(
        None, optional(real(gt=0, note="epsilon at dp.delta")),
        "the most DP epsilon the party's releases may compose to over the run (opacus' RDP accountant at dp.delta): "
        "an update whose release would take the total over it is withheld, whatever the action (dp_retrain retrains "
        "it with DP first, within the budget); a plainly trained update has no bound and is never sent under a run "
        "budget")
    # Not a plan key: the thresholded metrics compared as they are (compared_as_they_are), set by from_mapping from
    # the names the audit produces. A policy built without it compares every threshold's bound, and a round without
    # that bound trips the gate (fail closed).
    as_they_are: frozenset[str] = field(default=frozenset(), repr=False)

    def __post_init__(self):
        check_fields(self, GATE_PREFIX)
        object.__setattr__(self, "thresholds", MappingProxyType(dict(self.thresholds)))

    @property
    def enabled(self) -> bool:
        """False without thresholds or a budget: no update is ever gated for its metrics (non-finite ones still are)."""
        return bool(self.limits)

    @property
    def limits(self) -> dict[str, float]:
        """Every watched metric -> the highest value allowed: the thresholds, and the epsilon budget as the limit of
        the leak verdict's family-wise epsilon lower bound."""
        out = dict(self.thresholds)
        if self.epsilon_budget is not None:
            out[LEAK_EPSILON_LB] = self.epsilon_budget
        return out

    @classmethod
    def from_mapping(cls, mapping, *, audit_settings: AuditSettings, prefix: str = GATE_PREFIX,
                     audit_prefix: str = AUDIT_PREFIX) -> "GatePolicy":
        """Parse and validate a plan's `gate:` mapping (None or {} -> report_only without limits).

        Threshold names must be metrics the configured audit produces in every audited round (see
        `audit_metric_names`, `intermittent`); which value each compares follows from those names
        (`compared_as_they_are`); `audit_prefix` is the audit section's dotted key, for the errors that name both."""
        policy = parse(cls, mapping, prefix)
        produced = audit_metric_names(audit_settings)
        thresholds = _parse_thresholds(policy.thresholds, produced, audit_settings, prefix, audit_prefix)
        if policy.epsilon_budget is not None and not audit_settings.enabled:
            raise SettingsError(f"{prefix}.epsilon_budget: the audit is off (audit.enabled is false), so nothing "
                                "proves an epsilon")
        return dataclasses.replace(policy, thresholds=thresholds,
                                   as_they_are=compared_as_they_are(thresholds, produced, policy.bound))

    def compared_name(self, name: str) -> str:
        """The metric whose value is compared with `name`'s limit: its `bound` (<name>_upper, <name>_lower), or
        `name` itself under `point`, for a metric the audit reports no bound for (`as_they_are`) and for the epsilon
        budget's metric."""
        if self.bound == POINT or name == LEAK_EPSILON_LB or name in self.as_they_are:
            return name
        return bounded(name, self.bound)

    def decide(self, metrics: Mapping[str, float]) -> GateVerdict:
        """Gated if any watched value (the one `compared_name` says) is above its limit, NaN/Inf, or missing."""
        tripped, missing, compared = {}, [], {}
        for name, limit in self.limits.items():
            compared[name] = self.compared_name(name)
            if compared[name] not in metrics:
                missing.append(name)
                tripped[name] = (math.nan, limit)
                continue
            value = float(metrics[compared[name]])
            if not math.isfinite(value) or value > limit:
                tripped[name] = (value, limit)
        return GateVerdict(passed=not tripped, tripped=tripped, missing=tuple(missing), bound=self.bound,
                           compared=compared)

    def to_dict(self) -> dict:
        return to_dict(self)
