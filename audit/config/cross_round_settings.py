"""Settings of the cross-round attack (`task_runner.settings.audit.cross_round` in the plan). Torch-free.

    cross_round:
      enabled: false
      signal: logits               # per-sample signal under the party's update and under the others' combined one
      rounds_kept: 20              # rounds of per-sample signals kept (the most recent): the attack combines these
      aggregation: weighted_average   # the aggregator's rule; other: nothing can be derived, every round is skipped
      weights: {}                  # party -> its weight in the average; {}: every party's training-set size from
                                   # the plan's data split (OpenFL's weight)

What the party needs from the aggregator's plan, and why (docs/membership.md, "Across rounds"): under a weighted
average the next global model is sum_k w_k x local_k, so the others' combined update is (next global - w x own) /
(1 - w), where w is the party's own weight among the parties averaged that round.
"""

from __future__ import annotations

from dataclasses import dataclass

from audit.config.fields import boolean, choice, integer, mapping, parse, real, setting, to_dict
from audit.config.vocabulary import CROSS_ROUND, attack_metric, attack_statistics

__all__ = ["CrossRoundSettings", "cross_round_settings", "AGGREGATIONS", "WEIGHTED_AVERAGE", "OTHER",
           "SOURCE_METRICS", "ROUNDS_METRIC", "MAX_ROUNDS_KEPT"]

WEIGHTED_AVERAGE, OTHER = "weighted_average", "other"
AGGREGATIONS = (WEIGHTED_AVERAGE, OTHER)
# The signals the test can compare (one forward pass each: the gradient norm's backward pass is left out).
STEP_SIGNALS = ("loss", "logits")
# Far above any run's rounds; it bounds the private state (rounds x samples x 4 bytes x signals).
MAX_ROUNDS_KEPT = 1000

# The source inference's figures: the share of the members whose most likely source is the party's own update, its
# interval's bounds, chance (1 / the number of parties), the same share of the non-members; and how many rounds the
# attack combines.
SOURCE_RATE = f"{CROSS_ROUND}_source_rate"
SOURCE_METRICS = (SOURCE_RATE, f"{SOURCE_RATE}_lower", f"{SOURCE_RATE}_upper", f"{CROSS_ROUND}_source_chance",
                  f"{CROSS_ROUND}_source_nonmember_rate")
ROUNDS_METRIC = f"{CROSS_ROUND}_rounds"


@dataclass(frozen=True)
class CrossRoundSettings:
    """The aggregator's view across rounds: FedMIA's test on the party's sent updates against the other parties'
    combined update, and source inference (docs/membership.md, "Across rounds")."""

    enabled: bool = setting(False, boolean(), "run the cross-round attack and source inference (from round 1: each "
                                              "round attacks the updates sent before it)")
    # The logit margin by default: it held the loss's TPR at 1% FPR on IID digits and doubled it under label skew
    # (benchmarks/README.md, "Across rounds"); the loss is kept beside it for the source inference.
    signal: str = setting("logits", choice(STEP_SIGNALS, "signal"),
                          "per-sample signal compared under the party's update and under the others' combined "
                          "update: logits (the logit margin) or loss")
    rounds_kept: int = setting(20, integer(min=1, max=MAX_ROUNDS_KEPT),
                               "rounds of per-sample signals kept (the most recent); the attack combines them")
    aggregation: str = setting(WEIGHTED_AVERAGE, choice(AGGREGATIONS, "aggregation"),
                               "the aggregator's rule: weighted_average (FedAvg; src.aggregation.GatedWeightedAverage, "
                               "OpenFL's WeightedAverage) or other (nothing is derived: every round is skipped)")
    weights: dict = setting({}, mapping(real(gt=0), key_name="<collaborator>"),
                            "every party's weight in the average (its training-set size), each party of the "
                            "federation named; {}: every party's size from the plan's data split")

    def to_dict(self) -> dict:
        return to_dict(self)

    def due(self, round_num: int) -> bool:
        """From round 1: a round attacks the updates sent before it (round 0 has none)."""
        return self.enabled and round_num >= 1

    def metric_names(self, fpr_tolerance) -> list[str]:
        """The attack's statistics (cross_round_<signal>_<statistic>), the source inference's figures and the number
        of rounds combined."""
        return ([attack_metric(CROSS_ROUND, self.signal, s) for s in attack_statistics(fpr_tolerance)]
                + [*SOURCE_METRICS, ROUNDS_METRIC])


def cross_round_settings(key: str, value) -> CrossRoundSettings:
    """CrossRoundSettings from a plan mapping (None -> defaults); unknown keys and bad values name their dotted key."""
    return parse(CrossRoundSettings, value, key)
