"""Input canaries: the samples a shadow training may include, built from the party's own population shard, and the
coin flips that include them.

Constructions (`construction`):
- noise (the default): inputs drawn uniformly within the population's per-feature range (integers for token-id
  inputs), each labelled with a class drawn among those the received model does not predict for it: out of
  distribution, so nothing else in the training set explains them, and a canary left out does not get a low loss
  by the received model's chance agreement with its label (1 in 4 with 4 classes).
- mislabelled: population samples with a label re-drawn among the other classes (Privacy Meter v2's and Steinke et
  al.'s black-box canaries: a model can only fit them by memorising them). Past the shard's size a sample is used
  again with another wrong label, never one it had.
- natural: population samples with their own labels (the weakest: the rest of the data explains them).
The single label the received model finds least likely was measured weaker (many canaries then share it, and
training on some teaches it for all). Comparison: benchmarks/README.md "Canary audit".
"""

from __future__ import annotations

import zlib

import numpy as np

from audit.config.canary_settings import MISLABELLED, NATURAL, NOISE
from audit.scaled_pixels import take_rows

__all__ = ["canary_seed", "input_canaries", "draw_inclusion", "max_canaries"]


def canary_seed(seed: int | None, party: str, round_num: int, what: str) -> int:
    """A seed per (plan seed, party, round, purpose): the same plan gives the same canaries whatever the order."""
    return zlib.crc32(f"{seed or 0}/{party}/{round_num}/canary/{what}".encode()) & 0x7FFFFFFF


def max_canaries(construction: str, population_size: int, classes: int) -> int | None:
    """The most canaries a construction can build from a population shard (None: no limit)."""
    if construction == MISLABELLED:
        return population_size * max(classes - 1, 0)
    if construction == NATURAL:
        return population_size
    return None


def input_canaries(population, m: int, construction: str, classes: int, seed: int,
                   predict=None) -> tuple[np.ndarray, np.ndarray]:
    """m canaries (x, y) of `construction` from the population shard (x, y); `classes`: the model's output count;
    `predict(x) -> labels`: the received model's predictions, which noise canaries' labels avoid (None: any label).
    Everything is fixed before the canaries' inclusion is drawn."""
    x, y = population[0], np.asarray(population[1])
    n = len(y)
    limit = max_canaries(construction, n, classes)
    if limit is not None and m > limit:
        raise ValueError(f"canary: {m} {construction} canaries cannot be built from a population shard of {n} "
                         f"samples and {classes} classes (at most {limit})")
    rng = np.random.default_rng(seed)
    if construction == NOISE:
        sample = np.asarray(take_rows(x, rng.choice(n, size=min(n, 1000), replace=False)))
        lo, hi = sample.min(axis=0), sample.max(axis=0)
        shape = (m, *sample.shape[1:])
        if np.issubdtype(sample.dtype, np.integer):
            cx = rng.integers(lo, hi + 1, size=shape).astype(sample.dtype)
        else:
            cx = (lo + (hi - lo) * rng.random(shape)).astype(sample.dtype)
        if predict is None or classes < 2:
            return cx, rng.integers(0, classes, size=m).astype(np.int64)
        predicted = np.asarray(predict(cx), dtype=np.int64)
        return cx, ((predicted + rng.integers(1, classes, size=m)) % classes).astype(np.int64)
    order = rng.permutation(n)
    rows = order[np.arange(m) % n]
    cx = np.asarray(take_rows(x, rows))
    if construction == NATURAL:
        return cx, y[rows].astype(np.int64)
    # mislabelled: use k of a sample (its k-th appearance) gets the k-th of its own shuffled wrong labels
    offsets = np.argsort(rng.random((n, classes - 1)), axis=1) + 1  # a permutation of 1..classes-1 per sample
    use = np.arange(m) // n
    return cx, ((y[rows] + offsets[rows, use]) % classes).astype(np.int64)


def draw_inclusion(m: int, seed: int) -> np.ndarray:
    """Each of m canaries in (True) with probability 1/2, independently."""
    return np.random.default_rng(seed).random(m) < 0.5
