"""The one-run epsilon lower bound of Steinke, Nasr and Jagielski ("Privacy Auditing with One (1) Training Run",
NeurIPS 2023), from counts alone. Pure functions of numbers: no torch, no model.

The audit: m canaries, each included in training independently with probability 1/2 (S_i); from the trained model
the auditor guesses "in" for some canaries, "out" for others and abstains on the rest, r guesses in all, v of them
right. The paper's theorem (approximate DP): if the training is (epsilon, delta)-DP for each canary, then for every v

    P[W >= v] <= f(v) + 2 m delta max_{i = 1..v} (f(v - i) - f(v)) / i,   f(v) = P[Binomial(r, q) >= v],

with q = e^epsilon / (1 + e^epsilon) (the accuracy of epsilon-randomised response). `p_value` is this bound at the
observed v; the epsilon lower bound at one-sided error level alpha is the smallest epsilon whose p-value exceeds
alpha: every epsilon below it is rejected at level alpha, so "the training is not (epsilon', delta)-DP for any
epsilon' below the bound" holds with probability at least 1 - alpha.

How many guesses to make (r, and how many of them "in") is chosen after seeing the scores, over a fixed grid
(`guess_grid`), so each grid entry is tested at alpha / len(grid) (Bonferroni) and the bound is the largest of them:
the figure is corrected for the choice. `CanaryCounts` holds the counts of every grid entry, so the bound can be
computed again at any other level (e.g. a family-wise verdict's alpha / k) without the scores.

The statistical ceiling of m canaries (`ceiling`) is the bound when every guess is right: no training, however
leaky, can be certified above it with m canaries at that level, so a bound near its ceiling says "at least this
much, and m canaries cannot tell more".

Written from the paper's statement rather than taken from a package: jax_privacy (the reference implementation)
needs jax and dp_accounting, which this project does not install; tests/test_canary_bound.py checks these functions
against a separate transcription of the theorem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.special import expit
from scipy.stats import binom

__all__ = ["Guess", "GuessCount", "CanaryCounts", "OneRunBound", "guess_grid", "p_value", "epsilon_lower_bound",
           "ceiling", "counts_from_scores", "no_leak_p_value"]

# Fractions of m the grid guesses on (the r most confidently scored canaries), one-sided and two-sided each.
_GRID_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# Epsilon is searched on [0, _EPSILON_MAX]: q = expit(60) is 1 - 9e-27, beyond any count's resolution.
_EPSILON_MAX = 60.0
_EPSILON_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Guess:
    """One way of guessing: "in" for the `in_guesses` highest-scoring canaries, "out" for the `out_guesses` lowest."""

    in_guesses: int
    out_guesses: int

    @property
    def r(self) -> int:
        return self.in_guesses + self.out_guesses


@dataclass(frozen=True)
class GuessCount:
    """A grid entry's guesses and how many were right."""

    guess: Guess
    correct: int

    def to_dict(self) -> dict:
        return {"in_guesses": self.guess.in_guesses, "out_guesses": self.guess.out_guesses, "correct": self.correct}


def guess_grid(m: int) -> tuple[Guess, ...]:
    """The guess counts tried for m canaries: r = each fraction of `_GRID_FRACTIONS` of m (at least 1), guessing
    all r "in" (one-sided) or half "in" and half "out" (two-sided). Fixed before any score is seen."""
    _check_count("m", m, minimum=1)
    sizes = sorted({max(1, int(round(m * f))) for f in _GRID_FRACTIONS})
    grid = [Guess(r, 0) for r in sizes] + [Guess(r - r // 2, r // 2) for r in sizes if r >= 2]
    return tuple(grid)


def _check_count(name: str, value, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_level(alpha) -> float:
    if not (isinstance(alpha, (int, float, np.floating)) and 0 < alpha < 1):
        raise ValueError(f"alpha: expected a one-sided error level in (0, 1), got {alpha!r}")
    return float(alpha)


def _check_delta(delta) -> float:
    if not (isinstance(delta, (int, float, np.floating)) and 0 <= delta < 1):
        raise ValueError(f"delta: expected a number in [0, 1), got {delta!r}")
    return float(delta)


def _check_counts(m, r, v) -> tuple[int, int, int]:
    m, r, v = _check_count("m", m, minimum=1), _check_count("r", r), _check_count("v", v)
    if not v <= r <= m:
        raise ValueError(f"counts: need correct v <= guesses r <= canaries m, got v={v}, r={r}, m={m}")
    return m, r, v


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The theorem's bound on P[at least v of r guesses right] for an (epsilon, delta)-DP training with m canaries:
    the p-value of the observed counts under the hypothesis "(epsilon, delta)-DP"."""
    m, r, v = _check_counts(m, r, v)
    delta = _check_delta(delta)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon: expected a finite number >= 0, got {epsilon!r}")
    q = float(expit(epsilon))
    tail = float(binom.sf(v - 1, r, q))  # f(v) = P[Binomial(r, q) >= v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    # f(v - i) - f(v) = P[v - i <= Binomial < v], for i = 1..v (f(0) = 1)
    spread = float(np.max((binom.sf(v - i - 1, r, q) - tail) / i))
    return min(tail + 2 * m * delta * spread, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, alpha: float) -> float:
    """The one-run epsilon lower bound of counts (m canaries, r guesses, v right) at one-sided level alpha: the
    smallest epsilon whose `p_value` exceeds alpha (0.0 when even epsilon = 0 is not rejected)."""
    m, r, v = _check_counts(m, r, v)
    alpha, delta = _check_level(alpha), _check_delta(delta)

    def rejected(eps: float) -> bool:
        return p_value(m, r, v, eps, delta) <= alpha

    if not rejected(0.0):
        return 0.0
    # The first crossing, not any crossing: the p-value is increasing in epsilon in every case checked
    # (tests/test_canary_bound.py), and scanning before bisecting keeps the bound valid should it ever not be.
    step, lo = 0.25, 0.0
    while lo + step <= _EPSILON_MAX and rejected(lo + step):
        lo += step
    hi = min(lo + step, _EPSILON_MAX)
    if rejected(hi):  # rejected up to the search's end: the counts resolve more than any epsilon of interest
        return hi
    while hi - lo > _EPSILON_TOLERANCE:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rejected(mid) else (lo, mid)
    return lo


def no_leak_p_value(m: int, r: int, v: int, delta: float = 0.0) -> float:
    """The p-value of the counts under "no leak" (epsilon = 0: each guess right with probability 1/2; with delta,
    the theorem's delta term is added)."""
    return p_value(m, r, v, 0.0, delta)


@dataclass(frozen=True)
class OneRunBound:
    """A one-run bound and what it rests on."""

    epsilon: float        # the lower bound (0.0: nothing certified)
    ceiling: float        # the largest bound these m canaries could give at this level (every guess right)
    m: int
    guess: Guess | None   # the grid entry that gave the bound (None: no entry rejected epsilon = 0)
    correct: int          # right guesses of that entry
    alpha: float          # the one-sided error level of the whole figure (each grid entry at alpha / grid)
    delta: float
    grid: int             # grid entries the choice was made over

    def to_dict(self) -> dict:
        return {"epsilon": self.epsilon, "ceiling": self.ceiling, "m": self.m,
                "in_guesses": None if self.guess is None else self.guess.in_guesses,
                "out_guesses": None if self.guess is None else self.guess.out_guesses,
                "guesses": None if self.guess is None else self.guess.r, "correct": self.correct,
                "alpha": self.alpha, "delta": self.delta, "grid": self.grid}


def ceiling(m: int, delta: float, alpha: float, grid: tuple[Guess, ...] | None = None) -> float:
    """The statistical ceiling of m canaries: the largest bound over the grid (each entry at alpha / len(grid)) when
    every guess is right. E.g. 5.04 for m = 1000 at alpha = 0.05, delta = 1e-5 with the default grid."""
    return _ceiling(int(m), float(delta), _check_level(alpha), guess_grid(m) if grid is None else tuple(grid))


@lru_cache(maxsize=256)
def _ceiling(m: int, delta: float, alpha: float, grid: tuple[Guess, ...]) -> float:
    level = alpha / len(grid)
    return max(epsilon_lower_bound(m, g.r, g.r, delta, level) for g in grid)


@dataclass(frozen=True)
class CanaryCounts:
    """Every grid entry's counts for m canaries: enough to compute the bound at any level without the scores."""

    m: int
    counts: tuple[GuessCount, ...]

    def bound(self, delta: float, alpha: float) -> OneRunBound:
        """The bound at one-sided level alpha, corrected for the choice over the grid (each entry at
        alpha / len(counts)); a family-wise verdict over k figures calls it with alpha / k."""
        alpha = _check_level(alpha)
        level = alpha / len(self.counts)
        best, best_count = 0.0, None
        for count in self.counts:
            if p_value(self.m, count.guess.r, count.correct, best, delta) > level:
                continue  # not even the best so far is rejected: this entry's bound is below it
            eps = epsilon_lower_bound(self.m, count.guess.r, count.correct, delta, level)
            if eps > best:
                best, best_count = eps, count
        grid = tuple(c.guess for c in self.counts)
        return OneRunBound(best, ceiling(self.m, delta, alpha, grid), self.m,
                           None if best_count is None else best_count.guess,
                           0 if best_count is None else best_count.correct, alpha, float(delta), len(grid))

    def no_leak_p_value(self, delta: float = 0.0) -> float:
        """The p-value of "no leak" (epsilon = 0) over the grid, Bonferroni-corrected: the smallest entry's p-value
        times the grid's size, at most 1."""
        smallest = min(no_leak_p_value(self.m, c.guess.r, c.correct, delta) for c in self.counts)
        return min(1.0, smallest * len(self.counts))

    def to_dict(self) -> dict:
        return {"m": self.m, "counts": [c.to_dict() for c in self.counts]}

    @classmethod
    def from_dict(cls, data) -> "CanaryCounts":
        return cls(int(data["m"]), tuple(GuessCount(Guess(int(c["in_guesses"]), int(c["out_guesses"])),
                                                    int(c["correct"])) for c in data["counts"]))


def counts_from_scores(scores, included, grid: tuple[Guess, ...] | None = None) -> CanaryCounts:
    """Each grid entry's right guesses, from the canaries' scores (higher = more likely included) and whether each
    was included. Ties are broken by the canary's index, which was fixed before the inclusions were drawn."""
    scores = np.asarray(scores, dtype=float)
    included = np.asarray(included, dtype=bool)
    if scores.ndim != 1 or scores.shape != included.shape or not len(scores):
        raise ValueError(f"scores {scores.shape} and included {included.shape}: expected two equal 1-d arrays, "
                         "one entry per canary")
    if not np.isfinite(scores).all():
        raise ValueError("scores: every canary needs a finite score (a diverged shadow training has none)")
    m = len(scores)
    grid = guess_grid(m) if grid is None else grid
    order = np.lexsort((np.arange(m), -scores))  # highest score first, then lowest index
    in_sorted = included[order]
    right_in = np.concatenate([[0], np.cumsum(in_sorted)])           # right "in" guesses among the top k
    right_out = np.concatenate([[0], np.cumsum(~in_sorted[::-1])])   # right "out" guesses among the bottom k
    counts = []
    for g in grid:
        if g.r > m:
            raise ValueError(f"guess grid: {g} guesses on more than the {m} canaries")
        counts.append(GuessCount(g, int(right_in[g.in_guesses] + right_out[g.out_guesses])))
    return CanaryCounts(m, tuple(counts))
