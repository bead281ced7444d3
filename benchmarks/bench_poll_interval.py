"""Benchmark: wall time per round of a real multi-process federation against its compute; plan poll interval
against OpenFL's 10 s; the tooling's threads per process against torch's default.

Prepares the same small federation (aggregator + collaborators as separate `fx` processes on 127.0.0.1, made and
started by `python -m workspace`'s code) once per poll interval, then starts fresh copies of them in turns
(--repeats times each, alternating, so that a change in the machine's load hits both alike), and prints per
run and round the aggregator's own wall time (OpenFL's MetricWriter `elapsed_seconds`, round begin to round
end), the mean over rounds 1.. (round 0 also holds the collaborators' start-up), the whole run's wall time, and
the ratios of the means over all runs, and every process's peak RSS (sampled every 0.5 s from /proc).
OpenFL 1.9 tells an idle collaborator to wait `Aggregator._get_sleep_time()` = 10 s; AuditingAggregator
sends `aggregator.settings.poll_interval_s` instead.
A round's compute is the slowest collaborator's training plus audit in that round (its record's train_s and audit_s;
the collaborators work in parallel): the rest of the round's wall time is latency (polling, OpenFL's messages and
TensorDB, report writing, validation). `--threads auto inherit` also compares the tooling's threads per process
(workspace.processes.party_threads: the cores shared by the collaborators, one for the aggregator) with torch's
default of one thread per core in every process.

    .venv/bin/python benchmarks/bench_poll_interval.py [--rounds 4] [--collaborators 2] [--intervals 1 10]
                                                       [--threads auto] [--repeats 2] [--tls]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
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


def round_compute(reports: dict, rounds: int) -> list[float]:
    """Per round, the slowest collaborator's train_s + audit_s (its round record); NaN where a record is missing."""
    out = []
    for r in range(rounds):
        seconds = []
        for name, folder in reports.items():
            path = Path(folder) / f"round_{r:04d}" / "audit.json"
            if name != "aggregator" and path.is_file():
                timings = json.loads(path.read_text())["timings"]
                seconds.append(timings.get("train_s", 0.0) + timings.get("audit_s", 0.0))
        out.append(max(seconds) if seconds else float("nan"))
    return out


def peak_rss_gb(pid: int) -> float | None:
    """The process's peak resident set so far (Linux VmHWM), GB; None once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e9
    except (OSError, ValueError):
        return None
    return None


class PeakRSS(threading.Thread):
    """Samples, every 0.5 s, the peak RSS of every process the registry started (by name, the largest seen): a
    process's VmHWM only grows, so the last sample before it exits is within 0.5 s of its peak."""

    def __init__(self, registry):
        super().__init__(daemon=True)
        self.registry, self.peaks, self.done = registry, {}, threading.Event()

    def run(self):
        while not self.done.wait(0.5):
            for started in self.registry.started:
                gb = peak_rss_gb(started.pid)
                if gb is not None:
                    self.peaks[started.name] = max(gb, self.peaks.get(started.name, 0.0))


def run_once(prepared: Path, dest: Path, interval: int, threads: str, args) -> dict:
    import workspace.federation as federation
    from workspace.prepare import FederationLayout
    from workspace.processes import ProcessRegistry, party_threads

    shutil.copytree(prepared, dest)  # a prepared folder starts once: each run gets a fresh copy
    registry = ProcessRegistry()
    # "inherit": no thread counts set, every process takes torch's default (as before the tooling set them).
    federation.party_threads = party_threads if threads == "auto" else (lambda collaborators: None)
    rss = PeakRSS(registry)
    rss.start()
    try:
        outcome = federation.start(FederationLayout.load(dest), registry=registry, timeout_s=args.timeout,
                                   say=lambda m: None)
    finally:
        rss.done.set()
        registry.stop_all()
        federation.party_threads = party_threads
    if not outcome.ok:
        raise SystemExit(f"poll_interval_s={interval}: the federation failed: {outcome.problems}")
    return {"interval": interval, "threads": threads, "rounds": outcome.round_seconds, "total": outcome.seconds,
            "compute": round_compute(outcome.reports, len(outcome.round_seconds)), "peak_rss_gb": rss.peaks}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--collaborators", type=int, default=2)
    p.add_argument("--intervals", type=int, nargs="+", default=[1, 10], help="poll intervals to compare (s)")
    p.add_argument("--threads", nargs="+", choices=["auto", "inherit"], default=["auto"],
                   help="threads per process: the tooling's (auto) and/or torch's default (inherit)")
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
        variants = [(i, t) for i in args.intervals for t in args.threads]
        for repeat in range(args.repeats):
            for interval, threads in variants:
                dest = base / f"run{repeat}_poll_{interval}s_{threads}"
                results.append(run_once(prepared[interval], dest, interval, threads, args))
                print(f"poll_interval_s={interval} threads {threads} run {repeat + 1}: {results[-1]['total']:.1f} s",
                      flush=True)

    print(f"\n{args.collaborators} collaborators, {args.rounds} rounds, {'mTLS' if args.tls else 'no TLS'}, "
          f"overrides {args.set}; wall s per round (compute s: the slowest collaborator's train + audit)")
    header = f"{'poll s':>7}{'threads':>9}" + "".join(f"{f'round {r}':>16}" for r in range(args.rounds))
    print(header + f"{'mean 1..':>10}{'compute':>9}{'latency':>9}{'run s':>9}")
    for res in results:
        rounds, compute = res["rounds"], res["compute"]
        steady = rounds[1:] if len(rounds) > 1 else rounds
        res["steady"] = statistics.mean(steady)
        res["steady_compute"] = statistics.mean(compute[1:] if len(compute) > 1 else compute)
        cells = "".join(f"{w:>9.1f} ({c:4.1f})" for w, c in zip(rounds, compute))
        print(f"{res['interval']:>7}{res['threads']:>9}" + cells + f"{res['steady']:>10.1f}"
              f"{res['steady_compute']:>9.2f}{res['steady'] - res['steady_compute']:>9.2f}{res['total']:>9.1f}")
    for res in results:
        collaborators = {n: gb for n, gb in res["peak_rss_gb"].items() if n.startswith("collaborator")}
        others = {n: gb for n, gb in res["peak_rss_gb"].items() if n not in collaborators and gb > 0.2}
        print(f"peak RSS (poll {res['interval']} s, threads {res['threads']}): collaborators "
              + ", ".join(f"{n} {gb:.2f} GB" for n, gb in sorted(collaborators.items()))
              + (("; " + ", ".join(f"{n} {gb:.2f} GB" for n, gb in sorted(others.items()))) if others else ""))
    means = {}
    for interval, threads in variants:
        mine = [r for r in results if r["interval"] == interval and r["threads"] == threads]
        means[interval, threads] = tuple(statistics.mean(r[k] for r in mine)
                                         for k in ("steady", "steady_compute", "total"))
    for (interval, threads), (steady, compute, total) in means.items():
        print(f"poll {interval} s, threads {threads}: {steady:.2f} s per round (rounds 1.., mean of {args.repeats} "
              f"runs) against {compute:.2f} s of compute: latency {steady - compute:.2f} s; {total:.1f} s per run")
    fast, slow = min(args.intervals), max(args.intervals)
    for threads in args.threads:
        if fast != slow:
            a, b = means[fast, threads], means[slow, threads]
            print(f"threads {threads}: poll {slow} s vs {fast} s: {b[0] / a[0]:.2f}x the wall time per round, "
                  f"{b[2] / a[2]:.2f}x the whole run")
    if len(args.threads) == 2:
        for interval in args.intervals:
            a, b = means[interval, "auto"], means[interval, "inherit"]
            print(f"poll {interval} s: torch's default threads vs the tooling's: {b[0] / a[0]:.2f}x the wall time per "
                  f"round, {b[2] / a[2]:.2f}x the whole run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
