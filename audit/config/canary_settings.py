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
      gradient_count: 1000       # m white-box canaries of a DP check
      gradient_kind: dirac       # dirac (one coordinate each) | random (a random direction on its own coordinates)
      gradient_norm: 10.0        # a canary gradient's norm before clipping, in clipping bounds: a correct DP-SGD
                                 # clips it to the bound, one that skips clipping shows it

The one-run bound's level and delta are the audit's `confidence` and `epsilon_delta`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from audit.config.checks import SettingsError, check_bool, check_positive_int, from_checks, is_int, is_real

__all__ = ["CanarySettings", "canary_settings", "CONSTRUCTIONS", "SCORES", "GRADIENT_KINDS", "CANARY_METRICS",
           "CANARY_METRIC_RANGES", "CANARY_EPSILON_LB"]

MISLABELLED, NOISE, NATURAL = "mislabelled", "noise", "natural"
CONSTRUCTIONS = (NOISE, MISLABELLED, NATURAL)
LOSS, LOSS_REDUCTION = "loss", "loss_reduction"
SCORES = (LOSS, LOSS_REDUCTION)
DIRAC, RANDOM = "dirac", "random"
GRADIENT_KINDS = (DIRAC, RANDOM)

CANARY_EPSILON_LB = "canary_epsilon_lb"
# The scalars the step reports (every audited round the same names): the bound, the ceiling of its m canaries at the
# same level, the counts it rests on (canaries, guesses of the grid entry that gave the bound, right ones), and the
# Bonferroni-corrected p-value of "no leak" (epsilon = 0).
CANARY_METRICS = (CANARY_EPSILON_LB, "canary_epsilon_ceiling", "canary_count", "canary_guesses", "canary_correct",
                  "canary_no_leak_p_value")
CANARY_METRIC_RANGES = {"canary_epsilon_ceiling": (0.0, math.inf), "canary_count": (0.0, math.inf),
                        "canary_guesses": (0.0, math.inf), "canary_correct": (0.0, math.inf),
                        "canary_no_leak_p_value": (0.0, 1.0)}


@dataclass(frozen=True)
class CanarySettings:
    # Off by default: one more local training per audited round (benchmarks/README.md "Canary audit": its cost).
    enabled: bool = False
    interval: int = 1
    count: int = 500
    # The strongest construction and score measured (benchmarks/README.md "Canary audit": noise canaries scored by
    # their loss gave 1.6-1.7 at m = 500 where mislabelled ones gave 1.3-1.4; calibrating by the received model's
    # loss, which never saw the canaries, only adds its noise: 0.1-0.3).
    construction: str = NOISE
    score: str = LOSS
    dp_check: bool = True
    gradient_count: int = 1000
    gradient_kind: str = DIRAC
    gradient_norm: float = 10.0

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def due(self, round_num: int) -> bool:
        return self.enabled and round_num % self.interval == 0


def _choice(options):
    def check(key, value):
        if value not in options:
            raise SettingsError(f"{key}: unknown value {value!r}; known: {', '.join(options)}")
        return value
    return check


def _count(key, value) -> int:
    if not is_int(value) or value < 2:
        raise SettingsError(f"{key}: expected an integer >= 2 (canaries), got {value!r}")
    return int(value)


def _norm(key, value) -> float:
    if not is_real(value) or not (math.isfinite(value) and value >= 1):
        raise SettingsError(f"{key}: expected a number >= 1 (clipping bounds), got {value!r}")
    return float(value)


_CHECKS = {
    "enabled": check_bool,
    "interval": check_positive_int,
    "count": _count,
    "construction": _choice(CONSTRUCTIONS),
    "score": _choice(SCORES),
    "dp_check": check_bool,
    "gradient_count": _count,
    "gradient_kind": _choice(GRADIENT_KINDS),
    "gradient_norm": _norm,
}


def canary_settings(key: str, value) -> CanarySettings:
    """CanarySettings from a plan mapping (None -> defaults); unknown keys and bad values name their dotted key."""
    return from_checks(CanarySettings, _CHECKS, value, key)
