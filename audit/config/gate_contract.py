"""What a collaborator's gate tells the aggregator, and the one decision both sides read from it.

The collaborator's `train` task (src/taskrunner.py, with audit.party_audit) sends, with its update, these scalar metrics:

    gate_kept                1.0 if the update was sent, 0.0 if its gate withheld it
    gate_retries             DP retrains before the decision
    gate_epsilon             the privacy budget those retrains spent (0.0 without)
    gate_tripped__<metric>   the measured value of each watched metric that tripped the gate, 0.0 if it did not
                             (OpenFL averages a task's metrics by the names the first reporter sent, so every
                             collaborator sends every watched name each round); gate_tripped__non_finite_update
                             is 1.0 for an update with NaN/Inf; gate_tripped__dp_guarantee_violated is the canary
                             epsilon lower bound of a DP training it found above the accountant's epsilon
    gate_threshold__<metric> the limit its gate holds the metric to (NaN: its gate does not watch it)
    gate_missing__<metric>   1.0 if the round did not produce the watched metric (the gate failed closed), else 0.0

and its audit metrics, each a scalar, except the confidence bounds of its figures (`sent_to_aggregator`). Before
training it checks the global model it received (audit.before_training) and sends only the verdict:

    received_model_alarm     1.0 if a check raised an alarm on this round's global model, else 0.0
    received_model_rejected  1.0 if it therefore did not train on it (gate_kept is then 0.0), else 0.0

The aggregator's average (src/aggregation.py) and its report (audit/aggregator_report/record.py) both call `decide` on
what arrived, so the report says exactly what was averaged. This module imports neither torch nor OpenFL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from audit.config.vocabulary import LOWER, UPPER

__all__ = [
    "GATE_KEPT", "GATE_RETRIES", "GATE_EPSILON", "GATE_TRIPPED_PREFIX", "GATE_THRESHOLD_PREFIX",
    "GATE_MISSING_PREFIX", "NON_FINITE_UPDATE", "missing_name", "DP_VIOLATED", "DP_VIOLATED_TEXT", "RUN_BUDGET",
    "KEPT", "DP_RETRAINED", "WITHHELD", "VERDICTS", "LEFT_OUT_NON_FINITE", "STRAGGLER", "STATUSES",
    "PASSED", "NO_GATE_METRIC", "GATE_WITHHELD", "GATE_KEPT_NOT_FINITE", "NON_FINITE_TENSORS",
    "Decision", "decide", "tripped_name", "threshold_name", "sent_to_aggregator",
    "RECEIVED_MODEL_ALARM", "RECEIVED_MODEL_REJECTED", "RECEIVED_MODEL_REJECTED_REASON",
]

GATE_KEPT = "gate_kept"
GATE_RETRIES = "gate_retries"
GATE_EPSILON = "gate_epsilon"
GATE_TRIPPED_PREFIX = "gate_tripped__"
# The threshold a collaborator's gate holds a watched metric to (NaN: its gate does not watch it), so the aggregator's
# report can show each verdict beside its threshold.
GATE_THRESHOLD_PREFIX = "gate_threshold__"
GATE_MISSING_PREFIX = "gate_missing__"  # 1.0 where a watched metric was missing from the party's round
NON_FINITE_UPDATE = "non_finite_update"  # the gate's reason, and the tripped name, for a NaN/Inf update
RECEIVED_MODEL_ALARM = "received_model_alarm"
RECEIVED_MODEL_REJECTED = "received_model_rejected"
# The gate's reason in a round whose received model was rejected: "received model rejected: <check>: <figure>".
RECEIVED_MODEL_REJECTED_REASON = "received model rejected"
# The gate's reason, and the tripped name, for an update whose DP training a canary audit proved weaker than its
# accountant says (audit.canary.dp): withheld whatever the thresholds.
DP_VIOLATED = "dp_guarantee_violated"
DP_VIOLATED_TEXT = "DP guarantee violated by the audit"
# The gate's reason, and the tripped name, for an update whose release would take the party's composed DP epsilon over
# the run budget (gate.run_epsilon_budget, audit.gate_flow): withheld, or retrained with DP within the budget.
RUN_BUDGET = "run_epsilon_budget"

# A collaborator's gate verdict on its own update (audit.gate_flow): sent as trained, sent after a DP retrain, or
# withheld (the received weights are sent back).
KEPT = "kept"
DP_RETRAINED = "dp_retrained"
WITHHELD = "withheld"
VERDICTS = (KEPT, DP_RETRAINED, WITHHELD)

# A collaborator's status in a round as the aggregator saw it, in the collaborators' words: KEPT (averaged in; a
# DP-retrained update too), WITHHELD (its gate withheld it, or its verdict is unreadable: fail closed), and:
LEFT_OUT_NON_FINITE = "left_out_non_finite"  # the aggregator found NaN/Inf in what it sent
STRAGGLER = "straggler"                      # OpenFL's straggler policy ended the round without it
STATUSES = (KEPT, WITHHELD, LEFT_OUT_NON_FINITE, STRAGGLER)

# Why (`Decision.cause`).
PASSED = "passed"                            # gate_kept = 1
NO_GATE_METRIC = "no_gate_metric"            # no gate_kept sent (a runner without the gate): averaged
GATE_WITHHELD = "gate_withheld"              # gate_kept = 0
GATE_KEPT_NOT_FINITE = "gate_kept_not_finite"  # gate_kept NaN/Inf/not a number
NON_FINITE_TENSORS = "non_finite_tensors"    # a tensor it trained this round holds NaN/Inf


def sent_to_aggregator(metric: str) -> bool:
    """Whether a collaborator sends this audit metric to the aggregator. The bounds of a figure's confidence
    interval (<figure>_lower, <figure>_upper) stay in the party's own report: they more than double the metrics
    (20 per attack where the estimates are 8), OpenFL's aggregator handles every metric of every collaborator each
    round through its tensor database (`make demo`, 8 rounds on 2 busy cores: 57 s of aggregation with the bounds
    sent, 20 s without), and an average of bounds over parties is no interval. A gate watching a bound still
    reports it (gate_tripped__<metric>)."""
    return not metric.endswith(("_" + LOWER, "_" + UPPER))


def tripped_name(metric: str) -> str:
    """The metric a collaborator sends for a watched `metric` (e.g. gate_tripped__mia_local_loss_auc)."""
    return GATE_TRIPPED_PREFIX + metric


def missing_name(metric: str) -> str:
    """The metric a collaborator sends for whether a watched `metric` was missing (gate_missing__<metric>)."""
    return GATE_MISSING_PREFIX + metric


def threshold_name(metric: str) -> str:
    """The metric a collaborator sends for the threshold of a watched `metric` (e.g. gate_threshold__mia_local_loss_auc)."""
    return GATE_THRESHOLD_PREFIX + metric


@dataclass(frozen=True)
class Decision:
    """Whether one collaborator's update is averaged into this round's model, and why not."""

    status: str  # KEPT, WITHHELD or LEFT_OUT_NON_FINITE
    cause: str   # PASSED, NO_GATE_METRIC, GATE_WITHHELD, GATE_KEPT_NOT_FINITE or NON_FINITE_TENSORS

    @property
    def averaged(self) -> bool:
        return self.status == KEPT


def decide(gate_kept, *, finite_update: bool) -> Decision:
    """The decision for a collaborator that reported `gate_kept` (None: it sent none) and whose trained tensors
    are all finite or not.

    NaN/Inf tensors leave it out whatever its gate said (they would poison the average). A `gate_kept` that is
    not a finite number fails closed: the verdict is unreadable, so the update may be one its gate withheld.
    """
    if not finite_update:
        return Decision(LEFT_OUT_NON_FINITE, NON_FINITE_TENSORS)
    if gate_kept is None:
        return Decision(KEPT, NO_GATE_METRIC)
    try:
        value = float(gate_kept)
    except (TypeError, ValueError):
        return Decision(WITHHELD, GATE_KEPT_NOT_FINITE)
    if not math.isfinite(value):
        return Decision(WITHHELD, GATE_KEPT_NOT_FINITE)
    return Decision(KEPT, PASSED) if value >= 0.5 else Decision(WITHHELD, GATE_WITHHELD)
