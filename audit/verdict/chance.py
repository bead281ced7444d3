"""Tests of an attack's figures against chance, the family-wise correction over many of them, and what given sample
sizes could detect at all.

Every test here is one-sided ("the attack does better than a guess") and valid when members and non-members are
exchangeable given the model, i.e. when the model learnt nothing that tells them apart: then any attack's scores of
the members and of the non-members are two samples of one distribution, whatever the attack, signal or model.

- `auc_p_value(pos, neg)`: the Mann-Whitney U test of AUC > 0.5 (scipy; exact for small tie-free samples,
  normal approximation with tie and continuity corrections otherwise).
- `tpr_p_value(tp, n_pos, fp, n_neg)`: Fisher's exact test of "a fixed threshold flags members more often than
  non-members" (the hypergeometric tail), for the TPR at a threshold set on a separate population.
- `holm(p_values)`: Holm's step-down adjusted p-values (family-wise error at most the level, any dependence).
- `smallest_detectable_tpr`, `smallest_detectable_auc`: the smallest figure such counts could show beats chance at a
  given level; `largest_certifiable_epsilon`: the largest epsilon lower bound they could prove.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import hypergeom, mannwhitneyu, norm

from audit.membership.epsilon_bound import epsilon_lower_bound

__all__ = ["auc_p_value", "tpr_p_value", "holm", "smallest_detectable_tpr", "smallest_detectable_auc",
           "largest_certifiable_epsilon"]


def auc_p_value(pos_scores, neg_scores) -> float:
    """One-sided p-value of "members score higher than non-members" (AUC > 0.5; higher score = member)."""
    pos, neg = np.asarray(pos_scores, dtype=np.float64), np.asarray(neg_scores, dtype=np.float64)
    if pos.size == 0 or neg.size == 0:
        return 1.0
    if np.ptp(np.concatenate([pos, neg])) == 0:  # every score equal: no evidence either way
        return 1.0
    return float(mannwhitneyu(pos, neg, alternative="greater").pvalue)


def tpr_p_value(tp, n_pos: int, fp, n_neg: int):
    """One-sided p-value of "the threshold flags members (tp of n_pos) more often than non-members (fp of n_neg)":
    Fisher's exact test, P(X >= tp) for X hypergeometric given the tp + fp samples flagged. Vectorised over tp/fp."""
    tp, fp = np.asarray(tp), np.asarray(fp)
    p = hypergeom.sf(tp - 1, n_pos + n_neg, tp + fp, n_pos)
    return float(p) if p.ndim == 0 else p


def holm(p_values) -> np.ndarray:
    """Holm's adjusted p-values: reject test i at family-wise level a iff its adjusted p <= a.

    Written here: scipy has the false-discovery-rate control (false_discovery_control) but no family-wise one. With
    the p-values sorted ascending, adjusted p_(i) = max over j <= i of min(1, (k - j + 1) p_(j))."""
    p = np.asarray(p_values, dtype=np.float64)
    k = p.size
    if k == 0:
        return p
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (k - np.arange(k)) * p[order])
    adjusted = np.empty(k)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def smallest_detectable_tpr(n_pos: int, n_neg: int, tolerance: float, alpha: float) -> float | None:
    """The smallest TPR at FPR `tolerance` that `tpr_p_value` declares above chance at level `alpha`, when the
    threshold flags the non-members at exactly the tolerance (floor(tolerance * n_neg) of them); None when not even
    every member flagged would do."""
    fp = math.floor(tolerance * n_neg)
    tp = np.arange(n_pos + 1)
    ok = np.flatnonzero(tpr_p_value(tp, n_pos, np.full_like(tp, fp), n_neg) <= alpha)
    return float(tp[ok[0]] / n_pos) if ok.size else None


def smallest_detectable_auc(n_pos: int, n_neg: int, alpha: float) -> float | None:
    """The smallest AUC the Mann-Whitney test (normal approximation, continuity-corrected, no ties) declares above
    0.5 at level `alpha`; None when even AUC 1 would not do."""
    m, n = n_pos, n_neg
    if m < 1 or n < 1:
        return None
    sigma = math.sqrt(m * n * (m + n + 1) / 12.0)
    auc = 0.5 + (float(norm.isf(alpha)) * sigma + 0.5) / (m * n)
    return auc if auc <= 1.0 else None


def largest_certifiable_epsilon(n_pos: int, n_neg: int, *, delta: float, confidence: float) -> float:
    """The largest epsilon lower bound `epsilon_lower_bound` can prove from n_pos members and n_neg non-members: the
    bound of perfectly separated scores (every member above every non-member), at that confidence and delta."""
    return epsilon_lower_bound(np.ones(n_pos), np.zeros(n_neg), delta=delta, confidence=confidence).epsilon
