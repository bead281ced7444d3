"""The tight one-run bounds and the white-box estimate of the DP check (audit.canary.tradeoff, claims, fdp,
independent, whitebox): against closed forms, a separate 50-digit transcription of the f-DP recursion, Steinke et
al.'s theorem, and by simulation of mechanisms whose privacy is known exactly (the Gaussian mechanism, DP-SGD's
canary view): sound (a true claim rejected at most alpha of the time) and tight (the ratios of the issue's goals)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy.stats import binomtest, norm

from audit.canary.claims import CEILING_LOWEST, CEILING_TOLERANCE, dp_sgd_family, gdp_family, least_rejected_noise
from audit.canary.dp import dp_sgd_tests
from audit.canary.fdp import fdp_bound, one_sided_counts, rejects
from audit.canary.gradients import DEFAULT_COUNT, ROW_BUDGET_BYTES, resolve_count
from audit.canary.independent import FPR_TARGETS, ThresholdCounts, independent_bound, threshold_counts
from audit.canary.one_run import CanaryCounts, Guess, GuessCount, counts_from_scores, epsilon_lower_bound
from audit.canary.tradeoff import GaussianDP, gdp_epsilon, subsampled_gaussian
from audit.canary.whitebox import StepStatistics, estimate

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the")

ALPHA, DELTA = 0.05, 1e-5


class PureDP:
    """The (epsilon, delta) trade-off: the least false-positive rate reaching true-positive rate x."""

    def __init__(self, epsilon: float, delta: float = 0.0):
        self.e, self.delta = math.exp(epsilon), delta

    def fpr_for(self, x: float) -> float:
        return max(0.0, (x - self.delta) / self.e, 1 - self.delta - self.e * (1 - x))


# ------------------------------------------------------------------------------------------ trade-off curves


@pytest.mark.parametrize("sigma, q", [(1.0, 0.1), (0.5, 0.3), (3.0, 0.01)])
def test_one_step_curve_is_above_the_exact_one_and_within_the_grid_bias(sigma, q):
    """One Poisson-subsampled Gaussian step has a closed-form curve (the likelihood ratio is monotone in the
    observation y): FPR = P(N(0,1) > y), TPR = (1 - q) P(N(0,1) > y) + q P(N(1/sigma,1) > y). The computed curve is an
    upper bound on it, loose by at most the grid's rounding of the loss (<= 0.01 nats: TPR within e^0.01 x, plus the
    margins)."""
    curve = subsampled_gaussian(sigma, q, 1)
    for y in np.linspace(-3, 3 + 1 / sigma, 40):
        fpr, tpr = norm.sf(y), (1 - q) * norm.sf(y) + q * norm.sf(y - 1 / sigma)
        ceiling = curve.tpr(fpr)
        assert tpr <= ceiling <= tpr * math.exp(0.01) + 0.01 * fpr + curve.tpr_margin + 1e-12


@pytest.mark.slow
def test_curves_without_subsampling_and_in_the_limit_of_many_steps_are_gaussian_dp():
    assert subsampled_gaussian(2.0, 1.0, 9) == GaussianDP(1.5)  # 9 steps of sensitivity 1, noise 2: sqrt(9)/2-GDP
    # many steps at a small rate: the central limit (Dong, Roth and Su), mu = q sqrt(T (e^(1/sigma^2) - 1))
    curve = subsampled_gaussian(1.0, 0.01, 3000)
    mu = 0.01 * math.sqrt(3000 * math.expm1(1.0))
    for fpr in (0.3, 0.1, 0.01):
        assert norm.ppf(curve.tpr(fpr)) - norm.ppf(fpr) == pytest.approx(mu, rel=0.05)


def test_a_curve_thinned_for_the_cache_still_bounds_every_point_of_the_full_one():
    from audit.canary.tradeoff import _fewer_points

    fpr = np.concatenate([[0.0], np.geomspace(1e-9, 1.0, 50_000)])
    tpr = norm.cdf(norm.ppf(np.clip(fpr, 1e-300, 1.0)) + 1.3)  # a concave curve (1.3-GDP), densely sampled
    kept, lifted = _fewer_points(fpr, tpr)
    assert len(kept) < 25_000 and kept[0] == 0 and kept[-1] == len(fpr) - 1
    coarse = np.interp(fpr, fpr[kept], lifted)
    assert np.all(coarse >= tpr - 1e-15) and np.max(coarse - tpr) < 1e-4


@pytest.mark.parametrize("sigma, q, steps", [(1.0, 0.1, 30), (0.3, 0.2, 10), (4.0, 0.05, 60), (0.01, 0.16, 20)])
def test_a_coarse_curve_is_looser_than_the_fine_one_everywhere(sigma, q, steps):
    """The ceilings' coarse curves must only understate a ceiling: at every false-positive rate their ceiling of the
    true-positive rate is at least the fine curve's, and their inverse at most the fine one's."""
    fine, coarse = subsampled_gaussian(sigma, q, steps), subsampled_gaussian(sigma, q, steps, coarse=True)
    assert coarse.tpr_margin >= fine.tpr_margin and coarse.fpr_margin >= fine.fpr_margin
    for a in np.concatenate([[0.0], np.geomspace(1e-9, 1.0, 60)]):
        assert coarse.tpr(float(a)) >= fine.tpr(float(a))
    for t in np.concatenate([np.geomspace(1e-9, 1.0, 60), [0.5, 0.9, 0.999]]):
        assert coarse.fpr_for(float(t)) <= fine.fpr_for(float(t))


def _fine_ceilings(counts: CanaryCounts, thresholds: ThresholdCounts, family, claimed: float, alpha: float):
    """The two ceilings' noise on the fine curves: the searches of fdp_bound and independent_bound with the main
    search's curves."""
    entries = one_sided_counts(counts)
    level = alpha / len(entries)
    perfect = [GuessCount(c.guess, c.guess.r) for c in entries]
    fdp = least_rejected_noise(lambda s: any(rejects(family.curve(s), counts.m, c.guess.r, c.correct, level)
                                             for c in perfect), claimed, CEILING_TOLERANCE, CEILING_LOWEST)
    best = ThresholdCounts(thresholds.thresholds, thresholds.included, thresholds.excluded,
                           (thresholds.included,) * len(thresholds.thresholds), (0,) * len(thresholds.thresholds))
    independent = least_rejected_noise(lambda s: best.rejects(family.curve(s), alpha), claimed, CEILING_TOLERANCE,
                                       CEILING_LOWEST)
    return fdp, independent


def _ceilings_match(q, steps, sigma, m):
    """The bounds (their search helped by the coarse curves' rejections) are the fine curves' search's, exactly; the ceilings
    they report (coarse curves) against the fine curves' on the same counts: never above, and at most one step of the
    ceiling search's grid (its stated precision, CEILING_TOLERANCE in noise) below."""
    family = dp_sgd_family(q, steps)
    included = np.random.default_rng(m).random(m) < 0.5
    scores = np.random.default_rng([m, 1]).standard_normal(m) + 2.0 * included
    counts = counts_from_scores(scores, included)
    thresholds = threshold_counts(scores, included, (0.5, 1.0, 2.0))
    bounds = (fdp_bound(counts, family, delta=DELTA, alpha=ALPHA / 4, claimed_noise=sigma),
              independent_bound(thresholds, family, delta=DELTA, alpha=ALPHA / 4, claimed_noise=sigma))
    # the bounds themselves: the plain search on the fine curves, without the coarse curves' rejections, finds the
    # same noise
    entries = one_sided_counts(counts)
    level = ALPHA / 4 / len(entries)
    assert bounds[0].noise == least_rejected_noise(
        lambda s: any(rejects(family.curve(s), m, c.guess.r, c.correct, level) for c in entries), sigma)
    assert bounds[1].noise == least_rejected_noise(lambda s: thresholds.rejects(family.curve(s), ALPHA / 4), sigma)
    for bound, fine in zip(bounds, _fine_ceilings(counts, thresholds, family, sigma, ALPHA / 4)):
        assert bound.ceiling <= family.epsilon(fine, DELTA)
        # one grid step up, a hair further: the product rounds otherwise than the search's scale x exp(j ratio)
        assert bound.ceiling >= family.epsilon(None if fine is None else fine * (1 + CEILING_TOLERANCE) * (1 + 1e-12),
                                               DELTA)


@pytest.mark.parametrize("q, steps, sigma, m", [(0.16, 5, 0.01, 200), (0.3, 10, 3.0, 5000)])
def test_bounds_are_the_fine_searchs_and_ceilings_the_fine_curves_or_below(q, steps, sigma, m):
    _ceilings_match(q, steps, sigma, m)


@pytest.mark.slow
@pytest.mark.parametrize("q, steps, sigma, m", [(0.1, 30, 1.0, 1000), (1 / 7, 140, 1.4, 5764), (1 / 7, 140, 0.6, 10000),
                                                 (0.05, 60, 0.8, 1000), (0.02, 400, 1.0, 2000),
                                                 (0.16, 280, 0.01, 200)])
def test_bounds_and_ceilings_match_the_fine_curves_at_the_checks_sizes(q, steps, sigma, m):
    _ceilings_match(q, steps, sigma, m)


def test_the_curve_and_its_inverse_agree_and_grow_with_less_noise():
    curve = subsampled_gaussian(1.5, 1 / 7, 40)
    for fpr in (1e-4, 0.01, 0.2, 0.7):
        assert curve.fpr_for(curve.tpr(fpr)) <= fpr + 1e-9
    assert all(subsampled_gaussian(1.0, 1 / 7, 40).tpr(a) >= curve.tpr(a) for a in (1e-3, 0.05, 0.5))
    assert gdp_epsilon(1.0, 1e-5) == pytest.approx(4.3772, abs=1e-4)  # Dong, Roth and Su's conversion


# --------------------------------------------------------------------------------------- the f-DP recursion


def recursion_50_digits(mu, m: int, guesses: int, correct: int, alpha) -> bool:
    """The f-DP recursion as the paper states it, in 50-digit arithmetic, for mu-GDP, without the early stop."""
    with mpmath.workdps(50):
        mu, alpha = mpmath.mpf(mu), mpmath.mpf(alpha)

        def fpr_for(x):
            x = min(max(x, mpmath.mpf(0)), mpmath.mpf(1))
            if x in (0, 1):
                return x
            return mpmath.ncdf(mpmath.sqrt(2) * mpmath.erfinv(2 * x - 1) - mu)

        r, h = alpha * correct / m, alpha * (guesses - correct) / m
        for i in range(correct - 1, -1, -1):
            h_new = max(h, fpr_for(r))
            r = min(mpmath.mpf(1), r + mpmath.mpf(i) / (guesses - i) * (h_new - h))
            h = h_new
        return r + h > mpmath.mpf(guesses) / m


def largest_rejected_mu(decide, lo: float = 1e-3, hi: float = 20.0, tol: float = 1e-5) -> float:
    if decide(lo) is False:  # rejects(mu) is True for mu below the boundary
        return 0.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if decide(mid) else (lo, mid)
    return lo


@pytest.mark.slow
@pytest.mark.parametrize("m, guesses, correct", [(40, 20, 18), (200, 100, 80), (200, 40, 40), (1000, 120, 110)])
def test_recursion_is_the_50_digit_transcription(m, guesses, correct):
    """The boundary mu (the largest mu-GDP the counts reject) of the float recursion, found to 1e-6, is the 50-digit
    transcription's too: it rejects just below it and not just above (float rounding, 1e-16 a step over a few hundred
    steps, moves the boundary by far less than 1e-4)."""
    boundary = largest_rejected_mu(lambda mu: rejects(GaussianDP(mu), m, guesses, correct, ALPHA), tol=1e-6)
    assert boundary > 0
    assert recursion_50_digits(boundary - 1e-4, m, guesses, correct, ALPHA)
    assert not recursion_50_digits(boundary + 1e-4, m, guesses, correct, ALPHA)


@pytest.mark.parametrize("m, k", [(10, 10), (100, 100), (1000, 50), (1000, 1000)])
def test_recursion_with_the_pure_epsilon_curve_is_steinkes_theorem_when_every_guess_is_right(m, k):
    """With the (epsilon, 0) curve and every guess right, the f-DP test rejects exactly the epsilons Steinke et al.'s
    theorem rejects: P[all k right] = (e^eps / (1 + e^eps))^k. Equal to the two bisections' tolerance (1e-6)."""
    lo, hi = 0.0, 30.0
    while hi - lo > 1e-8:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rejects(PureDP(mid), m, k, k, ALPHA) else (lo, mid)
    assert lo == pytest.approx(epsilon_lower_bound(m, k, k, 0.0, ALPHA), abs=2e-6)


def test_recursion_never_rejects_chance_and_rejects_more_with_more_right_guesses():
    assert not rejects(GaussianDP(0.01), 1000, 100, 55, ALPHA)
    assert not rejects(GaussianDP(1.0), 1000, 0, 0, ALPHA)
    decisions = [rejects(GaussianDP(0.5), 1000, 100, c, ALPHA) for c in range(50, 101)]
    assert decisions == sorted(decisions) and decisions[-1] and not decisions[0]
    with pytest.raises(ValueError, match="correct <= guesses <= canaries"):
        rejects(GaussianDP(1.0), 10, 20, 5, ALPHA)


def _gaussian_canaries(mu: float, m: int, rng) -> tuple[np.ndarray, np.ndarray]:
    included = rng.random(m) < 0.5
    return rng.standard_normal(m) + mu * included, included


@pytest.mark.slow
@pytest.mark.parametrize("mu, m", [(0.1, 200), (1.0, 20), (1.0, 500), (4.0, 500)])
def test_fdp_bound_exceeds_the_gaussian_mechanisms_true_mu_at_most_alpha_of_the_time(mu, m):
    """m canaries, each seen through its own Gaussian mechanism (mu-GDP exactly), scored by the observation: the bound
    is above the truth exactly when the true curve is rejected (the family is nested), which may happen in at most
    alpha of the runs (binomial tolerance of 3 standard errors), weak to strong privacy, 20 to 500 canaries."""
    rng = np.random.default_rng(int(mu * 100) + m)
    runs, rejected = 400, 0
    for _ in range(runs):
        scores, included = _gaussian_canaries(mu, m, rng)
        counts = counts_from_scores(scores, included)
        entries = [c for c in counts.counts if c.guess.out_guesses == 0]
        rejected += any(rejects(GaussianDP(mu), m, c.guess.r, c.correct, ALPHA / len(entries)) for c in entries)
    assert rejected / runs <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / runs)


# ----------------------------------------------------------------------------------- independent canaries


def _cp_by_binomtest(k: int, n: int, level: float, side: str) -> float:
    ci = binomtest(k, n, alternative="greater" if side == "lower" else "less").proportion_ci(1 - level, "exact")
    return ci.low if side == "lower" else ci.high


def test_independent_bound_on_gaussian_dp_is_the_closed_form_of_its_best_threshold():
    """For mu-GDP, TPR <= Phi(Phi^-1(FPR) + mu): a threshold rejects every mu below Phi^-1(TPR_low) - Phi^-1(FPR_high),
    so the least rejected noise (1 / mu) is 1 / the largest of those (Clopper-Pearson from scipy's binomtest)."""
    rng = np.random.default_rng(3)
    scores, included = _gaussian_canaries(1.0, 4000, rng)
    thresholds = tuple(float(norm.isf(a)) for a in FPR_TARGETS)
    counts = threshold_counts(scores, included, thresholds)
    level = ALPHA / (2 * len(thresholds))
    best = max(norm.ppf(_cp_by_binomtest(tp, counts.included, level, "lower"))
               - norm.ppf(_cp_by_binomtest(fp, counts.excluded, level, "upper"))
               for tp, fp in zip(counts.true_positives, counts.false_positives))
    bound = independent_bound(counts, gdp_family(), delta=DELTA, alpha=ALPHA)
    assert bound.noise == pytest.approx(1 / best, rel=2.1e-3)  # the search's relative tolerance
    assert bound.epsilon == pytest.approx(gdp_epsilon(best, DELTA), rel=0.01)
    assert ThresholdCounts.from_dict(counts.to_dict()) == counts


@pytest.mark.slow
@pytest.mark.parametrize("mu, m", [(0.1, 1000), (1.0, 40), (1.0, 1000), (3.0, 1000)])
def test_independent_bound_rejects_the_true_gaussian_curve_at_most_alpha_of_the_time(mu, m):
    rng = np.random.default_rng(int(mu * 10) + m)
    thresholds = tuple(float(norm.isf(a)) for a in FPR_TARGETS)
    runs, rejected = 1000, 0
    for _ in range(runs):
        scores, included = _gaussian_canaries(mu, m, rng)
        rejected += threshold_counts(scores, included, thresholds).rejects(GaussianDP(mu), ALPHA)
    assert rejected / runs <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / runs)


@pytest.mark.slow
def test_independent_bound_is_tight_on_the_gaussian_mechanism_with_10000_canaries():
    """mu = 1 and 2 (true epsilon 4.38 and 10.0 at delta 1e-5): at least 85% of the true epsilon with 10,000
    canaries (the mean over seeds is 91% and 94%, benchmarks/README.md; Xiang et al. report 89% on average)."""
    rng = np.random.default_rng(11)
    thresholds = tuple(float(norm.isf(a)) for a in FPR_TARGETS)
    for mu in (1.0, 2.0):
        scores, included = _gaussian_canaries(mu, 10_000, rng)
        bound = independent_bound(threshold_counts(scores, included, thresholds), gdp_family(), delta=DELTA,
                                  alpha=ALPHA)
        assert 0.85 * gdp_epsilon(mu, DELTA) <= bound.epsilon <= gdp_epsilon(mu, DELTA)


def _dp_sgd_canaries(sigma: float, q: float, steps: int, m: int, rng, noise_factor: float = 1.0):
    """The ideal white-box view: each included canary in each step with probability q, observed with the noise."""
    included = rng.random(m) < 0.5
    present = (rng.random((m, steps)) < q) & included[:, None]
    y = present / sigma + noise_factor * rng.standard_normal((m, steps))
    scores = np.logaddexp(math.log1p(-q), math.log(q) + y / sigma - 1 / (2 * sigma ** 2)).sum(axis=1)
    return scores, included, y, present


@pytest.mark.slow
def test_dp_sgd_canaries_reach_the_goal_ratio_of_the_accountant_with_10000_canaries():
    """The ideal auditor of DP-SGD (q = 1/7, 140 steps, accountant's epsilon 4 and 8 at delta 1e-5), the check's
    share of alpha (1/4): the independent-canary bound is at least 0.8 of the accountant's epsilon and below it;
    the f-DP bound (valid however canaries interact) about half."""
    q, steps = 1 / 7, 140
    family = dp_sgd_family(q, steps)
    rng = np.random.default_rng(5)
    for sigma in (2.19, 1.35):
        claimed = family.epsilon(sigma, DELTA)
        scores, included, _, _ = _dp_sgd_canaries(sigma, q, steps, 10_000, rng)
        curve = subsampled_gaussian(sigma, q, steps)
        from audit.canary.independent import null_thresholds

        counts = threshold_counts(scores, included, null_thresholds(curve))
        assert not counts.rejects(curve, ALPHA / 4)
        noise = least_rejected_noise(lambda s: counts.rejects(family.curve(s), ALPHA / 4), sigma)
        assert 0.8 * claimed <= family.epsilon(noise, DELTA) <= claimed


# ------------------------------------------------------------------------------------- white-box estimate


def _statistics(noise: np.ndarray, signal: np.ndarray) -> StepStatistics:
    return StepStatistics(len(noise), noise.sum(), noise @ noise, len(signal), signal.sum(), signal @ signal)


@pytest.mark.slow
@pytest.mark.parametrize("noise_kind", ["gaussian", "laplace"])
def test_estimate_interval_covers_the_effective_noise_multiplier_on_each_side(noise_kind):
    """Observations y = a b + s z with s = 0.8, a = 1/2 (effective sigma 1.6), z Gaussian or Laplace (unit variance),
    600 signal observations (a known to 6%, where the delta method on the log undercovers): each limit misses on its
    side in at most alpha of the runs, and a claim equal to the truth is rejected at most alpha of the time (3
    standard errors of the rate). The interval is exact for Gaussian noise; Laplace noise's fourth moment widens the
    pooled spread's own spread, which moves the pivot's variance here from about 1.03 to 1.08 (the noncentrality
    0.26 x sqrt((kurtosis - 1) / 4)): a level of about 0.06 at 0.05 (0.061 in 4,000 runs), within the tolerance."""
    rng = np.random.default_rng(7 if noise_kind == "gaussian" else 8)
    runs, alpha, s, a = 600, 0.05, 0.8, 0.5

    def draw(n):
        return rng.standard_normal(n) if noise_kind == "gaussian" else rng.laplace(0, 1 / math.sqrt(2), n)

    below = above = rejected = 0
    for _ in range(runs):
        stats = _statistics(s * draw(3000), a + s * draw(600))
        found = estimate(stats, noise_multiplier=s / a, max_grad_norm=1.0, epsilon_of=lambda v, up: 1 / v, alpha=alpha)
        lo, hi = found.noise_interval
        below += hi < s / a
        above += lo > s / a
        rejected += found.claim_rejected
    tolerance = alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs)
    assert below / runs <= tolerance and above / runs <= tolerance and rejected / runs <= tolerance


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [0.3, 3.8])
def test_estimate_holds_its_level_with_few_observations_of_the_contribution(sigma):
    """The boundary of the estimate's use: few canaries over few steps, so 5 observations of the canary's contribution
    beside 200 of the noise, y = b / sigma + z with z standard normal (a correct Gaussian DP-SGD in units of the claimed
    noise), at small noise (sigma 0.3) and large (3.8). Each limit (the noise multiplier's two, the clipping bound's
    two) misses the truth on its own side, and the true claim is rejected, at most alpha of the time. A count above
    the Binomial(runs, alpha) quantile at 1 - 1e-5 fails: an exact interval fails one of the test's ten counts with
    probability below 1e-4. Intervals from the normal quantile and plug-in variances miss 7-9% here."""
    from scipy.stats import binom

    runs, alpha, n0, n1 = 1500, 0.05, 200, 5
    rng = np.random.default_rng(23 if sigma < 1 else 24)
    rejected = above = below = clip_above = clip_below = 0
    for _ in range(runs):
        found = estimate(_statistics(rng.standard_normal(n0), 1 / sigma + rng.standard_normal(n1)),
                         noise_multiplier=sigma, max_grad_norm=1.0, epsilon_of=lambda v, up: 1 / v, alpha=alpha)
        lo, hi = found.noise_interval
        rejected += found.claim_rejected
        above += sigma > hi
        below += sigma < lo
        clip_above += 1.0 > found.clipping_interval[1]
        clip_below += 1.0 < found.clipping_interval[0]
    limit = binom.ppf(1 - 1e-5, runs, alpha)
    assert max(rejected, above, below, clip_above, clip_below) <= limit, (rejected, above, below, clip_above,
                                                                          clip_below, limit)


def test_estimate_of_a_correct_training_and_its_fields():
    rng = np.random.default_rng(1)
    sigma, clip = 1.5, 2.0
    stats = _statistics(rng.standard_normal(200_000), 1 / sigma + rng.standard_normal(20_000))
    found = estimate(stats, noise_multiplier=sigma, max_grad_norm=clip, epsilon_of=lambda v, up: 10 / v, alpha=0.0125)
    lo, hi = found.noise_interval
    assert lo < sigma < hi and hi / lo < 1.15 and not found.claim_rejected
    assert found.clipping_interval[0] < clip < found.clipping_interval[1]
    assert found.epsilon_interval == pytest.approx((10 / hi, 10 / lo)) and abs(found.noise_mean_z) < 4
    assert StepStatistics.from_dict(stats.to_dict()) == stats
    assert "behaves like noise multiplier" in found.to_dict()["summary"]
    # no signal (the canaries' contribution lost): no finite noise multiplier, nothing rejected
    none = estimate(_statistics(rng.standard_normal(1000), rng.standard_normal(100)), noise_multiplier=sigma,
                    max_grad_norm=clip, epsilon_of=lambda v, up: 10 / v, alpha=0.0125)
    assert none.noise_interval[1] == math.inf and not none.claim_rejected
    assert estimate(StepStatistics(), noise_multiplier=1.0, max_grad_norm=1.0, epsilon_of=lambda v, up: v,
                    alpha=0.05) is None


@pytest.mark.slow
def test_the_checks_four_tests_pass_a_true_claim_and_reject_half_its_noise():
    """dp_sgd_tests (the DP check's tests from its canaries' observations, each at alpha / 4) on the ideal view of
    1,000 canaries of DP-SGD claiming sigma 2.19 (q 1/7, 140 steps): the claim drawn with its own noise passes every
    test; drawn with half of it, the estimate rejects it and the check's figure is above the claim's epsilon;
    diverged (non-finite) scores prove nothing."""
    q, steps, sigma = 1 / 7, 140, 2.19

    def tests(noise_factor, seed):
        scores, included, y, present = _dp_sgd_canaries(sigma, q, steps, 1000, np.random.default_rng(seed),
                                                         noise_factor)
        return dp_sgd_tests(scores, included, _statistics(y[~present], y[present]), noise_multiplier=sigma,
                            max_grad_norm=1.0, sample_rate=q, steps=steps, delta=DELTA, alpha=ALPHA), scores

    correct, scores = tests(1.0, 11)
    assert correct.tests == 4 and correct.bound.alpha == pytest.approx(ALPHA / 4)
    assert correct.claimed_epsilon == pytest.approx(dp_sgd_family(q, steps).epsilon(sigma, DELTA))
    assert not correct.violated and set(correct.figures) == {"one_run", "fdp", "independent", "estimate"}
    assert all(v <= correct.claimed_epsilon for v in correct.figures.values())
    broken, _ = tests(0.5, 12)
    assert broken.violated and broken.estimate.claim_rejected and broken.epsilon_lb > broken.claimed_epsilon
    assert broken.estimate.noise_interval[1] < 0.6 * sigma
    scores[0] = np.nan
    diverged = dp_sgd_tests(scores, np.random.default_rng(13).random(1000) < 0.5, StepStatistics(),
                            noise_multiplier=sigma, max_grad_norm=1.0, sample_rate=q, steps=steps, delta=DELTA,
                            alpha=ALPHA)
    assert diverged.figures == {"one_run": 0.0} and not diverged.violated


@pytest.mark.slow
def test_estimate_catches_noise_at_four_fifths_and_clipping_at_twice_the_claim():
    """The ideal view of 1,000 canaries of DP-SGD claiming sigma 2.19 (q 1/7, 140 steps): noise drawn at 0.8 sigma,
    or canaries clipped to 2 C with the noise of C, are caught at the check's share of alpha; the truth is not."""
    q, steps, sigma = 1 / 7, 140, 2.19
    rng = np.random.default_rng(2)
    for factor, contribution, caught in ((1.0, 1.0, False), (0.8, 1.0, True), (1.0, 2.0, True)):
        _, _, y, present = _dp_sgd_canaries(sigma, q, steps, 1000, rng, noise_factor=factor)
        y = y + (contribution - 1) * present / sigma
        found = estimate(_statistics(y[~present], y[present]), noise_multiplier=sigma, max_grad_norm=1.0,
                         epsilon_of=lambda v, up: 1 / v, alpha=ALPHA / 4)
        assert found.claim_rejected is caught


# ---------------------------------------------------------------------------------------------- the count


def test_default_canary_count_is_ten_thousand_or_one_per_trainable_value_within_the_budget():
    assert resolve_count(None, 75_000, 1 / 7) == DEFAULT_COUNT
    assert resolve_count(None, 339, 1 / 6) == 339
    big = resolve_count(None, 5_000_000, 0.5)
    assert 2 <= big < DEFAULT_COUNT  # rows of 5M values: the budget holds few
    with pytest.raises(ValueError, match="too large for the DP check"):
        resolve_count(None, 500_000_000, 0.5)
    assert resolve_count(500, 10_000, 0.1) == 500
    with pytest.raises(ValueError, match="need as many coordinates; the model has 300"):
        resolve_count(1000, 300, 0.1)
    with pytest.raises(ValueError, match=f"exceed {ROW_BUDGET_BYTES >> 20} MiB"):
        resolve_count(10_000, 10_000_000, 0.5)


def test_fdp_bound_of_perfect_counts_is_its_ceiling_and_chance_gives_nothing():
    m = 1000
    grid = tuple(Guess(r, 0) for r in (10, 100, 500))
    perfect = CanaryCounts(m, tuple(GuessCount(g, g.r) for g in grid))
    bound = fdp_bound(perfect, gdp_family(), delta=DELTA, alpha=ALPHA)
    assert bound.epsilon == pytest.approx(bound.ceiling, rel=0.12) and bound.epsilon > 5  # ceiling at 5% tolerance
    chance = CanaryCounts(m, tuple(GuessCount(g, g.r // 2) for g in grid))
    nothing = fdp_bound(chance, gdp_family(), delta=DELTA, alpha=ALPHA)
    assert nothing.noise is None and nothing.epsilon == 0.0
