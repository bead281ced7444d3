"""RMIA's reference models as a party of a federation can have them, without anyone's private data but its own.

Each trained kind is K copies trained at once with the party's own recipe (audit.training.train_references), copy k
on its own subset of the party's population shard of the member count (`population_subsets`), so that the party
knows which population samples each reference trained on (RMIA's Pr(z) then uses the references that did not, and
`a` can be tuned on them):

- `fine_tuned_references`: from the round's received global model, one local training: the same start as the
  party's own model this round, on other data. Trained anew each round.
- `independent_references`: from the plan's initial model, never the global model: they never see this party's data.
  Kept in the party's store and brought, each audited round, to as many local trainings as the party's model has had
  (round + 1), so each costs one local training per round on average.

Either kind is trained once per round and reused by every audit of that round (a DP retrain's re-audits).
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from audit.spill import ModelSource, load_model
from audit.training import TrainedCopies, train_references

__all__ = ["References", "population_subsets", "fine_tuned_references", "independent_references", "reference_seed"]


@dataclass(frozen=True, eq=False)
class References:
    """K trained reference models and which population samples each trained on."""

    kind: str
    copies: TrainedCopies
    population_in: np.ndarray  # (K, M) bool
    trainings: int             # local trainings each reference has had
    seconds: float             # spent training them for this round (0.0 when reused)


def reference_seed(seed: int | None, party: str, round_num: int, kind: str) -> int:
    """A seed per (plan seed, party, round, kind): the same plan gives the same references whatever the order."""
    return zlib.crc32(f"{seed or 0}/{party}/{round_num}/rmia/{kind}".encode()) & 0x7FFFFFFF


def population_subsets(n_population: int, size: int, k: int, seed: int) -> np.ndarray:
    """K subsets of `size` population indices, (K, size), at most half the population each (Privacy Meter v2
    trains every reference on a random half of the population).

    Consecutive disjoint slices of a random permutation; when K slices do not fit in one, the next slices come from a
    new permutation (never a slice across two: a subset holds no sample twice). So the K references share as few
    samples as the sizes allow, and every population sample z is OUT of at least one reference of every permutation
    used: RMIA's Pr(z) (the OUT references' mean) exists for all of them, and the tuning of `a` (each reference in
    turn the target, the others its references) has IN and OUT samples with references left for both."""
    if n_population < 2:
        raise ValueError(f"RMIA references: the population needs at least 2 samples, got {n_population}")
    size = max(1, min(int(size), n_population // 2))
    per_permutation = n_population // size
    rng = np.random.default_rng(seed)
    subsets = []
    while len(subsets) < k:
        order = rng.permutation(n_population)
        subsets += [order[j * size:(j + 1) * size] for j in range(min(per_permutation, k - len(subsets)))]
    return np.stack(subsets)


def _membership(subsets: np.ndarray, n_population: int) -> np.ndarray:
    trained = np.zeros((len(subsets), n_population), dtype=bool)
    for j, picked in enumerate(subsets):
        trained[j, picked] = True
    return trained


def fine_tuned_references(global_model: torch.nn.Module, population, recipe, *, k: int, size: int,
                          seed: int) -> References:
    """K references fine-tuned from the received global model, one local training each on its population subset."""
    x, y = population[0], np.asarray(population[1])  # x as given: samples held as pixels are converted per chunk
    subsets = population_subsets(len(y), size, k, seed)
    start = time.perf_counter()
    copies = train_references(global_model, x, y, recipe, seed=seed, subsets=subsets)  # no K x size copy of x
    return References("fine_tuned", copies, _membership(subsets, len(y)), 1, time.perf_counter() - start)


def independent_references(store: dict, initial_model: ModelSource, population, recipe, *, k: int, size: int,
                           trainings: int, seed: int) -> References:
    """K references that never saw the party's data, brought to `trainings` local trainings each.

    `store` (the party's, kept across rounds) holds them between rounds: each call trains only the local trainings
    missing since the last one. They are started again (from the initial model) when the population, K or the
    subset size changed. `initial_model`: the model, or a zero-argument callable giving it (audit.spill.ModelSource),
    called only when the references start: later calls continue from the stored copies, whose own template gives
    the architecture, so a caller that keeps the initial model on disk never reads it for them."""
    x, y = population[0], np.asarray(population[1])  # x as given: samples held as pixels are converted per chunk
    key = (len(y), int(k), int(size))
    if store.get("key") != key:
        subsets = population_subsets(len(y), size, k, seed)
        store.clear()
        store.update(key=key, subsets=subsets, copies=None, trainings=0)
    subsets = store["subsets"]
    start = time.perf_counter()
    while store["trainings"] < trainings:
        # One local training per step, each with its own shuffles: as the party's model trains once per round.
        step_seed = (seed + 7919 * store["trainings"]) & 0x7FFFFFFF
        model = load_model(initial_model) if store["copies"] is None else store["copies"].model
        store["copies"] = train_references(model, x, y, recipe, seed=step_seed, start=store["copies"],
                                           subsets=subsets)
        store["trainings"] += 1
    return References("independent", store["copies"], _membership(subsets, len(y)), store["trainings"],
                      time.perf_counter() - start)
