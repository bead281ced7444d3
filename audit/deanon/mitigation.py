"""User-side mitigations of deanonymization through model updates (Orekondy et al., "Understanding and
Controlling Deanonymization in Federated Learning", section 7.1).

Data mitigations mix the user's data D_u with background data D_bkg before training, so that the update carries
less of the user's own bias:

* ``bkg_repl`` - replace a fraction alpha in [0, 1] of D_u with random background samples (size stays |D_u|);
* ``rand_aug`` - add round(alpha * |D_u|) random background samples (alpha >= 0);
* ``mm_aug``   - k-means D_bkg into ``clusters`` modes, pick one mode at random and add round(alpha * |D_u|)
  samples from it.

Update mitigations perturb the update delta = trained - received before it leaves the device:

* ``noise``     - add N(0, sigma^2) to every element of delta;
* ``dp_fedavg`` - clip the whole delta to L2 norm <= clip, then add N(0, (sigma * clip)^2) (McMahan et al.'s
  clipping + Gaussian mechanism; sigma is the noise multiplier, the paper fixes clip = 50).

Only floating-point tensors are perturbed; integer tensors (e.g. BatchNorm's num_batches_tracked) pass through.
Everything is deterministic given ``seed``.  Knows nothing about OpenFL.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral

import numpy as np

from audit.config.mitigation_settings import DATA_MITIGATIONS, MITIGATIONS, UPDATE_MITIGATIONS, Mitigation

__all__ = [
    "MITIGATIONS",
    "DATA_MITIGATIONS",
    "UPDATE_MITIGATIONS",
    "Mitigation",
    "DataMitigationResult",
    "mitigate_data",
    "mitigate_update",
    "update_norm",
]

# Explicit (sklearn's default changed across versions); a few restarts guard against a poor k-means++ start
# without making the clustering of a large background set slow.
_KMEANS_N_INIT = 3


def _check_seed(seed) -> int:
    # KMeans' random_state and default_rng both need a non-negative int.
    if not isinstance(seed, Integral) or isinstance(seed, (bool, np.bool_)) or seed < 0:
        raise ValueError(f"seed: expected an integer >= 0, got {seed!r}")
    return int(seed)


@dataclass
class DataMitigationResult:
    x: np.ndarray  # the training data after the mitigation
    y: np.ndarray
    background_used: np.ndarray  # int64 indices into the background arrays of the samples now trained on
    cluster: int | None  # mm_aug: the cluster picked


def _sample(rng: np.random.Generator, pool: np.ndarray, k: int) -> np.ndarray:
    # Without replacement when the pool is big enough (the paper assumes |D_bkg| >> |D_u|); otherwise with
    # replacement, so the requested mixing ratio alpha is kept rather than silently shrunk to the pool size.
    return rng.choice(pool, size=k, replace=k > len(pool)).astype(np.int64)


def mitigate_data(mitigation: Mitigation, x, y, background_x, background_y, *, seed: int) -> DataMitigationResult:
    """The user's training data after a data mitigation (identity for "none", update mitigations and alpha = 0).

    x: (n, ...) features, y: (n,) integer labels; the background arrays must have the same feature shape.
    Background samples are cast to x's / y's dtypes (an unsafe cast, e.g. float into uint8, is an error).
    Added samples are appended after the user's; shuffle when loading.
    """
    seed = _check_seed(seed)
    x, y = np.asarray(x), np.asarray(y)
    empty = np.empty(0, dtype=np.int64)
    if mitigation.method not in DATA_MITIGATIONS or not mitigation.active:
        return DataMitigationResult(x, y, empty, None)
    bx, by = np.asarray(background_x), np.asarray(background_y)
    n = len(x)
    if y.shape != (n,):
        raise ValueError(f"y: expected shape ({n},) to match x, got {y.shape}")
    if by.shape != (len(bx),):
        raise ValueError(f"background_y: expected shape ({len(bx)},) to match background_x, got {by.shape}")
    if bx.shape[1:] != x.shape[1:]:
        raise ValueError(f"background_x: feature shape {bx.shape[1:]} differs from x's {x.shape[1:]}")
    for name, labels in (("y", y), ("background_y", by)):
        if not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"{name}: expected integer labels, got dtype {labels.dtype}")
    if len(bx) == 0:
        raise ValueError(f"{mitigation.method} needs background data, got none")
    for name, src, dst in (("background_x", bx, x), ("background_y", by, y)):
        if not np.can_cast(src.dtype, dst.dtype, casting="same_kind"):
            raise ValueError(f"{name}: dtype {src.dtype} cannot be cast to the user data's {dst.dtype}")

    rng = np.random.default_rng(seed)
    k = int(round(mitigation.alpha * n))  # Python's round: halves go to the even integer

    if mitigation.method == "bkg_repl":
        used = _sample(rng, np.arange(len(bx)), k)
        positions = np.sort(rng.choice(n, size=k, replace=False))
        x_out, y_out = x.copy(), y.copy()
        x_out[positions] = bx[used]
        y_out[positions] = by[used]
        return DataMitigationResult(x_out, y_out, used, None)

    cluster = None
    if mitigation.method == "rand_aug":
        used = _sample(rng, np.arange(len(bx)), k)
    else:  # mm_aug
        labels = _kmeans_labels(bx, mitigation.clusters, seed)
        # Uniform over the non-empty clusters (KMeans can leave one empty when the data has duplicates).
        cluster = int(rng.choice(np.unique(labels)))
        used = _sample(rng, np.flatnonzero(labels == cluster), k)
    x_out = np.concatenate([x, bx[used]], dtype=x.dtype, casting="same_kind")
    y_out = np.concatenate([y, by[used]], dtype=y.dtype, casting="same_kind")
    return DataMitigationResult(x_out, y_out, used, cluster)


def _kmeans_labels(background_x: np.ndarray, clusters: int, seed: int) -> np.ndarray:
    # The paper clusters ImageNet-pretrained MobileNet features; we have no pretrained feature extractor here, so
    # we cluster the flattened raw features (pixel space), whose modes are cruder than semantic topics.
    from sklearn.cluster import KMeans

    if clusters > len(background_x):
        raise ValueError(
            f"mitigation.clusters: {clusters} clusters but only {len(background_x)} background samples"
        )
    features = background_x.reshape(len(background_x), -1).astype(np.float64)
    return KMeans(n_clusters=clusters, n_init=_KMEANS_N_INIT, random_state=seed).fit(features).labels_


def _float_deltas(received: Mapping, trained: Mapping) -> dict[str, np.ndarray]:
    """float64 trained - received for the floating-point tensors, keys in sorted order (for determinism)."""
    for missing, present_in, absent_in in (
        (set(trained) - set(received), "trained", "received"),
        (set(received) - set(trained), "received", "trained"),
    ):
        if missing:
            raise ValueError(f"tensor(s) {sorted(missing)} in {present_in} but missing from {absent_in}")
    deltas = {}
    for key in sorted(trained):
        t, r = np.asarray(trained[key]), np.asarray(received[key])
        if t.shape != r.shape:
            raise ValueError(f"tensor {key!r}: trained shape {t.shape} differs from received {r.shape}")
        if np.issubdtype(t.dtype, np.floating):
            deltas[key] = t.astype(np.float64) - r.astype(np.float64)
    return deltas


def update_norm(received: Mapping, trained: Mapping) -> float:
    """L2 norm of the whole update (all floating-point tensors together; integer counters are not weights)."""
    deltas = _float_deltas(received, trained)
    return math.sqrt(sum(float(np.dot(d.ravel(), d.ravel())) for d in deltas.values()))


def mitigate_update(mitigation: Mitigation, received: Mapping, trained: Mapping, *, seed: int) -> dict[str, np.ndarray]:
    """The tensors to send: received + mitigated(trained - received) for "noise" / "dp_fedavg", else trained."""
    seed = _check_seed(seed)
    deltas = _float_deltas(received, trained)  # also checks keys and shapes
    out = {key: np.asarray(value) for key, value in trained.items()}
    if mitigation.method not in UPDATE_MITIGATIONS or not mitigation.active:
        return out
    if mitigation.method == "noise":
        scale, std = 1.0, mitigation.sigma
    else:
        norm = update_norm(received, trained)
        if not math.isfinite(norm):
            raise ValueError(f"dp_fedavg: the update norm is {norm}; a non-finite update cannot be clipped")
        scale = min(1.0, mitigation.clip / norm) if norm > 0 else 1.0
        std = mitigation.sigma * mitigation.clip
    rng = np.random.default_rng(seed)
    for key, delta in deltas.items():  # sorted keys: the same noise whatever the dicts' insertion order
        sent = np.asarray(received[key], dtype=np.float64) + scale * delta
        if std > 0:
            sent += rng.normal(0.0, std, size=delta.shape)
        out[key] = sent.astype(out[key].dtype)
    return out
