"""Benchmark: what one rewrite of run.json and of the run index's utility line costs as a run grows.

Both are rewritten at every round's end. A run folder of N rounds is made for 2 parties (each account.json's round
entries shaped like a real run's: the trained and the sent update's leak summaries in words, no DP) and the
aggregator (its round files made by audit.aggregator_report.record.round_record, 2 collaborators' scalars); then
the CPU-milliseconds of one rewrite, the median of `--reps`:

- run.json (audit.reporting.run_file.write_run_file) with no account changed since the last rewrite, and after each
  party rewrote its account (once a round in a run), beside a rewrite that reads everything again (a process with
  nothing kept);
- the utility line (audit.reporting.html: the aggregator's round files, each read once) beside reading every round
  file again (audit.reporting.records.load_round_files).

    nice .venv/bin/python benchmarks/bench_rewrite_cost.py [--rounds 10 100 200] [--reps 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit.aggregator_report.page import GLOBAL_ACCURACY, utility_of  # noqa: E402
from audit.aggregator_report.record import round_record  # noqa: E402
from audit.reporting import html, run_file  # noqa: E402
from audit.reporting.atomic_io import atomic_write_json  # noqa: E402
from audit.reporting.records import load_round_files, round_file_name  # noqa: E402
from audit.run_account import RoundRelease  # noqa: E402
from audit.run_record import ACCOUNT_FILE, LeakSummary, PartyRun, RoundEntry, RunInfo  # noqa: E402
from audit.run_states import RUNNING  # noqa: E402

PARTIES = ("collaborator1", "collaborator2")
_TEXT = ("no leak detected (36 tests, Holm-corrected, 95%); strongest: local / loss TPR at FPR 0.9 0.894 [0.86, 0.92] "
         "(corrected: [0.83, 0.94]), chance 0.847, p = 1 adjusted; these counts (359 members, 359 non-members) could "
         "only have shown exact AUC >= 0.565, TPR >= 0.18 at FPR 0.1, TPR >= 0.61 at FPR 0.5, TPR >= 0.96 at FPR 0.9; "
         "an epsilon lower bound of at most 3.29")


def make_run(root: Path, rounds: int) -> None:
    leak = LeakSummary(False, 1.0, 0.0, 3.29, _TEXT, "local / loss TPR at FPR 0.9 0.894 [0.86, 0.92]")
    for name in PARTIES:
        entries = tuple(RoundEntry(r, True, "kept", "the trained update", leak=leak, sent_leak=leak,
                                   release=RoundRelease(r, unbounded="sent as trained, without DP"))
                        for r in range(rounds))
        atomic_write_json(root / name / ACCOUNT_FILE, PartyRun(name, entries).to_json(versioned=True))
    scalars = {"mia_local_loss_exact_auc": 0.52, "leak_detected": 0.0, "leak_p_value": 0.6, "leak_epsilon_lb": 0.0,
               "gate_kept": 1.0}
    for r in range(rounds):
        atomic_write_json(root / "aggregator" / round_file_name(r), round_record(
            r, authorized=PARTIES, stragglers=[], metrics={name: dict(scalars) for name in PARTIES},
            aggregator_logs={GLOBAL_ACCURACY: 0.5 + 0.001 * r}))
    run_file.write_run_file(root, info=RunInfo(RUNNING, rounds, {"rounds": rounds}))


def cpu_ms(work, reps: int, before=None) -> float:
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        started = time.process_time()
        work()
        times.append((time.process_time() - started) * 1000)
    return statistics.median(times)


def rewrite_accounts(root: Path) -> None:
    for name in PARTIES:  # as the party does: a new file, os.replace'd in
        path = root / name / ACCOUNT_FILE
        shutil.copy(path, path.with_suffix(".new"))
        os.replace(path.with_suffix(".new"), path)


def forget() -> None:
    run_file._ACCOUNTS.clear()
    run_file._WRITTEN.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[10, 100, 200])
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    print("| rounds | run.json: nothing changed | both accounts rewritten | everything read again | utility line "
          "| every round file read again |")
    print("|---|---|---|---|---|---|")
    for rounds in args.rounds:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_run(root, rounds)
            aggregator = root / "aggregator"
            same = cpu_ms(lambda: run_file.write_run_file(root), args.reps)
            changed = cpu_ms(lambda: run_file.write_run_file(root), args.reps, before=lambda: rewrite_accounts(root))
            full = cpu_ms(lambda: run_file.write_run_file(root), args.reps, before=forget)
            utility_of(html._utility_views(aggregator))
            kept = cpu_ms(lambda: utility_of(html._utility_views(aggregator)), args.reps)
            again = cpu_ms(lambda: utility_of(load_round_files(aggregator, "aggregator round")), args.reps)
            size = (root / "run.json").stat().st_size / 1e3
            print(f"| {rounds} | {same:.1f} | {changed:.1f} | {full:.1f} | {kept:.2f} | {again:.1f} |"
                  f"  (run.json {size:.0f} KB)")


if __name__ == "__main__":
    main()
