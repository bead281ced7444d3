"""The white-box estimate of a DP-SGD training's effective noise multiplier and clipping bound, from its gradient
canaries' per-step observations. Pure numpy / scipy: no torch.

Each step the DP check reads the privatised gradient along every canary's direction, in units of the claimed noise
(sigma C, audit.canary.gradients): y = b a + s z, with b = 1 when the step sampled the canary (the audit's own draw,
so it knows b), a the canary's clipped contribution, s the noise's standard deviation and z standard noise. A correct
DP-SGD has s = 1 and a = 1 / sigma (a canary of any norm clipped to C), so the effective noise multiplier
s / a (noise over the contribution one example can make) equals the claimed sigma. A training that adds less noise
than it tells its accountant (s < 1), or clips to more than it claims (a > 1 / sigma), shows s / a < sigma; one that
skips clipping shows a = the canary's norm.

Estimates: s from the observations where the canary was not in the step (every excluded canary, and the included
ones' other steps), a from the difference of the means where it was and where it was not; their variances by the
central limit theorem with the data's own moments (s's from the fourth moment: no normality assumed), and the
interval of s / a by Fieller's method (the ratio's own interval: the delta method on log(s / a) undercovers when a is
known to only a few percent, as with a few hundred canaries). With m canaries over T steps the counts are about m T
and q m T / 2 (a million and a hundred thousand at m = 10,000, T = 140, q = 1/7), where these intervals are exact to
well below their width.
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

from scipy.stats import norm

__all__ = ["StepStatistics", "Estimate", "estimate"]


@dataclass(frozen=True)
class StepStatistics:
    """Sums of the per-step observations (units of the claimed sigma C): `noise_*` where the canary was not in the
    step (powers 1 to 4), `signal_*` where it was (powers 1 and 2)."""

    noise_count: int = 0
    noise_sum: float = 0.0
    noise_sum2: float = 0.0
    noise_sum3: float = 0.0
    noise_sum4: float = 0.0
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
    noise_std: float                 # s: 1 when the training adds the claimed noise (units of sigma C)
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
    mean0 = stats.noise_sum / n0
    var0 = max(stats.noise_sum2 / n0 - mean0 ** 2, 0.0) * n0 / (n0 - 1)
    # central moments of the noise observations: the variance estimate's own variance needs the fourth
    m2 = stats.noise_sum2 / n0 - mean0 ** 2
    m3 = stats.noise_sum3 / n0 - 3 * mean0 * stats.noise_sum2 / n0 + 2 * mean0 ** 3
    m4 = (stats.noise_sum4 / n0 - 4 * mean0 * stats.noise_sum3 / n0 + 6 * mean0 ** 2 * stats.noise_sum2 / n0
          - 3 * mean0 ** 4)
    mean1 = stats.signal_sum / n1
    var1 = max(stats.signal_sum2 / n1 - mean1 ** 2, 0.0) * n1 / (n1 - 1)
    s = math.sqrt(var0)
    a = mean1 - mean0
    var_a = var1 / n1 + var0 / n0
    var_s = max(m4 - m2 ** 2, 0.0) / (4 * m2 * n0) if m2 > 0 else math.inf  # the delta method on sqrt(s^2)
    cov_sa = -m3 / (2 * s * n0) if s > 0 else 0.0  # a holds -mean0, which covaries with s through the third moment
    z = float(norm.isf(alpha))
    claimed = float(noise_multiplier)
    sigma = s / a if a > 0 else math.inf
    interval = _fieller(s, a, var_s, var_a, cov_sa, z)
    # The test: s - claimed a >= 0 (noise at least the claim's share of the contribution) rejected at alpha.
    spread = math.sqrt(max(var_s + claimed ** 2 * var_a - 2 * claimed * cov_sa, 0.0))
    rejected = bool(spread > 0 and (s - claimed * a) / spread < -z)
    scale = claimed * max_grad_norm  # the observations' unit
    clip = a * scale
    clip_half = z * math.sqrt(var_a) * scale
    eps = epsilon_of(sigma, False) if math.isfinite(sigma) else 0.0
    eps_interval = (epsilon_of(interval[1], True) if math.isfinite(interval[1]) else 0.0,
                    epsilon_of(interval[0], False) if math.isfinite(interval[0]) and interval[0] > 0 else math.inf)
    return Estimate(sigma, interval, clip, (clip - clip_half, clip + clip_half), s,
                    mean0 / math.sqrt(var0 / n0) if var0 > 0 else 0.0, eps, eps_interval, claimed, rejected,
                    float(alpha), (n0, n1))


def _fieller(s: float, a: float, var_s: float, var_a: float, cov: float, z: float) -> tuple[float, float]:
    """Fieller's interval for the ratio s / a: the r with (s - r a)^2 <= z^2 Var(s - r a), the roots of a quadratic
    (an exact pivot for jointly normal estimates; the delta method on log(s / a) undercovers when a is known to
    only a few percent). Unbounded above when a is not significantly positive."""
    lead = a * a - z * z * var_a
    half = s * a - z * z * cov
    const = s * s - z * z * var_s
    if lead <= 0 or a <= 0:
        return (0.0, math.inf)
    root = math.sqrt(max(half * half - lead * const, 0.0))
    return (max((half - root) / lead, 0.0), (half + root) / lead)

