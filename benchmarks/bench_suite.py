"""CPU-seconds the test suite spends per test file and per test: a figure that a busy machine changes far less than
wall time (the suite is CPU-bound: `make test` keeps two workers busy on two cores).

Runs pytest as `make test` does, with a plugin (benchmarks/suite_cpu_plugin.py) that records, around each test's run
(its fixtures' set-up included), the CPU time of the pytest worker and of the child processes it waited for (`fx`,
`python -m workspace`, `cifar10_PM.py`: a child's own children count once it has waited for them). Then prints the
totals, the files and the tests that cost most.

    .venv/bin/python benchmarks/bench_suite.py                      # the whole suite, as make test runs it
    .venv/bin/python benchmarks/bench_suite.py -- tests/test_docs.py   # pytest arguments after --
    .venv/bin/python benchmarks/bench_suite.py --read FILE          # print an earlier run's records again
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAKE_TEST = ["-q", "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder", "tests"]


def run(pytest_args: list[str], out: Path) -> tuple[int, float]:
    env = {**os.environ, "SUITE_CPU_OUT": str(out),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))}
    start = time.monotonic()
    code = subprocess.call([sys.executable, "-m", "pytest", "-p", "suite_cpu_plugin", *pytest_args], cwd=ROOT,
                           env=env)
    return code, time.monotonic() - start


def summarise(records: list[dict], top: int) -> None:
    cpu = [r["self"] + r["children"] for r in records]
    print(f"\n{len(records)} tests, {sum(cpu):.0f} CPU-s in tests ({sum(r['children'] for r in records):.0f} of it in "
          "child processes)")
    by_file: collections.Counter = collections.Counter()
    for r, c in zip(records, cpu):
        by_file[r["id"].split("::")[0]] += c
    print(f"\n{'CPU s':>8} {'share':>6}  file")
    total = sum(cpu) or 1.0
    for name, seconds in by_file.most_common(top):
        print(f"{seconds:8.1f} {seconds / total:6.1%}  {name}")
    timeline(records)
    print(f"\n{'CPU s':>8} {'child':>7} {'wall s':>7}  test")
    for r in sorted(records, key=lambda r: -(r["self"] + r["children"]))[:top]:
        print(f"{r['self'] + r['children']:8.1f} {r['children']:7.1f} {r['wall']:7.1f}  {r['id']}")


def timeline(records: list[dict]) -> None:
    """Each worker's first start, last end, and the seconds its tests took: where the run's wall time went between
    the workers (a worker that ends early leaves a core idle)."""
    timed = [r for r in records if "start" in r]
    if not timed:
        return
    zero = min(r["start"] for r in timed)
    end = max(r["start"] + r["wall"] for r in timed)
    print(f"\n{'worker':>8} {'first s':>8} {'last s':>8} {'in tests s':>11} {'CPU s':>8} {'idle at end s':>14}")
    for worker in sorted({r["worker"] for r in timed}):
        mine = [r for r in timed if r["worker"] == worker]
        last = max(r["start"] + r["wall"] for r in mine)
        print(f"{worker:>8} {min(r['start'] for r in mine) - zero:8.1f} {last - zero:8.1f} "
              f"{sum(r['wall'] for r in mine):11.1f} {sum(r['self'] + r['children'] for r in mine):8.1f} "
              f"{end - last:14.1f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--top", type=int, default=25, help="how many files and tests to list")
    p.add_argument("--read", type=Path, default=None, help="print the records of an earlier run (one JSON per line)")
    p.add_argument("--out", type=Path, default=None, help="where the records go (default: a new temporary file)")
    p.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: make test's)")
    args = p.parse_args(argv)
    if args.read is None:
        out = args.out or Path(tempfile.mkstemp(prefix="suite_cpu_", suffix=".jsonl")[1])
        out.write_text("")
        code, wall = run(args.pytest_args or MAKE_TEST, out)
        load = os.getloadavg()
        print(f"\npytest exit code {code}, {wall:.0f} s wall; load average now {load[0]:.1f} {load[1]:.1f} "
              f"{load[2]:.1f}; records: {out}")
    else:
        out = args.read
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    summarise(records, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
