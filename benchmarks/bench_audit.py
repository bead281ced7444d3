"""Benchmark: per-round audit time against local training time, measured in the same federation run.

Runs the in-process federation (real OpenFL objects) and reads the timings each collaborator's round
record holds: local training (one epoch) and the audit (signals on members, non-members and population
under the local and the received global model, population attacks, update attack). Prints per-round
figures, the ratio of audit to training time and the share of audit time per signal.

    .venv/bin/python benchmarks/bench_audit.py [--rounds 3] [--collaborators 2] [--model cnn]
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit import RoundRecord  # noqa: E402 (after the path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--collaborators", type=int, default=2)
    p.add_argument("--model", default="cnn")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    import logging

    import torch

    from workspace.in_process import run_in_process
    from workspace.plan_file import collaborator_names

    torch.set_num_threads(args.threads)
    logging.getLogger("openfl").setLevel(logging.ERROR)
    overrides = {
        "data_loader": {"settings": {"dataset": args.dataset}},
        "task_runner": {"settings": {"model": args.model}},
    }
    with tempfile.TemporaryDirectory() as tmp:
        result = run_in_process(Path(tmp), collaborators=args.collaborators, rounds=args.rounds, overrides=overrides)
        records = [
            RoundRecord.read(result.report_dir / name / f"round_{r:04d}" / "audit.json")
            for name in collaborator_names(args.collaborators) for r in range(args.rounds)
        ]
    sizes = records[0].sizes
    print(f"dataset={args.dataset} model={args.model} collaborators={args.collaborators} rounds={args.rounds} "
          f"threads={args.threads}; per party: {sizes}")
    print(f"{'party':<15}{'round':>6}{'train s':>10}{'audit s':>10}{'audit/train':>13}")
    for rec in records:
        t = rec.timings
        print(f"{rec.party:<15}{rec.round:>6}{t['train_s']:>10.3f}{t['audit_s']:>10.3f}{t['audit_s'] / t['train_s']:>13.2f}")
    train = statistics.median(r.timings["train_s"] for r in records)
    audit = statistics.median(r.timings["audit_s"] for r in records)
    print(f"median: train {train:.3f}s, audit {audit:.3f}s, audit/train ratio {audit / train:.2f}")
    per_signal = {}
    for rec in records:
        for per_model in rec.timings["signals_s"].values():
            for signal, seconds in per_model.items():
                per_signal[signal] = per_signal.get(signal, 0.0) + seconds
    total = sum(per_signal.values())
    print("signal time share: " + ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(per_signal.items())))


if __name__ == "__main__":
    main()
