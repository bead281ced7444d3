"""An empirical lower bound on the privacy parameter epsilon from an attack's scores on members and non-members:
the largest epsilon the attack's results prove with confidence `confidence` (TensorFlow Privacy's privacy tests'
definition, one-sided Clopper-Pearson bounds, Bonferroni over the thresholds). The scores follow
audit.membership.uncertainty's convention (higher = member), whose Clopper-Pearson bounds it uses.

    from audit.membership.epsilon_bound import epsilon_lower_bound
    eps = epsilon_lower_bound(member_scores, nonmember_scores, delta=1e-5)  # .epsilon .threshold .tp .fp ...
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from audit.membership.uncertainty import (CONFIDENCE, check_confidence, check_scores, counts_at_all_cuts, cp_lower,
                                          cp_upper)

__all__ = ["EpsilonLowerBound", "epsilon_lower_bound"]


@dataclass(frozen=True)
class EpsilonLowerBound:
    """An epsilon that the attack's results prove: with probability >= `confidence` the mechanism that produced the
    scores is not (epsilon', delta)-DP for any epsilon' < `epsilon` (0 when nothing is proven).

    It rests on one decision rule (`rule`, at `threshold`) and one pair of rates (`pair`): epsilon =
    log((numerator_lower - delta) / denominator_upper), each bound one-sided Clopper-Pearson at level `bound_alpha`
    = (1 - confidence) / (bounds per threshold * n_thresholds) (Bonferroni). tp, fp, fn, tn: that rule's counts
    at the threshold (members flagged, non-members flagged, members missed, non-members not flagged)."""

    epsilon: float
    delta: float
    confidence: float
    threshold: float | None
    rule: str | None
    pair: str | None
    numerator_lower: float | None
    denominator_upper: float | None
    tp: int | None
    fp: int | None
    fn: int | None
    tn: int | None
    n_pos: int
    n_neg: int
    n_thresholds: int
    bound_alpha: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _per_count(bound, counts: np.ndarray, n: int, alpha: float) -> np.ndarray:
    """bound(k, n, alpha) for every entry of counts, computed once per distinct count (the beta quantiles dominate
    the cost, and n_pos + n_neg + 1 thresholds share at most n + 1 counts)."""
    distinct, where = np.unique(counts, return_inverse=True)
    return bound(distinct, n, alpha)[where]


def epsilon_lower_bound(pos_scores, neg_scores, *, delta: float = 0.0, confidence: float = CONFIDENCE,
                        reverse: bool = True, thresholds=None) -> EpsilonLowerBound:
    """Empirical epsilon lower bound from an attack's scores on members (pos) and non-members (neg).

    As TensorFlow Privacy's ``privacy_tests/epsilon_lower_bound.py`` defines it (its Clopper-Pearson method): if a
    mechanism is (eps, delta)-DP, every decision rule S satisfies P_in(S) <= e^eps P_out(S) + delta and the same with
    in/out swapped. So for the rule "member iff score >= t": eps >= log((TPR - delta) / FPR) and
    eps >= log((TNR - delta) / FNR); with `reverse`, also for the rule "member iff score < t" (FPR/TPR and FNR/TNR
    in the first rule's terms), as TF Privacy's ``two_sided_threshold``. The rates are replaced by one-sided
    Clopper-Pearson bounds (lower in the numerator, upper in the denominator) and the bound is the max over all
    thresholds t, clipped at 0.

    Choosing the best of many thresholds is corrected, as jax_privacy's ``CanaryScoreAuditor`` does (Bonferroni):
    every bound holds at level (1 - confidence) / (bounds per threshold * n_thresholds), so that all of them hold
    together with probability >= confidence. Per threshold the first rule needs two events (TPR >= its lower bound,
    FPR <= its upper bound: TNR's lower bound is 1 - FPR's upper bound and FNR's upper bound 1 - TPR's lower bound,
    for free), the reverse rule two more (the other tails). n_thresholds: by default every cut of the pooled sample,
    counted as n_pos + n_neg + 1 whatever the ties (a number fixed before looking at the scores); or the length of
    `thresholds`, a grid fixed in advance.

    delta = 0 gives the pure-DP bound (TF Privacy ignores delta); a Gaussian mechanism has no finite pure-DP epsilon,
    so compare with its eps(delta) at the delta you pass."""
    confidence = check_confidence(confidence)
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta < 1:
        raise ValueError(f"delta: {delta!r} must be a number in [0, 1)")
    if not isinstance(reverse, bool):
        raise ValueError(f"reverse: expected a bool, got {reverse!r}")
    pos = check_scores(pos_scores, "positives (members)")
    neg = check_scores(neg_scores, "negatives (non-members)")
    if thresholds is not None:
        thresholds = check_scores(thresholds, "thresholds")
        n_thresholds = thresholds.size
    else:
        n_thresholds = pos.size + neg.size + 1
    cuts, tp, fp = counts_at_all_cuts(pos, neg, thresholds)
    n_pos, n_neg = pos.size, neg.size
    fn, tn = n_pos - tp, n_neg - fp
    bounds_per_threshold = 4 if reverse else 2
    alpha = (1 - confidence) / (bounds_per_threshold * n_thresholds)

    tpr_lo, fpr_hi = _per_count(cp_lower, tp, n_pos, alpha), _per_count(cp_upper, fp, n_neg, alpha)
    candidates = [  # (rule, pair, numerator lower bound, denominator upper bound, ...)
        ("member if score >= t", "TPR/FPR", tpr_lo, fpr_hi),
        ("member if score >= t", "TNR/FNR", 1 - fpr_hi, 1 - tpr_lo),
    ]
    if reverse:  # member iff score < t: its TPR is our FNR, its FPR our TNR
        tpr_hi, fpr_lo = _per_count(cp_upper, tp, n_pos, alpha), _per_count(cp_lower, fp, n_neg, alpha)
        candidates += [
            ("member if score < t", "TPR/FPR", 1 - tpr_hi, 1 - fpr_lo),  # FNR lower / TNR upper
            ("member if score < t", "TNR/FNR", fpr_lo, tpr_hi),          # FPR lower / TPR upper
        ]
    best = None
    for rule, pair, num, den in candidates:
        with np.errstate(divide="ignore", invalid="ignore"):
            eps = np.where((num > delta) & (den > 0), np.log(np.maximum(num - delta, 1e-300)) - np.log(den), -np.inf)
        i = int(np.argmax(eps))
        if eps[i] > 0 and (best is None or eps[i] > best[0]):
            best = (float(eps[i]), i, rule, pair, float(num[i]), float(den[i]))
    if best is None:
        return EpsilonLowerBound(0.0, float(delta), confidence, None, None, None, None, None, None, None, None, None,
                                 n_pos, n_neg, n_thresholds, alpha)
    eps, i, rule, pair, num, den = best
    counts = (tp[i], fp[i], fn[i], tn[i]) if rule.endswith(">= t") else (fn[i], tn[i], tp[i], fp[i])
    return EpsilonLowerBound(eps, float(delta), confidence, float(cuts[i]), rule, pair, num, den,
                             *(int(c) for c in counts), n_pos, n_neg, n_thresholds, alpha)
