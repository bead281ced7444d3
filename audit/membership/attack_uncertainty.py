"""Every figure of one attack with its uncertainty and the counts it rests on, as the audit reports it: the exact
AUC with its interval, the rates at each FPR tolerance's population threshold, the epsilon lower bound and the
attacker's advantage (audit.membership.uncertainty, audit.membership.epsilon_bound).

    from audit.membership.attack_uncertainty import attack_uncertainty
    figures = attack_uncertainty(member_scores, nonmember_scores, population_scores, {0.01: threshold})
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from audit.config.vocabulary import (ADVANTAGE, AUC, EPSILON_LB, EXACT_AUC, LOWER, UPPER, bounded, tolerance_name,
                                     tpr_statistic)
from audit.membership.epsilon_bound import EpsilonLowerBound, epsilon_lower_bound
from audit.membership.uncertainty import (CONFIDENCE, Advantage, AUCInterval, RatesAtThreshold, attacker_advantage,
                                          auc, auc_interval, check_confidence, check_scores, rates_at_threshold)

__all__ = ["AttackUncertainty", "attack_uncertainty", "attack_metrics"]


@dataclass(frozen=True)
class AttackUncertainty:
    """Every figure of one attack with its uncertainty and the counts it rests on: the exact AUC (`auc_interval`), the
    rates at each FPR tolerance's population threshold (Clopper-Pearson), the epsilon lower bound and the advantage.
    `confidence` is every interval's; `delta` the epsilon bound's."""

    auc: AUCInterval
    at_fpr: dict          # tolerance (float) -> RatesAtThreshold
    epsilon: EpsilonLowerBound
    advantage: Advantage
    confidence: float
    delta: float
    # The scores it rests on (members, non-members; higher = member), kept in memory only: the round's leak verdict
    # (audit.verdict.leak) tests them against chance and recomputes the epsilon bound at a corrected level.
    scores: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        """JSON-able (non-finite numbers as None); tolerance keys named as in metric names."""
        return _json_ready({
            "confidence": self.confidence, "delta": self.delta, "exact_auc": self.auc.to_dict(),
            "at_fpr": {tolerance_name(t): rates.to_dict() for t, rates in self.at_fpr.items()},
            "epsilon_lb": self.epsilon.to_dict(), "advantage": self.advantage.to_dict(),
        })


def _json_ready(value):
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _auc_interval_or_nothing_known(pos: np.ndarray, neg: np.ndarray, confidence: float) -> AUCInterval:
    """`auc_interval`; with fewer than two samples in a class no variance can be estimated and the interval is
    the whole of [0, 1] (nothing is known beyond the estimate)."""
    if pos.size >= 2 and neg.size >= 2:
        return auc_interval(pos, neg, confidence)
    return AUCInterval(auc(pos, neg), 0.0, 1.0, float("nan"), pos.size, neg.size, confidence, "none")


def attack_uncertainty(pos_scores, neg_scores, population_scores, thresholds, *, confidence: float = CONFIDENCE,
                       delta: float = 0.0) -> AttackUncertainty:
    """The uncertainty of one attack's figures, from its per-sample scores (higher = member) on members (pos),
    non-members (neg) and the population, and the threshold it set at each FPR tolerance (tolerance -> threshold,
    "member iff score > threshold", set on the population by the attack itself).

    The rates at each threshold are counted exactly as the attack counted them, so the TPR interval is the interval
    of the TPR the attack reports; the population's share flagged and its size say whether the tolerance was
    resolvable (`RatesAtThreshold.resolvable`)."""
    confidence = check_confidence(confidence)
    pos = check_scores(pos_scores, "positives (members)")
    neg = check_scores(neg_scores, "negatives (non-members)")
    population = check_scores(population_scores, "population")
    at_fpr = {}
    for tolerance, threshold in thresholds.items():
        rates = rates_at_threshold(pos, neg, float(threshold), confidence)
        flagged = int((population > threshold).sum())
        at_fpr[float(tolerance)] = RatesAtThreshold(rates.threshold, rates.tpr, rates.fpr, float(tolerance),
                                                    flagged / population.size, int(population.size))
    return AttackUncertainty(
        auc=_auc_interval_or_nothing_known(pos, neg, confidence), at_fpr=at_fpr,
        epsilon=epsilon_lower_bound(pos, neg, delta=delta, confidence=confidence),
        advantage=attacker_advantage(pos, neg, confidence), confidence=confidence, delta=float(delta),
        scores=(pos, neg),
    )


def attack_metrics(result) -> dict[str, float]:
    """One attack's scalars by statistic (audit.config.vocabulary.attack_statistics) from its result (the AttackResult
    of audit.membership.population_attack, which every membership attack returns, here so that no step imports
    another): the grid AUC, the exact AUC, TPR at each tolerance, the epsilon lower bound and the advantage, each
    interval's bounds beside its estimate."""
    u = result.uncertainty
    out = {AUC: result.auc, EXACT_AUC: result.exact_auc,
           bounded(EXACT_AUC, LOWER): u.auc.lower, bounded(EXACT_AUC, UPPER): u.auc.upper}
    for tolerance, tpr in result.tpr_at_fpr.items():
        rates = u.at_fpr[tolerance].tpr
        name = tpr_statistic(tolerance)
        out.update({name: tpr, bounded(name, LOWER): rates.lower, bounded(name, UPPER): rates.upper})
    out.update({EPSILON_LB: u.epsilon.epsilon, ADVANTAGE: u.advantage.value,
                bounded(ADVANTAGE, LOWER): u.advantage.lower, bounded(ADVANTAGE, UPPER): u.advantage.upper})
    return {name: float(value) for name, value in out.items()}
