"""Settings of the received-model check (`task_runner.settings.audit.received_model`), its verdict scalars and the
words of its reasons. Torch-free: reading a plan imports this, not the check.

Every threshold may be null: its figure is still measured and reported, and never raises an alarm. The architecture
check has no threshold: a model whose tensors do not fit the plan cannot be trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from audit.config.checks import SettingsError, check_bool, from_checks, is_int, is_real
from audit.config.gate_contract import RECEIVED_MODEL_ALARM, RECEIVED_MODEL_REJECTED

__all__ = ["ReceivedModelSettings", "received_model_settings", "ACTIONS", "REJECT", "REPORT_ONLY", "METRICS", "CHECKS",
           "ARCHITECTURE", "HISTORY", "STRUCTURE", "PROBE"]

REJECT = "reject"            # on an alarm the party does not train and sends nothing new (the withheld path)
REPORT_ONLY = "report_only"  # on an alarm the party records it and trains as usual
ACTIONS = (REJECT, REPORT_ONLY)

# The only scalars the aggregator gets (audit.config.gate_contract): the verdict. The figures stay with the party.
METRICS = (RECEIVED_MODEL_ALARM, RECEIVED_MODEL_REJECTED)

# The checks, in the order they run (a reason names the first one that raised an alarm).
ARCHITECTURE, HISTORY, STRUCTURE, PROBE = "architecture", "history", "structure", "leakage probe"
CHECKS = (ARCHITECTURE, HISTORY, STRUCTURE, PROBE)


@dataclass(frozen=True)
class ReceivedModelSettings:
    enabled: bool = True
    action: str = REJECT
    # history: a layer's change since the previous global model, over the largest change an honest round has shown
    # (this party's own last update, the earlier global models' changes)
    max_change_ratio: float | None = 10.0
    # structure: rows of one linear layer that are scaled copies of one direction (|cosine| >= 0.99), at most this many
    # less one; the share of the batch a live ReLU neuron sees (mean), at least this; the share of live neurons that
    # see exactly one sample, at most this; the classifier's largest class weight norm over the median one, at most this
    parallel_rows: int | None = 4
    min_support: float | None = 0.15
    max_isolating: float | None = 0.25
    class_weight_ratio: float | None = 10.0
    # leakage probe: samples of one local batch read back from its update, more than every honest reference reads back
    # by this share of the batch, and significantly so (exact one-sided McNemar test at this level)
    probe_margin: float | None = 0.25
    probe_alpha: float = 0.01

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _action(key: str, value) -> str:
    if value not in ACTIONS:
        raise SettingsError(f"{key}: unknown action {value!r}; choose one of {', '.join(ACTIONS)}")
    return value


def _optional(check):
    def parse(key: str, value):
        return None if value is None else check(key, value)
    return parse


def _ratio(key: str, value) -> float:
    if not is_real(value) or not 1 < value < float("inf"):
        raise SettingsError(f"{key}: expected a number > 1 or null (never an alarm), got {value!r}")
    return float(value)


def _rows(key: str, value) -> int:
    if not is_int(value) or value < 2:
        raise SettingsError(f"{key}: expected an integer >= 2 or null (never an alarm), got {value!r}")
    return int(value)


def _share(key: str, value) -> float:
    if not is_real(value) or not 0 < value < 1:
        raise SettingsError(f"{key}: expected a number in (0, 1) or null (never an alarm), got {value!r}")
    return float(value)


def _alpha(key: str, value) -> float:
    if not is_real(value) or not 0 < value < 0.5:
        raise SettingsError(f"{key}: expected a significance level in (0, 0.5), e.g. 0.01, got {value!r}")
    return float(value)


_CHECKS = {
    "enabled": check_bool, "action": _action,
    "max_change_ratio": _optional(_ratio), "parallel_rows": _optional(_rows), "min_support": _optional(_share),
    "max_isolating": _optional(_share), "class_weight_ratio": _optional(_ratio), "probe_margin": _optional(_share),
    "probe_alpha": _alpha,
}


def received_model_settings(key: str, value) -> ReceivedModelSettings:
    """ReceivedModelSettings from a plan mapping (None -> defaults: on, reject); errors name the dotted key."""
    if isinstance(value, bool):
        raise SettingsError(f"{key}: is a section; write {key}.enabled: {str(value).lower()}")
    return from_checks(ReceivedModelSettings, _CHECKS, value, key)
