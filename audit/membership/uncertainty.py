"""Uncertainty of membership-inference figures: intervals of rates, of the AUC, of the TPR at a population's FPR
threshold, and of the attacker's advantage. The epsilon lower bound is audit.membership.epsilon_bound, every figure
of one attack together audit.membership.attack_uncertainty; both build on what is here.

Everything here works on per-sample attack scores with one convention: a higher score means "more likely a member"
(members are the positives). Negate a loss or a gradient norm before passing it.

- `clopper_pearson(k, n)`: the exact (Clopper-Pearson) interval of a rate k/n, e.g. a TPR or an FPR; `cp_lower`,
  `cp_upper`: its one-sided bounds, vectorised.
- `auc_interval(pos, neg)`: the ROC AUC with an interval that holds on each side near AUC 1 and at 20 samples a class
  (audit.membership.auc_bounds), DeLong's standard error, and the counts. `delong(pos, neg)`: the AUC and DeLong's
  variance.
- `population_threshold(population, fpr)` and `rates_at_threshold(pos, neg, threshold)`: the TPR (and FPR) of the
  decision "score > threshold", the threshold set on a separate population so that at most a share `fpr` of it is
  flagged, each with its Clopper-Pearson interval and counts. `tpr_at_population_fpr` does both.
- `attacker_advantage(pos, neg)`: max over thresholds of |TPR - FPR|, with a simultaneous (DKW) interval;
  `counts_at_all_cuts`: the counts of every threshold it (and the epsilon bound) sweeps.
- `check_scores`, `check_confidence`: the inputs' checks, one message naming the input.

What the intervals cover: the randomness of the scored samples given the model, i.e. "if we had drawn other members
and non-members from the same distributions, scored by the same model". They say nothing about other training runs.

    from audit.membership.uncertainty import auc_interval, tpr_at_population_fpr
    auc = auc_interval(member_scores, nonmember_scores)                 # .estimate .lower .upper .n_pos .n_neg
    at = tpr_at_population_fpr(member_scores, nonmember_scores, population_scores, 0.01)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta, rankdata

from audit.membership.auc_bounds import METHOD as AUC_METHOD, auc_bounds
from audit.config.resolution import largest_count, resolvable

__all__ = [
    "CONFIDENCE",
    "RateInterval",
    "AUCInterval",
    "RatesAtThreshold",
    "Advantage",
    "clopper_pearson",
    "auc",
    "delong",
    "placements",
    "auc_interval",
    "population_threshold",
    "rates_at_threshold",
    "tpr_at_population_fpr",
    "attacker_advantage",
    "check_scores",
    "check_confidence",
    "counts_at_all_cuts",
    "cp_lower",
    "cp_upper",
]

CONFIDENCE = 0.95


# ------------------------------------------------------------------------------------------ inputs


def check_scores(values, name: str, *, min_size: int = 1) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not an array of numbers ({exc})") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of per-sample scores, got shape {arr.shape}")
    if arr.size < min_size:
        raise ValueError(f"{name}: needs at least {min_size} score(s), got {arr.size}")
    if np.isnan(arr).any():
        raise ValueError(f"{name}: {int(np.isnan(arr).sum())} of {arr.size} scores are NaN")
    return arr


def check_confidence(confidence) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.5 <= confidence < 1:
        raise ValueError(f"confidence: {confidence!r} must be a number in [0.5, 1), e.g. 0.95")
    return float(confidence)


# ------------------------------------------------------------------------------------------ rates


@dataclass(frozen=True)
class RateInterval:
    """A rate k/n with its two-sided Clopper-Pearson interval at `confidence`."""

    rate: float
    lower: float
    upper: float
    k: int
    n: int
    confidence: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def cp_lower(k, n, alpha):
    """One-sided Clopper-Pearson lower bound: P(rate < bound) <= alpha. Vectorised over k (and alpha)."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(k > 0, beta.ppf(alpha, np.maximum(k, 1), n - k + 1), 0.0)


def cp_upper(k, n, alpha):
    """One-sided Clopper-Pearson upper bound: P(rate > bound) <= alpha. Vectorised over k (and alpha)."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(k < n, beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1)), 1.0)


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> RateInterval:
    """The rate k/n and its exact two-sided interval (scipy's beta quantiles; equal to
    ``scipy.stats.binomtest(k, n).proportion_ci(confidence, method="exact")``, vectorised elsewhere here).

    Conservative: it covers the true rate with probability >= `confidence` for every true rate and n."""
    confidence = check_confidence(confidence)
    if isinstance(k, bool) or isinstance(n, bool) or int(k) != k or int(n) != n or not 0 <= k <= n or n < 1:
        raise ValueError(f"clopper_pearson: need integers 0 <= k <= n, n >= 1; got k={k!r}, n={n!r}")
    k, n = int(k), int(n)
    alpha = (1 - confidence) / 2
    return RateInterval(k / n, float(cp_lower(k, n, alpha)), float(cp_upper(k, n, alpha)), k, n, confidence)


# ------------------------------------------------------------------------------------------ AUC


@dataclass(frozen=True)
class AUCInterval:
    """The AUC, its two-sided interval at `confidence` (each side at (1 - confidence) / 2, `method` says how),
    DeLong's standard error and the class sizes."""

    estimate: float
    lower: float
    upper: float
    std_error: float
    n_pos: int
    n_neg: int
    confidence: float
    method: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def auc(pos_scores, neg_scores) -> float:
    """ROC AUC = P(pos > neg) + P(pos = neg)/2 (Mann-Whitney with midranks; equals sklearn's roc_auc_score)."""
    return delong(pos_scores, neg_scores, variance=False)[0]


def placements(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each member's share of non-members ranked below it and each non-member's share of members ranked above it
    (ties half), by the midrank algorithm of Sun & Xu (2014), "Fast Implementation of DeLong's Algorithm for
    Comparing the Areas Under Correlated Receiver Operating Characteristic Curves", IEEE Signal Processing Letters
    21(11): O((m + n) log(m + n)) instead of m * n comparisons. With ranks in the pooled sample (Tz), within the
    members (Tx) and within the non-members (Ty): V10_i = (Tz_i - Tx_i) / n, V01_j = 1 - (Tz_j - Ty_j) / m. Both
    average to the AUC."""
    m, n = pos.size, neg.size
    tz = rankdata(np.concatenate([pos, neg]))  # midranks: ties count half
    return (tz[:m] - rankdata(pos)) / n, 1.0 - (tz[m:] - rankdata(neg)) / m


def delong(pos_scores, neg_scores, *, variance: bool = True) -> tuple[float, float]:
    """(AUC, DeLong's variance of it): Var = var(V10) / m + var(V01) / n (sample variances of the `placements`).

    Written here (scikit-learn has the AUC but no variance)."""
    pos = check_scores(pos_scores, "positives (members)", min_size=2 if variance else 1)
    neg = check_scores(neg_scores, "negatives (non-members)", min_size=2 if variance else 1)
    m, n = pos.size, neg.size
    if not variance:
        tz = rankdata(np.concatenate([pos, neg]))
        return float((tz[:m].sum() - m * (m + 1) / 2) / (m * n)), float("nan")
    v10, v01 = placements(pos, neg)
    return float(v10.mean()), float(v10.var(ddof=1) / m + v01.var(ddof=1) / n)


def auc_interval(pos_scores, neg_scores, confidence: float = CONFIDENCE) -> AUCInterval:
    """The AUC with its two-sided interval at `confidence` (audit.membership.auc_bounds: a score interval with the
    variance of the least favourable sample the data allow, each side at (1 - confidence) / 2 for AUCs up to 0.995
    and 20 to 10,000 samples a class; at perfect separation [k / (k + t^2), 1], k = min(m, n)) and DeLong's
    standard error. Needs 2 members and 2 non-members."""
    confidence = check_confidence(confidence)
    pos = check_scores(pos_scores, "positives (members)", min_size=2)
    neg = check_scores(neg_scores, "negatives (non-members)", min_size=2)
    v10, v01 = placements(pos, neg)
    pos_var, neg_var = v10.var(ddof=1), v01.var(ddof=1)
    area = float(v10.mean())
    lower, upper = auc_bounds(area, pos_var, neg_var, pos.size, neg.size, confidence)
    se = math.sqrt(max(pos_var / pos.size + neg_var / neg.size, 0.0))
    return AUCInterval(area, float(lower), float(upper), se, pos.size, neg.size, confidence, AUC_METHOD)


# ------------------------------------------------------------------------------------------ TPR at an FPR


@dataclass(frozen=True)
class RatesAtThreshold:
    """The decision "member iff score > threshold" on members (TPR) and non-members (FPR), each with its
    Clopper-Pearson interval and counts. `target_fpr` and `population_fpr` are set when the threshold came from a
    population (`tpr_at_population_fpr`): the tolerance asked for and the share of the population flagged."""

    threshold: float
    tpr: RateInterval
    fpr: RateInterval
    target_fpr: float | None = None
    population_fpr: float | None = None
    n_population: int | None = None

    @property
    def resolvable(self) -> bool | None:
        """Whether the population has at least 1/t samples (audit.config.resolution): below that the threshold
        flags none of it and "TPR at FPR t" is the TPR at population FPR 0, whatever t. None when the threshold did
        not come from a population."""
        if self.target_fpr is None or self.n_population is None:
            return None
        return resolvable(self.target_fpr, self.n_population)

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        out["tpr"], out["fpr"] = self.tpr.to_dict(), self.fpr.to_dict()
        out["resolvable"] = self.resolvable
        return out


def population_threshold(population_scores, fpr: float) -> float:
    """The threshold t such that "score > t" flags at most floor(fpr * n) of the n population scores, and as many
    as the ties allow: the (k+1)-th largest population score, k = floor(fpr * n) (-inf if k >= n).

    The population's FPR at t is <= fpr by construction; the non-members' FPR at t is a random quantity around it,
    which `rates_at_threshold` measures with its own interval."""
    population = check_scores(population_scores, "population")
    if isinstance(fpr, bool) or not isinstance(fpr, (int, float)) or not 0 <= fpr <= 1:
        raise ValueError(f"fpr: {fpr!r} must be a number in [0, 1]")
    k = largest_count(population.size, fpr)  # the population attack's count, exact for 0.01 * 300
    if k >= population.size:
        return float("-inf")
    return float(np.sort(population)[::-1][k])


def rates_at_threshold(pos_scores, neg_scores, threshold: float, confidence: float = CONFIDENCE) -> RatesAtThreshold:
    """TPR and FPR of "member iff score > threshold", with Clopper-Pearson intervals and the counts.

    The TPR interval covers the true TPR of this fixed threshold (the share of the members' distribution above it)
    with probability >= `confidence`, provided the threshold was chosen without looking at these members (e.g. on a
    separate population). It does not cover "the TPR at FPR exactly t": the threshold's true FPR differs from the
    tolerance it was set for; read it, with its interval, in `fpr`."""
    confidence = check_confidence(confidence)
    pos = check_scores(pos_scores, "positives (members)")
    neg = check_scores(neg_scores, "negatives (non-members)")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.floating)) or math.isnan(threshold):
        raise ValueError(f"threshold: {threshold!r} is not a number")
    tp, fp = int((pos > threshold).sum()), int((neg > threshold).sum())
    return RatesAtThreshold(float(threshold), clopper_pearson(tp, pos.size, confidence),
                            clopper_pearson(fp, neg.size, confidence))


def tpr_at_population_fpr(pos_scores, neg_scores, population_scores, fpr: float,
                          confidence: float = CONFIDENCE) -> RatesAtThreshold:
    """The threshold from the population (`population_threshold`), then the members' TPR and non-members' FPR at
    it with their intervals (`rates_at_threshold`): the population attack's "TPR at FPR t" with honest error bars."""
    population = check_scores(population_scores, "population")
    threshold = population_threshold(population, fpr)
    rates = rates_at_threshold(pos_scores, neg_scores, threshold, confidence)
    flagged = int((population > threshold).sum())
    return RatesAtThreshold(rates.threshold, rates.tpr, rates.fpr, float(fpr), flagged / population.size,
                            int(population.size))


# ------------------------------------------------------------------------------------------ every threshold, advantage


def counts_at_all_cuts(pos: np.ndarray, neg: np.ndarray, thresholds: np.ndarray | None):
    """Thresholds t and tp(t) = #{pos >= t}, fp(t) = #{neg >= t}; by default every distinct pooled score and +inf
    (every way "score >= t" can split the pooled sample)."""
    if thresholds is None:
        thresholds = np.concatenate([np.unique(np.concatenate([pos, neg])), [np.inf]])
    pos_sorted, neg_sorted = np.sort(pos), np.sort(neg)
    tp = pos.size - np.searchsorted(pos_sorted, thresholds, side="left")
    fp = neg.size - np.searchsorted(neg_sorted, thresholds, side="left")
    return thresholds, tp, fp


@dataclass(frozen=True)
class Advantage:
    """max over thresholds t of |TPR(t) - FPR(t)| (rule "member iff score >= t"; the reverse rule gives the
    negative), where it is reached, and a two-sided interval at `confidence` for the true advantage of the score
    distributions (Dvoretzky-Kiefer-Wolfowitz with Massart's constant: simultaneous over all thresholds, so valid
    for the maximum; conservative)."""

    value: float
    lower: float
    upper: float
    threshold: float
    tpr: float
    fpr: float
    n_pos: int
    n_neg: int
    confidence: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def attacker_advantage(pos_scores, neg_scores, confidence: float = CONFIDENCE) -> Advantage:
    """The attacker's advantage (TF Privacy's ``attacker_advantage``; the two-sample Kolmogorov-Smirnov statistic)
    with its interval: P(sup_t |empirical CDF - CDF| > e) <= 2 exp(-2 n e^2) for each class, alpha/2 each."""
    confidence = check_confidence(confidence)
    pos = check_scores(pos_scores, "positives (members)")
    neg = check_scores(neg_scores, "negatives (non-members)")
    cuts, tp, fp = counts_at_all_cuts(pos, neg, None)
    gap = tp / pos.size - fp / neg.size
    i = int(np.argmax(np.abs(gap)))
    value = float(abs(gap[i]))
    alpha = 1 - confidence
    half = math.sqrt(math.log(4 / alpha) / (2 * pos.size)) + math.sqrt(math.log(4 / alpha) / (2 * neg.size))
    return Advantage(value, max(0.0, value - half), min(1.0, value + half), float(cuts[i]), float(tp[i] / pos.size),
                     float(fp[i] / neg.size), pos.size, neg.size, confidence)


