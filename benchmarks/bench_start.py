"""What `python -m workspace start` (or `prepare`) costs: CPU time (user + system, of the tool and every process it
waited for: the participants and their launcher, or the set-up commands' worker), wall time, and the peak memory of
the run's processes summed (RSS, and PSS, which counts a page that n processes share as 1/n in each), optionally side
by side with another checkout's code.

`start`: it prepares one federation (or takes --prepared), then starts a fresh copy of it per run. `prepare`
(--command prepare): it prepares a fresh folder per run, 2 collaborators and 1 round with mutual TLS. The checkouts
run in turn (A B A B ...); it prints each run and the medians, and with --base the ratio this checkout / base, pair by
pair. Memory: every process whose working folder lies in the run folder, sampled every 0.2 s.

    .venv/bin/python benchmarks/bench_start.py --runs 3 --base /path/to/other/checkout   # it needs its own .venv
    .venv/bin/python benchmarks/bench_start.py --command prepare --runs 3 --base /path/to/other/checkout
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREPARE = ["--collaborators", "2", "--rounds", "2", "--no-tls", "--set", "tasks.train.kwargs.epochs=1",
           "--set", "task_runner.settings.audit.signals=[loss]", "--set", "task_runner.settings.audit.rmia.enabled=false"]
PREPARE_TIMED = ["--collaborators", "2", "--rounds", "1"]  # `--command prepare`: mutual TLS, 15 set-up commands
SAMPLE_S = 0.2


def _memory(folder: str) -> tuple[int, int]:
    """RSS and PSS, in bytes, summed over the processes working in `folder`."""
    rss = pss = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            if cwd != folder and not cwd.startswith(folder + os.sep):
                continue
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in ("Rss", "Pss"):
                        size = int(value.split()[0]) * 1024
                        rss, pss = (rss + size, pss) if key == "Rss" else (rss, pss + size)
        except (OSError, ValueError):
            continue
    return rss, pss


def run_once(command: str, code: Path, prepared: Path | None, scratch: Path) -> dict:
    run_dir = scratch / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    if command == "start":
        shutil.copytree(prepared, run_dir, symlinks=True)
    else:
        run_dir.mkdir()  # so that its processes are found from the start; prepare takes an empty folder
    folder = str(run_dir.resolve())
    extra = PREPARE_TIMED if command == "prepare" else []
    began = time.monotonic()
    proc = subprocess.Popen([str(code / ".venv" / "bin" / "python"), "-m", "workspace", command, "--dir", folder,
                             *extra], cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak_rss = peak_pss = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        rss, pss = _memory(folder)
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        time.sleep(SAMPLE_S)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": proc.returncode, "cpu": usage.ru_utime + usage.ru_stime, "wall": time.monotonic() - began,
            "rss": peak_rss / 2**30, "pss": peak_pss / 2**30}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--base", type=Path, help="another checkout (with its own .venv) to run in turn with this one")
    parser.add_argument("--prepared", type=Path, help="a prepared federation folder to copy (default: prepare one)")
    parser.add_argument("--command", choices=("start", "prepare"), default="start", help="what is timed")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench_start_"))
    prepared = args.prepared
    if prepared is None and args.command == "start":
        prepared = scratch / "prepared"
        subprocess.run([sys.executable, "-m", "workspace", "prepare", "--dir", str(prepared), *PREPARE], cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL)
    codes = {"this": ROOT, **({"base": args.base.resolve()} if args.base else {})}
    results: dict[str, list[dict]] = {name: [] for name in codes}
    for i in range(args.runs):
        for name, code in codes.items():
            result = run_once(args.command, code, prepared, scratch)
            results[name].append(result)
            print(f"run {i + 1} {name}: exit {result['rc']}, CPU {result['cpu']:.1f} s, wall {result['wall']:.1f} s, "
                  f"peak RSS sum {result['rss']:.2f} GiB, peak PSS sum {result['pss']:.2f} GiB", flush=True)
    for name, runs in results.items():
        print(f"{name}: median CPU {statistics.median(r['cpu'] for r in runs):.1f} s, wall "
              f"{statistics.median(r['wall'] for r in runs):.1f} s, peak RSS sum "
              f"{statistics.median(r['rss'] for r in runs):.2f} GiB, PSS sum {statistics.median(r['pss'] for r in runs):.2f} GiB")
    if args.base:
        for key in ("cpu", "wall", "rss", "pss"):
            ratios = sorted(a[key] / b[key] for a, b in zip(results["this"], results["base"]))
            print(f"this/base {key}: median {statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
