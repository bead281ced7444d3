"""How many model-sized arrays a collaborator's TensorDB holds when each local training starts, round by round: with
the plan's collaborator dropping each finished round's models (src.collaborator.drop_finished_models), or with
OpenFL's clean-up alone (`db_store_rounds` rounds kept), as a collaborator process of its own had it before.

Run on demand (not a test). An in-process federation on digits (the plan's CNN, one epoch, audit off: the TensorDB
is what is counted, not the audit); distinct array buffers are counted, in units of the model's bytes:

    .venv/bin/python benchmarks/bench_collaborator_models.py --rounds 4
    .venv/bin/python benchmarks/bench_collaborator_models.py --rounds 4 --openfl-clean-up-only
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def held_model_copies(collaborator) -> float:
    """Distinct bytes of the TensorDB's model and trained arrays over the bytes of the collaborator's model."""
    frame = collaborator.tensor_db.tensor_db
    rows = frame[frame["tags"].map(lambda tags: bool({"model", "trained"} & set(tags)))]
    buffers = {}
    for value in rows["nparray"]:
        base = np.asarray(value)
        while isinstance(base.base, np.ndarray):
            base = base.base
        buffers[base.__array_interface__["data"][0]] = base.nbytes
    model = sum(np.asarray(v).nbytes for v in collaborator.task_runner.get_tensor_dict().values())
    return sum(buffers.values()) / model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--openfl-clean-up-only", action="store_true",
                   help="no drop of finished rounds' models: OpenFL's db_store_rounds clean-up alone")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    sys.path.insert(0, str(ROOT))

    from openfl.component import Collaborator

    import src.collaborator
    from audit import render_queue
    from workspace.in_process import run_in_process

    if args.openfl_clean_up_only:
        src.collaborator.drop_finished_models = lambda col, round_num: 0
    render_queue.submit = lambda writer, round_num: None  # the report's images are not what is measured
    seen: dict[str, list] = {}
    do_task = Collaborator.do_task

    def counted(self, task, round_number):
        if (task if isinstance(task, str) else task.name).startswith("train"):
            seen.setdefault(self.collaborator_name, []).append((round_number, held_model_copies(self)))
        return do_task(self, task, round_number)

    Collaborator.do_task = counted
    overrides = {"tasks": {"train": {"kwargs": {"epochs": 1}}},
                 "task_runner": {"settings": {"audit": {"enabled": False}}}}
    with tempfile.TemporaryDirectory() as tmp:
        run_in_process(Path(tmp) / "run", collaborators=2, rounds=args.rounds, overrides=overrides)
    what = "OpenFL's clean-up only" if args.openfl_clean_up_only else "finished rounds' models dropped"
    for name, counts in seen.items():
        print(f"{what}: {name}, model copies held as each training starts: "
              + ", ".join(f"round {r} {c:.1f}" for r, c in counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
