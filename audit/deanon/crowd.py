"""The crowd a collaborator's update must hide in: synthetic users drawn from the population data.

Each synthetic user gets its own label mix, drawn the way the federation's non-IID partition draws its parties'
(per class, the users' shares ~ Dirichlet(alpha); alpha None = IID), and samples of that mix split into a
"prior" part (what the adversary knows of the user) and a "private" part (what the user trains on).

The crowd must stand in the same relation to the adversary's prior data as the collaborator does: its private
samples are in nobody's prior, and its prior and private data are drawn alike. So the users are disjoint draws
without repeats (no sample belongs to two users, or twice to one), and a user's prior and private parts are two
independent draws of its mix, as the collaborator's non-members and members are two draws of its shard's mix.
(Drawing every user from the whole pool, with repeats, put a crowd user's private samples into other users'
priors: the attacks matched crowd updates to the wrong users, and the collaborator, whose members are in nobody's
prior, stood out in an IID federation.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CrowdUser", "label_mixes", "crowd_capacity", "draw_crowd"]


@dataclass(frozen=True)
class CrowdUser:
    mix: np.ndarray          # the user's class probabilities (its target: a class the pool runs short of gives less)
    prior: np.ndarray        # indices into the population arrays
    private: np.ndarray      # indices into the population arrays; no index is in two parts or two users


def label_mixes(class_counts: np.ndarray, n_users: int, alpha: float | None, rng: np.random.Generator) -> np.ndarray:
    """(n_users, n_classes) label mixes. As in src.data.split: per class, q ~ Dirichlet(alpha * 1_users) is each
    user's share of that class, so a user's mix is proportional to q[class] * class count."""
    class_counts = np.asarray(class_counts, dtype=np.float64)
    if alpha is None:
        q = np.full((len(class_counts), n_users), 1.0 / n_users)
    else:
        q = rng.dirichlet(np.full(n_users, float(alpha)), size=len(class_counts))  # (classes, users)
    mixes = (q * class_counts[:, None]).T
    return mixes / mixes.sum(axis=1, keepdims=True)


def crowd_capacity(pool_size: int, prior_size: int, private_size: int) -> int:
    """How many users of `prior_size` + `private_size` distinct samples a pool of `pool_size` holds."""
    return int(pool_size) // (int(prior_size) + int(private_size))


def _part_counts(mixes: np.ndarray, sizes: np.ndarray, left: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(parts, classes) label counts: part i gets sizes[i] samples, its counts an independent multinomial draw of
    mixes[i], all parts together within `left` samples per class.

    Where the parts together want more of a class than there is, its samples go to the wanting parts at random
    (a multivariate hypergeometric draw: in proportion, on average), and each part's shortfall is drawn again over
    its classes that still have samples (over whatever is left if none has): a part drifts from its mix rather
    than share samples. All parts are dealt at once, so no part is left with the remains of the others (a user
    drawn last would take the pool's leftover composition into its prior and its private part alike, which the
    attacks recognise even in an IID crowd).
    """
    counts = np.zeros((len(sizes), len(left)), dtype=np.int64)
    need = np.asarray(sizes, dtype=np.int64).copy()
    while need.any():  # every pass takes >= 1 sample: only classes with samples left have weight
        spare = left - counts.sum(axis=0)
        want = np.zeros_like(counts)
        for i in np.flatnonzero(need):
            weights = np.where(spare > 0, mixes[i], 0.0)
            if weights.sum() == 0:
                weights = spare.astype(np.float64)
            want[i] = rng.multinomial(need[i], weights / weights.sum())
        for c in np.flatnonzero(want.sum(axis=0) > spare):
            want[:, c] = rng.multivariate_hypergeometric(want[:, c], spare[c])
        counts += want
        need -= want.sum(axis=1)
    return counts


def _deal_parts(labels: np.ndarray, mixes: np.ndarray, sizes, rng: np.random.Generator) -> list[np.ndarray]:
    """Disjoint parts of `labels`' indices: part i has sizes[i] of them, its label counts a multinomial draw of
    mixes[i] (over the classes in `labels`, in np.unique's order; see _part_counts); no index is in two parts."""
    labels = np.asarray(labels)
    classes, left = np.unique(labels, return_counts=True)
    if left.sum() < sum(sizes):
        raise ValueError(f"crowd: {sum(sizes)} samples wanted, the pool has {left.sum()}")
    counts = _part_counts(np.asarray(mixes), np.asarray(sizes), left, rng)
    parts = [[] for _ in sizes]
    for c, per_part in zip(classes, counts.T):
        picks = rng.permutation(np.flatnonzero(labels == c))[:per_part.sum()]
        for part, chunk in zip(parts, np.split(picks, np.cumsum(per_part)[:-1])):
            part.append(chunk)
    return [rng.permutation(np.concatenate(part)).astype(np.int64) for part in parts]


def draw_crowd(population_labels, n_users: int, prior_size: int, private_size: int, alpha: float | None,
               *, seed: int) -> list[CrowdUser]:
    """`n_users` synthetic users over the population pool, disjoint (see the module docstring): each user's prior
    and private part are prior_size and private_size samples of its mix. The pool must hold them all
    (crowd_capacity)."""
    labels = np.asarray(population_labels)
    if n_users < 1 or prior_size < 1 or private_size < 1:
        raise ValueError(f"crowd: n_users, prior_size and private_size must be >= 1, got {n_users}, {prior_size}, "
                         f"{private_size}")
    if crowd_capacity(len(labels), prior_size, private_size) < n_users:
        raise ValueError(f"crowd: {n_users} users of {prior_size} prior + {private_size} private samples need "
                         f"{n_users * (prior_size + private_size)} distinct samples; the population has {len(labels)}")
    rng = np.random.default_rng(seed)
    mixes = label_mixes(np.unique(labels, return_counts=True)[1], n_users, alpha, rng)
    parts = _deal_parts(labels, np.repeat(mixes, 2, axis=0), [prior_size, private_size] * n_users, rng)
    return [CrowdUser(mix=mix, prior=parts[2 * k], private=parts[2 * k + 1]) for k, mix in enumerate(mixes)]
