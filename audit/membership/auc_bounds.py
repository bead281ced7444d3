"""Confidence bounds for the ROC AUC that hold on each side, near AUC 1 and with 20 samples a class as well.

The AUC estimate is the mean of the members' placements (each member's share of non-members ranked below it, ties
half) and equally the mean of the non-members' placements (each one's share of members ranked above it). DeLong's
interval, estimate +- z * SE, leaves the truth below its lower bound far more often than (1 - c) / 2 near AUC 1 at
small sizes (benchmarks/README.md, "AUC interval coverage", has its miss rates): the placements are skewed, and a
sample that missed the few badly ranked members both overestimates the AUC and underestimates its variance. No
estimate of the variance from such a sample can see what it missed. A rank-based interval cannot tell a perfectly separated sample of well-behaved scores from one drawn where
a share 1 - AUC of the smaller class (k = min(m, n) samples) ranks beyond every sample of the other class, where
perfect separation has probability AUC^k: so no lower bound that holds for every score distribution exceeds
((1 - c) / 2)^(1/k) at perfect separation (0.832 at 20 a class, 95%).

`auc_bounds` inverts a test of each candidate AUC `a`, as Newcombe (2006, "Confidence intervals for an effect size
measure based on the Mann-Whitney statistic. Part 2: asymptotic methods and evaluation", Statistics in Medicine 25:
559-573) does with a variance that is a function of the AUC, here:

- V(a), the variance the estimate would have if the AUC were `a`, for the least favourable way in which the sample
  can be wrong about it: a share of one class that the sample missed, ranked beyond every sample of the other class
  (for `a` below the estimate: members below every non-member, or non-members above every member; above it, the
  reverse), as large as moves the AUC from the estimate to `a`. Of all one-point additions to the observed
  placements that move their mean to `a`, the one at the far end gives them the largest variance; the other class's
  placements shrink with it. V(a) is the larger of the two classes' versions plus the bound
  (a(1 - a) - both classes' parts) / (mn) on the U-statistic's remaining term.
- V(a) as an effective number of binomial trials, n(a) = a(1 - a) / V(a): never more than the sample's own,
  estimate(1 - estimate) / DeLong's variance, and never fewer than min(m, n), since a(1 - a) / min(m, n) is the
  largest variance any pair of distributions with AUC `a` gives (Birnbaum & Klose 1957, "Bounds for the variance of
  the Mann-Whitney statistic", Annals of Mathematical Statistics 28).
- The test: `a` is rejected when the estimate falls in the (1 - c) / 2 tail of a binomial proportion of n(a) trials
  at `a` (Clopper-Pearson, with the regularized incomplete beta for fractional counts; Korn & Graubard (1998, Survey
  Methodology 24: 193-201) invert Clopper-Pearson at an effective sample size the same way for proportions from
  complex samples).

What it gives: where one class's scores are all equal the estimate is a binomial proportion and the interval is
exactly Clopper-Pearson's, each side at most (1 - c) / 2 for every AUC. At perfect separation the lower bound is
((1 - c) / 2)^(1/k), the largest the argument above allows (0.832 at 20 a class). All scores tied: 0.5 with
[0.39, 0.61] at 20 a class. Away from the boundary and with large samples it is DeLong's interval (widths within a
few per cent at 1,000 a class and AUC <= 0.9). Near AUC 1 at small sizes it is as wide as the binomial argument
requires (AUC 0.99 with 20 a class: lower bounds near 0.8). Coverage by simulation over AUC 0.5-0.995, 20-10,000
a class, unequal classes, and score distributions with heavy tails, ties and point masses:
benchmarks/bench_interval_coverage.py.

Every function works on arrays, so that many samples are bounded at once (the coverage tests and benchmark do).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import elementwise
from scipy.special import betainc

__all__ = ["METHOD", "auc_bounds"]

METHOD = "lf-binomial"  # least-favourable variance, binomial test; recorded in AUCInterval.method

_GRID = 4  # a scan from the far end brackets the outermost accepted candidate; scipy's root finder refines it
_TOLERANCE = 1e-10


def _variance(a, estimate, pos_var, neg_var, m, n):
    """The variance of the AUC estimate if the AUC were `a` (module docstring); pos_var / neg_var: the placements'
    sample variances (ddof 1, DeLong's)."""
    below = a <= estimate
    with np.errstate(divide="ignore", invalid="ignore"):
        keep = np.where(below, a / estimate, (1 - a) / (1 - estimate))  # share of the observed class kept
        # DeLong's variance per unit of a binomial proportion's: the sample's own effective trials, inverted
        per_trial = np.nan_to_num((pos_var / m + neg_var / n) / (estimate * (1 - estimate)), nan=0.0, posinf=0.0)
    keep = np.clip(np.nan_to_num(keep, nan=1.0, posinf=1.0), 0.0, 1.0)
    between = np.where(below, a * (estimate - a), (a - estimate) * (1 - a))  # the added share against the rest
    mixed_pos, mixed_neg = keep * pos_var + between, keep * neg_var + between
    scaled_pos, scaled_neg = keep**2 * pos_var, keep**2 * neg_var
    members_missed = mixed_pos / m + scaled_neg / n
    nonmembers_missed = scaled_pos / m + mixed_neg / n
    first = members_missed >= nonmembers_missed
    part_pos = np.where(first, mixed_pos, scaled_pos)
    part_neg = np.where(first, scaled_neg, mixed_neg)
    remainder = np.maximum(a * (1 - a) - part_pos - part_neg, 0.0) / (m * n)
    binomial = a * (1 - a)
    least_favourable = np.maximum(part_pos / m + part_neg / n + remainder, binomial * per_trial)
    return np.minimum(least_favourable, binomial / np.minimum(m, n))


def _log_tail(a, side, estimate, pos_var, neg_var, m, n):
    """log P(a binomial proportion with n(a) = a(1 - a) / V(a) trials at `a` lies at least as far out as the
    estimate): beyond it above `a` for side -1, below it for side +1 (`side`: -1, +1, or an array of them). For `a`
    in (0, 1)."""
    trials = a * (1 - a) / _variance(a, estimate, pos_var, neg_var, m, n)
    hits = trials * estimate
    low = np.asarray(side) < 0
    with np.errstate(invalid="ignore", divide="ignore"):
        # side -1: P(X >= hits) = I_a(hits, trials - hits + 1); side +1: P(X <= hits) = 1 - I_a(hits + 1, trials -
        # hits) = I_(1-a)(trials - hits, hits + 1)
        tail = betainc(np.where(low, np.maximum(hits, 1e-300), np.maximum(trials - hits, 1e-300)),
                       np.where(low, trials - hits + 1, hits + 1), np.where(low, a, 1 - a))
        return np.log(np.maximum(tail, 1e-300))


def _rejected(a, side, estimate, pos_var, neg_var, m, n, alpha):
    """Whether candidate `a` is outside the interval (at 0 or 1 only the estimate itself is possible)."""
    inner = (a > 0) & (a < 1)
    log_tail = _log_tail(np.where(inner, a, 0.5), side, estimate, pos_var, neg_var, m, n)
    return np.where(inner, log_tail < np.log(alpha), True) & (a != estimate)


def _bound(side, estimate, pos_var, neg_var, m, n, alpha):
    """The outermost accepted candidate on side `side` (-1: lower, +1: upper; an array of them bounds each element
    on its own side, so that both sides share one scan and one root finding): a grid scanned from the far end (0 or
    1) towards the estimate finds the first accepted point, and scipy's bracketing root finder (Chandrupatla) the
    crossing between it and the rejected point before it."""
    low = np.broadcast_to(np.asarray(side) < 0, estimate.shape)
    far = np.where(low, 0.0, 1.0)
    span = estimate - far
    data = (estimate, pos_var, neg_var, m, n)
    rejected, accepted = far.copy(), estimate.copy()  # the estimate itself is always accepted
    found = np.zeros(estimate.shape, dtype=bool)
    for i in range(_GRID):  # the estimate itself (i = _GRID) needs no test
        point = far + span * (i / _GRID)
        newly = ~found & ~_rejected(point, side, *data, alpha)
        accepted = np.where(newly, point, accepted)
        found |= newly
        rejected = np.where(~found, point, rejected)
    refine = accepted != rejected
    if not refine.any():
        return accepted
    # the crossing lies strictly inside (0, 1): nudge a far-end bracket point inwards for the log tail
    lo, hi = np.where(low, rejected, accepted)[refine], np.where(low, accepted, rejected)[refine]
    inset = np.minimum(1e-12, (hi - lo) / 4)
    lo_in, hi_in = np.maximum(lo, inset), np.minimum(hi, 1 - inset)
    sides = np.where(low, -1.0, 1.0)[refine]
    args = (sides, *(np.broadcast_to(d, estimate.shape)[refine] for d in data))
    log_alpha = np.log(alpha)
    found_root = elementwise.find_root(lambda a, s, *d: _log_tail(a, s, *d) - log_alpha, (lo_in, hi_in), args=args,
                                       tolerances={"xatol": _TOLERANCE, "xrtol": 0.0})
    # where the root finder fails, the bracket's rejected end: wider, never narrower
    root = np.where(np.isfinite(found_root.x), found_root.x, np.where(sides < 0, lo_in, hi_in))
    out = accepted.copy()
    out[refine] = root
    return out


def auc_bounds(estimate, pos_var, neg_var, n_pos, n_neg, confidence: float = 0.95):
    """(lower, upper): two-sided bounds at `confidence` for AUCs `estimate` whose members' and non-members'
    placements have sample variances (ddof 1) `pos_var` and `neg_var`, with n_pos members and n_neg non-members
    (each >= 2). Arrays broadcast; each side holds at level (1 - confidence) / 2."""
    estimate, pos_var, neg_var, m, n = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in
                                                             (estimate, pos_var, neg_var, n_pos, n_neg)))
    if np.any(np.minimum(m, n) < 2):
        raise ValueError("auc_bounds: needs at least 2 members and 2 non-members")
    if not 0 < confidence < 1:
        raise ValueError(f"auc_bounds: confidence {confidence!r} must be in (0, 1)")
    alpha = (1 - confidence) / 2
    # both sides in one pass (scipy's root finder costs most per call, not per element): the lower bounds first
    both = _bound(np.repeat([-1.0, 1.0], estimate.size),
                  *(np.tile(v.ravel(), 2) for v in (estimate, pos_var, neg_var, m, n)), alpha)
    return both[:estimate.size].reshape(estimate.shape), both[estimate.size:].reshape(estimate.shape)
