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

from audit.config.canary_settings import DIRAC
from audit.canary.inputs import draw_inclusion

__all__ = ["GradientCanaries", "ROW_BUDGET_BYTES"]

# Per-sample canary rows live beside the batch's per-sample gradients for one step: refuse a design whose expected
# rows per step would take more than this (a large model with many canaries and a high sampling rate).
ROW_BUDGET_BYTES = 1 << 30
_MAX_BLOCK = 256


class GradientCanaries:
    """m gradient canaries for one DP-SGD training: `before_step(optimizer)` inserts the sampled included canaries'
    gradients among the per-sample gradients, `after_step(optimizer)` reads the privatised gradient; `scores()`
    then ranks them (higher: more likely included). `included` is the private draw."""

    def __init__(self, m: int, *, kind: str = DIRAC, norm_factor: float = 10.0, seed: int = 0):
        if m < 1:
            raise ValueError(f"gradient canaries: m must be >= 1, got {m}")
        if not norm_factor >= 1:
            raise ValueError(f"gradient canaries: norm_factor must be >= 1 (clipping bounds), got {norm_factor}")
        self.m, self.kind, self.norm_factor, self.seed = int(m), kind, float(norm_factor), int(seed)
        self.included = draw_inclusion(self.m, self.seed)
        self._rng = np.random.default_rng([self.seed, 1])
        self._started = False
        self.steps = 0
        self.sampled = np.zeros(self.m, dtype=np.int64)  # steps each canary was in the batch (private)

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
        if self.m > d:
            raise ValueError(f"gradient canaries: {self.m} orthogonal canaries need as many coordinates; the model "
                             f"has {d} trainable values")
        expected_rows = sample_rate * self.m / 2
        if expected_rows * d * 4 > ROW_BUDGET_BYTES:
            raise ValueError(f"gradient canaries: about {expected_rows:.0f} canary gradients of {d} values per step "
                             f"exceed {ROW_BUDGET_BYTES >> 20} MiB; use fewer canaries")
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
        self._known = torch.zeros(self.m, dtype=self._weights.dtype, device=device)
        self._started = True

    def before_step(self, optimizer) -> None:
        """Add this step's sampled included canaries to the per-sample gradients the DP optimizer will clip."""
        if not self._started:
            raise RuntimeError("gradient canaries: start() was not called before the training's first step")
        self._known = self._clipped_batch_along_canaries()
        picked = np.flatnonzero(self.included & (self._rng.random(self.m) < self.q))
        self.sampled[picked] += 1
        if not len(picked):
            return
        k = len(picked)
        index = torch.as_tensor(picked, dtype=torch.long, device=self._coords.device)
        rows = torch.zeros((k, self.d), dtype=self._weights.dtype, device=self._coords.device)
        rows.scatter_(1, self._coords[index], self._weights[index] * (self.norm_factor * self.clip))
        for p, part in zip(self.params, torch.split(rows, self.sizes, dim=1)):
            part = part.reshape(k, *p.shape).to(p.dtype)
            current = getattr(p, "grad_sample", None)
            if current is None:
                p.grad_sample = part
            elif isinstance(current, list):
                current.append(part)
            else:
                p.grad_sample = torch.cat([current, part.to(current.device)], dim=0)

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
        self.steps += 1

    def scores(self, statistic: str = "likelihood_ratio") -> np.ndarray:
        """Each canary's score over the steps run: the likelihood ratio (default) or the plain sum of y_t."""
        if statistic not in ("likelihood_ratio", "sum"):
            raise ValueError(f"gradient canaries: unknown statistic {statistic!r}")
        return (self._lr if statistic == "likelihood_ratio" else self._sum).copy()
