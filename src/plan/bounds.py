"""The most of each count a plan may ask for, from what the data and the machine allow, checked before any work.

- Rounds: OpenFL's task assigner (RandomGroupedAssigner, StaticGroupedAssigner) builds, when the aggregator starts,
  a list per round for every task and every collaborator, all of it before round 0: a billion rounds fill a machine's
  memory before any round runs. A run may ask for at most MAX_ROUNDS rounds, and for no more than fit in
  ASSIGNER_MEMORY_SHARE of the machine's memory at ASSIGNER_BYTES_PER_ENTRY per round, task and collaborator.
- Collaborators: every collaborator's member, non-member and population sets need at least one sample of the
  dataset (src.data.split); a local federation runs a process per collaborator, each holding the libraries it
  imports (PARTY_PROCESS_BYTES).
- The audit's sample size: at most the dataset's samples (a larger one samples nothing more).

Torch-free and OpenFL-free: the tooling and the demo check their flags with these before they import either. Every
error is a SettingsError whose message starts with the flag or the dotted plan key it is given.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from audit import SettingsError, is_int

__all__ = ["MAX_ROUNDS", "ASSIGNER_BYTES_PER_ENTRY", "ASSIGNER_MEMORY_SHARE", "PARTY_PROCESS_BYTES",
           "physical_memory", "max_rounds", "check_rounds", "max_collaborators_for_data", "check_collaborators",
           "max_local_collaborators", "check_local_collaborators", "check_sample_size"]

MAX_ROUNDS = 100_000
# What OpenFL 1.9's assigners hold per round for each task and each collaborator, rounded up from what
# benchmarks/bench_assigner_memory.py measures (retained and peak under tracemalloc; benchmarks/README.md).
ASSIGNER_BYTES_PER_ENTRY = 160
ASSIGNER_MEMORY_SHARE = 1 / 8
# The libraries a party's process imports (torch, OpenFL, pandas, ...), as resident memory (benchmarks/README.md,
# "Memory").
PARTY_PROCESS_BYTES = 440 * 2**20


def physical_memory() -> int:
    """The machine's memory in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _gb(n: float) -> str:
    return f"{n / 2**30:,.3g} GB"


def max_rounds(tasks: int, collaborators: int, memory: int | None = None) -> int:
    """The most rounds a plan of `tasks` tasks and `collaborators` collaborators may train."""
    memory = physical_memory() if memory is None else memory
    if memory <= 0:
        return MAX_ROUNDS
    per_round = ASSIGNER_BYTES_PER_ENTRY * max(1, tasks + collaborators)
    return max(1, min(MAX_ROUNDS, int(memory * ASSIGNER_MEMORY_SHARE // per_round)))


def check_rounds(key: str, rounds, *, tasks: int, collaborators: int, memory: int | None = None) -> None:
    if not is_int(rounds) or rounds < 1:
        return  # the type and the minimum are the settings' own checks
    most = max_rounds(tasks, collaborators, memory)
    if rounds > most:
        held = rounds * ASSIGNER_BYTES_PER_ENTRY * max(1, tasks + collaborators)
        raise SettingsError(f"{key}: {rounds:,} rounds; at most {most:,} (OpenFL's task assigner holds a list per "
                            f"round for each of the {tasks} tasks and {collaborators} collaborators from the start: "
                            f"~{_gb(held)} for {rounds:,} rounds; the limit is {MAX_ROUNDS:,} rounds and "
                            f"{ASSIGNER_MEMORY_SHARE:.3g} of this machine's {_gb(physical_memory())})")


def _set_sizes(samples: int, ratios: Mapping[str, float]) -> dict[str, int]:
    # src.data.split: floor(n * ratio) samples per set (train, test, population)
    return {key: int(math.floor(samples * float(r) + 1e-6)) for key, r in ratios.items()}


def max_collaborators_for_data(dataset: str, ratios: Mapping[str, float]) -> tuple[int, str]:
    """The most collaborators the dataset's split can give a sample of each set, and the set that limits it."""
    from src.data.datasets import dataset_samples

    sizes = _set_sizes(dataset_samples(dataset), ratios)
    limiting = min(sizes, key=sizes.get)
    return sizes[limiting], limiting


def check_collaborators(key: str, collaborators, *, dataset, ratios: Mapping[str, float], prefix: str) -> None:
    """Each collaborator needs a sample of each of its sets: at most min(floor(samples x ratio)) collaborators.
    `ratios`: the three split ratios by their plan key names; `prefix` names them (a flag's "--", the plan's
    "data_loader.settings.")."""
    from src.data.datasets import dataset_samples

    if not is_int(collaborators) or collaborators < 1:
        return
    from src.data.split import check_ratios

    check_ratios(ratios, prefix=prefix)  # a share out of range is named as itself, not as a count of collaborators
    try:
        samples = dataset_samples(dataset)
        most, limiting = max_collaborators_for_data(dataset, ratios)
    except (ValueError, TypeError, KeyError):
        return  # an unknown dataset or a bad ratio: the data loader's settings name it
    if collaborators > most:
        raise SettingsError(f"{key}: {collaborators:,} collaborators; at most {most:,} for {dataset} ({samples:,} "
                            f"samples): every collaborator needs at least one sample of each set, and {prefix}"
                            f"{limiting} {float(ratios[limiting]):g} x {samples:,} gives {most:,}")


def max_local_collaborators(memory: int | None = None) -> int:
    """The most collaborators a federation on this machine may start: a process each, and the aggregator's."""
    memory = physical_memory() if memory is None else memory
    return max(1, memory // PARTY_PROCESS_BYTES - 1) if memory > 0 else 10**6


def check_local_collaborators(key: str, collaborators, memory: int | None = None) -> None:
    if not is_int(collaborators) or collaborators < 1:
        return
    most = max_local_collaborators(memory)
    if collaborators > most:
        raise SettingsError(f"{key}: {collaborators:,} collaborators; at most {most:,} on this machine (each is a "
                            f"process holding ~{_gb(PARTY_PROCESS_BYTES)} of libraries, as is the aggregator; this "
                            f"machine has {_gb(physical_memory())})")


def check_sample_size(key: str, sample_size, *, dataset) -> None:
    """The audit's sample per set: at most the dataset's samples (null: every sample)."""
    from src.data.datasets import dataset_samples

    if not is_int(sample_size):
        return
    try:
        samples = dataset_samples(dataset)
    except (ValueError, TypeError):
        return
    if sample_size > samples:
        raise SettingsError(f"{key}: {sample_size:,} samples per set; at most {samples:,}, every sample of "
                            f"{dataset} (null, or `all` on the demo's command line: every sample of each set)")
