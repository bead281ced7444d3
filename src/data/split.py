"""The per-collaborator member / non-member / population split of a dataset (src.data.datasets loads them).

No OpenFL imports here: this module is shared by the OpenFL data loader
(:mod:`src.dataloader`), the auditor and the tests.

The split (:func:`split_federation`)
------------------------------------
Like the tutorial, the pool is cut into a *train* set (the members an attack tries to
recognise), a *test* set (non-members) and a *population* set (the attacker's audit /
reference data) by ``train_ratio`` / ``test_ratio`` / ``audit_ratio``; each set is then
dealt to the parties.  Unlike the tutorial, the pool is shuffled with ``seed`` first (the
tutorial takes CIFAR-10 in file order: train = first 24k, test = next 24k, population =
last 12k, so its "test" set mixes the end of CIFAR's train files with the start of its
test file).  Set sizes are ``floor(N * ratio)``; when the ratios sum to less than 1 the
leftover samples are not used.

Users with several devices (``devices_per_user``)
-------------------------------------------------
For the shadow-device protocol of the deanonymization attack (an adversary trains its
attack model on the updates of *shadow devices* K_prior of the target users and
deanonymizes their other, anonymous devices K_anon) each *user* owns ``devices_per_user``
FL devices (collaborators) whose data follow the same user-specific label mix.  The split
is first made for ``n_users = n_parties // devices_per_user`` users exactly as without
devices (same seed, IID or Dirichlet label skew), then each user's train, test and
population index sets are dealt to its devices as ``set[j::devices_per_user]`` for
device j.  Party index p belongs to user ``p // devices_per_user``, device
``p % devices_per_user`` (:func:`user_of_party`).  ``devices_per_user=1`` is the plain
split, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from audit import SettingsError, integer, optional, real

__all__ = [
    "PartyData",
    "SPLIT_SETS",
    "validate_split_settings",
    "split_indices",
    "split_federation",
    "user_of_party",
]

#: Names of the three per-party sets, in the order they are cut from the shuffled pool.
SPLIT_SETS = ("train", "test", "population")
#: The data loader's defaults for what decides the split (src.dataloader.AuditDataLoader's keyword arguments, by their
#: plan names): read by the checks that bound a plan's counts before any data is loaded (src.plan.bounds).


# ----------------------------------------------------------------------------- splitting


@dataclass(frozen=True)
class PartyData:
    """One party's shards: members (train), non-members (test) and population (audit)."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    population_x: np.ndarray
    population_y: np.ndarray


#: What the split's settings take (data_loader.settings declares its fields with them: src.data.loader_settings).
RATIO = real(gt=0)
COUNT = integer(min=1)
ALPHA = optional(real(gt=0), "IID")


def check_ratios(ratios: Mapping, *, prefix: str = "") -> None:
    """The three shares of the pool by their plan names (train_dataset_ratio, test_dataset_ratio,
    audit_dataset_ratio): each a number > 0, together at most 1. SettingsError naming the first offending one (with
    `prefix`: "data_loader.settings.", or the demo's "--")."""
    for key, value in ratios.items():
        RATIO(f"{prefix}{key}", value)
    total = float(sum(ratios.values()))
    if total > 1.0 + 1e-9:
        shown = " + ".join(f"{prefix}{key}" for key in ratios)
        raise SettingsError(f"{prefix}train_dataset_ratio: {shown} must be <= 1, got "
                            f"{' + '.join(str(v) for v in ratios.values())} = {total:g}")


def validate_split_settings(
    train_ratio, test_ratio, audit_ratio, n_parties, dirichlet_alpha=None, *, prefix="", devices_per_user=1
) -> None:
    """Raise SettingsError (a ValueError) naming the offending setting (plan names, with ``prefix``).

    ``n_parties`` must be a multiple of ``devices_per_user`` (an integer >= 1).
    """
    check_ratios({
        "train_dataset_ratio": train_ratio,
        "test_dataset_ratio": test_ratio,
        "audit_dataset_ratio": audit_ratio,
    }, prefix=prefix)
    parties_name = f"{prefix}collaborator_count" if prefix else "n_parties"
    COUNT(parties_name, n_parties)
    devices_name = f"{prefix}devices_per_user"
    COUNT(devices_name, devices_per_user)
    if n_parties % devices_per_user:
        raise SettingsError(
            f"{devices_name}: the collaborator count ({parties_name}={n_parties}) must be a "
            f"multiple of {devices_name}={devices_per_user} (every user owns "
            f"{devices_per_user} devices); use a collaborator count such as "
            f"{max(1, n_parties // devices_per_user) * devices_per_user} or another {devices_name}"
        )
    ALPHA(f"{prefix}dirichlet_alpha", dirichlet_alpha)


def _largest_remainder(totals: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Integer counts C (K, n) with C[k].sum() == totals[k], C[k] ~ totals[k] * weights[k].

    ``weights`` rows sum to 1.  Hamilton's method; ties go to the lower party index.
    """
    raw = totals[:, None] * weights
    base = np.floor(raw).astype(np.int64)
    short = totals - base.sum(axis=1)  # in [0, n)
    frac = raw - base
    order = np.argsort(-frac, axis=1, kind="stable")
    rank = np.argsort(order, axis=1)  # rank of each party's remainder within its class
    return base + (rank < short[:, None])


def user_of_party(party_index, devices_per_user=1) -> tuple[int, int]:
    """``(user, device)`` of 0-based party (collaborator) index ``party_index``.

    Party p is device ``p % devices_per_user`` of user ``p // devices_per_user`` (both 0-based).
    """
    integer(min=0)("party_index", party_index)
    COUNT("devices_per_user", devices_per_user)
    user, device = divmod(int(party_index), int(devices_per_user))
    return user, device


def split_indices(
    y,
    n_parties,
    *,
    train_ratio=0.4,
    test_ratio=0.4,
    audit_ratio=0.2,
    seed=0,
    dirichlet_alpha=None,
    devices_per_user=1,
    _max_draws=100,
) -> list[dict[str, np.ndarray]]:
    """Index version of :func:`split_federation`.

    Returns, per party, ``{"train": idx, "test": idx, "population": idx}`` (int64 indices
    into the pool, each pool index used at most once overall).  Used by the data loader
    so that a collaborator only copies its own shard.
    """
    validate_split_settings(
        train_ratio, test_ratio, audit_ratio, n_parties, dirichlet_alpha, devices_per_user=devices_per_user
    )
    devices_per_user = int(devices_per_user)
    n_users = n_parties // devices_per_user
    users = _split_users(
        y,
        n_users,
        devices_per_user,
        train_ratio=train_ratio,
        test_ratio=test_ratio,
        audit_ratio=audit_ratio,
        seed=seed,
        dirichlet_alpha=dirichlet_alpha,
        max_draws=_max_draws,
    )
    if devices_per_user == 1:
        return users
    # Deal each user's (shuffled-order) sets to its devices: device j gets set[j::d].
    parts = [
        {s: np.ascontiguousarray(user[s][j::devices_per_user]) for s in SPLIT_SETS} for user in users for j in range(devices_per_user)
    ]
    for p, part in enumerate(parts):  # guaranteed by _split_users; kept as a clear safety net
        for s in SPLIT_SETS:
            if len(part[s]) == 0:
                u, j = user_of_party(p, devices_per_user)
                raise ValueError(
                    f"devices_per_user={devices_per_user}: device {j} of user {u} (party {p}) got no "
                    f"sample in the {s} set; use fewer devices_per_user or fewer parties"
                )
    return parts


def _split_users(
    y,
    n_users,
    devices_per_user,
    *,
    train_ratio,
    test_ratio,
    audit_ratio,
    seed,
    dirichlet_alpha,
    max_draws,
) -> list[dict[str, np.ndarray]]:
    """The plain split for ``n_users`` users (parties when ``devices_per_user == 1``).

    With ``devices_per_user = d > 1`` every user set must hold >= d samples (so that each
    of the user's devices gets one); Dirichlet shares are redrawn otherwise.  ``d == 1`` is
    the original party split, bit for bit (same generator calls, same checks).
    """
    d = devices_per_user
    n_devices = n_users * d
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D (one label per sample), got shape {y.shape}")
    n = int(y.shape[0])
    sizes = [int(math.floor(n * r + 1e-6)) for r in (train_ratio, test_ratio, audit_ratio)]
    while sum(sizes) > n:  # only reachable through the 1e-9 tolerance on the ratio sum
        sizes[2] -= 1
    names = dict(zip(SPLIT_SETS, ("train_dataset_ratio", "test_dataset_ratio", "audit_dataset_ratio")))

    for set_name, size in zip(SPLIT_SETS, sizes):
        if size < n_devices:
            who = (
                f"{n_devices} parties"
                if d == 1
                else f"{n_devices} parties ({n_users} users x devices_per_user={d})"
            )
            raise ValueError(
                f"the {set_name} set has {size} samples ({names[set_name]} x {n} samples) "
                f"but {who} need at least 1 each; raise {names[set_name]} or "
                f"use fewer parties"
            )

    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)  # the tutorial does not shuffle; we do (see module docstring)
    bounds = np.cumsum([0] + sizes)
    sets = {s: perm[bounds[i] : bounds[i + 1]] for i, s in enumerate(SPLIT_SETS)}

    if dirichlet_alpha is None:
        # IID: deal each (shuffled) set like the tutorial, set[i::n_users].
        return [{s: sets[s][i::n_users].astype(np.int64) for s in SPLIT_SETS} for i in range(n_users)]

    # Non-IID (label skew).  For every class k draw q_k ~ Dirichlet(alpha * 1_n): the share
    # of class k each party receives.  The SAME matrix q is used for the train, test and
    # population sets, so a party's members, non-members and population samples all follow
    # the same label mix.  Otherwise a membership-inference attack on that party would
    # partly measure the distribution shift between its members and non-members (e.g. a
    # class the model never saw has high loss) instead of memorisation, i.e. leakage.
    classes, codes = np.unique(y, return_inverse=True)
    codes = codes.reshape(-1)
    n_classes = len(classes)
    for _ in range(max_draws):
        q = rng.dirichlet(np.full(n_users, float(dirichlet_alpha)), size=n_classes)  # (K, n)
        result = [dict() for _ in range(n_users)]
        empty = None
        for set_name in SPLIT_SETS:
            idx = sets[set_name]
            labels = codes[idx]
            totals = np.bincount(labels, minlength=n_classes)
            counts = _largest_remainder(totals, q)  # (K, n)
            per_party = counts.sum(axis=0)
            if empty is None and (per_party < d).any():  # d == 1: a party with no sample
                empty = (set_name, int(np.argmin(per_party)), int(per_party.min()))
            # Positions grouped by class (set order kept within a class), cut into parties.
            order = np.argsort(labels, kind="stable")
            owner_sorted = np.repeat(np.tile(np.arange(n_users), n_classes), counts.ravel())
            owner = np.empty(len(idx), dtype=np.int64)
            owner[order] = owner_sorted
            for i in range(n_users):
                result[i][set_name] = idx[owner == i].astype(np.int64)  # keeps shuffled order
        if empty is None:
            return result
    set_name, user, got = empty
    if d == 1:
        raise ValueError(
            f"dirichlet_alpha={dirichlet_alpha}: party {user} got no sample in the {set_name} set "
            f"in {max_draws} seeded draws ({sizes[SPLIT_SETS.index(set_name)]} samples for "
            f"{n_users} parties); use a larger dirichlet_alpha, fewer parties or a larger "
            f"{names[set_name]}"
        )
    raise ValueError(
        f"dirichlet_alpha={dirichlet_alpha}, devices_per_user={d}: user {user} got {got} "
        f"sample(s) in the {set_name} set, fewer than its {d} devices, in {max_draws} seeded draws, "
        f"so a device would get no sample ({sizes[SPLIT_SETS.index(set_name)]} samples for {n_users} users x "
        f"{d} devices); use a larger dirichlet_alpha, fewer devices_per_user, fewer parties or a "
        f"larger {names[set_name]}"
    )


def split_federation(
    x,
    y,
    n_parties,
    *,
    train_ratio=0.4,
    test_ratio=0.4,
    audit_ratio=0.2,
    seed=0,
    dirichlet_alpha=None,
    devices_per_user=1,
) -> list[PartyData]:
    """Shuffle (seeded) and split ``(x, y)`` into per-party member/non-member/population shards.

    * ``train_ratio`` / ``test_ratio`` / ``audit_ratio`` (plan: ``train_dataset_ratio`` /
      ``test_dataset_ratio`` / ``audit_dataset_ratio``) must each be > 0 and sum to <= 1.
    * ``dirichlet_alpha=None``: IID, each set dealt as ``set[i::n_parties]``.
    * ``dirichlet_alpha=a``: label skew; per class, party shares ~ Dirichlet(a), the same
      shares for train, test and population (so each party's three shards share one
      label mix).  If a party would get an empty shard the shares are redrawn from the
      same seeded generator (at most 100 times), then ValueError.
    * ``devices_per_user=d`` (>= 1; ``n_parties`` must be a multiple of it): the split
      above is made for ``n_parties // d`` users, then each user's train / test /
      population sets are dealt to its d devices as ``set[j::d]`` (device j); party p is
      device ``p % d`` of user ``p // d`` (:func:`user_of_party`), so a user's devices
      share one label mix.  ``d=1`` gives exactly the plain split.
    * Every party gets >= 1 sample in every set, else ValueError saying which set.
    * Deterministic for a given ``seed``.
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y differ in length: {x.shape[0]} != {y.shape[0]}")
    parts = split_indices(
        y,
        n_parties,
        train_ratio=train_ratio,
        test_ratio=test_ratio,
        audit_ratio=audit_ratio,
        seed=seed,
        dirichlet_alpha=dirichlet_alpha,
        devices_per_user=devices_per_user,
    )
    return [
        PartyData(
            train_x=x[p["train"]],
            train_y=y[p["train"]],
            test_x=x[p["test"]],
            test_y=y[p["test"]],
            population_x=x[p["population"]],
            population_y=y[p["population"]],
        )
        for p in parts
    ]
