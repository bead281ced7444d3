"""Benchmark: the CPU a party's report drawing takes per round, as its report worker draws it (audit.reporting).

Run on demand:  .venv/bin/python benchmarks/bench_report_drawing.py [--report DIR] [--compare-with REV] [--runs N]

The party's report folder (default: reports/demo/collaborator1, which `make demo` writes) is replayed round by round
in a child process, into an empty folder: each round's folder is copied in, then what the report worker does for it,
`render_round` (the round's ROC and histogram images) and `rebuild_summary` (the cross-round plots, the headline, the
pages, the run index). The child reports its process CPU for each, per round. With `--compare-with REV` the same is
done with git revision REV's `audit` package, the two alternating (`--runs` each), and the ratio of the medians is
printed: the two in one run, on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from revisions import export_revision  # noqa: E402


def child(code_root: Path, report: Path) -> dict:
    """Replay `report`'s rounds with the `audit` package under code_root; CPU seconds per round and part."""
    import time

    sys.path.insert(0, str(code_root))
    from audit import ReportWriter

    out = {"render_round": [], "rebuild_summary": []}
    with tempfile.TemporaryDirectory() as tmp:
        party_dir = Path(tmp) / report.name
        party_dir.mkdir()
        writer = ReportWriter(tmp, report.name)
        for round_dir in sorted(report.glob("round_*")):
            shutil.copytree(round_dir, party_dir / round_dir.name)
            start = time.process_time()
            writer.render_round(int(round_dir.name.split("_")[1]))
            middle = time.process_time()
            writer.rebuild_summary()
            out["render_round"].append(middle - start)
            out["rebuild_summary"].append(time.process_time() - middle)
    return out


def run_child(code_root: Path, report: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", str(code_root), str(report)], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the drawing failed with {code_root}'s code:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", type=Path, default=ROOT / "reports" / "demo" / "collaborator1",
                   help="a party's report folder (default: the demo's collaborator1; run `make demo` first)")
    p.add_argument("--compare-with", metavar="REV", default=None, help="also draw with git revision REV's code")
    p.add_argument("--runs", type=int, default=3, help="replays of each code, alternating (default 3)")
    p.add_argument("--child", nargs=2, metavar=("CODE_ROOT", "REPORT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(Path(args.child[0]), Path(args.child[1]))))
        return 0
    report = args.report.resolve()
    if not sorted(report.glob("round_*/audit.json")):
        p.error(f"--report {args.report}: no round_*/audit.json there (make demo writes reports/demo/collaborator1)")
    if args.runs < 1:
        p.error(f"--runs {args.runs}: must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        codes = {"working tree": ROOT}
        if args.compare_with:
            codes = {args.compare_with: export_revision(ROOT, args.compare_with, Path(tmp) / "rev"), **codes}
        results = {name: [] for name in codes}
        for _ in range(args.runs):
            for name, code_root in codes.items():
                results[name].append(run_child(code_root, report))
    rounds = len(next(iter(results.values()))[0]["render_round"])
    print(f"{report}: {rounds} rounds replayed, {args.runs} runs each; CPU seconds per round (median over runs and "
          "rounds)")
    medians = {}
    for name, runs in results.items():
        per_part = {part: statistics.median(v for run in runs for v in run[part]) for part in runs[0]}
        per_part["round"] = statistics.median(sum(run[part][i] for part in run) for run in runs for i in range(rounds))
        medians[name] = per_part
        print(f"  {name:>14}: render_round {per_part['render_round']:.3f}  rebuild_summary "
              f"{per_part['rebuild_summary']:.3f}  per round {per_part['round']:.3f}")
    if args.compare_with:
        new, old = medians["working tree"], medians[args.compare_with]
        print("  working tree / " + args.compare_with + ": " + "  ".join(
            f"{part} {new[part] / old[part]:.2f}" for part in ("render_round", "rebuild_summary", "round")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
