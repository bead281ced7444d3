"""Benchmark: wall time per round of a real multi-process federation against its compute (the latency) and every
process's peak RSS; this tree's code against an earlier revision's (--compare-with); plan poll interval against
OpenFL's 10 s; the tooling's threads per process against torch's default.

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
`--compare-with REV` also prepares the same federation from git revision REV's code (exported with `git archive`
into the temporary folder, the repository untouched; each participant runs the code its folder was prepared
with) and runs the two in turns, in the same load: it prints both side by side, the ratios REV / this tree of the
wall time per round, of the latency and of each process's peak RSS, and whether the collaborators' audit metrics
of every round are identical (same plan and seed: they must be).

    .venv/bin/python benchmarks/bench_poll_interval.py [--rounds 4] [--collaborators 2] [--intervals 1 10]
                                                       [--threads auto] [--repeats 2] [--tls] [--compare-with REV]
e.g. .venv/bin/python benchmarks/bench_poll_interval.py --intervals 1 --compare-with main --repeats 3
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from revisions import export_revision  # benchmarks/: the script's own folder is first on sys.path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


THIS_TREE = "this tree"

# Run by a fresh interpreter with the code tree to prepare from first on sys.path: the participants' folders get the
# code of the tree whose workspace.prepare made them.
PREPARE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from workspace.prepare import prepare
from workspace.processes import ProcessRegistry
from workspace.run_plan import merge_overrides
a = json.loads(sys.argv[2])
registry = ProcessRegistry()
try:
    layout = prepare(__import__("pathlib").Path(a["dest"]), collaborators=a["collaborators"], rounds=a["rounds"],
                     use_tls=a["tls"], overrides=merge_overrides(a["set"]), registry=registry, say=lambda m: None)
finally:
    registry.stop_all()
print(layout.root)
"""


def prepare_once(base: Path, code: str, code_root: Path, interval: int, args) -> Path:
    dest = base / f"prepared_{'this' if code == THIS_TREE else 'rev'}_poll_{interval}s"
    options = {"dest": str(dest), "collaborators": args.collaborators, "rounds": args.rounds, "tls": args.tls,
               "set": [f"aggregator.settings.poll_interval_s={interval}", *args.set]}
    done = subprocess.run([sys.executable, "-c", PREPARE, str(code_root), json.dumps(options)], cwd=code_root,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"preparing {code} (poll {interval} s) failed:\n{done.stdout}{done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1])


def round_metrics(reports: dict, rounds: int) -> dict:
    """(collaborator, round) -> the audit metrics of its round record (for the same-answers check)."""
    out = {}
    for name, folder in reports.items():
        for r in range(rounds):
            path = Path(folder) / f"round_{r:04d}" / "audit.json"
            if name != "aggregator" and path.is_file():
                out[name, r] = json.loads(path.read_text())["metrics"]
    return out


def metric_differences(a: dict, b: dict) -> tuple[int, float, list[str]]:
    """(values compared, the largest absolute difference, what is in one and not the other) of two round_metrics."""
    compared, largest, missing = 0, 0.0, []
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            missing.append(f"{key[0]} round {key[1]}")
            continue
        for metric in sorted(set(a[key]) | set(b[key])):
            x, y = a[key].get(metric), b[key].get(metric)
            if x is None or y is None:
                missing.append(f"{key[0]} round {key[1]} {metric}")
            elif not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
                compared += 1
                largest = max(largest, abs(float(x) - float(y)))
    return compared, largest, missing


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
    process's VmHWM only grows, so the last sample before it exits is within 0.5 s of its peak. `peaks_in_rounds`
    holds the peaks when `rounds_over()` first turned true (the aggregator's last round ended): a collaborator's
    peak is often reached later, while the interpreter shuts down (measured: +0.05-0.13 GB of shared-library pages,
    after every atexit hook, in torch's CUDA build), which no code of the run can change."""

    def __init__(self, registry, rounds_over):
        super().__init__(daemon=True)
        self.registry, self.rounds_over, self.done = registry, rounds_over, threading.Event()
        self.peaks, self.peaks_in_rounds = {}, None

    def run(self):
        while not self.done.wait(0.5):
            for started in self.registry.started:
                gb = peak_rss_gb(started.pid)
                if gb is not None:
                    self.peaks[started.name] = max(gb, self.peaks.get(started.name, 0.0))
            if self.peaks_in_rounds is None and self.rounds_over():
                self.peaks_in_rounds = dict(self.peaks)


def run_once(prepared: Path, dest: Path, code: str, interval: int, threads: str, args) -> dict:
    import workspace.federation as federation
    from workspace.federation_state import FederationLayout
    from workspace.federation import metrics_file
    from workspace.processes import ProcessRegistry, party_threads
    from workspace.progress import rounds_done

    shutil.copytree(prepared, dest)  # a prepared folder starts once: each run gets a fresh copy
    registry = ProcessRegistry()
    # "inherit": no thread counts set, every process takes torch's default (as before the tooling set them).
    federation.party_threads = party_threads if threads == "auto" else (lambda collaborators: None)
    layout = FederationLayout.load(dest)
    rss = PeakRSS(registry, lambda: rounds_done(metrics_file(layout)) >= layout.rounds)
    rss.start()
    try:
        outcome = federation.start(layout, registry=registry, timeout_s=args.timeout,
                                   say=lambda m: None)
    finally:
        rss.done.set()
        registry.stop_all()
        federation.party_threads = party_threads
    if not outcome.ok:
        raise SystemExit(f"{code}, poll_interval_s={interval}: the federation failed: {outcome.problems}")
    return {"code": code, "interval": interval, "threads": threads, "rounds": outcome.round_seconds,
            "total": outcome.seconds, "compute": round_compute(outcome.reports, len(outcome.round_seconds)),
            "metrics": round_metrics(outcome.reports, len(outcome.round_seconds)), "peak_rss_gb": rss.peaks,
            "peak_rss_in_rounds_gb": rss.peaks_in_rounds or {}}


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--collaborators", type=int, default=2)
    p.add_argument("--intervals", type=int, nargs="+", default=[1, 10], help="poll intervals to compare (s)")
    p.add_argument("--threads", nargs="+", choices=["auto", "inherit"], default=["auto"],
                   help="threads per process: the tooling's (auto) and/or torch's default (inherit)")
    p.add_argument("--repeats", type=int, default=2, help="runs per variant, alternating (default 2)")
    p.add_argument("--tls", action="store_true", help="mTLS as in a deployment (slower set-up, same rounds)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--set", action="append", default=["tasks.train.kwargs.epochs=1"],
                   help="plan overrides for every run (default: tasks.train.kwargs.epochs=1)")
    p.add_argument("--compare-with", metavar="REV", default=None,
                   help="also run git revision REV's code (e.g. main, HEAD~3), in turns with this tree's")
    p.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    args = p.parse_args()
    if args.compare_with and subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{args.compare_with}^{{commit}}"],
            stdout=subprocess.DEVNULL).returncode != 0:
        p.error(f"--compare-with: {args.compare_with!r} is not a git revision of {ROOT}")

    results, loads = [], [load_average()]
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        codes = {THIS_TREE: ROOT}
        if args.compare_with:
            codes[args.compare_with] = export_revision(ROOT, args.compare_with, base / "revision_code")
        prepared = {}
        for code, code_root in codes.items():
            for interval in args.intervals:
                began = time.monotonic()
                prepared[code, interval] = prepare_once(base, code, code_root, interval, args)
                print(f"{code}, poll_interval_s={interval}: prepared in {time.monotonic() - began:.0f} s", flush=True)
        variants = [(c, i, t) for c in codes for i in args.intervals for t in args.threads]
        for repeat in range(args.repeats):
            # Alternate, and start each repeat with the other variant: a trend in the machine's load hits all alike.
            for code, interval, threads in (variants if repeat % 2 == 0 else variants[::-1]):
                tag = "this" if code == THIS_TREE else "rev"
                dest = base / f"run{repeat}_{tag}_poll_{interval}s_{threads}"
                results.append(run_once(prepared[code, interval], dest, code, interval, threads, args))
                loads.append(load_average())
                print(f"{code}, poll_interval_s={interval} threads {threads} run {repeat + 1}: "
                      f"{results[-1]['total']:.1f} s (load average {loads[-1]})", flush=True)

    print(f"\n{args.collaborators} collaborators, {args.rounds} rounds, {'mTLS' if args.tls else 'no TLS'}, "
          f"overrides {args.set}; wall s per round (compute s: the slowest collaborator's train + audit); "
          f"load average (1, 5, 15 min) from {loads[0]} to {loads[-1]}")
    width = max(len(c) for c in (THIS_TREE, args.compare_with or "")) + 2
    header = f"{'code':>{width}}{'poll s':>7}{'threads':>9}" + "".join(f"{f'round {r}':>16}" for r in range(args.rounds))
    print(header + f"{'mean 1..':>10}{'compute':>9}{'latency':>9}{'run s':>9}")
    for res in results:
        rounds, compute = res["rounds"], res["compute"]
        steady = rounds[1:] if len(rounds) > 1 else rounds
        res["steady"] = statistics.mean(steady)
        res["steady_compute"] = statistics.mean(compute[1:] if len(compute) > 1 else compute)
        cells = "".join(f"{w:>9.1f} ({c:4.1f})" for w, c in zip(rounds, compute))
        print(f"{res['code']:>{width}}{res['interval']:>7}{res['threads']:>9}" + cells + f"{res['steady']:>10.2f}"
              f"{res['steady_compute']:>9.2f}{res['steady'] - res['steady_compute']:>9.2f}{res['total']:>9.1f}")
    for res in results:
        collaborators = {n: gb for n, gb in res["peak_rss_gb"].items() if n.startswith("collaborator")}
        others = {n: gb for n, gb in res["peak_rss_gb"].items() if n not in collaborators and gb > 0.2}
        in_rounds = res["peak_rss_in_rounds_gb"]
        print(f"peak RSS ({res['code']}, poll {res['interval']} s, threads {res['threads']}): collaborators "
              + ", ".join(f"{n} {gb:.2f} GB (rounds {in_rounds.get(n, math.nan):.2f})"
                          for n, gb in sorted(collaborators.items()))
              + (("; " + ", ".join(f"{n} {gb:.2f} GB" for n, gb in sorted(others.items()))) if others else ""))
    means, rss, rss_rounds = {}, {}, {}
    for variant in variants:
        mine = [r for r in results if (r["code"], r["interval"], r["threads"]) == variant]
        means[variant] = tuple(statistics.mean(r[k] for r in mine) for k in ("steady", "steady_compute", "total"))
        names = sorted({n for r in mine for n in r["peak_rss_gb"]})
        rss[variant] = {n: max(r["peak_rss_gb"].get(n, 0.0) for r in mine) for n in names}
        rss_rounds[variant] = {n: max(r["peak_rss_in_rounds_gb"].get(n, 0.0) for r in mine) for n in names}
    for (code, interval, threads), (steady, compute, total) in means.items():
        print(f"{code}, poll {interval} s, threads {threads}: {steady:.2f} s per round (rounds 1.., mean of "
              f"{args.repeats} runs) against {compute:.2f} s of compute: latency {steady - compute:.2f} s; "
              f"{total:.1f} s per run; peak RSS (largest over the runs; in brackets until the last round's end) "
              + ", ".join(f"{n} {gb:.2f} GB ({rss_rounds[code, interval, threads][n]:.2f})"
                          for n, gb in rss[code, interval, threads].items() if gb > 0.2))
    fast, slow = min(args.intervals), max(args.intervals)
    for code in codes:
        for threads in args.threads:
            if fast != slow:
                a, b = means[code, fast, threads], means[code, slow, threads]
                print(f"{code}, threads {threads}: poll {slow} s vs {fast} s: {b[0] / a[0]:.2f}x the wall time per "
                      f"round, {b[2] / a[2]:.2f}x the whole run")
    if len(args.threads) == 2:
        for code in codes:
            for interval in args.intervals:
                a, b = means[code, interval, "auto"], means[code, interval, "inherit"]
                print(f"{code}, poll {interval} s: torch's default threads vs the tooling's: {b[0] / a[0]:.2f}x the "
                      f"wall time per round, {b[2] / a[2]:.2f}x the whole run")
    if args.compare_with:
        rev = args.compare_with
        for interval in args.intervals:
            for threads in args.threads:
                new, old = means[THIS_TREE, interval, threads], means[rev, interval, threads]
                latency_new, latency_old = new[0] - new[1], old[0] - old[1]
                print(f"{rev} / {THIS_TREE} (poll {interval} s, threads {threads}): {old[0] / new[0]:.2f}x the wall "
                      f"time per round ({old[0]:.2f} s vs {new[0]:.2f} s), latency {latency_old:.2f} s vs "
                      f"{latency_new:.2f} s ({latency_old / latency_new:.2f}x), compute {old[1]:.2f} s vs "
                      f"{new[1]:.2f} s, {old[2] / new[2]:.2f}x the whole run")
                for what, table in (("peak RSS", rss), ("peak RSS until the last round's end", rss_rounds)):
                    peaks_new, peaks_old = table[THIS_TREE, interval, threads], table[rev, interval, threads]
                    print(f"  {what}: " + ", ".join(
                        f"{n} {peaks_old[n]:.2f} GB vs {peaks_new[n]:.2f} GB ({peaks_old[n] / peaks_new[n]:.2f}x)"
                        for n in sorted(set(peaks_new) & set(peaks_old)) if peaks_new[n] > 0.2))
                new_runs = [r for r in results if (r["code"], r["interval"], r["threads"]) == (THIS_TREE, interval, threads)]
                old_runs = [r for r in results if (r["code"], r["interval"], r["threads"]) == (rev, interval, threads)]
                compared, largest, missing = metric_differences(old_runs[0]["metrics"], new_runs[0]["metrics"])
                same = "identical" if largest == 0.0 and not missing else "DIFFERENT"
                print(f"  collaborators' audit metrics, {rev} vs {THIS_TREE}: {same} ({compared} values, largest "
                      f"absolute difference {largest:.3g}" + (f"; only in one: {missing[:5]}" if missing else "") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
