"""Pairs of score distributions (members, non-members) with a known AUC, and fast simulation of the statistics the
AUC interval rests on, for the coverage tests and benchmarks/bench_interval_coverage.py.

A family is given by the members' CDF G(u) on the non-members' probability scale (u = F_nonmembers(score)): the
AUC is the integral of 1 - G over [0, 1], and only the ranks matter, so every continuous pair of distributions is one
of these. `raw` draws scores; `binned` rounds them to `levels` bins of equal non-member probability (a discrete
score with ties, e.g. a rounded loss), whose AUC (ties half) is exact, and draws the per-bin counts directly:
O(levels) per draw whatever the class sizes, which makes 1,000 draws of 10,000 samples a class cheap.

    family = FAMILIES["exponential"]
    parameter = family.parameter_for(0.99)                   # the continuous pair with AUC 0.99
    auc, pos_var, neg_var = raw_statistics(*family.raw(rng, parameter, 20, 20, draws=1000))
    binned = family.binned(0.99, levels=200)                 # (members' bin probabilities, non-members'), AUC 0.99
    auc, pos_var, neg_var = binned_statistics(rng, *binned, 10_000, 10_000, draws=1000)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import stats
from scipy.optimize import brentq
from scipy.special import betaln
from scipy.stats import rankdata

__all__ = ["Family", "FAMILIES", "rounded_loss", "exact_auc", "binned_statistics", "level_statistics",
           "raw_statistics", "placement_statistics"]


def _solve(f, lo: float, hi: float) -> float:
    """The root of an increasing f in [lo, hi] (lo itself where f(lo) is 0 up to rounding)."""
    if abs(f(lo)) < 1e-12:
        return lo
    return brentq(f, lo, hi, xtol=1e-14, rtol=1e-13)


def exact_auc(p_members: np.ndarray, p_nonmembers: np.ndarray) -> float:
    """P(member > non-member) + P(tie) / 2 for scores on ordered levels with these probabilities."""
    below = np.cumsum(p_nonmembers) - p_nonmembers
    return float((p_members * (below + p_nonmembers / 2)).sum())


@dataclass(frozen=True)
class Family:
    """members_cdf(u, parameter): G on (0, 1); members_quantile(v, parameter): its inverse (raw draws); auc: the
    continuous pair's AUC in closed form, increasing in the parameter; top_share: the share of members above every
    non-member (a point mass past u = 1)."""

    name: str
    about: str
    members_cdf: Callable[[np.ndarray, float], np.ndarray]
    members_quantile: Callable[[np.ndarray, float], np.ndarray]
    parameter_range: tuple[float, float]
    auc: Callable[[float], float]
    top_share: Callable[[float], float] = lambda parameter: 0.0

    def parameter_for(self, auc: float) -> float:
        lo, hi = self.parameter_range
        return _solve(lambda p: self.auc(p) - auc, lo, hi)

    def raw(self, rng: np.random.Generator, parameter: float, n_pos: int, n_neg: int, draws: int):
        """(members' scores (draws, n_pos), non-members' (draws, n_neg)) on the non-members' probability scale."""
        members = self.members_quantile(rng.random((draws, n_pos)), parameter)
        top = self.top_share(parameter)
        if top:
            members = np.where(rng.random((draws, n_pos)) < top, 2.0, members)
        return members, rng.random((draws, n_neg))

    def binned_at(self, parameter: float, levels: int) -> tuple[np.ndarray, np.ndarray]:
        edges = np.linspace(0.0, 1.0, levels + 1)
        cdf = np.clip(self.members_cdf(edges, parameter), 0.0, 1.0)
        cdf[0], cdf[-1] = 0.0, 1.0
        top = self.top_share(parameter)
        p_members = np.append(np.diff(cdf) * (1 - top), top)
        return p_members, np.append(np.full(levels, 1.0 / levels), 0.0)

    def binned(self, auc: float, levels: int) -> tuple[np.ndarray, np.ndarray]:
        """Bin probabilities (members, non-members) of the binned family whose exact AUC is `auc`."""
        lo, hi = self.parameter_range
        parameter = _solve(lambda p: exact_auc(*self.binned_at(p, levels)) - auc, lo, hi)
        return self.binned_at(parameter, levels)


def _shift(dist):
    """Location shift d of a continuous distribution: G(u) = F(F^-1(u) - d)."""
    return (lambda u, d: dist.cdf(dist.ppf(u) - d)), (lambda v, d: dist.cdf(dist.ppf(v) + d))


def _beta_auc(c: float) -> float:
    """P(X > Y), X ~ Beta(c, 2), Y ~ Beta(2, c): Y's CDF is 1 - (1 - y)^c (1 + c y), so the AUC is
    1 - c(c + 1) [B(c, c + 2) + c B(c + 1, c + 2)]."""
    return 1 - c * (c + 1) * (math.exp(betaln(c, c + 2)) + c * math.exp(betaln(c + 1, c + 2)))


FAMILIES = {family.name: family for family in (
    Family("gaussian", "N(d, 1) against N(0, 1), AUC Phi(d / sqrt 2): the suite's reference", *_shift(stats.norm),
           (0.0, 40.0), auc=lambda d: float(stats.norm.cdf(d / math.sqrt(2)))),
    Family("exponential", "members Exp(scale k) against non-members Exp(1): AUC k / (1 + k)",
           lambda u, k: 1 - np.power(1 - u, 1 / k), lambda v, k: 1 - np.power(1 - v, k), (1.0, 1e6),
           auc=lambda k: k / (1 + k)),
    Family("beta", "members Beta(c, 2) against non-members Beta(2, c): scores in [0, 1]",
           lambda u, c: stats.beta.cdf(stats.beta.ppf(u, 2, c), c, 2),
           lambda v, c: stats.beta.cdf(stats.beta.ppf(v, c, 2), 2, c), (2.0, 2000.0), auc=_beta_auc),
    Family("gamma", "members Gamma(0.5, scale s) against non-members Gamma(0.5, 1): a skewed loss, AUC "
           "(2 / pi) atan(sqrt s) (the ratio is F(1, 1))",
           lambda u, s: stats.gamma.cdf(stats.gamma.ppf(u, 0.5), 0.5, scale=s),
           lambda v, s: stats.gamma.cdf(stats.gamma.ppf(v, 0.5, scale=s), 0.5), (1.0, 1e9),
           auc=lambda s: 2 / math.pi * math.atan(math.sqrt(s))),
    Family("cauchy", "Cauchy shifted by d: heavy tails, AUC 1/2 + atan(d / 2) / pi", *_shift(stats.cauchy),
           (0.0, 1e6), auc=lambda d: 0.5 + math.atan(d / 2) / math.pi),
    Family("memorised", "a share p of members above every non-member, the rest scored like non-members",
           lambda u, p: u, lambda v, p: v, (0.0, 1.0), top_share=lambda p: p, auc=lambda p: 0.5 + p / 2),
)}


def rounded_loss(auc: float, levels: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Level probabilities (members, non-members) of a loss rounded to `levels` values with this exact AUC (ties
    half): Binomial(levels - 1, q) levels, members' q = expit(s), non-members' expit(-s)."""
    k = np.arange(levels)

    def pair(s):
        return (stats.binom.pmf(k, levels - 1, 1 / (1 + math.exp(-s))),
                stats.binom.pmf(k, levels - 1, 1 / (1 + math.exp(s))))
    return pair(_solve(lambda s: exact_auc(*pair(s)) - auc, 0.0, 30.0))


def placement_statistics(v10: np.ndarray, v01: np.ndarray, w10=None, w01=None):
    """(AUC, members' placement variance, non-members'), ddof 1, per row; w: multiplicities of each placement."""
    if w10 is None:
        w10, w01 = np.ones_like(v10), np.ones_like(v01)
    m, n = w10.sum(axis=-1), w01.sum(axis=-1)
    auc = (w10 * v10).sum(axis=-1) / m
    pos_var = ((w10 * v10**2).sum(axis=-1) - m * auc**2) / (m - 1)
    neg_var = ((w01 * v01**2).sum(axis=-1) - n * auc**2) / (n - 1)
    return auc, np.maximum(pos_var, 0.0), np.maximum(neg_var, 0.0)


def raw_statistics(members: np.ndarray, nonmembers: np.ndarray):
    """Per row, from raw scores: midrank placements as audit.membership.uncertainty.placements computes them."""
    m, n = members.shape[1], nonmembers.shape[1]
    pooled = rankdata(np.concatenate([members, nonmembers], axis=1), axis=1)
    v10 = (pooled[:, :m] - rankdata(members, axis=1)) / n
    v01 = 1.0 - (pooled[:, m:] - rankdata(nonmembers, axis=1)) / m
    return placement_statistics(v10, v01)


def level_statistics(members: np.ndarray, nonmembers: np.ndarray):
    """From counts per ordered level (rows: draws): the members at a level have placement (non-members below + half
    those tied) / n, the non-members there (members above + half those tied) / m."""
    n_pos, n_neg = members.sum(axis=-1, keepdims=True), nonmembers.sum(axis=-1, keepdims=True)
    below = np.cumsum(nonmembers, axis=-1) - nonmembers
    above = n_pos - np.cumsum(members, axis=-1)
    return placement_statistics((below + nonmembers / 2) / n_neg, (above + members / 2) / n_pos, members, nonmembers)


def binned_statistics(rng: np.random.Generator, p_members, p_nonmembers, n_pos: int, n_neg: int, draws: int):
    """`level_statistics` of `draws` multinomial draws of n_pos members and n_neg non-members."""
    members = rng.multinomial(n_pos, p_members / p_members.sum(), size=draws)
    nonmembers = rng.multinomial(n_neg, p_nonmembers / p_nonmembers.sum(), size=draws)
    return level_statistics(members, nonmembers)
