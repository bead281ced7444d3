"""The independent-canary bound: a one-run test of a hypothesised trade-off curve that is tight when the canaries do
not interact. Pure numpy / scipy: no torch.

Where each canary's view of the training depends on its own inclusion only (the white-box gradient canaries of the
DP check: orthogonal directions, the noise independent across coordinates, the training's own examples subtracted),
the canaries are independent draws given which were included: at a threshold c on the score fixed beforehand, the
included canaries above it are Binomial(n_in, TPR(c)) and the others Binomial(n_out, FPR(c)), TPR(c) at most the
hypothesised curve's ceiling at FPR(c). Clopper-Pearson bounds (TPR's lower, FPR's upper, each at its share of
alpha) that contradict the ceiling reject the curve (the approach of Nasr et al., "Tight Auditing of Differentially
Private Machine Learning", 2023, with the canaries of one run as the trials). The thresholds are the score's
quantiles at `FPR_TARGETS` under the claimed mechanism (fixed before the scores are seen), and the figure is
corrected for the choice among them (Bonferroni over thresholds and the two bounds of each).

What it assumes beyond DP: that the canaries do not interact. The worst-case bounds (Steinke et al.'s,
audit.canary.one_run; the f-DP one, audit.canary.fdp) assume nothing of the kind and stand beside it. How close it
comes to the true epsilon of simulated mechanisms, beside Xiang et al.'s published one-run figures on the same ones:
benchmarks/README.md "Tight canary bounds".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from audit.canary.claims import CEILING_LOWEST, CEILING_TOLERANCE, Family, least_rejected_noise
from audit.canary.fdp import FamilyBound
from audit.membership.uncertainty import cp_lower, cp_upper

__all__ = ["FPR_TARGETS", "ThresholdCounts", "threshold_counts", "null_thresholds", "independent_bound"]

# The false-positive rates, under the claimed mechanism, of the thresholds the test looks at.
FPR_TARGETS = (0.3, 0.1, 0.03, 0.01, 0.003, 0.001)


@dataclass(frozen=True)
class ThresholdCounts:
    """At each fixed threshold: included canaries above it (true positives) and excluded ones (false positives).
    Enough to compute the bound at any level without the scores."""

    thresholds: tuple[float, ...]
    included: int
    excluded: int
    true_positives: tuple[int, ...]
    false_positives: tuple[int, ...]

    def rejects(self, curve, alpha: float) -> bool:
        """Whether the counts contradict `curve` at level alpha (Bonferroni over thresholds and both bounds)."""
        if not self.included or not self.excluded:
            return False
        level = alpha / (2 * len(self.thresholds))
        tpr_low = cp_lower(np.asarray(self.true_positives), self.included, level)
        fpr_high = cp_upper(np.asarray(self.false_positives), self.excluded, level)
        return any(low > curve.tpr(float(high)) for low, high in zip(tpr_low, fpr_high) if low > 0)

    def to_dict(self) -> dict:
        return {"thresholds": list(self.thresholds), "included": self.included, "excluded": self.excluded,
                "true_positives": list(self.true_positives), "false_positives": list(self.false_positives)}

    @classmethod
    def from_dict(cls, data) -> "ThresholdCounts":
        return cls(tuple(float(t) for t in data["thresholds"]), int(data["included"]), int(data["excluded"]),
                   tuple(int(v) for v in data["true_positives"]), tuple(int(v) for v in data["false_positives"]))


def null_thresholds(curve_with_losses) -> tuple[float, ...]:
    """The scores (log-likelihood ratios) whose false-positive rate under the claimed mechanism is each of
    `FPR_TARGETS`, read from its privacy-loss distribution."""
    fpr, losses = curve_with_losses.fpr, curve_with_losses.losses
    out = []
    for target in FPR_TARGETS:
        i = min(int(np.searchsorted(fpr, target, side="left")), len(losses) - 1)
        out.append(float(losses[i]))
    return tuple(out)


def threshold_counts(scores, included, thresholds) -> ThresholdCounts:
    """The counts of the canaries' scores (higher: more likely included) at each threshold."""
    scores = np.asarray(scores, dtype=float)
    included = np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise ValueError(f"scores {scores.shape} and included {included.shape}: expected two equal 1-d arrays")
    inside, outside = scores[included], scores[~included]
    return ThresholdCounts(tuple(float(t) for t in thresholds), int(included.sum()), int((~included).sum()),
                           tuple(int((inside >= t).sum()) for t in thresholds),
                           tuple(int((outside >= t).sum()) for t in thresholds))


def independent_bound(counts: ThresholdCounts, family: Family, *, delta: float, alpha: float,
                      claimed_noise: float | None = None) -> FamilyBound:
    """The least noise of `family` the counts reject at alpha, its epsilon, the ceiling (every included canary above
    every threshold, no excluded one) and whether the claimed noise is rejected."""
    scale = claimed_noise or 1.0
    # a rejected coarse curve (looser) means a rejected fine one: the fine curves' answer from fewer of them
    noise = least_rejected_noise(lambda s: (counts.rejects(family.curve(s, coarse=True), alpha)
                                            or counts.rejects(family.curve(s), alpha)), scale)
    perfect = ThresholdCounts(counts.thresholds, counts.included, counts.excluded,
                              (counts.included,) * len(counts.thresholds), (0,) * len(counts.thresholds))
    # on coarse curves (looser, higher ceilings of the true-positive rate: rejected at no lower noise than the fine
    # ones), so the ceiling is understated, never overstated
    best = least_rejected_noise(lambda s: perfect.rejects(family.curve(s, coarse=True), alpha), scale,
                                CEILING_TOLERANCE, CEILING_LOWEST)
    claim = None if claimed_noise is None else counts.rejects(family.curve(claimed_noise), alpha)
    return FamilyBound("independent canaries", family, noise, family.epsilon(noise, delta),
                       family.epsilon(best, delta), claim, alpha, float(delta), 2 * len(counts.thresholds))
