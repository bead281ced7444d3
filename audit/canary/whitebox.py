"""The white-box estimate of a DP-SGD training's effective noise multiplier and clipping bound, from its gradient
canaries' per-step observations. Pure numpy / scipy: no torch.

Each step the DP check reads the privatised gradient along every canary's direction, in units of the claimed noise
(sigma C, audit.canary.gradients): y = b a + s z, with b = 1 when the step sampled the canary (the audit's own draw,
so it knows b), a the canary's clipped contribution, s the noise's standard deviation and z standard noise. A correct
DP-SGD has s = 1 and a = 1 / sigma (a canary of any norm clipped to C), so the effective noise multiplier
s / a (noise over the contribution one example can make) equals the claimed sigma. A training that adds less noise
than it tells its accountant (s < 1), or clips to more than it claims (a > 1 / sigma), shows s / a < sigma; one that
skips clipping shows a = the canary's norm.

Estimates: s from the pooled spread of both groups (in a DP-SGD the canary's contribution is a constant, so
the observations where the canary was in the step and where it was not share the noise's variance), a from the
difference of the means. Under the observation model with Gaussian noise (what a DP-SGD that adds Gaussian noise
releases, exactly), the two-sample t statistic t = (mean_1 - mean_0) / (s sqrt(1 / n_0 + 1 / n_1)) has the
noncentral t distribution with n_0 + n_1 - 2 degrees of freedom and noncentrality (a / s) / sqrt(1 / n_0 + 1 / n_1):
an exact pivot for a / s = 1 / (the effective noise multiplier), whatever the counts. The test of a claim, and each
limit of the noise multiplier's interval, invert it at the test's own level, each tail on its own; the clipping
bound's interval is Student's t interval of a. Exact, not asymptotic: the delta method, Fieller's method on
moment-based variances and the normal quantile all cover less than their level when the canaries' steps are few (a
hundred observations of the contribution), and a test shared four ways must hold its share there too.
The epsilon the accountant gives the effective noise multiplier (at the claimed sampling rate and steps: the
canaries are sampled at the claimed rate, so the estimate says nothing of the training's own sampling) is shown with
the interval the noise multiplier's gives.

The check's test: s - sigma_claimed a < 0 at the test's own share of the check's error level (the claim above the
interval: the training behaves like less noise than claimed): a correct DP-SGD trips it with that probability.
This is an estimate with an interval under the observation model above, which a Gaussian-noise DP-SGD meets
exactly, not a bound that holds for any mechanism (audit.canary.one_run, fdp, independent are those).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from scipy.optimize import brentq
from scipy.stats import nct
from scipy.stats import t as student_t

__all__ = ["StepStatistics", "Estimate", "estimate"]


@dataclass(frozen=True)
class StepStatistics:
    """Sums of the per-step observations (units of the claimed sigma C) and of their squares: `noise_*` where the
    canary was not in the step, `signal_*` where it was."""

    noise_count: int = 0
    noise_sum: float = 0.0
    noise_sum2: float = 0.0
    signal_count: int = 0
    signal_sum: float = 0.0
    signal_sum2: float = 0.0

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data) -> "StepStatistics":
        return cls(**{f.name: (int if f.name.endswith("count") else float)(data[f.name]) for f in fields(cls)})


@dataclass(frozen=True)
class Estimate:
    """The effective noise multiplier and clipping bound of the training, with intervals, and their epsilon."""

    noise_multiplier: float          # s / a: the claimed sigma when the training is as claimed
    noise_interval: tuple[float, float]
    clipping_bound: float            # a sigma C: the claimed C when the training clips as claimed
    clipping_interval: tuple[float, float]
    noise_std: float                 # s (pooled): 1 when the training adds the claimed noise (units of sigma C)
    noise_mean_z: float              # the noise's mean along the canaries over its standard error: about N(0, 1)
    epsilon: float                   # the accountant's epsilon of the effective noise multiplier
    epsilon_interval: tuple[float, float]
    claimed_noise_multiplier: float
    claim_rejected: bool             # the claim above the noise multiplier's upper limit
    alpha: float                     # the test's one-sided level (the interval is two-sided at 1 - 2 alpha)
    counts: tuple[int, int]          # observations of noise, of signal

    def summary(self) -> str:
        lo, hi = self.noise_interval
        return (f"the training behaves like noise multiplier {self.noise_multiplier:.3g} [{lo:.3g}, {hi:.3g}] "
                f"(claimed {self.claimed_noise_multiplier:.3g})")

    def to_dict(self) -> dict:
        def finite(v):
            return v if math.isfinite(v) else None

        return {"noise_multiplier": finite(self.noise_multiplier),
                "noise_interval": [finite(v) for v in self.noise_interval],
                "clipping_bound": self.clipping_bound, "clipping_interval": list(self.clipping_interval),
                "noise_std": self.noise_std, "noise_mean_z": self.noise_mean_z, "epsilon": finite(self.epsilon),
                "epsilon_interval": [finite(v) for v in self.epsilon_interval],
                "claimed_noise_multiplier": self.claimed_noise_multiplier, "claim_rejected": self.claim_rejected,
                "alpha": self.alpha, "noise_observations": self.counts[0], "signal_observations": self.counts[1],
                "summary": self.summary()}


def estimate(stats: StepStatistics, *, noise_multiplier: float, max_grad_norm: float, epsilon_of,
             alpha: float) -> Estimate | None:
    """The estimate from `stats` for a training claiming (noise_multiplier, max_grad_norm); `epsilon_of(sigma, up)`
    the accountant's epsilon of a noise multiplier (at the claimed rate, steps and delta; `up`: it may round the noise
    up, not down, as the interval's lower epsilon must not grow). None without two noise and two signal
    observations."""
    n0, n1 = stats.noise_count, stats.signal_count
    if n0 < 2 or n1 < 2:
        return None
    mean0, mean1 = stats.noise_sum / n0, stats.signal_sum / n1
    squares0 = max(stats.noise_sum2 - n0 * mean0 ** 2, 0.0)
    squares1 = max(stats.signal_sum2 - n1 * mean1 ** 2, 0.0)
    df = n0 + n1 - 2
    s = math.sqrt((squares0 + squares1) / df)
    a = mean1 - mean0
    k = math.sqrt(1 / n0 + 1 / n1)  # the difference of the means' standard deviation, in units of s
    claimed = float(noise_multiplier)
    if s > 0:
        sigma = s / a if a > 0 else math.inf
        t = a / (s * k)
        # the claim (a / s <= 1 / claimed, noise at least the claim's share of the contribution) rejected at alpha:
        # the noncentral t's upper tail at the claim's noncentrality
        rejected = bool(1 - _below(t, df, 1 / (claimed * k)) < alpha)
        interval = _ratio_interval(t, df, k, alpha)
    else:  # no noise at all along the canaries: any positive contribution is infinitely many noise units
        sigma = 0.0 if a > 0 else math.inf
        rejected = a > 0
        interval = (sigma, sigma) if a > 0 else (0.0, math.inf)
    scale = claimed * max_grad_norm  # the observations' unit
    clip = a * scale
    clip_half = float(student_t.isf(alpha, df)) * s * k * scale
    eps = epsilon_of(sigma, False) if math.isfinite(sigma) else 0.0
    eps_interval = (epsilon_of(interval[1], True) if math.isfinite(interval[1]) else 0.0,
                    epsilon_of(interval[0], False) if math.isfinite(interval[0]) and interval[0] > 0 else math.inf)
    spread0 = math.sqrt(squares0 / (n0 - 1))
    return Estimate(sigma, interval, clip, (clip - clip_half, clip + clip_half), s,
                    mean0 / (spread0 / math.sqrt(n0)) if spread0 > 0 else 0.0, eps, eps_interval, claimed, rejected,
                    float(alpha), (n0, n1))


def _ratio_interval(t: float, df: int, k: float, alpha: float) -> tuple[float, float]:
    """The noise multiplier's interval s / a from the noncentral t pivot: the a / s whose noncentrality
    (a / s) / k puts the observed t at the alpha quantile (the lower limit of a / s, so the upper limit of the noise
    multiplier) and at the 1 - alpha quantile. Unbounded above when a is not significantly positive."""
    def noncentrality(excess) -> float:
        # the root of excess(nc), which grows with nc: bracketed by widening around t (T's spread is about
        # sqrt(1 + nc^2 / (2 df)), with Student's tails at few degrees of freedom)
        width = 10 * math.sqrt(1 + t * t / (2 * df)) * float(student_t.isf(alpha, df)) + 1
        lo, hi = t - width, t + width
        while excess(lo) > 0:
            lo -= width
            width *= 2
        while excess(hi) < 0:
            hi += width
            width *= 2
        return brentq(excess, lo, hi, xtol=1e-12 * max(1.0, abs(t)), rtol=1e-12)

    upper_nc = noncentrality(lambda nc: alpha - _below(t, df, nc))  # P(T <= t) = alpha: the largest a / s
    if upper_nc <= 0:
        return (0.0, math.inf)
    lower_nc = noncentrality(lambda nc: 1 - _below(t, df, nc) - alpha)  # P(T >= t) = alpha: the smallest a / s
    return (1 / (upper_nc * k), 1 / (lower_nc * k) if lower_nc > 0 else math.inf)


def _below(t: float, df: int, nc: float) -> float:
    """P(T <= t) for T noncentral t (df, nc). scipy's (Boost's) series returns NaN tens of standard deviations out in
    a tail, where the probability is 0 or 1 to double precision: the side of t that nc is on says which."""
    value = float(nct.cdf(t, df, nc))
    if math.isnan(value):
        return 0.0 if nc > t else 1.0
    return value
