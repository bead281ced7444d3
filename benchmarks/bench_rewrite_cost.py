"""Benchmark: what one rewrite of run.json and of the run index costs as a run grows.

Both are rewritten at every round's end. A run of N rounds is made from a real run's report folder (`--from`: a
demo's --log_dir): each party's account.json with its round entries repeated up to N rounds, and the aggregator's
round files likewise (N files); the parties' own round folders are left out (the run index's grid and the parties'
pages are not what is measured). Then the CPU-milliseconds of one rewrite, the median of `--reps`:

- run.json (`write_run_file`): with no account changed since the last rewrite; after each party rewrote its account
  (as once a round in a run); and the first rewrite in a new interpreter, which reads everything (what every rewrite
  read before the rewrites kept what they read);
- the run index (`write_index`: run.json, the utility line from the aggregator's round files, the aggregator's row):
  with nothing changed, and the first in a new interpreter.

    .venv/bin/python cifar10_PM.py --dataset digits --comm_round 2 --log_dir rewrite_source --replace_log_dir
    nice .venv/bin/python benchmarks/bench_rewrite_cost.py --from reports/rewrite_source [--rounds 10 100 200]
        [--reps 15]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit import ACCOUNT_FILE, atomic_write_json, round_file_name, write_index, write_run_file  # noqa: E402

_ROUND_FILE = re.compile(r"^round_(\d+)\.json$")


def make_run(source: Path, root: Path, rounds: int) -> list[Path]:
    """root: source's parties (account.json and page) and aggregator with `rounds` rounds; the accounts' paths."""
    accounts = []
    for folder in sorted(d for d in source.iterdir() if d.is_dir()):
        if (folder / ACCOUNT_FILE).is_file():
            account = json.loads((folder / ACCOUNT_FILE).read_text(encoding="utf-8"))
            base = account["rounds"]
            account["rounds"] = [dict(base[r % len(base)], round=r) for r in range(rounds)]
            (root / folder.name).mkdir()
            shutil.copy(folder / "index.html", root / folder.name / "index.html")
            accounts.append(atomic_write_json(root / folder.name / ACCOUNT_FILE, account))
        elif (folder / "decisions.csv").is_file():  # the aggregator's report
            shutil.copytree(folder, root / folder.name, ignore=shutil.ignore_patterns("round_*.json"))
            base = [json.loads(f.read_text(encoding="utf-8")) for f in sorted(folder.glob("round_*.json"))
                    if _ROUND_FILE.match(f.name)]
            for r in range(rounds):
                atomic_write_json(root / folder.name / round_file_name(r), dict(base[r % len(base)], round=r))
    shutil.copy(source / "run.json", root / "run.json")
    return accounts


def cpu_ms(work, reps: int, before=None) -> float:
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        started = time.process_time()
        work()
        times.append((time.process_time() - started) * 1000)
    return statistics.median(times)


def rewrite(paths: list[Path]) -> None:
    for path in paths:  # as a party does: a new file, os.replace'd in
        shutil.copy(path, path.with_suffix(".new"))
        os.replace(path.with_suffix(".new"), path)


def first_in_new_process(root: Path, what: str, reps: int) -> float:
    """The CPU-ms of the first `what` rewrite in a new interpreter (nothing kept), the median of `reps`."""
    out = []
    for _ in range(reps):
        done = subprocess.run([sys.executable, __file__, "--one", what, str(root)], capture_output=True, text=True,
                              check=True)
        out.append(float(done.stdout))
    return statistics.median(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="a real run's report folder (a demo's --log_dir)")
    parser.add_argument("--rounds", type=int, nargs="+", default=[10, 100, 200])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--one", nargs=2, metavar=("WHAT", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        what, root = args.one[0], Path(args.one[1])
        work = {"run.json": lambda: write_run_file(root), "index": lambda: write_index(root)}[what]
        print(cpu_ms(work, 1))
        return
    if args.source is None or not (args.source / "run.json").is_file():
        parser.error("--from: a run's report folder with a run.json (a demo's --log_dir)")
    print("CPU-ms of one rewrite (median); 'new process': the first rewrite in a new interpreter, everything read")
    print("| rounds | run.json: no account changed | both accounts rewritten | new process | run index: nothing "
          "changed | new process | run.json size |")
    print("|---|---|---|---|---|---|---|")
    for rounds in args.rounds:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            accounts = make_run(args.source, root, rounds)
            write_index(root)
            same = cpu_ms(lambda: write_run_file(root), args.reps)
            changed = cpu_ms(lambda: write_run_file(root), args.reps, before=lambda: rewrite(accounts))
            index = cpu_ms(lambda: write_index(root), args.reps)
            cold_run = first_in_new_process(root, "run.json", max(3, args.reps // 3))
            cold_index = first_in_new_process(root, "index", max(3, args.reps // 3))
            size = (root / "run.json").stat().st_size / 1e3
            print(f"| {rounds} | {same:.1f} | {changed:.1f} | {cold_run:.1f} | {index:.1f} | {cold_index:.1f} "
                  f"| {size:.0f} KB |")


if __name__ == "__main__":
    main()
