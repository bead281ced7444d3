"""The one-run bound (audit.canary.one_run) against a direct transcription of Steinke, Nasr and Jagielski's theorem,
its ceilings against the published figures, and its error rate by simulation of the theorem's worst case
(randomised response)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from audit.canary.one_run import (CanaryCounts, Guess, GuessCount, ceiling, counts_from_scores, epsilon_lower_bound,
                                  guess_grid, no_leak_p_value, p_value)


def theorem_tail(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The theorem as written, with exact binomial sums: P[W >= v] <= f(v) + 2 m delta max_{i in [m]} (f(v-i) -
    f(v)) / i, f(v) = P[Binomial(r, e^eps / (1 + e^eps)) >= v], f of a negative count = 1."""
    q = math.exp(epsilon) / (1 + math.exp(epsilon))
    pmf = [math.comb(r, j) * q ** j * (1 - q) ** (r - j) for j in range(r + 1)]
    tails = [sum(pmf[k:]) for k in range(r + 2)]  # tails[k] = P[Binomial >= k]

    def f(k: int) -> float:
        return 1.0 if k <= 0 else tails[k]

    spread = max((f(v - i) - f(v)) / i for i in range(1, m + 1))
    return min(1.0, f(v) + 2 * m * delta * spread)


def theorem_bound(m: int, r: int, v: int, delta: float, alpha: float) -> float:
    """The epsilon where the transcription's p-value crosses alpha (by bisection to 1e-5): every epsilon below it is
    rejected at level alpha (the p-value increases with epsilon: test below)."""
    if theorem_tail(m, r, v, 0.0, delta) > alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while theorem_tail(m, r, v, hi, delta) <= alpha:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-5:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if theorem_tail(m, r, v, mid, delta) <= alpha else (lo, mid)
    return lo


HAND_MADE = [  # (m, r, v, delta)
    (10, 10, 10, 0.0),
    (40, 20, 18, 1e-5),
    (100, 50, 45, 1e-5),
    (100, 100, 100, 1e-3),
    (200, 120, 95, 1e-4),
    (150, 30, 30, 0.0),
]


@pytest.mark.parametrize("m, r, v, delta", HAND_MADE)
@pytest.mark.parametrize("epsilon", [0.0, 0.5, 1.7, 4.0])
def test_p_value_is_the_theorem_on_hand_made_counts(m, r, v, delta, epsilon):
    assert p_value(m, r, v, epsilon, delta) == pytest.approx(theorem_tail(m, r, v, epsilon, delta), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("m, r, v, delta", HAND_MADE)
def test_epsilon_bound_is_the_theorem_on_hand_made_counts(m, r, v, delta):
    for alpha in (0.05, 0.01):
        direct = theorem_bound(m, r, v, delta, alpha)
        assert epsilon_lower_bound(m, r, v, delta, alpha) == pytest.approx(direct, abs=2e-5)


def test_bound_at_a_corrected_level_is_lower_and_zero_when_chance_explains_the_counts():
    assert epsilon_lower_bound(100, 50, 45, 1e-5, 0.05 / 10) < epsilon_lower_bound(100, 50, 45, 1e-5, 0.05)
    assert epsilon_lower_bound(100, 50, 27, 1e-5, 0.05) == 0.0  # 27 of 50: a coin does as well
    assert epsilon_lower_bound(100, 0, 0, 1e-5, 0.05) == 0.0     # no guess, nothing shown


@pytest.mark.parametrize("r, published", [(100, 3.49), (500, 5.11), (1000, 5.81), (10000, 8.11)])
def test_ceiling_of_all_guesses_right_matches_the_published_figures(r, published):
    """Steinke et al.'s ceilings at 95%, delta = 0, all r guesses right (one guess count, no choice)."""
    assert ceiling(r, 0.0, 0.05, grid=(Guess(r, 0),)) == pytest.approx(published, abs=0.01)


def test_ceiling_with_the_grid_and_delta_is_the_best_all_right_bound_of_the_grid():
    m, delta, alpha = 1000, 1e-5, 0.05
    grid = guess_grid(m)
    expected = max(epsilon_lower_bound(m, g.r, g.r, delta, alpha / len(grid)) for g in grid)
    assert ceiling(m, delta, alpha) == expected
    perfect = CanaryCounts(m, tuple(GuessCount(g, g.r) for g in grid)).bound(delta, alpha)
    assert perfect.epsilon == perfect.ceiling == expected


@pytest.mark.parametrize("m, r", [(100, 20), (1000, 200), (1000, 1000)])
def test_p_value_increases_with_epsilon_and_decreases_with_right_guesses(m, r):
    for v in range(0, r + 1, max(1, r // 10)):
        values = [p_value(m, r, v, eps, 1e-5) for eps in np.linspace(0, 10, 51)]
        assert all(b >= a - 1e-12 for a, b in zip(values, values[1:]))
    for eps in (0.0, 1.0, 4.0):
        values = [p_value(m, r, v, eps, 1e-5) for v in range(0, r + 1, max(1, r // 100))]
        assert all(b <= a + 1e-12 for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("epsilon, r", [(0.0, 20), (0.0, 500), (1.0, 100), (3.0, 50), (6.0, 400)])
def test_bound_exceeds_the_truth_at_most_alpha_of_the_time_for_randomised_response(epsilon, r):
    """Randomised response with epsilon is the theorem's worst case (delta = 0): each guess right with probability
    e^eps / (1 + e^eps), independently. The bound may exceed epsilon in at most alpha of the runs (and it does come
    close to alpha: the theorem is tight there)."""
    alpha, runs = 0.05, 4000
    rng = np.random.default_rng(int(epsilon * 100) + r)
    q = math.exp(epsilon) / (1 + math.exp(epsilon))
    right = rng.binomial(r, q, size=runs)
    exceeds = {v: epsilon_lower_bound(r, r, int(v), 0.0, alpha) > epsilon for v in np.unique(right)}
    rate = np.mean([exceeds[v] for v in right])
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs)
    # the exact probability of exceeding, from the binomial: at most alpha
    exact = sum(math.comb(r, v) * q ** v * (1 - q) ** (r - v) for v in range(r + 1)
                if epsilon_lower_bound(r, r, v, 0.0, alpha) > epsilon) if r <= 100 else None
    assert exact is None or exact <= alpha


def test_counts_from_hand_made_scores():
    scores = np.array([9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    included = np.array([1, 1, 0, 1, 0, 0, 1, 0, 0, 0], dtype=bool)
    grid = (Guess(2, 0), Guess(4, 0), Guess(2, 2), Guess(5, 5))
    counts = counts_from_scores(scores, included, grid)
    assert [c.correct for c in counts.counts] == [2, 3, 2 + 2, 3 + 4]
    # ties are broken by the canary's index: canary 0 before canary 1 at the same score
    tied = counts_from_scores(np.array([1.0, 1.0, 0.0]), np.array([False, True, True]), (Guess(1, 0),))
    assert tied.counts[0].correct == 0
    assert CanaryCounts.from_dict(counts.to_dict()) == counts


def test_no_leak_p_value_is_the_binomial_tail_corrected_for_the_grid():
    grid = (Guess(10, 0), Guess(20, 0))
    counts = CanaryCounts(40, (GuessCount(grid[0], 9), GuessCount(grid[1], 12)))
    tail = sum(math.comb(10, k) for k in range(9, 11)) / 2 ** 10
    assert no_leak_p_value(40, 10, 9) == pytest.approx(tail)
    assert counts.no_leak_p_value() == pytest.approx(min(1.0, 2 * tail))


def test_the_grid_and_the_counts_refuse_what_cannot_be():
    assert guess_grid(1) == (Guess(1, 0),)
    assert all(g.r <= 1000 for g in guess_grid(1000)) and len(set(guess_grid(1000))) == len(guess_grid(1000))
    with pytest.raises(ValueError, match="v <= guesses r <= canaries m"):
        p_value(10, 5, 6, 1.0, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        epsilon_lower_bound(10, 5, 5, 0.0, 1.5)
    with pytest.raises(ValueError, match="finite score"):
        counts_from_scores(np.array([1.0, np.nan]), np.array([True, False]))
