"""Benchmark: does a long multi-process run stay flat? Per round, every participant's peak RSS and the aggregator's
seconds per round, over many rounds of a small federation (`python -m workspace`'s code: an aggregator and
collaborators as separate `fx` processes on 127.0.0.1).

Each participant's peak of a round is its kernel high-water mark (VmHWM) read when the aggregator finishes the
round (a new line in its metrics log) and then reset (`/proc/PID/clear_refs` 5, Linux >= 4.0): the peak within the
round, not since the start; its CPU time in the round likewise (/proc/PID/stat; it moves far less with the
machine's load than the wall time). The seconds per round are the aggregator's own (OpenFL's MetricWriter
`elapsed_seconds`, round begin to round end). From round `--from` on, each series is summarised by its median, its
spread (max - min over the median) and a least-squares line: the drift it predicts over those rounds, as a share of
the median, with its standard error (a trend the noise of a shared machine cannot hide); `flat` when the drift is
within `--within` (5%) of the median.

    nice .venv/bin/python benchmarks/bench_rounds_flat.py [--rounds 200] [--collaborators 2] [--from 10]
        [--within 0.05] [--set KEY=VALUE ...] [--keep DIR]

The defaults: digits, a small split (`train_dataset_ratio` 0.05), 1 epoch, the plan's audit (loss, logits, gradient
norm, RMIA with one reference), no TLS.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SMALL = ["tasks.train.kwargs.epochs=1", "data_loader.settings.train_dataset_ratio=0.05",
         "data_loader.settings.test_dataset_ratio=0.05", "data_loader.settings.audit_dataset_ratio=0.2"]


def high_water_mb(pid: int) -> float | None:
    """The process's peak RSS since its start or the last reset (VmHWM), MB; None once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """The process's CPU time so far (user + system, /proc/PID/stat), seconds; None once it has gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def reset_high_water(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class RoundPeaks(threading.Thread):
    """At each round the aggregator finishes: every participant's VmHWM, then reset."""

    def __init__(self, registry, metrics_file: Path):
        super().__init__(daemon=True)
        self.registry, self.metrics_file, self.done = registry, metrics_file, threading.Event()
        self.peaks: list[dict[str, float]] = []  # per finished round: name -> MB
        self.cpu: list[dict[str, float]] = []  # per finished round: name -> CPU-seconds it took
        self._cpu_before: dict[str, float] = {}
        self.resettable = True

    def run(self):
        from workspace.progress import rounds_done

        seen = 0
        while not self.done.wait(0.05):
            finished = rounds_done(self.metrics_file)
            if finished == seen:
                continue
            peaks, cpu = {}, {}
            for started in self.registry.started:
                mb, used = high_water_mb(started.pid), cpu_seconds(started.pid)
                if mb is not None:
                    peaks[started.name] = mb
                    self.resettable &= reset_high_water(started.pid)
                if used is not None:
                    if started.name in self._cpu_before:
                        cpu[started.name] = (used - self._cpu_before[started.name]) / (finished - seen)
                    self._cpu_before[started.name] = used
            for _ in range(finished - seen):  # rounds shorter than a poll share their peak
                self.peaks.append(peaks)
                self.cpu.append(cpu)
            seen = finished


def trend(values: list[float]) -> tuple[float, float]:
    """Least-squares slope per round and its standard error."""
    n = len(values)
    xs = list(range(n))
    mx, my = statistics.fmean(xs), statistics.fmean(values)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, values)) / sxx
    residuals = [y - (my + slope * (x - mx)) for x, y in zip(xs, values)]
    se = math.sqrt(sum(r * r for r in residuals) / max(1, n - 2) / sxx)
    return slope, se


def summary(name: str, values: list[float], unit: str, within: float) -> str:
    median = statistics.median(values)
    slope, se = trend(values)
    span = len(values) - 1
    drift, drift_se = slope * span / median, se * span / median
    spread = (max(values) - min(values)) / median
    flat = abs(drift) <= within
    return (f"{name:<18} median {median:8.2f} {unit}, min {min(values):8.2f}, max {max(values):8.2f} (spread "
            f"{100 * spread:5.1f}%); trend {slope:+.4f} {unit}/round = {100 * drift:+5.2f}% +- {100 * drift_se:.2f}% "
            f"over {span} rounds: {'flat' if flat else 'NOT flat'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--collaborators", type=int, default=2)
    p.add_argument("--from", dest="start", type=int, default=10, help="first round of the summary (default 10)")
    p.add_argument("--within", type=float, default=0.05, help="flat: |drift| within this share of the median")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more plan overrides")
    p.add_argument("--keep", type=Path, default=None, help="run in this (new) folder and keep it")
    p.add_argument("--json", type=Path, default=None, help="also write the per-round figures here")
    args = p.parse_args()

    import workspace.federation as federation
    from workspace.federation import metrics_file
    from workspace.prepare import prepare
    from workspace.processes import ParticipantLauncher, ProcessRegistry
    from workspace.run_plan import merge_overrides

    base = args.keep or Path(tempfile.mkdtemp(prefix="bench_rounds_flat_")) / "run"
    registry = ProcessRegistry()
    began = time.monotonic()
    try:
        layout = prepare(base, collaborators=args.collaborators, rounds=args.rounds, use_tls=False,
                         overrides=merge_overrides([*SMALL, *args.set]), registry=registry, say=lambda m: None)
        sampler = RoundPeaks(registry, metrics_file(layout))
        sampler.start()
        outcome = federation.start(layout, registry=registry, say=lambda m: None)
    finally:
        registry.stop_all()
    sampler.done.set()
    sampler.join()
    if outcome.rounds_done < args.rounds:
        print(f"the federation failed after {outcome.rounds_done} rounds: {outcome.problems}", file=sys.stderr)
        return 1
    for problem in outcome.problems:  # e.g. a collaborator slow to exit after the last round: its rounds are done
        print(f"note: {problem}")
    seconds = outcome.round_seconds
    names = sorted({n for peaks in sampler.peaks for n in peaks if n != ParticipantLauncher.NAME})
    print(f"{args.rounds} rounds, {args.collaborators} collaborators, overrides {[*SMALL, *args.set]}; "
          f"{time.monotonic() - began:.0f} s in all; folder {layout.root}")
    if not sampler.resettable:
        print("note: /proc/PID/clear_refs could not be written: each figure is the peak since the process started")
    print("round  seconds  " + "  ".join(f"{n + ' MB':>16}" for n in names)
          + "  " + "  ".join(f"{n + ' CPU-s':>19}" for n in names))
    for r, peaks in enumerate(sampler.peaks):
        sec = seconds[r] if r < len(seconds) else float("nan")
        cpu = sampler.cpu[r] if r < len(sampler.cpu) else {}
        print(f"{r:5d}  {sec:7.2f}  " + "  ".join(f"{peaks.get(n, float('nan')):16.1f}" for n in names)
              + "  " + "  ".join(f"{cpu.get(n, float('nan')):19.2f}" for n in names))
    print(f"\nfrom round {args.start} on ({len(seconds) - args.start} rounds):")
    print(summary("seconds/round", seconds[args.start:], "s", args.within))
    for n in names:
        series = [peaks[n] for peaks in sampler.peaks[args.start:] if n in peaks]
        print(summary(n, series, "MB", args.within))
    for n in names:  # CPU time moves far less with the machine's load than wall time
        series = [cpu[n] for cpu in sampler.cpu[args.start:] if n in cpu]
        print(summary(f"{n} CPU", series, "CPU-s", args.within))
    if args.json is not None:
        args.json.write_text(json.dumps({"seconds": seconds, "peaks_mb": sampler.peaks, "cpu_s": sampler.cpu},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
