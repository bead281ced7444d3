"""What a DP claim says, as a family of mechanisms indexed by their noise multiplier, and the search for the least
noise the canaries reject.

A claim is "this training is DP-SGD with noise multiplier sigma, Poisson rate q, T steps" (or "a Gaussian mechanism
of sensitivity s with noise sigma", or, without any DP claim, "mu-Gaussian DP"). The family holds every noise
multiplier of the same kind: more noise is more private (the larger noise is a post-processing of the smaller, so the
curves are nested), and a test that rejects one member rejects every noisier one. The audit's figure is the least
noise it rejects, sigma*, stated in the claim's own units: the accountant's epsilon of sigma* (the epsilon of
`family.epsilon`): "the training is less private than the claimed mechanism would be with noise sigma*, whose
accountant's epsilon is this". It is above the claim's own epsilon exactly when the claim itself is rejected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from audit.canary.accountant import dp_sgd_epsilon, gaussian_epsilon
from audit.canary.tradeoff import GaussianDP, gdp_epsilon, subsampled_gaussian

__all__ = ["Family", "dp_sgd_family", "gaussian_family", "gdp_family", "least_rejected_noise", "on_grid",
           "CEILING_TOLERANCE", "CEILING_LOWEST"]

DP_SGD, GAUSSIAN, GDP = "dp_sgd", "gaussian", "gdp"
# The search for sigma*: noise multipliers in [_LOWEST, _HIGHEST] x the family's scale, to a relative tolerance.
_LOWEST, _HIGHEST, _TOLERANCE = 1e-2, 1e3, 5e-3
# A ceiling needs no more digits, nor noise below a sixteenth of the claim's (its epsilon is then "at least" that).
CEILING_TOLERANCE, CEILING_LOWEST = 0.05, 1 / 16


@dataclass(frozen=True)
class Family:
    """Mechanisms of one kind indexed by the noise multiplier; `curve(noise)` their trade-off (an upper bound on a
    test's true-positive rate), `epsilon(noise, delta)` the epsilon the claim's accountant gives them."""

    kind: str                 # DP_SGD, GAUSSIAN (sensitivity / noise, composed `steps` times) or GDP (mu = 1 / noise)
    sample_rate: float = 1.0  # DP_SGD: the Poisson rate
    steps: int = 1            # DP_SGD: steps; GAUSSIAN: releases
    sensitivity: float = 1.0  # GAUSSIAN: in clipping bounds (dp_fedavg: 2)

    def curve(self, noise: float, *, coarse: bool = False):
        """`coarse`: a cheaper curve, still an upper bound but less tight (tradeoff.subsampled_gaussian), for
        figures a looser curve may only understate (the ceilings); the Gaussian ones are exact either way."""
        if self.kind == DP_SGD:
            return subsampled_gaussian(noise, self.sample_rate, self.steps, coarse=coarse)
        if self.kind == GAUSSIAN:
            return GaussianDP(self.sensitivity * math.sqrt(self.steps) / noise)
        return GaussianDP(1.0 / noise)

    def epsilon(self, noise: float | None, delta: float) -> float:
        """The accountant's epsilon of the member (opacus' RDP accountant, as the claim's), or mu-GDP's exact epsilon
        for GDP. None (no member rejected): 0."""
        if noise is None:
            return 0.0
        if self.kind == DP_SGD:
            return dp_sgd_epsilon(noise, self.sample_rate, self.steps, delta)
        if self.kind == GAUSSIAN:
            return gaussian_epsilon(noise / self.sensitivity, delta, self.steps)
        return gdp_epsilon(1.0 / noise, delta)

    def to_dict(self) -> dict:
        out = {"kind": self.kind}
        if self.kind == DP_SGD:
            out.update(sample_rate=self.sample_rate, steps=self.steps)
        elif self.kind == GAUSSIAN:
            out.update(sensitivity=self.sensitivity, releases=self.steps)
        return out


def dp_sgd_family(sample_rate: float, steps: int) -> Family:
    return Family(DP_SGD, float(sample_rate), int(steps))


def gaussian_family(sensitivity: float, releases: int = 1) -> Family:
    return Family(GAUSSIAN, steps=int(releases), sensitivity=float(sensitivity))


def gdp_family() -> Family:
    return Family(GDP)


def on_grid(noise: float, scale: float, *, up: bool = False) -> float:
    """`noise` moved to the search's grid scale x (1 + _TOLERANCE)^j (to the next point above when `up`): epsilons of
    grid points are cached across audits of the same claim. Infinite and zero noise stay as they are."""
    if not (math.isfinite(noise) and noise > 0):
        return noise
    ratio = math.log1p(_TOLERANCE)
    j = math.log(noise / scale) / ratio
    return scale * math.exp((math.ceil(j - 1e-9) if up else round(j)) * ratio)


def least_rejected_noise(rejects: Callable[[float], bool], scale: float = 1.0,
                         tolerance: float = _TOLERANCE, lowest: float = _LOWEST) -> float | None:
    """The least noise multiplier a monotone test rejects (every larger one rejected too), to a relative
    `tolerance`, the returned value itself rejected. The candidates are scale x (1 + tolerance)^j (a grid anchored at
    the claim, so that audits of the same claim meet the same curves and epsilons in the caches), searched from j = 0
    outwards by factors of about 4 until the boundary is bracketed, then by bisection over j, within
    [lowest, _HIGHEST] x `scale`. None when not even the largest is rejected; the lowest when everything is (the
    canaries resolve more than the search's range)."""
    ratio = math.log1p(tolerance)
    low_end, high_end = math.floor(math.log(lowest) / ratio), math.ceil(math.log(_HIGHEST) / ratio)
    stride = max(1, round(math.log(4.0) / ratio))

    def test(j: int) -> bool:
        return rejects(scale * math.exp(j * ratio))

    if test(0):
        hi = 0
        while True:
            if hi - stride <= low_end:
                if test(low_end):
                    return scale * math.exp(low_end * ratio)
                lo = low_end
                break
            if not test(hi - stride):
                lo = hi - stride
                break
            hi -= stride
    else:
        lo = 0
        while True:
            if lo + stride >= high_end:
                if not test(high_end):
                    return None
                hi = high_end
                break
            if test(lo + stride):
                hi = lo + stride
                break
            lo += stride
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if test(mid) else (mid, hi)
    return scale * math.exp(hi * ratio)
