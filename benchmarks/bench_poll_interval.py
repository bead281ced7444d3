"""Benchmark: wall time per round of a real multi-process federation, plan poll interval against OpenFL's 10 s.

Prepares the same small federation (aggregator + collaborators as separate `fx` processes on 127.0.0.1, made and
started by `python -m workspace`'s code) once per poll interval, then starts fresh copies of them in turns
(--repeats times each, alternating, so that a change in the machine's load hits both alike), and prints per
run and round the aggregator's own wall time (OpenFL's MetricWriter `elapsed_seconds`, round begin to round
end), the mean over rounds 1.. (round 0 also holds the collaborators' start-up), the whole run's wall time, and
the ratios of the means over all runs.
OpenFL 1.9 tells an idle collaborator to wait `Aggregator._get_sleep_time()` = 10 s; AuditingAggregator
sends `aggregator.settings.poll_interval_s` instead.

    .venv/bin/python benchmarks/bench_poll_interval.py [--rounds 4] [--collaborators 2] [--intervals 1 10]
                                                       [--repeats 2] [--tls]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def prepare_once(base: Path, interval: int, args) -> Path:
    from workspace.prepare import prepare
    from workspace.processes import ProcessRegistry
    from workspace.run_plan import merge_overrides

    overrides = merge_overrides([f"aggregator.settings.poll_interval_s={interval}", *args.set])
    registry = ProcessRegistry()
    try:
        layout = prepare(base / f"prepared_poll_{interval}s", collaborators=args.collaborators, rounds=args.rounds,
                         use_tls=args.tls, overrides=overrides, registry=registry, say=lambda m: None)
    finally:
        registry.stop_all()
    return layout.root


def run_once(prepared: Path, dest: Path, interval: int, args) -> dict:
    from workspace.federation import start
    from workspace.prepare import FederationLayout
    from workspace.processes import ProcessRegistry

    shutil.copytree(prepared, dest)  # a prepared folder starts once: each run gets a fresh copy
    registry = ProcessRegistry()
    try:
        outcome = start(FederationLayout.load(dest), registry=registry, timeout_s=args.timeout, say=lambda m: None)
    finally:
        registry.stop_all()
    if not outcome.ok:
        raise SystemExit(f"poll_interval_s={interval}: the federation failed: {outcome.problems}")
    return {"interval": interval, "rounds": outcome.round_seconds, "total": outcome.seconds}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--collaborators", type=int, default=2)
    p.add_argument("--intervals", type=int, nargs="+", default=[1, 10], help="poll intervals to compare (s)")
    p.add_argument("--repeats", type=int, default=2, help="runs per interval, alternating (default 2)")
    p.add_argument("--tls", action="store_true", help="mTLS as in a deployment (slower set-up, same rounds)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--set", action="append", default=["tasks.train.kwargs.epochs=1"],
                   help="plan overrides for both runs (default: tasks.train.kwargs.epochs=1)")
    p.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    args = p.parse_args()

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        prepared = {}
        for interval in args.intervals:
            began = time.monotonic()
            prepared[interval] = prepare_once(base, interval, args)
            print(f"poll_interval_s={interval}: prepared in {time.monotonic() - began:.0f} s", flush=True)
        for repeat in range(args.repeats):
            for interval in args.intervals:
                results.append(run_once(prepared[interval], base / f"run{repeat}_poll_{interval}s", interval, args))
                print(f"poll_interval_s={interval} run {repeat + 1}: {results[-1]['total']:.1f} s", flush=True)

    print(f"\n{args.collaborators} collaborators, {args.rounds} rounds, {'mTLS' if args.tls else 'no TLS'}, "
          f"overrides {args.set}")
    header = f"{'poll s':>7}" + "".join(f"{f'round {r}':>10}" for r in range(args.rounds))
    print(header + f"{'mean 1..':>10}{'run s':>9}")
    for res in results:
        rounds = res["rounds"]
        res["steady"] = statistics.mean(rounds[1:]) if len(rounds) > 1 else rounds[0]
        print(f"{res['interval']:>7}" + "".join(f"{s:>10.1f}" for s in rounds) + f"{res['steady']:>10.1f}"
              f"{res['total']:>9.1f}")
    means = {i: (statistics.mean(r["steady"] for r in results if r["interval"] == i),
                 statistics.mean(r["total"] for r in results if r["interval"] == i)) for i in args.intervals}
    fast, slow = min(args.intervals), max(args.intervals)
    for i, (steady, total) in means.items():
        print(f"poll {i} s: {steady:.1f} s per round (rounds 1.., mean of {args.repeats} runs), {total:.1f} s per run")
    if fast != slow:
        print(f"poll {slow} s vs {fast} s: {means[slow][0] / means[fast][0]:.2f}x the wall time per round, "
              f"{means[slow][1] / means[fast][1]:.2f}x the whole run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
