"""Settings of the canary audit (`task_runner.settings.audit.canary` in the plan) and the metrics it reports.
Torch-free.

    canary:
      enabled: false             # input canaries: one shadow local training per audited round (its cost)
      interval: 1                # rounds where round % interval == 0 (on audited rounds)
      count: 500                 # m input canaries, each in the shadow training with probability 1/2
      construction: noise        # noise | mislabelled | natural (audit.canary.inputs)
      score: loss                # loss (under the shadow model) | loss_reduction (the received model's minus it)
      dp_check: true             # every DP training the party runs (the gate's dp_retrain, the dp_fedavg
                                 # mitigation) is audited with white-box canaries; a bound above the accountant's
                                 # epsilon withholds the update
      gradient_count: auto       # m white-box canaries of a DP check: auto = 10,000, or one per trainable value
                                 # on a smaller model (within the canary rows' memory budget)
      gradient_kind: dirac       # dirac (one coordinate each) | random (a random direction on its own coordinates)
      gradient_norm: 10.0        # a canary gradient's norm before clipping, in clipping bounds: a correct DP-SGD
                                 # clips it to the bound, one that skips clipping shows it

The one-run bounds' level and delta are the audit's `confidence` and `epsilon_delta`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from audit.config.fields import boolean, choice, either, integer, literal, parse, real, setting, to_dict

__all__ = ["CanarySettings", "canary_settings", "CONSTRUCTIONS", "SCORES", "GRADIENT_KINDS", "DIRAC", "RANDOM",
           "CANARY_METRICS", "CANARY_METRIC_RANGES", "CANARY_EPSILON_LB", "CANARY_FDP_EPSILON", "AUTO"]

MISLABELLED, NOISE, NATURAL = "mislabelled", "noise", "natural"
CONSTRUCTIONS = (NOISE, MISLABELLED, NATURAL)
LOSS, LOSS_REDUCTION = "loss", "loss_reduction"
SCORES = (LOSS, LOSS_REDUCTION)
DIRAC, RANDOM = "dirac", "random"
GRADIENT_KINDS = (DIRAC, RANDOM)
AUTO = "auto"

CANARY_EPSILON_LB = "canary_epsilon_lb"
CANARY_FDP_EPSILON = "canary_fdp_epsilon"
# The scalars the step reports (every audited round the same names): the bound, the ceiling of its m canaries at the
# same level, the counts it rests on (canaries, guesses of the grid entry that gave the bound, right ones), the
# Bonferroni-corrected p-value of "no leak" (epsilon = 0), and the f-DP bound (audit.canary.fdp: without DP the
# epsilon of the most private mu-Gaussian-DP mechanism the canaries reject, with DP the accountant's epsilon of the
# most private DP-SGD of the shadow's rate and steps they reject).
CANARY_METRICS = (CANARY_EPSILON_LB, "canary_epsilon_ceiling", "canary_count", "canary_guesses", "canary_correct",
                  "canary_no_leak_p_value", CANARY_FDP_EPSILON)
CANARY_METRIC_RANGES = {"canary_epsilon_ceiling": (0.0, math.inf), "canary_count": (0.0, math.inf),
                        "canary_guesses": (0.0, math.inf), "canary_correct": (0.0, math.inf),
                        "canary_no_leak_p_value": (0.0, 1.0), CANARY_FDP_EPSILON: (0.0, math.inf)}


@dataclass(frozen=True)
class CanarySettings:
    """The one-run canary audit (docs/canary.md): input canaries in a shadow training, white-box gradient canaries in
    every DP training the party runs."""

    # Off by default: one more local training per audited round (benchmarks/README.md "Canary audit": its cost).
    enabled: bool = setting(False, boolean(), "run the input-canary audit (one shadow local training a round)")
    interval: int = setting(1, integer(min=1), "input canaries in audited rounds where round % interval == 0")
    count: int = setting(500, integer(min=2, note="canaries"), "m input canaries, each in the shadow training with "
                                                             "probability 1/2")
    # The strongest construction and score measured (benchmarks/README.md "Canary audit": noise canaries scored by
    # their loss gave 1.6-1.7 at m = 500 where mislabelled ones gave 1.3-1.4; calibrating by the received model's
    # loss, which never saw the canaries, only adds its noise: 0.1-0.3).
    construction: str = setting(NOISE, choice(CONSTRUCTIONS, "construction"), "how input canaries are made "
                                                                              "(audit.canary.inputs)")
    score: str = setting(LOSS, choice(SCORES, "score"), "loss under the shadow model, or the received model's loss "
                                                        "minus it")
    dp_check: bool = setting(True, boolean(), "audit every DP training the party runs with white-box canaries; a "
                                              "bound above the accountant's epsilon withholds the update")
    # Enough canaries for the independent-canary bound and the white-box estimate to resolve a claim of DP-SGD
    # (benchmarks/README.md "Tight canary bounds"), within the memory of the canary rows.
    gradient_count: int | str = setting(AUTO, either(literal(AUTO, "10,000, or one per trainable value on a smaller "
                                                                   "model"), integer(min=2, note="canaries")),
                                        "m white-box canaries of a DP check")
    gradient_kind: str = setting(DIRAC, choice(GRADIENT_KINDS, "kind"), "dirac (one coordinate each) or random (a "
                                                                        "random direction on its own coordinates)")
    gradient_norm: float = setting(10.0, real(ge=1, note="clipping bounds"),
                                   "a canary gradient's norm before clipping: a correct DP-SGD clips it to the bound")

    def to_dict(self) -> dict:
        return to_dict(self)

    def due(self, round_num: int) -> bool:
        return self.enabled and round_num % self.interval == 0


def canary_settings(key: str, value) -> CanarySettings:
    """CanarySettings from a plan mapping (None -> defaults); unknown keys and bad values name their dotted key."""
    return parse(CanarySettings, value, key)
