"""The crowd a collaborator's update must hide in: synthetic users drawn from the population data.

Each synthetic user gets its own label mix, drawn the way the federation's non-IID partition draws its parties'
(per class, the users' shares ~ Dirichlet(alpha); alpha None = IID), and samples of that mix split into a
"prior" part (what the adversary knows of the user) and a "private" part (what the user trains on).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CrowdUser", "label_mixes", "draw_by_mix", "draw_crowd"]


@dataclass(frozen=True)
class CrowdUser:
    mix: np.ndarray          # the user's class probabilities
    prior: np.ndarray        # indices into the population arrays
    private: np.ndarray      # indices into the population arrays, disjoint from prior


def label_mixes(class_counts: np.ndarray, n_users: int, alpha: float | None, rng: np.random.Generator) -> np.ndarray:
    """(n_users, n_classes) label mixes. As in src.data's split: per class, q ~ Dirichlet(alpha * 1_users) is each
    user's share of that class, so a user's mix is proportional to q[class] * class count."""
    class_counts = np.asarray(class_counts, dtype=np.float64)
    if alpha is None:
        q = np.full((len(class_counts), n_users), 1.0 / n_users)
    else:
        q = rng.dirichlet(np.full(n_users, float(alpha)), size=len(class_counts))  # (classes, users)
    mixes = (q * class_counts[:, None]).T
    return mixes / mixes.sum(axis=1, keepdims=True)


def draw_by_mix(labels: np.ndarray, pool: np.ndarray, mix: np.ndarray, classes: np.ndarray, size: int,
                rng: np.random.Generator) -> np.ndarray:
    """`size` indices from `pool` (indices into `labels`) whose label counts are a multinomial draw of `mix`.

    Within a class, samples are distinct while the pool has enough; a strongly skewed user can want more of a
    class than the pool holds, and then repeats samples rather than drifting away from its mix.
    """
    pool_labels = labels[pool]
    present = np.isin(classes, pool_labels)
    weights = np.where(present, mix, 0.0)
    if weights.sum() == 0:  # the user's classes are all missing from this pool: fall back to the pool's own mix
        weights = present.astype(np.float64)
    counts = rng.multinomial(size, weights / weights.sum())
    picks = []
    for c, n in zip(classes, counts):
        if n:
            candidates = pool[pool_labels == c]
            picks.append(rng.choice(candidates, size=n, replace=n > len(candidates)))
    return rng.permutation(np.concatenate(picks)).astype(np.int64)


def draw_crowd(population_labels, n_users: int, prior_size: int, private_size: int, alpha: float | None,
               *, seed: int) -> list[CrowdUser]:
    """`n_users` synthetic users over the population pool.

    Per user, the pool is cut at random into a prior part and a private part (in proportion to the sizes), so a
    user's prior and private samples are distinct; different users may share samples (the crowd usually wants
    more data than the pool has).
    """
    labels = np.asarray(population_labels)
    if n_users < 1 or prior_size < 1 or private_size < 1:
        raise ValueError(f"crowd: n_users, prior_size and private_size must be >= 1, got {n_users}, {prior_size}, "
                         f"{private_size}")
    if len(labels) < 2:
        raise ValueError(f"crowd: the population has {len(labels)} samples; at least 2 are needed")
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    cut = min(len(labels) - 1, max(1, round(len(labels) * prior_size / (prior_size + private_size))))
    users = []
    for mix in label_mixes(counts, n_users, alpha, rng):
        order = rng.permutation(len(labels))
        users.append(CrowdUser(mix=mix, prior=draw_by_mix(labels, order[:cut], mix, classes, prior_size, rng),
                               private=draw_by_mix(labels, order[cut:], mix, classes, private_size, rng)))
    return users
