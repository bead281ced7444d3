"""Uncertainty of membership-inference figures, and an empirical lower bound on the privacy parameter epsilon.

Everything here works on per-sample attack scores with one convention: a higher score means "more likely a member"
(members are the positives). Negate a loss or a gradient norm before passing it.

- `clopper_pearson(k, n)`: the exact (Clopper-Pearson) interval of a rate k/n, e.g. a TPR or an FPR.
- `auc_interval(pos, neg)`: the ROC AUC with an interval that holds on each side near AUC 1 and at 20 samples a class
  (audit.membership.auc_bounds), DeLong's standard error, and the counts. `delong(pos, neg)`: the AUC and DeLong's
  variance.
- `population_threshold(population, fpr)` and `rates_at_threshold(pos, neg, threshold)`: the TPR (and FPR) of the
  decision "score > threshold", the threshold set on a separate population so that at most a share `fpr` of it is
  flagged, each with its Clopper-Pearson interval and counts. `tpr_at_population_fpr` does both.
- `epsilon_lower_bound(pos, neg, delta=...)`: the largest epsilon that the attack's results prove with confidence
  `confidence` (TensorFlow Privacy's privacy tests' definition, Clopper-Pearson bounds, Bonferroni over thresholds).
- `attacker_advantage(pos, neg)`: max over thresholds of |TPR - FPR|, with a simultaneous (DKW) interval.
- `attack_uncertainty(pos, neg, population, thresholds)`: all of the above for one attack, as the audit reports it.

What the intervals cover: the randomness of the scored samples given the model, i.e. "if we had drawn other members
and non-members from the same distributions, scored by the same model". They say nothing about other training runs.

One module though above 400 lines: the intervals, the epsilon bound and the advantage share one score convention,
the Clopper-Pearson bounds and the sweep over thresholds, and read as one statistical toolkit.

    from audit.membership.uncertainty import auc_interval, tpr_at_population_fpr, epsilon_lower_bound
    auc = auc_interval(member_scores, nonmember_scores)                 # .estimate .lower .upper .n_pos .n_neg
    at = tpr_at_population_fpr(member_scores, nonmember_scores, population_scores, 0.01)
    eps = epsilon_lower_bound(member_scores, nonmember_scores, delta=1e-5)  # .epsilon .threshold .tp .fp ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import beta, rankdata

from audit.config.vocabulary import tolerance_name
from audit.membership.auc_bounds import METHOD as AUC_METHOD, auc_bounds
from audit.membership.resolution import largest_count, resolvable

__all__ = [
    "CONFIDENCE",
    "RateInterval",
    "AUCInterval",
    "RatesAtThreshold",
    "EpsilonLowerBound",
    "Advantage",
    "clopper_pearson",
    "auc",
    "delong",
    "placements",
    "auc_interval",
    "population_threshold",
    "rates_at_threshold",
    "tpr_at_population_fpr",
    "epsilon_lower_bound",
    "attacker_advantage",
    "AttackUncertainty",
    "attack_uncertainty",
]

CONFIDENCE = 0.95


# ------------------------------------------------------------------------------------------ inputs


def _scores(values, name: str, *, min_size: int = 1) -> np.ndarray:
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


def _confidence(confidence) -> float:
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


def _cp_lower(k, n, alpha):
    """One-sided Clopper-Pearson lower bound: P(rate < bound) <= alpha. Vectorised over k (and alpha)."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(k > 0, beta.ppf(alpha, np.maximum(k, 1), n - k + 1), 0.0)


def _cp_upper(k, n, alpha):
    """One-sided Clopper-Pearson upper bound: P(rate > bound) <= alpha. Vectorised over k (and alpha)."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(k < n, beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1)), 1.0)


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> RateInterval:
    """The rate k/n and its exact two-sided interval (scipy's beta quantiles; equal to
    ``scipy.stats.binomtest(k, n).proportion_ci(confidence, method="exact")``, vectorised elsewhere here).

    Conservative: it covers the true rate with probability >= `confidence` for every true rate and n."""
    confidence = _confidence(confidence)
    if isinstance(k, bool) or isinstance(n, bool) or int(k) != k or int(n) != n or not 0 <= k <= n or n < 1:
        raise ValueError(f"clopper_pearson: need integers 0 <= k <= n, n >= 1; got k={k!r}, n={n!r}")
    k, n = int(k), int(n)
    alpha = (1 - confidence) / 2
    return RateInterval(k / n, float(_cp_lower(k, n, alpha)), float(_cp_upper(k, n, alpha)), k, n, confidence)


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
    pos = _scores(pos_scores, "positives (members)", min_size=2 if variance else 1)
    neg = _scores(neg_scores, "negatives (non-members)", min_size=2 if variance else 1)
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
    confidence = _confidence(confidence)
    pos = _scores(pos_scores, "positives (members)", min_size=2)
    neg = _scores(neg_scores, "negatives (non-members)", min_size=2)
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
        """Whether the population has at least 1/t samples (audit.membership.resolution): below that the threshold
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
    population = _scores(population_scores, "population")
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
    confidence = _confidence(confidence)
    pos = _scores(pos_scores, "positives (members)")
    neg = _scores(neg_scores, "negatives (non-members)")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.floating)) or math.isnan(threshold):
        raise ValueError(f"threshold: {threshold!r} is not a number")
    tp, fp = int((pos > threshold).sum()), int((neg > threshold).sum())
    return RatesAtThreshold(float(threshold), clopper_pearson(tp, pos.size, confidence),
                            clopper_pearson(fp, neg.size, confidence))


def tpr_at_population_fpr(pos_scores, neg_scores, population_scores, fpr: float,
                          confidence: float = CONFIDENCE) -> RatesAtThreshold:
    """The threshold from the population (`population_threshold`), then the members' TPR and non-members' FPR at
    it with their intervals (`rates_at_threshold`): the population attack's "TPR at FPR t" with honest error bars."""
    population = _scores(population_scores, "population")
    threshold = population_threshold(population, fpr)
    rates = rates_at_threshold(pos_scores, neg_scores, threshold, confidence)
    flagged = int((population > threshold).sum())
    return RatesAtThreshold(rates.threshold, rates.tpr, rates.fpr, float(fpr), flagged / population.size,
                            int(population.size))


# ------------------------------------------------------------------------------------------ epsilon lower bound


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


def _counts_at_all_cuts(pos: np.ndarray, neg: np.ndarray, thresholds: np.ndarray | None):
    """Thresholds t and tp(t) = #{pos >= t}, fp(t) = #{neg >= t}; by default every distinct pooled score and +inf
    (every way "score >= t" can split the pooled sample)."""
    if thresholds is None:
        thresholds = np.concatenate([np.unique(np.concatenate([pos, neg])), [np.inf]])
    pos_sorted, neg_sorted = np.sort(pos), np.sort(neg)
    tp = pos.size - np.searchsorted(pos_sorted, thresholds, side="left")
    fp = neg.size - np.searchsorted(neg_sorted, thresholds, side="left")
    return thresholds, tp, fp


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
    confidence = _confidence(confidence)
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta < 1:
        raise ValueError(f"delta: {delta!r} must be a number in [0, 1)")
    if not isinstance(reverse, bool):
        raise ValueError(f"reverse: expected a bool, got {reverse!r}")
    pos = _scores(pos_scores, "positives (members)")
    neg = _scores(neg_scores, "negatives (non-members)")
    if thresholds is not None:
        thresholds = _scores(thresholds, "thresholds")
        n_thresholds = thresholds.size
    else:
        n_thresholds = pos.size + neg.size + 1
    cuts, tp, fp = _counts_at_all_cuts(pos, neg, thresholds)
    n_pos, n_neg = pos.size, neg.size
    fn, tn = n_pos - tp, n_neg - fp
    bounds_per_threshold = 4 if reverse else 2
    alpha = (1 - confidence) / (bounds_per_threshold * n_thresholds)

    tpr_lo, fpr_hi = _per_count(_cp_lower, tp, n_pos, alpha), _per_count(_cp_upper, fp, n_neg, alpha)
    candidates = [  # (rule, pair, numerator lower bound, denominator upper bound, ...)
        ("member if score >= t", "TPR/FPR", tpr_lo, fpr_hi),
        ("member if score >= t", "TNR/FNR", 1 - fpr_hi, 1 - tpr_lo),
    ]
    if reverse:  # member iff score < t: its TPR is our FNR, its FPR our TNR
        tpr_hi, fpr_lo = _per_count(_cp_upper, tp, n_pos, alpha), _per_count(_cp_lower, fp, n_neg, alpha)
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


# ------------------------------------------------------------------------------------------ advantage


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
    confidence = _confidence(confidence)
    pos = _scores(pos_scores, "positives (members)")
    neg = _scores(neg_scores, "negatives (non-members)")
    cuts, tp, fp = _counts_at_all_cuts(pos, neg, None)
    gap = tp / pos.size - fp / neg.size
    i = int(np.argmax(np.abs(gap)))
    value = float(abs(gap[i]))
    alpha = 1 - confidence
    half = math.sqrt(math.log(4 / alpha) / (2 * pos.size)) + math.sqrt(math.log(4 / alpha) / (2 * neg.size))
    return Advantage(value, max(0.0, value - half), min(1.0, value + half), float(cuts[i]), float(tp[i] / pos.size),
                     float(fp[i] / neg.size), pos.size, neg.size, confidence)


# ------------------------------------------------------------------------------------------ one attack, in full


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
    confidence = _confidence(confidence)
    pos = _scores(pos_scores, "positives (members)")
    neg = _scores(neg_scores, "negatives (non-members)")
    population = _scores(population_scores, "population")
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
