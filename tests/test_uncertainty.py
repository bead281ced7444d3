"""audit.uncertainty: intervals checked against scipy / scikit-learn and direct formulas, their coverage in
simulation (and exactly, for Clopper-Pearson; each side near the boundaries: tests/test_interval_coverage.py), and
the empirical epsilon lower bound against mechanisms whose privacy is known analytically: identical distributions (no
leakage), Gaussian DP (eps(delta) in closed form) and the Laplace mechanism (pure eps-DP)."""

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import binom, binomtest, ks_2samp, norm
from sklearn.metrics import roc_auc_score

from audit.membership.auc_bounds import auc_bounds
from audit.membership.epsilon_bound import epsilon_lower_bound
from audit.membership.uncertainty import (
    attacker_advantage,
    auc,
    auc_interval,
    clopper_pearson,
    delong,
    placements,
    population_threshold,
    rates_at_threshold,
    tpr_at_population_fpr,
)

DRAWS = 1000


# ------------------------------------------------------------------------------------------ Clopper-Pearson


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_clopper_pearson_is_scipys_exact_interval(confidence):
    for k, n in [(0, 1), (1, 1), (0, 90), (1, 90), (3, 90), (90, 90), (7, 404), (250, 1000)]:
        got = clopper_pearson(k, n, confidence)
        want = binomtest(k, n).proportion_ci(confidence, method="exact")
        assert (got.k, got.n, got.rate) == (k, n, k / n)
        # scipy's beta quantiles (a few float64 spacings) against binomtest's brentq on the same bounds, which stops
        # within its xtol = 2e-12 (plus 4 eps of the root) of them: twice that
        np.testing.assert_allclose([got.lower, got.upper], [want.low, want.high], rtol=0, atol=4e-12)
    # The notes' example: 1 of 90 members has the 95% interval [0.0003, 0.060].
    r = clopper_pearson(1, 90)
    assert round(r.lower, 4) == 0.0003 and round(r.upper, 3) == 0.060


@pytest.mark.parametrize("n", [7, 90, 404])
def test_clopper_pearson_covers_at_least_its_nominal_rate(n):
    """Conservative: the exact coverage (sum of the binomial pmf over the k whose interval holds p) is >= 95% at
    every true rate; a 1,000-draw simulation agrees within its own noise."""
    ks = np.arange(n + 1)
    bounds = np.array([[clopper_pearson(int(k), n).lower, clopper_pearson(int(k), n).upper] for k in ks])
    exact = [binom.pmf(ks, n, p)[(bounds[:, 0] <= p) & (p <= bounds[:, 1])].sum()
             for p in np.linspace(0.002, 0.998, 250)]
    assert min(exact) >= 0.95
    assert min(exact) < 0.97  # not trivially wide: somewhere it is close to nominal
    rng = np.random.default_rng(n)
    p = 0.05
    k = rng.binomial(n, p, DRAWS)
    simulated = np.mean((bounds[k, 0] <= p) & (p <= bounds[k, 1]))
    assert 0.93 <= simulated <= 1.0


def test_clopper_pearson_rejects_bad_counts():
    for k, n in [(5, 4), (-1, 3), (1, 0), (1.5, 3), (True, 3)]:
        with pytest.raises(ValueError, match="clopper_pearson"):
            clopper_pearson(k, n)
    with pytest.raises(ValueError, match="confidence"):
        clopper_pearson(1, 3, confidence=95)


# ------------------------------------------------------------------------------------------ AUC


def direct_delong(pos, neg):
    """DeLong et al. (1988) with the m x n kernel psi(x, y) = 1 if x > y, 1/2 if equal."""
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    return psi.mean(), v10.var(ddof=1) / pos.size + v01.var(ddof=1) / neg.size


def test_auc_and_delong_equal_sklearn_and_the_direct_formula_with_ties():
    rng = np.random.default_rng(0)
    for m, n in [(2, 2), (13, 29), (200, 57)]:
        pos = np.round(rng.normal(0.8, 1, m), 1)  # rounded: many ties, within and across classes
        neg = np.round(rng.normal(0, 1, n), 1)
        area, var = delong(pos, neg)
        want_area, want_var = direct_delong(pos, neg)
        assert area == pytest.approx(roc_auc_score(np.r_[np.ones(m), np.zeros(n)], np.r_[pos, neg]), abs=1e-12)
        assert area == pytest.approx(want_area, abs=1e-12) and auc(pos, neg) == pytest.approx(area, abs=1e-12)
        assert var == pytest.approx(want_var, rel=1e-9, abs=1e-15)


def test_delong_variance_matches_the_sampling_variance():
    """Over independent draws, the AUC's variance is what DeLong estimates on average (it is the interval's
    standard error)."""
    rng = np.random.default_rng(1)
    mu = math.sqrt(2) * norm.ppf(0.75)  # AUC 0.75
    draws = [delong(rng.normal(mu, 1, 150), rng.normal(0, 1, 300)) for _ in range(400)]
    assert np.var([a for a, _ in draws]) == pytest.approx(np.mean([v for _, v in draws]), rel=0.2)
    pos, neg = rng.normal(mu, 1, 150), rng.normal(0, 1, 300)
    assert auc_interval(pos, neg).std_error ** 2 == pytest.approx(delong(pos, neg)[1], rel=1e-12)


@pytest.mark.slow
def test_auc_interval_covers_each_side_at_its_rate_a_little_wider_than_delongs():
    """1,000 draws of 100 members and 400 non-members, Gaussian scores with a true AUC of 0.75: each side misses at
    most 2.5% plus three standard errors (measured: 1.1% below, 1.9% above), and the interval is somewhat wider
    than DeLong's Wald interval (2 x 1.96 x 0.027; measured 1.14 x: with 100 members a share of them the sample
    missed could lower the AUC, and the least favourable such share widens the lower side most; the Wald interval
    misses below 3.9% of the time on these draws). tests/test_interval_coverage.py covers the grid up to AUC 0.995
    and 10,000 a class."""
    rng = np.random.default_rng(3)
    mu = math.sqrt(2) * norm.ppf(0.75)
    draws = [(rng.normal(mu, 1, 100), rng.normal(0, 1, 400)) for _ in range(DRAWS)]
    # Every draw's interval in one call of auc_bounds on its placements' statistics (auc_interval's own steps; a
    # call of auc_interval costs ~4 ms, nearly all of it auc_bounds on one draw), tied to auc_interval's answer
    # exactly on every 20th draw.
    stats = np.array([(v10.mean(), v10.var(ddof=1), v01.var(ddof=1))
                      for v10, v01 in (placements(p, n) for p, n in draws)])
    lower, upper = auc_bounds(stats[:, 0], stats[:, 1], stats[:, 2], np.full(DRAWS, 100), np.full(DRAWS, 400), 0.95)
    for i in range(0, DRAWS, 20):
        ci = auc_interval(*draws[i])
        assert (ci.estimate, ci.lower, ci.upper) == (stats[i, 0], lower[i], upper[i])
        assert (ci.n_pos, ci.n_neg, ci.method) == (100, 400, "lf-binomial")
    below, above = np.sum(0.75 < lower), np.sum(0.75 > upper)
    wald_widths = [2 * 1.959964 * math.sqrt(delong(pos, neg)[1]) for pos, neg in draws]
    allowed = 0.025 + 3 * math.sqrt(0.025 * 0.975 / DRAWS)
    assert below / DRAWS <= allowed and above / DRAWS <= allowed
    assert 1.0 <= np.mean(upper - lower) / np.mean(wald_widths) < 1.25


def test_auc_interval_rejects_bad_input():
    with pytest.raises(ValueError, match="negatives .* at least 2"):
        auc_interval([0.1, 0.2], [0.3])
    with pytest.raises(ValueError, match="positives .* NaN"):
        auc_interval([0.1, np.nan], [0.3, 0.4])
    with pytest.raises(ValueError, match="confidence"):
        auc_interval([0.1, 0.2], [0.3, 0.4], confidence=95)


# ------------------------------------------------------------------------------------------ TPR at a population FPR


def test_population_threshold_flags_at_most_the_tolerance_even_with_ties():
    population = np.array([5, 4, 4, 4, 3, 2, 1, 1, 0, 0], dtype=float)
    assert population_threshold(population, 0.1) == 4.0  # flags the 5 only: the three 4s cannot be split
    assert population_threshold(population, 0.4) == 3.0  # flags 5, 4, 4, 4
    assert population_threshold(population, 0.0) == 5.0  # flags nothing
    assert population_threshold(population, 1.0) == -math.inf
    rng = np.random.default_rng(4)
    for n in (7, 100, 999):
        pop = np.round(rng.normal(size=n), 1)
        for t in (0.001, 0.01, 0.05, 0.3):
            flagged = (pop > population_threshold(pop, t)).sum()
            assert flagged <= math.floor(t * n + 1e-9)
    pop = np.arange(300, dtype=float)  # 0.01 * 300 rounds to 3.0000000000000004: still 3 flagged
    assert (pop > population_threshold(pop, 0.01)).sum() == 3


@pytest.mark.slow
def test_tpr_interval_covers_its_thresholds_tpr_but_not_the_tpr_at_exactly_the_tolerance():
    """The threshold comes from 200 population samples at FPR 0.05. The TPR interval (100 members) covers the true
    TPR of the threshold it was given at >= 95% (Clopper-Pearson given the threshold); it does not cover "the TPR at
    FPR exactly 0.05" at that rate, because the threshold's own FPR is off 0.05 by the population's sampling error
    (measured: 95.6% and 82.9%)."""
    rng = np.random.default_rng(5)
    mu, t = 1.0, 0.05
    tpr_exact = norm.sf(norm.isf(t) - mu)
    own = exact = 0
    for _ in range(DRAWS):
        r = tpr_at_population_fpr(rng.normal(mu, 1, 100), rng.normal(0, 1, 400), rng.normal(0, 1, 200), t)
        own += r.tpr.lower <= norm.sf(r.threshold - mu) <= r.tpr.upper
        exact += r.tpr.lower <= tpr_exact <= r.tpr.upper
        assert r.population_fpr <= t and r.n_population == 200 and r.target_fpr == t
    assert own / DRAWS >= 0.94
    assert exact / DRAWS < 0.9


def test_rates_at_threshold_count_strictly_above():
    r = rates_at_threshold([3, 2, 2, 1], [2, 1, 0, 0, 0], 2.0, confidence=0.9)
    assert (r.tpr.k, r.tpr.n, r.fpr.k, r.fpr.n) == (1, 4, 0, 5)
    assert r.tpr.to_dict() == clopper_pearson(1, 4, 0.9).to_dict() and r.fpr.upper > 0
    with pytest.raises(ValueError, match="threshold"):
        rates_at_threshold([1.0], [0.0], float("nan"))
    with pytest.raises(ValueError, match="fpr"):
        population_threshold([1.0, 2.0], 1.5)


# ------------------------------------------------------------------------------------------ advantage


def test_advantage_is_the_ks_statistic_and_its_interval_covers_the_total_variation():
    rng = np.random.default_rng(6)
    pos, neg = np.round(rng.normal(0.7, 1, 300), 1), np.round(rng.normal(0, 1, 500), 1)
    adv = attacker_advantage(pos, neg)
    assert adv.value == pytest.approx(ks_2samp(pos, neg).statistic, abs=1e-12)
    assert adv.value == pytest.approx(abs(np.mean(pos >= adv.threshold) - np.mean(neg >= adv.threshold)))
    mu = 1.0
    true = 2 * norm.cdf(mu / 2) - 1  # total variation between N(1, 1) and N(0, 1): the best threshold's advantage
    hits = sum(a.lower <= true <= a.upper for a in (attacker_advantage(rng.normal(mu, 1, 200), rng.normal(0, 1, 300))
                                                   for _ in range(DRAWS)))
    assert hits / DRAWS >= 0.95  # DKW is simultaneous over thresholds, hence conservative (measured 100%)


# ------------------------------------------------------------------------------------------ epsilon lower bound


def gdp_epsilon(mu: float, delta: float) -> float:
    """eps(delta) of mu-GDP (Dong, Roth, Su): delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    return brentq(lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - delta, 0, 100)


def direct_epsilon(pos, neg, delta, confidence):
    """Every threshold, rule and pair by hand, with scipy's one-sided exact binomial bounds."""
    thresholds = sorted(set(pos) | set(neg)) + [math.inf]
    m = len(pos) + len(neg) + 1
    alpha = (1 - confidence) / (4 * m)

    def lower(k, n):
        return binomtest(k, n, alternative="greater").proportion_ci(1 - alpha, method="exact").low

    def upper(k, n):
        return binomtest(k, n, alternative="less").proportion_ci(1 - alpha, method="exact").high

    best = 0.0
    for t in thresholds:
        tp, fp = sum(p >= t for p in pos), sum(q >= t for q in neg)
        fn, tn = len(pos) - tp, len(neg) - fp
        for num, den in [(lower(tp, len(pos)), upper(fp, len(neg))),   # TPR / FPR
                         (lower(tn, len(neg)), upper(fn, len(pos))),   # TNR / FNR
                         (lower(fn, len(pos)), upper(tn, len(neg))),   # reverse rule: its TPR / FPR
                         (lower(fp, len(neg)), upper(tp, len(pos)))]:  # reverse rule: its TNR / FNR
            if num > delta:
                best = max(best, math.log((num - delta) / den))
    return best


@pytest.mark.parametrize("delta", [0.0, 0.02])
def test_epsilon_bound_equals_a_direct_computation(delta):
    rng = np.random.default_rng(7)
    pos = list(np.round(rng.normal(2.5, 1, 25), 1))
    neg = list(np.round(rng.normal(0, 1, 30), 1))
    got = epsilon_lower_bound(pos, neg, delta=delta, confidence=0.9)
    assert got.epsilon > 0.5
    assert got.epsilon == pytest.approx(direct_epsilon(pos, neg, delta, 0.9), rel=1e-9)
    # It names what it rests on: the threshold, the counts there, the bounds and the Bonferroni level.
    assert (got.tp, got.fp) == (sum(p >= got.threshold for p in pos), sum(q >= got.threshold for q in neg))
    assert got.tp + got.fn == 25 and got.fp + got.tn == 30 and got.n_thresholds == 56
    assert got.bound_alpha == pytest.approx(0.1 / (4 * 56))
    assert got.epsilon == pytest.approx(math.log((got.numerator_lower - delta) / got.denominator_upper))
    assert (got.rule, got.pair, got.delta, got.confidence) == ("member if score >= t", "TPR/FPR", delta, 0.9)
    # Reversed scores: the same evidence, found by the reverse rule.
    flipped = epsilon_lower_bound(-np.array(pos), -np.array(neg), delta=delta, confidence=0.9)
    assert flipped.rule == "member if score < t" and flipped.epsilon == pytest.approx(got.epsilon, rel=1e-9)
    assert (flipped.tp, flipped.fp, flipped.fn, flipped.tn) == (got.tp, got.fp, got.fn, got.tn)


@pytest.mark.slow
def test_epsilon_bound_is_zero_for_identical_distributions():
    rng = np.random.default_rng(8)
    bounds = [epsilon_lower_bound(rng.normal(size=1000), rng.normal(size=1000)).epsilon for _ in range(200)]
    assert max(bounds) <= 0.1
    assert np.mean(np.array(bounds) == 0) >= 0.95  # measured: all 200 are exactly 0
    none = epsilon_lower_bound(np.zeros(50), np.zeros(50))
    assert none.epsilon == 0 and none.threshold is None and none.tp is None


def test_epsilon_bound_grows_with_the_separation():
    rng = np.random.default_rng(9)
    base_pos, neg = rng.normal(size=2000), rng.normal(size=2000)
    bounds = [epsilon_lower_bound(base_pos + shift, neg).epsilon for shift in (0, 0.25, 0.5, 1, 1.5, 2, 3, 4)]
    assert bounds[0] == 0
    assert all(b2 > b1 for b1, b2 in zip(bounds[1:], bounds[2:]))  # strictly increasing once above 0


@pytest.mark.slow
def test_epsilon_bound_is_sound_and_gains_power_on_gaussian_dp():
    """Members N(1, 1), non-members N(0, 1) are exactly 1-GDP: eps(delta = 0.05) = 1.569. Over 100 seeds the bound
    never exceeds it (soundness), and it approaches it as the samples grow (power; measured means 0.725 at 1,000
    per class, 1.190 at 10,000, 1.421 at 100,000)."""
    mu, delta = 1.0, 0.05
    truth = gdp_epsilon(mu, delta)
    assert truth == pytest.approx(1.569, abs=1e-3)
    rng = np.random.default_rng(10)
    small = [epsilon_lower_bound(rng.normal(mu, 1, 1000), rng.normal(0, 1, 1000), delta=delta).epsilon
             for _ in range(100)]
    large = [epsilon_lower_bound(rng.normal(mu, 1, 10000), rng.normal(0, 1, 10000), delta=delta).epsilon
             for _ in range(20)]
    assert max(small) < truth and max(large) < truth
    assert np.mean(large) > np.mean(small) + 0.3
    assert np.mean(large) > 0.7 * truth
    huge = epsilon_lower_bound(rng.normal(mu, 1, 100000), rng.normal(0, 1, 100000), delta=delta).epsilon
    assert 0.85 * truth < huge < truth
    # Soundness far in the tail too: mu = 2 at delta = 1e-5 (eps 9.997).
    tail = gdp_epsilon(2.0, 1e-5)
    assert max(epsilon_lower_bound(rng.normal(2, 1, 2000), rng.normal(0, 1, 2000), delta=1e-5).epsilon
               for _ in range(30)) < tail


@pytest.mark.slow
def test_pure_dp_bound_is_sound_and_tight_on_the_laplace_mechanism():
    """Members Laplace(eps, 1), non-members Laplace(0, 1): the privacy loss is at most eps, so the mechanism is
    eps-DP with delta = 0, and any threshold above eps attains TPR / FPR = e^eps."""
    rng = np.random.default_rng(11)
    for eps in (0.5, 1.0, 2.0):
        bounds = [epsilon_lower_bound(rng.laplace(eps, 1, 3000), rng.laplace(0, 1, 3000)).epsilon
                  for _ in range(40)]
        assert max(bounds) < eps
        assert np.mean(bounds) > 0.6 * eps


def test_correcting_for_fewer_thresholds_or_a_smaller_delta_gives_a_larger_bound():
    rng = np.random.default_rng(12)
    pos, neg = rng.normal(1.5, 1, 500), rng.normal(0, 1, 500)
    every = epsilon_lower_bound(pos, neg)
    one = epsilon_lower_bound(pos, neg, thresholds=[every.threshold])
    assert one.n_thresholds == 1 and one.epsilon > every.epsilon and (one.tp, one.fp) == (every.tp, every.fp)
    assert epsilon_lower_bound(pos, neg, delta=0.01).epsilon < every.epsilon
    forward = epsilon_lower_bound(pos, neg, reverse=False)  # half the bounds per threshold: a looser correction
    assert forward.bound_alpha == pytest.approx(2 * every.bound_alpha) and forward.epsilon > every.epsilon


def test_epsilon_bound_rejects_bad_settings():
    with pytest.raises(ValueError, match="delta"):
        epsilon_lower_bound([1.0], [0.0], delta=1.0)
    with pytest.raises(ValueError, match="confidence"):
        epsilon_lower_bound([1.0], [0.0], confidence=1.0)
    with pytest.raises(ValueError, match="negatives .* 1-D"):
        epsilon_lower_bound([1.0], [[0.0]])
