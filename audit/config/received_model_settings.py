"""Settings of the received-model check (`task_runner.settings.audit.received_model`), its verdict scalars and the
words of its reasons. Torch-free: reading a plan imports this, not the check.

Every threshold may be null: its figure is still measured and reported, and never raises an alarm. The architecture
check has no threshold: a model whose tensors do not fit the plan cannot be trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

from audit.config.fields import (SettingsError, boolean, choice, integer, optional, parse, real, setting,
                                  to_dict)
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

_NEVER = "its figure is measured, never an alarm"


@dataclass(frozen=True)
class ReceivedModelSettings:
    """Check of every received global model before training on it (docs/received-model.md)."""

    enabled: bool = setting(True, boolean(), "check every received global model before training on it")
    action: str = setting(REJECT, choice(ACTIONS, "action"),
                          "on an alarm: reject (no training, nothing new sent) or report_only (record, train)")
    max_change_ratio: float | None = setting(
        10.0, optional(real(gt=1), _NEVER),
        "history: a layer's change since the previous global model over the largest honest change, at most this")
    parallel_rows: int | None = setting(
        4, optional(integer(min=2), _NEVER),
        "structure: rows of one linear layer that are scaled copies of one direction, fewer than this")
    min_support: float | None = setting(
        0.15, optional(real(gt=0, lt=1), _NEVER), "structure: mean share of the batch a live ReLU neuron sees, at least")
    max_isolating: float | None = setting(
        0.25, optional(real(gt=0, lt=1), _NEVER),
        "structure: share of live neurons that see exactly one sample, at most")
    class_weight_ratio: float | None = setting(
        10.0, optional(real(gt=1), _NEVER),
        "structure: the classifier's largest class weight norm over the median one, at most")
    probe_margin: float | None = setting(
        0.25, optional(real(gt=0, lt=1), _NEVER),
        "leakage probe: share of a local batch read back from its update beyond every honest reference, at most")
    probe_alpha: float = setting(0.01, real(gt=0, lt=0.5, note="a significance level, e.g. 0.01"),
                                 "leakage probe: level of the exact one-sided McNemar test against each reference")

    def to_dict(self) -> dict:
        return to_dict(self)


def received_model_settings(key: str, value) -> ReceivedModelSettings:
    """ReceivedModelSettings from a plan mapping (None -> defaults: on, reject); errors name the dotted key."""
    if isinstance(value, bool):
        raise SettingsError(f"{key}: is a section; write {key}.enabled: {str(value).lower()}")
    return parse(ReceivedModelSettings, value, key)
