"""Trade-off curves (f-DP, Dong, Roth and Su 2019) of the mechanisms a canary audit tests, as upper bounds on the
true-positive rate any membership test can reach at a given false-positive rate. Pure numpy / scipy: no torch.

A mechanism M is f-DP when every test of "canary out" against "canary in" with false-positive rate a has
true-positive rate at most 1 - f(a). `tpr(a)` is that ceiling, `fpr_for(t)` its inverse (the least false-positive
rate that reaches t; Mahloujifar et al.'s inverse blow-up function). An audit rejects a hypothesised curve when the
canaries do better than it allows, so every curve here errs on the generous side (a higher ceiling): a rejection
stays valid.

- `GaussianDP(mu)`: mu-Gaussian DP, exact: tpr(a) = Phi(Phi^-1(a) + mu). The Gaussian mechanism with sensitivity s
  and noise sigma is (s / sigma)-GDP.
- `subsampled_gaussian(noise_multiplier, sample_rate, steps)`: DP-SGD as its accountant analyses it (Poisson
  subsampling at `sample_rate`, Gaussian noise of `noise_multiplier` clipping bounds, `steps` steps), from the
  canary's side ("in": the mixture (1 - q) N(0, 1) + q N(1/sigma, 1) each step, "out": N(0, 1)). Computed from the
  privacy-loss distribution: each step's loss is rounded up to a grid (a pair that dominates the mechanism: it can
  be post-processed into it), composed by FFT, and every numerical error (the tail beyond the grid, the circular
  FFT's wrap-around, float rounding) is bounded and added to the ceiling; the rounding up biases the loss upwards by
  at most `steps` x the grid step (`_BIAS` nats in all). tests/test_canary_fdp.py checks it against the closed form
  of one step and the central limit of many.

Written here: opacus' PRV accountant computes the same privacy-loss distribution, but for epsilon at one delta, not
the whole curve with its error bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from scipy.special import log_ndtr, ndtr, ndtri

__all__ = ["GaussianDP", "PiecewiseTradeOff", "subsampled_gaussian", "gdp_epsilon", "curve_epsilon"]

# Grid of the privacy loss: at most this many points in the composed distribution's window (an FFT of 2^21 float64
# is ~0.1 s and 50 MB), and the loss grid step at most _BIAS / steps (the rounding up adds at most that in all).
_MAX_POINTS = 1 << 21
_BIAS = 0.01
# The coarse curves (`coarse=True`, for ceilings): a grid 16 times coarser and windows 16 times smaller, 5-10x cheaper
# (the fine grid's window is still laid out, for its margins). Still upper bounds on the true-positive rate (the same
# rounding up, every error bounded the same way), looser than the fine curves (`_coarse`).
_COARSE_MAX_POINTS = 1 << 17
_COARSE_BIAS = 0.16
# Per-step tail of the "in" distribution put on an infinite loss (counted as a test that always detects it), and the
# probability mass the composed window may leave out (bounded by Chernoff, added to the ceiling).
_STEP_TAIL = 1e-16
_WINDOW_TAIL = 1e-6
_BLOCK = 64  # grid points per block of the tail bound's moment function
_FAR_MASS = 1e-7  # the "in" mass of all steps' far tails given an infinite loss (added to the ceiling)
_KEPT_POINTS = 20_000  # points a cached curve keeps


@dataclass(frozen=True)
class GaussianDP:
    """mu-Gaussian differential privacy: the trade-off of N(0, 1) against N(mu, 1)."""

    mu: float

    def tpr(self, fpr: float) -> float:
        if fpr <= 0:
            return 0.0
        if fpr >= 1:
            return 1.0
        return float(ndtr(ndtri(fpr) + self.mu))

    def fpr_for(self, tpr: float) -> float:
        if tpr <= 0:
            return 0.0
        if tpr >= 1:
            return 1.0
        return float(ndtr(ndtri(tpr) - self.mu))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The epsilon at `delta` of mu-Gaussian DP (Dong, Roth and Su, Corollary 2.13):
    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    from scipy.optimize import brentq

    if not mu > 0:
        return 0.0
    if math.isinf(mu):
        return math.inf

    def gap(eps):  # in logs: e^eps Phi(.) overflows for a large mu's epsilon
        head = float(log_ndtr(-eps / mu + mu / 2))
        tail = eps + float(log_ndtr(-eps / mu - mu / 2))
        return (math.exp(head) * -math.expm1(tail - head) if tail < head else 0.0) - delta

    if gap(0.0) <= 0:
        return 0.0
    hi = max(1.0, mu * mu)
    while gap(hi) > 0:
        hi *= 2
    return float(brentq(gap, 0.0, hi, xtol=1e-9))


def curve_epsilon(curve, delta: float) -> float:
    """The least epsilon with TPR <= e^eps FPR + delta on the whole curve: the mechanism's own (epsilon, delta) for
    the "canary out against in" direction (for a computed DP-SGD curve, above the true one by at most its grid's
    bias; mu-GDP's exactly, by `gdp_epsilon`)."""
    if isinstance(curve, GaussianDP):
        return gdp_epsilon(curve.mu, delta)
    fpr, tpr = curve.fpr, np.minimum(curve.tpr_points + curve.tpr_margin, 1.0)
    lo, hi = 0.0, 1.0
    while np.max(tpr - math.exp(hi) * fpr) > delta:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-9 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.max(tpr - math.exp(mid) * fpr) > delta else (lo, mid)
    return hi


@dataclass(frozen=True)
class PiecewiseTradeOff:
    """A curve given by its points (false-positive rate, true-positive rate), both increasing, joined linearly (the
    randomised likelihood-ratio tests between them), with margins that bound its numerical error: the ceiling is
    read `fpr_margin` to the right and raised by `tpr_margin`."""

    fpr: np.ndarray
    tpr_points: np.ndarray
    tpr_margin: float
    fpr_margin: float
    losses: np.ndarray | None = None  # each point's likelihood-ratio threshold (log; the test "loss >= it")

    def tpr(self, fpr: float) -> float:
        if fpr <= 0 and self.tpr_margin == 0:
            return 0.0
        x = min(1.0, max(0.0, fpr) + self.fpr_margin)
        return float(min(1.0, np.interp(x, self.fpr, self.tpr_points) + self.tpr_margin))

    def fpr_for(self, tpr: float) -> float:
        x = tpr - self.tpr_margin
        if x <= 0:
            return 0.0
        if x >= 1:
            return 1.0
        i = int(np.searchsorted(self.tpr_points, x, side="left"))  # first point with tpr >= x
        if i == 0:
            return 0.0
        t0, t1 = self.tpr_points[i - 1], self.tpr_points[i]
        f0, f1 = self.fpr[i - 1], self.fpr[i]
        at = f0 + (f1 - f0) * (x - t0) / (t1 - t0) if t1 > t0 else f0
        return float(max(0.0, at - self.fpr_margin))


def subsampled_gaussian(noise_multiplier: float, sample_rate: float, steps: int, *,
                        coarse: bool = False) -> "PiecewiseTradeOff | GaussianDP":
    """The trade-off curve of `steps` Poisson-subsampled Gaussian steps (DP-SGD seen from one example), an upper
    bound on the true-positive rate with every numerical error included (see the module). `coarse`: on a coarser
    loss grid (`_COARSE_BIAS` nats of rounding in all, `_COARSE_MAX_POINTS`), cheaper and still an upper bound, less
    tight by about that bias."""
    if not (noise_multiplier > 0 and 0 < sample_rate <= 1 and steps >= 1):
        raise ValueError(f"subsampled_gaussian: need noise_multiplier > 0, 0 < sample_rate <= 1 and steps >= 1, got "
                         f"{noise_multiplier}, {sample_rate}, {steps}")
    if sample_rate == 1:  # every step samples the canary: `steps` Gaussian mechanisms, sqrt(steps)/sigma-GDP
        return GaussianDP(math.sqrt(steps) / noise_multiplier)
    if not coarse:
        return _fine(float(noise_multiplier), float(sample_rate), int(steps))
    return _coarse(float(noise_multiplier), float(sample_rate), int(steps))


@lru_cache(maxsize=64)
def _fine(sigma: float, q: float, steps: int) -> PiecewiseTradeOff:
    return _subsampled_gaussian(sigma, q, steps, _BIAS, _MAX_POINTS)


@lru_cache(maxsize=128)  # apart from the fine curves: a check's coarse curves do not push its fine ones out
def _coarse(sigma: float, q: float, steps: int) -> PiecewiseTradeOff:
    """The coarse curve, looser than the fine one of the same mechanism: its grid step is 16 of the fine one's (the
    same origin, where neither window widens its grid), so its rounded-up pair is the fine pair rounded up further (a
    post-processing: a higher ceiling);
    its margins are raised to the fine curve's (read from the fine grid's window alone, without its FFT), since the
    smaller FFT's rounding bound is smaller than the larger one's."""
    curve = _subsampled_gaussian(sigma, q, steps, _COARSE_BIAS, _COARSE_MAX_POINTS)
    _, _, _, _, beyond, _, size, tail_in, tail_out = _window(sigma, q, steps, _BIAS, _MAX_POINTS)
    tpr_margin, fpr_margin = _margins(steps, beyond, size, tail_in, tail_out)
    return replace(curve, tpr_margin=max(curve.tpr_margin, tpr_margin), fpr_margin=max(curve.fpr_margin, fpr_margin))


def _loss_range(sigma: float, q: float) -> tuple[float, float]:
    """One step's privacy loss log(dP_in/dP_out) lies above log(1 - q) (the step did not sample the canary); the
    grid stops where the "in" mass beyond it is `_STEP_TAIL`."""
    y_top = float(-ndtri(_STEP_TAIL)) + 1 / sigma
    lo = math.log1p(-q)
    return lo, math.log1p(-q + q * math.exp(min(y_top / sigma - 0.5 / sigma ** 2, 700.0)))


def _step_losses(sigma: float, q: float, h: float) -> tuple[float, np.ndarray, float]:
    """One step's privacy loss rounded up to the grid lo + k h: the "in" masses of the grid points, and the "in"
    mass beyond the last one (given an infinite loss)."""
    lo, top = _loss_range(sigma, q)
    edges = lo + h * np.arange(int(math.ceil((top - lo) / h)) + 1)
    with np.errstate(divide="ignore"):
        ratio = np.expm1(edges - lo) * (1 - q) / q   # (e^loss - (1 - q)) / q = exp(y / sigma - 1 / (2 sigma^2))
        y = np.where(ratio > 0, sigma * np.log(np.where(ratio > 0, ratio, 1.0)) + 0.5 / sigma, -np.inf)
    # P_in(edge_{k-1} < loss <= edge_k): each component's mass from whichever of its tails keeps it exact
    mass = (1 - q) * _between(y[:-1], y[1:]) + q * _between(y[:-1] - 1 / sigma, y[1:] - 1 / sigma)
    beyond = (1 - q) * float(ndtr(-y[-1])) + q * float(ndtr(1 / sigma - y[-1]))
    return lo, np.concatenate([[0.0], np.clip(mass, 0.0, None)]), beyond


def _between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """P(a < Z <= b) for a standard normal Z, without the cancellation of a difference of two CDFs near 1."""
    return np.where(a >= 0, ndtr(-a) - ndtr(-b), ndtr(b) - ndtr(a))


def _tail_bound(masses: np.ndarray, steps: int, lower: float, upper: float) -> float:
    """A bound on the mass of sum_t k_t outside [lower, upper) when each k_t has the (sub-)masses `masses` on
    0, 1, ..: the chance that some step lands beyond half the room to the edge (a union bound), plus Chernoff for the
    steps that do not, over a grid of exponents, each step's moment function bounded on blocks of
    `_BLOCK` grid points (the block's far end) to keep it cheap."""
    total = float(np.sum(masses))
    if total <= 0:
        return 0.0
    k = np.arange(len(masses), dtype=np.float64)
    mean = float(np.sum(masses * k) / total)
    spread = math.sqrt(max(float(np.sum(masses * (k - mean) ** 2) / total), 1.0))
    upper_tail = np.cumsum(masses[::-1])[::-1]  # mass at or above each index
    lower_tail = np.cumsum(masses)              # mass at or below each index
    bound = 0.0
    for side, edge in ((1.0, upper), (-1.0, lower)):
        if (side > 0 and edge > steps * (len(masses) - 1)) or (side < 0 and edge <= 0):
            continue  # the sum cannot go beyond this edge
        # a step beyond half the room to the edge is counted as escaping (union bound); Chernoff for the rest
        if side > 0:
            far = min(len(masses), max(1, int(mean + (edge - steps * mean) / 2)))
            kept, offset = masses[:far], 0
            bound += steps * (float(upper_tail[far]) if far < len(masses) else 0.0)
        else:
            near = min(len(masses) - 1, max(0, int(math.ceil(mean - (steps * mean - edge) / 2))))
            kept, offset = masses[near:], near
            bound += steps * (float(lower_tail[near - 1]) if near > 0 else 0.0)
        pad = (-len(kept)) % _BLOCK
        sums = np.concatenate([kept, np.zeros(pad)]).reshape(-1, _BLOCK).sum(axis=1)
        with np.errstate(divide="ignore"):
            logm = np.log(sums)
        starts = offset + np.arange(len(sums), dtype=np.float64) * _BLOCK
        ends = starts + _BLOCK - 1 if side > 0 else starts
        best = 0.0
        for lam in np.geomspace(1e-3, 30.0, 60) / spread:
            log_mgf = float(np.logaddexp.reduce(logm + side * lam * ends))
            best = min(best, steps * log_mgf - side * lam * edge)
        bound += math.exp(best)
    return bound


def _window(sigma: float, q: float, steps: int, bias: float, max_points: int):
    """One step's rounded-up privacy-loss pair on its grid, and the composed window that holds all but
    `_WINDOW_TAIL` of both: (lo, h, p_in, p_out, beyond, start, size, tail_in, tail_out)."""
    lo, top = _loss_range(sigma, q)
    h = max(bias / steps, (top - lo) / max_points)
    room_spreads = 12.0  # the window around both distributions' bulk, widened until the tail bound holds
    while True:
        lo, p_in, beyond = _step_losses(sigma, q, h)
        # the far tail of one step's loss is moved to an infinite loss (the "out" part of it to a never-rejected
        # outcome): a pair that still dominates, whose composed window stays small
        tail = np.cumsum(p_in[::-1])[::-1]
        far = int(np.searchsorted(-tail, -_FAR_MASS / steps, side="right"))
        if far < len(p_in):
            beyond += float(tail[far])
            p_in = p_in[:far]
        losses = lo + h * np.arange(len(p_in))
        p_out = p_in * np.exp(-losses)  # the "out" masses of the rounded-up pair (a sub-probability)
        k = np.arange(len(p_in), dtype=np.float64)
        centres, spreads = [], []
        for m in (p_in, p_out):
            mean = float(np.sum(m * k) / np.sum(m))
            centres.append(steps * mean)
            spreads.append(math.sqrt(steps * max(float(np.sum(m * (k - mean) ** 2) / np.sum(m)), 1e-300)))
        # room for the tail bound's coarseness too (each step's moment function is bounded on blocks)
        room = room_spreads * max(spreads) + 2 * steps * _BLOCK + _BLOCK
        first = max(0.0, min(centres) - room)
        width = max(centres) - first + room
        if width > max_points:
            h *= 2 * width / max_points  # a coarser grid: more bias, the same error bounds
            continue
        size = 1 << max(10, int(math.ceil(math.log2(width))))
        start = int(math.floor(first))
        tail_in = _tail_bound(p_in, steps, start, start + size)
        tail_out = _tail_bound(p_out, steps, start, start + size)
        if max(tail_in, tail_out) <= _WINDOW_TAIL:
            break
        if room_spreads >= 200:
            raise RuntimeError(f"subsampled_gaussian({sigma}, {q}, {steps}): the loss window leaves out "
                               f"{max(tail_in, tail_out):.1e} of the mass")
        room_spreads *= 2
    return lo, h, p_in, p_out, beyond, start, size, tail_in, tail_out


def _margins(steps: int, beyond: float, size: int, tail_in: float, tail_out: float) -> tuple[float, float]:
    """The curve's error margins (true-positive rate, false-positive rate): the window's tails, the far tails put on
    an infinite loss, and the float rounding of the FFT and the sums (per value about log2(size) x steps x machine
    epsilon)."""
    rounding = size * steps * math.log2(size) * 2.2e-16
    infinite = -math.expm1(steps * math.log1p(-beyond)) if beyond < 1 else 1.0
    return tail_in + infinite + rounding, tail_out + rounding


def _subsampled_gaussian(sigma: float, q: float, steps: int, bias: float, max_points: int) -> PiecewiseTradeOff:
    lo, h, p_in, p_out, beyond, start, size, tail_in, tail_out = _window(sigma, q, steps, bias, max_points)
    composed = []
    for m in (p_in, p_out):
        folded = np.bincount(np.arange(len(m)) % size, weights=m, minlength=size)  # per-step masses mod the window
        circular = np.clip(np.fft.irfft(np.fft.rfft(folded) ** steps, size), 0.0, None)
        composed.append(np.roll(circular, -(start % size)))  # index j <-> sum_t k_t = start + j
    # Likelihood-ratio tests "loss >= threshold", from the highest threshold down: (fpr, tpr) of each.
    tpr = np.concatenate([[0.0], np.cumsum(composed[0][::-1])])
    fpr = np.concatenate([[0.0], np.cumsum(composed[1][::-1])])
    tpr, fpr = np.minimum(tpr, 1.0), np.minimum(fpr, 1.0)
    fpr = np.concatenate([fpr, [1.0]])
    tpr = np.concatenate([tpr, [1.0]])
    # the threshold of each point: +inf, then the composed grid's losses from the top, then -inf
    losses = np.concatenate([[math.inf], steps * lo + h * (start + np.arange(size - 1, -1, -1)), [-math.inf]])
    keep = np.concatenate([[True], np.diff(fpr) > 0]) | np.concatenate([[True], np.diff(tpr) > 0])
    fpr, tpr, losses = np.maximum.accumulate(fpr[keep]), np.maximum.accumulate(tpr[keep]), losses[keep]
    kept, lifted = _fewer_points(fpr, tpr)
    tpr_margin, fpr_margin = _margins(steps, beyond, size, tail_in, tail_out)
    return PiecewiseTradeOff(fpr[kept], lifted, tpr_margin=tpr_margin, fpr_margin=fpr_margin, losses=losses[kept])


def _fewer_points(fpr: np.ndarray, tpr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most about `_KEPT_POINTS` of the curve's points (spread evenly in log false-positive rate and in
    true-positive rate), each raised by the most the full curve rises above the chords next to it (the curve is
    concave: the chords lie below it), so that the coarser curve still bounds it from above. Keeps the cached
    curves small."""
    if len(fpr) <= _KEPT_POINTS:
        return np.arange(len(fpr)), tpr
    half = _KEPT_POINTS // 2
    kept = np.unique(np.concatenate([
        [0, len(fpr) - 1],
        np.minimum(np.searchsorted(fpr, np.geomspace(1e-15, 1.0, half)), len(fpr) - 1),
        np.minimum(np.searchsorted(tpr, np.linspace(0.0, 1.0, half)), len(fpr) - 1)]))
    segment = np.clip(np.searchsorted(kept, np.arange(len(fpr)), side="left"), 1, len(kept) - 1) - 1
    a, b = kept[segment], kept[segment + 1]
    width = fpr[b] - fpr[a]
    with np.errstate(invalid="ignore", divide="ignore"):
        chord = np.where(width > 0, tpr[a] + (tpr[b] - tpr[a]) * (fpr - fpr[a]) / width, tpr[b])
    rise = np.zeros(len(kept) - 1)
    np.maximum.at(rise, segment, tpr - chord)
    lift = np.maximum(np.concatenate([[0.0], rise]), np.concatenate([rise, [0.0]]))
    return kept, np.maximum.accumulate(tpr[kept] + lift)  # may pass 1 at the top: tpr() clips its answer
