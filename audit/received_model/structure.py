"""The structural signatures of the published constructions, read off the received weights and the probe's step.

- Imprint layers (Fowl et al., "Robbing the Fed"): the rows of a linear layer are scaled copies of one measurement
  direction, with biases that cut it into bins. Figure: the largest set of rows whose pairwise |cosine| is at least
  0.99, and how many distinct offsets (bias / row norm) they have. Rows of honest layers start random and move by
  data-dependent updates: no two of them are that parallel in the models measured (benchmarks/README.md).
- Trap weights (Boenisch et al.): each ReLU neuron of a layer fires for few samples, so most fire for one. Figures,
  over the neurons that any sample of the batch moves (a neuron that died in honest training moves none): the mean
  share of the batch that moves each, and the share moved by exactly one sample.
- Fishing (Wen et al.): the classifier's rows of all classes but one set to zero (with large biases), so only the
  target class's samples send gradient down the model. Figure: the largest class weight-row norm over the median.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from audit.received_model.probe import LayerCapture

__all__ = ["PARALLEL_COSINE", "MIN_SPARSITY_BATCH", "parallel_rows", "relu_support", "class_weight_ratio"]

PARALLEL_COSINE = 0.99
# Layers with more than this many (rows^2 * inputs) multiply-adds are compared in a random projection first.
_EXACT_BUDGET = 2**28
_PROJECTION = 64
_PROJECTED_COSINE = 0.9  # a parallel pair projects to exactly 1; 0.9 keeps pairs a projection blurs, checked after
# The sparsity figures need a batch where an honest neuron (firing for about half the samples) is almost never moved by
# one sample alone: n * 2^-(n-1) is 1e-3 at n = 16.
MIN_SPARSITY_BATCH = 16
_MIN_LIVE_NEURONS = 8


def parallel_rows(weight: torch.Tensor, bias: torch.Tensor | None) -> dict:
    """The largest group of rows of `weight` (out, in) that are scaled copies of one direction: rows whose |cosine|
    with the row that has most such neighbours is >= PARALLEL_COSINE. Zero rows have no direction and are left out.

    A large layer is first compared in a random projection to _PROJECTION dimensions (parallel rows stay exactly
    parallel under any linear map; other rows' cosines move by about 1/sqrt(_PROJECTION)), and the group found there
    is then checked on the rows themselves: k^2 * _PROJECTION operations instead of k^2 * d."""
    w = weight.detach().cpu().numpy().reshape(weight.shape[0], -1).astype(np.float32, copy=False)
    norms = np.linalg.norm(w, axis=1).astype(np.float64)
    live = np.flatnonzero(norms > 0)
    if len(live) == 0:
        return {"rows": 0, "distinct_offsets": 0, "of": int(weight.shape[0])}
    # Cosines to 1e-6 in float32: far finer than 0.99. w[live] is a copy (w may be the model's own memory), divided in
    # place, and the cosines' absolute values are taken in place: a large layer's rows and their cosines held once each.
    unit = w[live]
    unit /= norms[live, None].astype(np.float32)
    seen = unit
    if len(live) ** 2 * unit.shape[1] > _EXACT_BUDGET and unit.shape[1] > _PROJECTION:
        seen = unit @ np.random.default_rng(0).standard_normal((unit.shape[1], _PROJECTION)).astype(np.float32)
        seen /= np.maximum(np.linalg.norm(seen, axis=1, keepdims=True), np.finfo(np.float32).tiny)
    cosines = seen @ seen.T
    close = np.abs(cosines, out=cosines) >= (PARALLEL_COSINE if seen is unit else _PROJECTED_COSINE)
    del cosines
    centre = int(close.sum(axis=1).argmax())
    members = np.flatnonzero(close[centre])
    members = members[np.abs(unit[members] @ unit[centre]) >= PARALLEL_COSINE]  # on the rows themselves
    group = live[members]
    distinct = 0
    if bias is not None:
        offsets = bias.detach().cpu().numpy().astype(np.float64)[group] / norms[group]
        distinct = len(np.unique(np.round(offsets, 5)))
    return {"rows": int(len(group)), "distinct_offsets": int(distinct), "of": int(weight.shape[0])}


def relu_support(layer: LayerCapture) -> dict | None:
    """For a layer's neurons that some sample moves (nonzero d loss / d output): the mean share of the batch moving
    each, and the share of them moved by exactly one sample. None when the batch or the live neurons are too few to
    say (MIN_SPARSITY_BATCH samples, 8 neurons)."""
    n = layer.gamma.shape[0]
    moved = (layer.gamma != 0).sum(axis=0)
    live = moved[moved > 0]
    if n < MIN_SPARSITY_BATCH or len(live) < _MIN_LIVE_NEURONS:
        return None
    return {"live_neurons": int(len(live)), "of": int(layer.gamma.shape[1]), "batch": int(n),
            "mean_support": float(live.mean() / n), "isolating": float(np.mean(live == 1))}


def class_weight_ratio(weight: torch.Tensor) -> float:
    """The largest class weight-row norm of the classifier over the median one (inf when the median row is zero)."""
    norms = weight.detach().to(torch.float64).reshape(weight.shape[0], -1).norm(dim=1)
    median = float(norms.median())
    top = float(norms.max())
    if median > 0:
        return top / median
    return math.inf if top > 0 else 1.0
