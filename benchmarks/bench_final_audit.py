"""Benchmark: the final model's audit against a round's audit, in the same run, in CPU-seconds of the thread that runs
them (time.thread_time: the report worker's drawing, another thread, is left out; torch on one thread).

Runs `make demo`'s configuration in one process (cifar10_PM.py's plan: digits, 2 collaborators, 8 rounds of 5 Adam
epochs, FPR tolerances 0.001 0.01 0.1 0.5, RMIA with global and independent references) with the report's drawing
off, and times the party's audit of each round's trained update (PartyAudit._audit) and the whole of the round
after the last at the party (PartyAudit.final_model: the final model's accuracy, its audit, its record and account
written). Prints per party the rounds' audits (mean, min, max) and the final task, as ratios to the rounds' mean and
to the cheapest round (wall seconds beside them, for a machine's load).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_final_audit.py [--rounds 8] [--epochs 5]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--collaborators", type=int, default=2)
    args = p.parse_args()

    import logging

    import torch

    from audit import PartyAudit, render_queue
    from workspace.in_process import run_in_process

    torch.set_num_threads(1)
    logging.getLogger("openfl").setLevel(logging.ERROR)
    logging.getLogger("audit").setLevel(logging.ERROR)
    seconds: dict[tuple[str, str], list[float]] = {}

    def timed(kind, function, party_at: int):
        def run(self, *a, **kw):
            start, wall = time.thread_time(), time.perf_counter()
            out = function(self, *a, **kw)
            seconds.setdefault((a[party_at], kind), []).append(time.thread_time() - start)
            seconds.setdefault((a[party_at], kind + " wall"), []).append(time.perf_counter() - wall)
            return out
        return run

    # The party's audit of a model each round (_audit(model, global_model, party, round), the trained update's; a DP
    # retrain's too, where the plan has them) and the whole of the round after the last (final_model(party, ...)):
    # the accuracy, the final model's audit, its record and account.
    PartyAudit._audit = timed("round", PartyAudit._audit, 2)
    PartyAudit.final_model = timed("task", PartyAudit.final_model, 0)
    render_queue.submit = lambda writer, round_num: None  # no drawing: the audits alone
    overrides = {
        "tasks": {"train": {"kwargs": {"epochs": args.epochs}}},
        "data_loader": {"settings": {"dataset": "digits", "train_dataset_ratio": 0.1, "test_dataset_ratio": 0.45,
                                     "audit_dataset_ratio": 0.45}},
        "task_runner": {"settings": {"optimizer": "Adam", "learning_rate": 0.003,
                                     "audit": {"fpr_tolerance": [0.001, 0.01, 0.1, 0.5]}}},
    }
    with tempfile.TemporaryDirectory() as tmp:
        run_in_process(Path(tmp), collaborators=args.collaborators, rounds=args.rounds, overrides=overrides)
    print(f"{args.collaborators} collaborators x {args.rounds} rounds of {args.epochs} epochs, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; CPU-seconds of the auditing thread")
    for party in sorted({party for party, _ in seconds}):
        rounds, task = seconds[(party, "round")], seconds[(party, "task")][0]
        mean = statistics.mean(rounds)
        print(f"{party}: round audits mean {mean:.2f} s (min {min(rounds):.2f}, max {max(rounds):.2f}, n = "
              f"{len(rounds)}; wall {statistics.mean(seconds[(party, 'round wall')]):.2f} s); the final model's "
              f"task {task:.2f} s = {task / mean:.2f} x the mean, {task / min(rounds):.2f} x the cheapest round "
              f"(wall {seconds[(party, 'task wall')][0]:.2f} s)")


if __name__ == "__main__":
    main()
