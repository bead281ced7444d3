"""The most of each count a plan may ask for, from what the data and the machine allow, checked before any work.

- Rounds: OpenFL's task assigner (RandomGroupedAssigner, StaticGroupedAssigner) builds, when the aggregator starts,
  a list per round for every task and every collaborator, all of it before round 0: a billion rounds fill a machine's
  memory before any round runs. A run may ask for at most MAX_ROUNDS rounds, and for no more than fit in
  ASSIGNER_MEMORY_SHARE of the machine's memory at ASSIGNER_BYTES_PER_ENTRY per round, task and collaborator.
- Collaborators: every collaborator's member, non-member and population sets need at least one sample of the
  dataset (src.data.split); a local federation runs a process per collaborator, each holding the libraries it
  imports (PARTY_PROCESS_BYTES).
- The audit's sample size: at most the dataset's samples (a larger one samples nothing more).
- The trainings of a round: each count that multiplies a round's optimizer steps (the local training's epochs, RMIA's
  reference models, the deanonymization self-audit's shadow updates, the canary audit's canaries, the gate's DP
  retrains) may ask for at most MAX_ROUND_STEPS steps a round on the plan's mean shard: on the cheapest model measured
  (STEP_CPU_MS) that is already CPU_MINUTES_AT_MAX CPU-minutes a round. Each is checked on its own and named.
- The gate's DP retrains: at most audit.config.gate.MAX_DP_RETRIES (each doubles the noise), declared with the setting.

Torch-free and OpenFL-free: the tooling and the demo check their flags with these before they import either. Every
error is a SettingsError whose message starts with the flag or the dotted plan key it is given.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from audit import SettingsError, is_int

__all__ = ["MAX_ROUNDS", "ASSIGNER_BYTES_PER_ENTRY", "ASSIGNER_MEMORY_SHARE", "PARTY_PROCESS_BYTES",
           "MAX_ROUND_STEPS", "STEP_CPU_MS", "CPU_MINUTES_AT_MAX",
           "physical_memory", "max_rounds", "check_rounds", "max_collaborators_for_data", "check_collaborators",
           "max_local_collaborators", "check_local_collaborators", "check_sample_size", "mean_shard",
           "check_round_steps", "check_training_counts"]

MAX_ROUNDS = 100_000
# What OpenFL 1.9's assigners hold per round for each task and each collaborator, rounded up from what
# benchmarks/bench_assigner_memory.py measures (retained and peak under tracemalloc; benchmarks/README.md).
ASSIGNER_BYTES_PER_ENTRY = 160
ASSIGNER_MEMORY_SHARE = 1 / 8
# The libraries a party's process imports (torch, OpenFL, pandas, ...), as resident memory (benchmarks/README.md,
# "Memory").
PARTY_PROCESS_BYTES = 440 * 2**20
# Optimizer steps a round's trainings may take, per count that multiplies them. The cheapest step measured, the fcnn
# on digits at batch 32 on one core, takes STEP_CPU_MS (benchmarks/README.md, "Counts and their bounds"): a round at
# the bound is at least CPU_MINUTES_AT_MAX CPU-minutes of one training alone, far beyond any federated recipe (one
# to a few hundred local epochs of some hundred batches), and far short of the 10^12 epochs a typo can ask for.
MAX_ROUND_STEPS = 1_000_000
STEP_CPU_MS = 0.6
CPU_MINUTES_AT_MAX = MAX_ROUND_STEPS * STEP_CPU_MS / 1000 / 60


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


def mean_shard(dataset: str, ratio, collaborators) -> int | None:
    """The members (training samples) of the mean collaborator: floor(samples x ratio) / collaborators (a label skew
    moves samples between the shards, not their mean); None where the settings are not valid (theirs to name)."""
    from src.data.datasets import dataset_samples

    try:
        pool = int(math.floor(dataset_samples(dataset) * float(ratio) + 1e-6))
    except (ValueError, TypeError, KeyError):
        return None
    if not is_int(collaborators) or collaborators < 1 or pool < 1:
        return None
    return max(1, pool // collaborators)


def check_round_steps(key: str, count, *, steps_each: int, what: str, unit: str) -> None:
    """`count` (at `key`) times `steps_each` optimizer steps a round (`what` says how they come about), at most
    MAX_ROUND_STEPS; SettingsError naming `key`."""
    if not is_int(count) or count < 1 or steps_each < 1:
        return  # the type and the minimum are the settings' own checks
    total = count * steps_each
    if total > MAX_ROUND_STEPS:
        most = max(1, MAX_ROUND_STEPS // steps_each)
        raise SettingsError(f"{key}: {count:,} {unit}; at most {most:,}: {what} make {steps_each:,} optimizer steps "
                            f"a round each, {total:,} in all, and a round may take at most {MAX_ROUND_STEPS:,} (at "
                            f"least {CPU_MINUTES_AT_MAX:,.0f} CPU-minutes on the cheapest model measured)")


def _get(mapping, *path):
    for part in path:
        if not isinstance(mapping, Mapping):
            return None
        mapping = mapping.get(part)
    return mapping


def check_training_counts(config: Mapping, data: Mapping, *, epochs_key: str = "tasks.train.kwargs.epochs",
                          names: Mapping[str, str] | None = None) -> None:
    """The counts that multiply a round's trainings, on the plan's mean shard (mean_shard) and batch size: the train
    task's epochs and each per-collaborator epochs, RMIA's reference models, the deanonymization self-audit's shadow
    updates, the canary audit's canaries and the gate's DP retrains (check_round_steps). `names`: plan key -> the flag
    that sets it, for the demo's messages."""
    names = names or {}
    members = mean_shard(data.get("dataset"), data.get("train_dataset_ratio"), data.get("collaborator_count"))
    batch = data.get("batch_size")
    if members is None or not is_int(batch) or batch < 1:
        return
    batches = math.ceil(members / batch)
    shard = f"{batches:,} batch{'es' if batches != 1 else ''} of {batch} on the mean shard of {members:,} members"
    tasks = config.get("tasks") if isinstance(config.get("tasks"), Mapping) else {}
    epochs = next((_get(task, "kwargs", "epochs") for task in tasks.values()
                   if isinstance(task, Mapping) and task.get("function") == "train_task"), None)
    epochs = epochs if is_int(epochs) and epochs >= 1 else 1
    epochs_said = f"{epochs:,} epoch{'s' if epochs != 1 else ''} of {shard}"

    def key(plan_key: str) -> str:
        return names.get(plan_key, plan_key)

    check_round_steps(key(epochs_key), epochs, steps_each=batches, what=f"epochs of {shard}", unit="epochs")
    runner = _get(config, "task_runner", "settings") or {}
    for party, entry in (_get(runner, "per_collaborator") or {}).items():
        check_round_steps(f"task_runner.settings.per_collaborator.{party}.epochs", _get(entry, "epochs"),
                          steps_each=batches, what=f"epochs of {shard}", unit="epochs")
    local = epochs * batches  # one local training's steps
    audit = _get(runner, "audit") or {}
    if not isinstance(audit, Mapping) or audit.get("enabled") is False:
        return
    rmia = audit.get("rmia") or {}
    if isinstance(rmia, Mapping) and rmia.get("enabled", True) is not False:
        kinds = rmia.get("references", ("global", "independent"))
        trained = [k for k in (kinds if isinstance(kinds, (list, tuple)) else ()) if k != "global"]
        if trained:
            check_round_steps(key("task_runner.settings.audit.rmia.reference_models"), rmia.get("reference_models"),
                              steps_each=len(trained) * local, unit="reference models",
                              what=f"the references ({len(trained)} trained kind{'s' if len(trained) != 1 else ''}: "
                                   f"{', '.join(map(str, trained))}) each about one local training ({epochs_said}), "
                                   "they")
    deanon = audit.get("deanon") or {}
    if isinstance(deanon, Mapping) and deanon.get("enabled") is True:
        users = deanon.get("crowd_users", 10)
        if is_int(users) and users >= 1:
            check_round_steps("task_runner.settings.audit.deanon.shadows_per_user", deanon.get("shadows_per_user", 8),
                              steps_each=(users + 1) * local, unit="shadow updates per user",
                              what=f"the shadow updates of {users:,} crowd users and this collaborator, each about "
                                   f"one local training ({epochs_said}),")
    canary = audit.get("canary") or {}
    if isinstance(canary, Mapping) and canary.get("enabled") is True:
        count = canary.get("count", 500)
        if is_int(count) and count >= 1:
            # The canary audit's shadow training takes the members and about half the canaries, for `epochs` epochs.
            total = epochs * math.ceil((members + count / 2) / batch)
            if total > MAX_ROUND_STEPS:
                most = max(1, 2 * (MAX_ROUND_STEPS // epochs * batch - members))
                raise SettingsError(
                    f"task_runner.settings.audit.canary.count: {count:,} canaries; at most {most:,}: half of them "
                    f"join the shadow training of {members:,} members ({epochs:,} epochs at batch {batch}), "
                    f"{total:,} optimizer steps a round, and a round may take at most {MAX_ROUND_STEPS:,} (at least "
                    f"{CPU_MINUTES_AT_MAX:,.0f} CPU-minutes on the cheapest model measured)")
    gate = _get(runner, "gate") or {}
    if isinstance(gate, Mapping) and gate.get("action") == "dp_retrain":
        check_round_steps("task_runner.settings.gate.dp.max_retries", _get(gate, "dp", "max_retries"),
                          steps_each=local, unit="DP retrains",
                          what=f"DP retrains, each a local training ({epochs_said}),")
