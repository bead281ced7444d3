"""Every interval the audit prints covers at its level on each side separately, near the boundaries and at small
sizes, on score distributions the rest of the suite does not use (tests/score_families.py): exponential scores, a
share of memorised members above every non-member, a heavy-tailed (Cauchy) score, a loss rounded to 5 values, and
scores where one class is a single value (the AUC estimate is then a binomial proportion, checked exactly).

The AUC interval (uncertainty.auc_interval, audit.membership.auc_bounds) over AUC 0.5-0.995 x 20-10,000 samples a
class and unequal classes, 1,000 draws a cell. The draws are binned scores (200 levels of equal non-member
probability; the rounded loss has 5): counts per level give the placements exactly in O(levels) a draw whatever the
class sizes, and `test_binned_draws_are_what_the_audit_computes_from_raw_scores` ties them to the audit's own
computation from raw scores. Allowance: a side may miss (1 - c) / 2 plus three binomial standard errors of the draws
(1.48 points at 1,000 draws: a side at exactly 2.5% exceeds it with probability 0.13%), and pooled over the grid
(84,000 draws a family) at most (1 - c) / 2 plus three pooled standard errors. DeLong's Wald interval fails the same
check (`test_delongs_wald_interval_fails_the_check_near_auc_1`), so the check can fail.

benchmarks/bench_interval_coverage.py prints the same table for raw scores of six continuous families as well.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, norm

from audit.membership.auc_bounds import METHOD, _rejected, auc_bounds
from audit.membership.attack_uncertainty import attack_uncertainty
from audit.membership.epsilon_bound import epsilon_lower_bound
from audit.membership.uncertainty import attacker_advantage, auc_interval, clopper_pearson, placements
from tests.score_families import FAMILIES, binned_statistics, exact_auc, level_statistics, rounded_loss

AUCS = (0.5, 0.75, 0.9, 0.95, 0.99, 0.995)
SIZES = ((20, 20), (100, 100), (1000, 1000), (10000, 10000), (20, 400), (400, 20), (90, 404))
DRAWS = 1000
CONFIDENCE = 0.95
SIDE = (1 - CONFIDENCE) / 2
ALLOWED = SIDE + 3 * math.sqrt(SIDE * (1 - SIDE) / DRAWS)
LEVELS = 200
GRID_FAMILIES = ("exponential", "memorised", "cauchy", "rounded")


def level_probabilities(family: str, auc: float):
    return rounded_loss(auc) if family == "rounded" else FAMILIES[family].binned(auc, LEVELS)


def wald(estimate, pos_var, neg_var, m, n, confidence=CONFIDENCE):
    """DeLong's Wald interval: estimate +- z * sqrt(DeLong variance), clipped to [0, 1]."""
    half = norm.ppf(1 - (1 - confidence) / 2) * np.sqrt(pos_var / m + neg_var / n)
    return np.clip(estimate - half, 0, 1), np.clip(estimate + half, 0, 1)


@pytest.fixture(scope="module")
def grid():
    """{family: (truth, estimate, pos_var, neg_var, m, n, lower, upper)}, arrays over every (AUC, sizes) cell x draw;
    lower, upper: the AUC interval's bounds. Seconds of simulation: the tests that read it are marked slow."""
    out = {}
    for family in GRID_FAMILIES:
        columns = [[] for _ in range(6)]
        for auc in AUCS:
            p_members, p_nonmembers = level_probabilities(family, auc)
            truth = exact_auc(p_members, p_nonmembers)
            assert truth == pytest.approx(auc, abs=1e-9)
            for m, n in SIZES:
                rng = np.random.default_rng([m, n, int(auc * 1000), len(family)])
                estimate, pos_var, neg_var = binned_statistics(rng, p_members, p_nonmembers, m, n, DRAWS)
                for column, values in zip(columns, (np.full(DRAWS, truth), estimate, pos_var, neg_var,
                                                    np.full(DRAWS, m), np.full(DRAWS, n))):
                    column.append(values)
        truth, estimate, pos_var, neg_var, m, n = (np.concatenate(column) for column in columns)
        out[family] = (truth, estimate, pos_var, neg_var, m, n, *auc_bounds(estimate, pos_var, neg_var, m, n,
                                                                               CONFIDENCE))
    return out


def misses(truth, lower, upper):
    """Per cell (rows of DRAWS): the share of draws with the truth below the lower bound, and above the upper."""
    below = (truth < lower).reshape(-1, DRAWS).mean(axis=1)
    above = (truth > upper).reshape(-1, DRAWS).mean(axis=1)
    return below, above


def cells():
    return [(auc, m, n) for auc in AUCS for m, n in SIZES]


@pytest.mark.slow
def test_the_auc_interval_covers_each_side_over_the_grid(grid):
    failures, pooled = [], {}
    for family, (truth, estimate, pos_var, neg_var, m, n, lower, upper) in grid.items():
        assert np.all((lower <= estimate) & (estimate <= upper) & (lower >= 0) & (upper <= 1))
        below, above = misses(truth, lower, upper)
        for (auc, mm, nn), b, a in zip(cells(), below, above):
            if b > ALLOWED or a > ALLOWED:
                failures.append(f"{family} AUC {auc} {mm}/{nn}: below {b:.3f}, above {a:.3f}")
        pooled[family] = (below.mean(), above.mean())
    assert not failures, "\n".join(failures)
    total = DRAWS * len(cells())
    for family, sides in pooled.items():
        assert max(sides) <= SIDE + 3 * math.sqrt(SIDE * (1 - SIDE) / total), (family, sides)


@pytest.mark.slow
def test_delongs_wald_interval_fails_the_check_near_auc_1(grid):
    """The check above can fail: DeLong's Wald interval, on the same draws, has the truth below its lower bound in
    far more than 2.5% of draws at AUC 0.99 with 20 members and 20 non-members (measured 34% to 71% across the
    families), and that side is where it fails."""
    cell = cells().index((0.99, 20, 20))
    for family, (truth, estimate, pos_var, neg_var, m, n, _, _) in grid.items():
        below, above = misses(truth, *wald(estimate, pos_var, neg_var, m, n))
        assert below[cell] > ALLOWED + 0.2, (family, below[cell])
        assert above[cell] <= ALLOWED


@pytest.mark.slow
def test_the_interval_is_delongs_where_delong_holds(grid):
    """Not wide for safety where it need not be: with 1,000 and 10,000 a class and AUC up to 0.9, its mean width is
    within 5% of DeLong's Wald interval's (measured 1.02x), and with 10,000 a class each side misses about as often
    as its level allows (pooled over those cells, measured 2.0% to 2.7%)."""
    for family, (truth, estimate, pos_var, neg_var, m, n, lower, upper) in grid.items():
        old_lower, old_upper = wald(estimate, pos_var, neg_var, m, n)
        large = (np.minimum(m, n) >= 1000) & (truth <= 0.9 + 1e-9)
        assert np.mean((upper - lower)[large]) <= 1.05 * np.mean((old_upper - old_lower)[large]), family
        largest = (np.minimum(m, n) == 10000) & (truth <= 0.9 + 1e-9)
        for side in (np.mean((truth < lower)[largest]), np.mean((truth > upper)[largest])):
            assert 0.015 <= side <= 0.035, (family, side)


def test_binned_draws_are_what_the_audit_computes_from_raw_scores():
    """The grid's fast path (counts per level) gives the statistics and bounds that auc_interval computes from the
    same scores written out one by one."""
    rng = np.random.default_rng(5)
    for family, auc, m, n in (("exponential", 0.9, 20, 400), ("rounded", 0.75, 90, 404), ("memorised", 0.99, 30, 30),
                              ("cauchy", 0.5, 1000, 20)):
        p_members, p_nonmembers = level_probabilities(family, auc)
        members = rng.multinomial(m, p_members / p_members.sum())
        nonmembers = rng.multinomial(n, p_nonmembers / p_nonmembers.sum())
        estimate, pos_var, neg_var = level_statistics(members, nonmembers)
        lower, upper = auc_bounds(estimate, pos_var, neg_var, m, n, CONFIDENCE)
        levels = np.arange(len(p_members), dtype=float)
        interval = auc_interval(np.repeat(levels, members), np.repeat(levels, nonmembers), CONFIDENCE)
        assert interval.estimate == pytest.approx(estimate, abs=1e-12)
        assert interval.std_error**2 == pytest.approx(pos_var / m + neg_var / n, rel=1e-9, abs=1e-15)
        assert (interval.lower, interval.upper) == pytest.approx((float(lower), float(upper)), abs=1e-9)
        assert interval.method == METHOD


def test_each_bound_is_the_outermost_candidate_the_test_accepts():
    """The bounds come from a coarse scan and a root finder: on samples of every shape (tiny, unbalanced, tied,
    separated) they equal the outermost accepted candidate on a grid of 4,001 AUCs, and every candidate between them
    is accepted (the interval has no holes, and nothing accepted lies outside it)."""
    rng = np.random.default_rng(9)
    rows = []
    for family, auc in (("exponential", 0.8), ("memorised", 0.97), ("cauchy", 0.5), ("rounded", 0.9)):
        for m, n in ((2, 3), (20, 20), (300, 7), (7, 300), (1000, 2)):
            p_members, p_nonmembers = level_probabilities(family, auc) if family == "rounded" else \
                FAMILIES[family].binned(auc, 50)
            rows += zip(*binned_statistics(rng, p_members, p_nonmembers, m, n, 3), [m] * 3, [n] * 3)
    estimate, pos_var, neg_var, m, n = (np.array(column) for column in zip(*rows))
    lower, upper = auc_bounds(estimate, pos_var, neg_var, m, n, CONFIDENCE)
    candidates = np.linspace(0, 1, 4001)
    for i in range(len(estimate)):
        data = (estimate[i], pos_var[i], neg_var[i], m[i], n[i], SIDE)
        below, above = candidates[candidates <= estimate[i]], candidates[candidates >= estimate[i]]
        accepted_below = below[~_rejected(below, -1, *data)]
        accepted_above = above[~_rejected(above, +1, *data)]
        assert lower[i] <= accepted_below.min() < lower[i] + 1 / 4000
        assert upper[i] - 1 / 4000 < accepted_above.max() <= upper[i]
        assert accepted_below.size == ((below >= lower[i]) & (below <= estimate[i])).sum()
        assert accepted_above.size == ((above <= upper[i]) & (above >= estimate[i])).sum()


def test_each_elements_bounds_are_its_own_alone_or_in_an_array():
    """auc_bounds finds both sides of every element in one root finding: each element's bounds are the same, bit
    for bit, as when it is bounded alone (at the boundaries too: all tied, perfect separation, one class one value)."""
    rng = np.random.default_rng(11)
    samples = [(rng.normal(mu, 1, m), rng.normal(0, 1, n)) for mu, m, n in
               [(0, 20, 20), (0.7, 100, 400), (2, 20, 400), (4, 400, 20), (1, 90, 404)]]
    samples += [(np.zeros(20), np.zeros(20)), (np.ones(20), np.zeros(30)), (rng.normal(size=25), np.zeros(40))]
    rows = []
    for pos, neg in samples:
        v10, v01 = placements(pos, neg)
        rows.append((v10.mean(), v10.var(ddof=1), v01.var(ddof=1), pos.size, neg.size))
    lower, upper = auc_bounds(*np.array(rows).T, CONFIDENCE)
    for row, low, high in zip(rows, lower, upper):
        alone = auc_bounds(*row, CONFIDENCE)
        assert np.shape(alone[0]) == () and (float(alone[0]), float(alone[1])) == (low, high), row


# ------------------------------------------------------------------------------------------ degenerate samples


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_perfect_separation_gives_the_largest_lower_bound_valid_for_every_distribution(confidence):
    """AUC estimate 1: [((1 - c) / 2)^(1/k), 1], k = min(m, n). Where a share 1 - AUC of the members scores below
    every non-member, perfect separation has probability AUC^k, so a higher lower bound would miss more often than
    (1 - c) / 2 there; and it is no lower than that. AUC estimate 0 is the mirror image."""
    for m, n in ((20, 20), (20, 400), (400, 20), (90, 404), (2, 2), (1000, 3)):
        limit = ((1 - confidence) / 2) ** (1 / min(m, n))
        separated = auc_interval(np.arange(m) + 1e6, np.arange(n, dtype=float), confidence)
        assert separated.estimate == 1 and separated.upper == 1
        assert separated.lower == pytest.approx(limit, abs=1e-9)
        reversed_ = auc_interval(np.arange(m, dtype=float), np.arange(n) + 1e6, confidence)
        assert reversed_.lower == 0 and reversed_.upper == pytest.approx(1 - limit, abs=1e-9)
    # 20 a class, 95%: 0.832, where DeLong's interval was [1, 1]
    assert auc_interval(np.arange(20) + 50.0, np.arange(20.0)).lower == pytest.approx(0.8316, abs=1e-4)


def test_all_ties_and_two_samples_a_class_give_sensible_intervals():
    tied = auc_interval(np.zeros(20), np.zeros(20))
    assert tied.estimate == 0.5 and tied.std_error == 0
    assert 0.3 < tied.lower < 0.45 and tied.upper == pytest.approx(1 - tied.lower, abs=1e-9)
    tied_big = auc_interval(np.ones(1000), np.ones(1000))
    assert tied.lower < tied_big.lower < 0.5 < tied_big.upper  # more samples, narrower, never degenerate
    for pos, neg in (([1.0, 2.0], [0.0, 0.5]), ([0.0, 2.0], [1.0, 1.5]), ([1.0, 1.0], [1.0, 1.0]),
                     ([1.0, 3.0], [2.0, 2.0])):
        two = auc_interval(pos, neg)
        assert 0 <= two.lower <= two.estimate <= two.upper <= 1
        assert two.upper - two.lower > 0.5  # two samples a class say little
    # one member: no variance can be estimated, nothing is known beyond the estimate
    one = attack_uncertainty([1.0], [0.0, 0.5], [0.0, 0.2, 0.4], {0.1: 0.3})
    assert (one.auc.lower, one.auc.upper, one.auc.method) == (0.0, 1.0, "none")


@pytest.mark.parametrize("m", [2, 5, 20, 90, 404])
def test_a_binomial_estimate_is_covered_exactly_on_each_side(m):
    """Every non-member scores the same and each member is above it with probability AUC: the estimate is k/m,
    k ~ Binomial(m, AUC), and each side's miss probability is a finite sum, computed exactly at 1,999 AUCs: at most
    (1 - c) / 2 everywhere. With at least as many non-members the interval is Clopper-Pearson's; with fewer, wider
    (non-members the sample missed could rank above every member)."""
    k = np.arange(m + 1)
    estimate = k / m
    pos_var = k * (m - k) / (m * (m - 1))
    aucs = np.linspace(0.0005, 0.9995, 1999)
    pmf = binom.pmf(k[None, :], m, aucs[:, None])
    for n in (m, 4 * m, max(2, m // 4)):
        lower, upper = auc_bounds(estimate, pos_var, np.zeros(m + 1), m, n, CONFIDENCE)
        cp = np.array([[clopper_pearson(int(i), m, CONFIDENCE).lower, clopper_pearson(int(i), m, CONFIDENCE).upper]
                       for i in k])
        if n >= m:
            # auc_bounds' root finder (Chandrupatla, stopping within its xatol = 1e-10 of the bound) against scipy's
            # beta quantiles (a few float64 spacings): 1e-8 leaves 100 over the solver
            np.testing.assert_allclose(np.c_[lower, upper], cp, atol=1e-8)
        else:
            assert np.all(lower <= cp[:, 0] + 1e-9) and np.all(upper >= cp[:, 1] - 1e-9)
        assert (pmf * (lower[None, :] > aucs[:, None])).sum(axis=1).max() <= SIDE + 1e-9
        assert (pmf * (upper[None, :] < aucs[:, None])).sum(axis=1).max() <= SIDE + 1e-9


# ------------------------------------------------------------------------------------------ the other intervals


@pytest.mark.parametrize("n", [1, 2, 7, 20, 90, 404])
def test_clopper_pearson_covers_exactly_on_each_side(n):
    """Each side of the TPR / FPR interval misses with probability at most (1 - c) / 2 at every rate, near 0 and 1
    included (exact binomial sums at 1,999 rates)."""
    ks = np.arange(n + 1)
    bounds = np.array([[clopper_pearson(int(k), n).lower, clopper_pearson(int(k), n).upper] for k in ks])
    rates = np.concatenate([np.linspace(1e-4, 0.05, 500), np.linspace(0.05, 0.95, 999), np.linspace(0.95, 1 - 1e-4,
                                                                                                    500)])
    pmf = binom.pmf(ks[None, :], n, rates[:, None])
    below = (pmf * (bounds[None, :, 0] > rates[:, None])).sum(axis=1)
    above = (pmf * (bounds[None, :, 1] < rates[:, None])).sum(axis=1)
    assert below.max() <= SIDE + 1e-12 and above.max() <= SIDE + 1e-12
    assert max(below.max(), above.max()) > SIDE / 2 or n <= 2  # not trivially wide


def _ks_distance(p_members, p_nonmembers) -> float:
    """The true advantage of the rule "member iff score >= t" over level thresholds (ties: levels)."""
    at_least = lambda p: np.cumsum(p[::-1])[::-1]  # noqa: E731
    return float(np.max(np.abs(at_least(p_members) - at_least(p_nonmembers))))


@pytest.mark.parametrize("family, auc", [("memorised", 0.5), ("memorised", 0.995), ("exponential", 0.99),
                                         ("rounded", 0.9)])
def test_the_advantage_interval_covers_on_each_side(family, auc):
    """The advantage's DKW interval, at 20-404 samples a class, advantage 0 (identical scores), near 1 (memorised
    0.995: advantage 0.99) and with ties: each side misses at most (1 - c) / 2 plus three standard errors of 400
    draws (measured: never, DKW is simultaneous over thresholds)."""
    p_members, p_nonmembers = level_probabilities(family, auc)
    truth = _ks_distance(p_members, p_nonmembers)
    levels = np.arange(len(p_members), dtype=float)
    draws = 400
    allowed = SIDE + 3 * math.sqrt(SIDE * (1 - SIDE) / draws)
    for m, n in ((20, 20), (20, 400), (90, 404)):
        rng = np.random.default_rng([m, n, int(1000 * auc)])
        below = above = 0
        for _ in range(draws):
            members = np.repeat(levels, rng.multinomial(m, p_members / p_members.sum()))
            nonmembers = np.repeat(levels, rng.multinomial(n, p_nonmembers / p_nonmembers.sum()))
            adv = attacker_advantage(members, nonmembers, CONFIDENCE)
            below += truth < adv.lower
            above += truth > adv.upper
        assert below / draws <= allowed and above / draws <= allowed, (m, n, below, above)


@pytest.mark.parametrize("epsilon", [0.5, 3.0])
def test_the_epsilon_lower_bound_holds_at_small_sizes_with_ties(epsilon):
    """Randomized response (a member scores 1 with probability e^eps / (1 + e^eps), a non-member with
    1 / (1 + e^eps)) is exactly eps-DP, and at eps 3 its rates are near 0 and 1: the one-sided bound exceeds eps in at
    most 1 - c of the draws plus three standard errors (measured: never)."""
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    draws = 300
    for m, n in ((20, 20), (20, 400), (90, 404)):
        rng = np.random.default_rng([m, n, int(10 * epsilon)])
        over = sum(epsilon_lower_bound((rng.random(m) < p).astype(float), (rng.random(n) < 1 - p).astype(float),
                                       confidence=CONFIDENCE).epsilon > epsilon for _ in range(draws))
        assert over / draws <= (1 - CONFIDENCE) + 3 * math.sqrt(0.05 * 0.95 / draws), (m, n, over)
