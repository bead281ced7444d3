"""White-box gradient canaries for DP-SGD (Nasr et al. 2021; Steinke, Nasr, Jagielski 2023).

m canary gradients, each included in the training with probability 1/2. An included canary is an example like any
other: at each step it is in the batch with the training's Poisson sampling rate q, and then its gradient joins the
batch's per-sample gradients *before* the training's own clipping, with norm `norm_factor` x the clipping bound C.
A correct DP-SGD clips it to C, adds its noise and steps; an implementation that skips clipping lets it through at
full size. The audit reads each step's privatised gradient (the noisy clipped sum: what the accountant's analysis
releases, so reading it is post-processing) along each canary's direction:

    y_t = <u, noisy sum_t - known_t> / (sigma C)  ~  N(1/sigma, 1) in a step that sampled the canary, N(0, 1) else

where known_t is the sum of the batch's own examples' gradients, clipped: the auditor computes it from the model of
step t (what the earlier steps released) and which of the training's examples the step sampled (randomness that
does not involve the canaries), so subtracting it keeps the audit within what DP-SGD protects, and leaves the noise
alone around each canary (without it, the examples' gradients along a canary's direction drown a small model's
canaries). The audit scores each canary by the likelihood ratio of "Poisson-sampled at rate q" against "absent",
summed over the steps:
sum_t log(1 - q + q exp(y_t / sigma - 1 / (2 sigma^2))). The one-run bound (audit.canary.one_run) of these scores
is a lower bound on the epsilon of the training as run; the accountant's epsilon must be above it.

Directions are orthogonal, so canaries do not interfere: `dirac` puts canary i on one coordinate (a random sign),
`random` on its own block of d // m coordinates (at most 256) with a random unit direction there.

Written here rather than taken from a library: opacus has no auditing module, and the hook has to sit inside the
training's own optimizer step (between per-sample gradients and clipping) to test that step.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from audit.canary.inputs import draw_inclusion
from audit.canary.whitebox import StepStatistics
from audit.config.canary_settings import DIRAC

__all__ = ["GradientCanaries", "ROW_BUDGET_BYTES", "DEFAULT_COUNT", "resolve_count"]

# Per-sample canary rows live beside the batch's per-sample gradients for one step: refuse a design whose canary rows
# per step (the sampled canaries, with room for the draw's spread) would take more than this.
ROW_BUDGET_BYTES = 1 << 30
DEFAULT_COUNT = 10_000  # the statistical ceiling of the one-run bounds is above 8 (delta 1e-5) from about here
_MAX_BLOCK = 256
_BATCH_ROOM = 64  # rows for the training's own batch in the buffer, before it has to grow


def _canary_rows(m: int, sample_rate: float) -> int:
    """Rows to hold the included canaries a step samples: the mean of Binomial(m / 2, q) plus 6 standard
    deviations (the buffer grows in the rare step that needs more)."""
    mean = sample_rate * m / 2
    return int(math.ceil(mean + 6 * math.sqrt(mean * (1 - sample_rate)) + 4))


def resolve_count(requested: int | None, trainable_values: int, sample_rate: float) -> int:
    """The canaries of a check: `requested`, or (None) `DEFAULT_COUNT` capped at one per trainable value and at the
    row budget (the rows of the canaries a step samples; the step's own batch is copied beside them). Raises
    ValueError for a count the model or the budget cannot hold, and when not even two canaries fit."""
    d = int(trainable_values)

    def size(m: int) -> int:
        return _canary_rows(m, sample_rate) * d * 4

    if requested is None:
        m = min(DEFAULT_COUNT, d)
        while m > 2 and size(m) > ROW_BUDGET_BYTES:
            m = max(2, int(m * 0.8))
        if size(m) > ROW_BUDGET_BYTES:
            raise ValueError(f"gradient canaries: the rows of even {m} canaries of {d} values exceed "
                             f"{ROW_BUDGET_BYTES >> 20} MiB; this model is too large for the DP check "
                             "(audit.canary.dp_check: false)")
        return m
    if requested > d:
        raise ValueError(f"gradient canaries: {requested} orthogonal canaries need as many coordinates; the model "
                         f"has {d} trainable values")
    if size(requested) > ROW_BUDGET_BYTES:
        raise ValueError(f"gradient canaries: about {_canary_rows(requested, sample_rate)} rows of {d} values per "
                         f"step exceed {ROW_BUDGET_BYTES >> 20} MiB; use fewer canaries")
    return int(requested)


class GradientCanaries:
    """m gradient canaries for one DP-SGD training: `before_step(optimizer)` inserts the sampled included canaries'
    gradients among the per-sample gradients, `after_step(optimizer)` reads the privatised gradient; `scores()`
    then ranks them (higher: more likely included) and `statistics()` sums the per-step observations. `count` None:
    `resolve_count`'s default, known at `start`. `included` is the private draw (after `start`)."""

    def __init__(self, count: int | None = None, *, kind: str = DIRAC, norm_factor: float = 10.0, seed: int = 0):
        if count is not None and count < 1:
            raise ValueError(f"gradient canaries: m must be >= 1, got {count}")
        if not norm_factor >= 1:
            raise ValueError(f"gradient canaries: norm_factor must be >= 1 (clipping bounds), got {norm_factor}")
        self.requested, self.kind, self.norm_factor, self.seed = count, kind, float(norm_factor), int(seed)
        self.m = None if count is None else int(count)
        self.included = None if count is None else draw_inclusion(self.m, self.seed)
        self._rng = np.random.default_rng([self.seed, 1])
        self._started = False
        self.steps = 0

    def start(self, params: list[torch.Tensor], *, sample_rate: float, noise_multiplier: float,
              max_grad_norm: float) -> None:
        """Lay the canaries out over the trainable parameters `params` (the DP optimizer's, in its order) for a
        training with these DP settings (the claimed ones: what the accountant is told)."""
        if not (0 < sample_rate <= 1 and noise_multiplier > 0 and max_grad_norm > 0):
            raise ValueError(f"gradient canaries: need 0 < sample_rate <= 1, noise_multiplier > 0 and "
                             f"max_grad_norm > 0, got {sample_rate}, {noise_multiplier}, {max_grad_norm}")
        self.params = list(params)
        self.sizes = [p.numel() for p in self.params]
        d = sum(self.sizes)
        self.m = resolve_count(self.requested, d, sample_rate)
        self.included = draw_inclusion(self.m, self.seed)
        self.sampled = np.zeros(self.m, dtype=np.int64)  # steps each canary was in the batch (private)
        rng = np.random.default_rng([self.seed, 0])
        block = 1 if self.kind == DIRAC else max(1, min(d // self.m, _MAX_BLOCK))
        coords = rng.permutation(d)[: self.m * block].reshape(self.m, block)
        if block == 1:
            weights = rng.choice([-1.0, 1.0], size=(self.m, 1))
        else:
            weights = rng.standard_normal((self.m, block))
            weights /= np.linalg.norm(weights, axis=1, keepdims=True)
        device = self.params[0].device
        self._coords = torch.as_tensor(coords, dtype=torch.long, device=device)
        self._weights = torch.as_tensor(weights, dtype=torch.float32, device=device)
        # Per parameter: (canary of each of its canary coordinates, the coordinate within it, the canary's weight).
        offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self._per_param = []
        for lo, hi in zip(offsets[:-1], offsets[1:]):
            canary, slot = np.nonzero((coords >= lo) & (coords < hi))
            self._per_param.append(tuple(torch.as_tensor(a, device=device) for a in (
                canary, coords[canary, slot] - lo, weights[canary, slot].astype(np.float32))))
        self.d, self.q = d, float(sample_rate)
        self.sigma, self.clip = float(noise_multiplier), float(max_grad_norm)
        self._lr = np.zeros(self.m)
        self._sum = np.zeros(self.m)
        self._stats = np.zeros(6)  # noise: count, sums of y and y^2; signal: the same
        self._known = torch.zeros(self.m, dtype=self._weights.dtype, device=device)
        self._picked = np.zeros(self.m, dtype=bool)
        self._rows = _canary_rows(self.m, self.q) + _BATCH_ROOM
        self._buffers = [torch.zeros((self._rows, *p.shape), dtype=p.dtype, device=p.device) for p in self.params]
        self._written: list = []  # what the last step wrote into the buffers, to clear after it
        self._started = True

    def before_step(self, optimizer) -> None:
        """Add this step's sampled included canaries to the per-sample gradients the DP optimizer will clip."""
        if not self._started:
            raise RuntimeError("gradient canaries: start() was not called before the training's first step")
        self._known = self._clipped_batch_along_canaries()
        self._picked = self.included & (self._rng.random(self.m) < self.q)
        picked = np.flatnonzero(self._picked)
        self.sampled[picked] += 1
        if not len(picked):
            return
        k = len(picked)
        row_of = torch.full((self.m,), -1, dtype=torch.long, device=self._coords.device)
        row_of[torch.as_tensor(picked, dtype=torch.long, device=row_of.device)] = torch.arange(k, device=row_of.device)
        batch = self._batch_size()
        if batch + k > self._rows:  # a rare draw: grow the buffers (cleared, as they always are between steps)
            self._rows = batch + k + _BATCH_ROOM
            self._buffers = [torch.zeros((self._rows, *p.shape), dtype=p.dtype, device=p.device)
                             for p in self.params]
        self._written = []
        for p, buffer, (canary, local, weight) in zip(self.params, self._buffers, self._per_param):
            current = getattr(p, "grad_sample", None)
            if current is not None:
                current = torch.cat(current) if isinstance(current, list) else current
                buffer[:batch].copy_(current)
            rows = row_of[canary] if len(canary) else canary
            take = rows >= 0
            flat = buffer.view(self._rows, -1)
            entries = (batch + rows[take], local[take])
            flat[entries] = (weight[take] * (self.norm_factor * self.clip)).to(buffer.dtype)
            self._written.append((batch, entries))
            p.grad_sample = buffer[:batch + k]

    def _batch_size(self) -> int:
        for p in self.params:
            current = getattr(p, "grad_sample", None)
            if current is not None:
                return int(sum(len(g) for g in current)) if isinstance(current, list) else int(len(current))
        return 0

    def _clipped_batch_along_canaries(self) -> torch.Tensor:
        """The batch's own per-sample gradients, clipped as DP-SGD must clip them, summed, along each canary (m,).
        Parameter by parameter: no (batch, d) copy of the per-sample gradients."""
        zeros = torch.zeros(self.m, dtype=self._weights.dtype, device=self._coords.device)
        grads = []
        for p in self.params:
            g = getattr(p, "grad_sample", None)
            if g is None:
                return zeros
            g = torch.cat(g) if isinstance(g, list) else g
            grads.append(g.reshape(g.shape[0], -1).to(self._weights.dtype))
        if not grads or not grads[0].shape[0]:
            return zeros
        norms = torch.stack([g.norm(dim=1) for g in grads], dim=1).norm(dim=1)
        factor = (self.clip / (norms + 1e-6)).clamp(max=1.0)  # opacus' own clipping factor
        along = torch.zeros((grads[0].shape[0], self.m), dtype=self._weights.dtype, device=self._coords.device)
        for g, (canary, local, weight) in zip(grads, self._per_param):
            if len(canary):
                along.index_add_(1, canary, g[:, local] * weight)
        return (factor[:, None] * along).sum(dim=0)

    def after_step(self, optimizer) -> None:
        """Read the step's privatised gradient along every canary's direction and add to its score."""
        scale = float(optimizer.expected_batch_size) if getattr(optimizer, "loss_reduction", "mean") == "mean" else 1.0
        flat = torch.cat([p.grad.detach().reshape(-1) for p in self.params]).to(self._weights.dtype)
        along = (flat[self._coords] * self._weights).sum(dim=1) * scale - self._known
        y = (along / (self.sigma * self.clip)).double().cpu().numpy()
        if self.q >= 1:
            self._lr += y / self.sigma - 1 / (2 * self.sigma ** 2)
        else:
            self._lr += np.logaddexp(math.log1p(-self.q), math.log(self.q) + y / self.sigma - 1 / (2 * self.sigma ** 2))
        self._sum += y
        noise, signal = y[~self._picked], y[self._picked]
        self._stats += [len(noise), noise.sum(), noise @ noise, len(signal), signal.sum(), signal @ signal]
        for buffer, (batch, entries) in zip(self._buffers, self._written):  # the buffers are all zero again
            buffer[:batch].zero_()
            buffer.view(self._rows, -1)[entries] = 0
        self._written = []
        self.steps += 1

    def statistics(self) -> StepStatistics:
        """The sums of the per-step observations for the white-box estimate (audit.canary.whitebox)."""
        s = self._stats
        return StepStatistics(int(s[0]), float(s[1]), float(s[2]), int(s[3]), float(s[4]), float(s[5]))

    def scores(self, statistic: str = "likelihood_ratio") -> np.ndarray:
        """Each canary's score over the steps run: the likelihood ratio (default) or the plain sum of y_t."""
        if statistic not in ("likelihood_ratio", "sum"):
            raise ValueError(f"gradient canaries: unknown statistic {statistic!r}")
        return (self._lr if statistic == "likelihood_ratio" else self._sum).copy()
