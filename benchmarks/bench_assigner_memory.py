"""Benchmark: what OpenFL 1.9's task assigners hold per round, for src/plan/bounds.py's ASSIGNER_BYTES_PER_ENTRY.

Run on demand:  .venv/bin/python benchmarks/bench_assigner_memory.py

RandomGroupedAssigner (the plan's) and StaticGroupedAssigner build, when the aggregator starts, a list per round for
every task and every collaborator. Each is built here with the plan's three tasks for several collaborator counts
and round counts, under tracemalloc (they are pure Python: every byte goes through Python's allocator), and the
retained and peak bytes are printed per round x (tasks + collaborators).

The figures, and the bound they give: benchmarks/README.md, "OpenFL's task assigners".
"""

from __future__ import annotations

import tracemalloc

from openfl.component import RandomGroupedAssigner, StaticGroupedAssigner

TASKS = ["aggregated_model_validation", "train", "locally_tuned_model_validation"]


def measure(cls, collaborators: int, rounds: int) -> tuple[float, float]:
    names = [f"collaborator{i}" for i in range(1, collaborators + 1)]
    if cls is RandomGroupedAssigner:
        groups = [{"name": "learning", "percentage": 1.0, "tasks": TASKS}]
    else:
        groups = [{"name": "learning", "collaborators": names, "tasks": TASKS}]
    tracemalloc.start()
    assigner = cls(task_groups=groups, tasks={}, authorized_cols=names, rounds_to_train=rounds)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del assigner
    entries = rounds * (len(TASKS) + collaborators)
    return current / entries, peak / entries


def main() -> None:
    print("assigner              collaborators   rounds  bytes/entry retained  peak")
    for cls in (RandomGroupedAssigner, StaticGroupedAssigner):
        for collaborators in (1, 3, 10):
            for rounds in (10_000, 100_000):
                kept, peak = measure(cls, collaborators, rounds)
                print(f"{cls.__name__:<22}{collaborators:>13}{rounds:>9}{kept:>22.1f}{peak:>6.1f}")


if __name__ == "__main__":
    main()
