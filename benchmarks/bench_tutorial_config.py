"""Benchmark: the OpenFL Privacy Meter tutorial's CIFAR-10 configuration through cifar10_PM.py.

Measures, in one run of the real script (a child process), its peak RSS and, per round and collaborator,
the local training time against the audit time (all three signals, local and received global model), read
from the round records (`<log_dir>/<collaborator>/round_NNNN/audit.json`, `timings`).

The configuration is the tutorial's: CIFAR-10 train+test (60,000 images 3x32x32), 2 collaborators, ratios
0.4/0.4/0.2 (12,000 members, 12,000 non-members, 6,000 population per collaborator), `--model alexnet`,
SGD lr 0.005 momentum 0.9, batch 32, one local epoch per round, signals loss gradient_norm logits,
`--is_features True --layer_number 10`. There is no network here, so the data are synthetic images of the
same sizes (uint8, 10 classes, a faint class pattern plus noise), written in torchvision's
`cifar-10-batches-py` layout and read by the script's own loader through `--data-dir`. Revisions that read
the files with torchvision check them against the official files' md5 sums: the child process puts the synthetic
files' md5s in torchvision's table and changes nothing else (see CHILD_BOOT).

    .venv/bin/python benchmarks/bench_tutorial_config.py                       # full size, 3 rounds
    .venv/bin/python benchmarks/bench_tutorial_config.py --scale 0.1 --rounds 5   # each round's peak RSS
    .venv/bin/python benchmarks/bench_tutorial_config.py --scale 0.1 --census  # what holds memory, round by round
    .venv/bin/python benchmarks/bench_tutorial_config.py --scale 0.1 --rounds 2 --trace --keep DIR  # what the peaks hold
    .venv/bin/python benchmarks/bench_tutorial_config.py --scale 0.1 0.25      # 6,000 and 15,000 images
    .venv/bin/python benchmarks/bench_tutorial_config.py --scale 0.25 --compare-with HEAD~1
    .venv/bin/python benchmarks/bench_tutorial_config.py --scale 0.1 --compare-with 82771dd --also-with "--rmia False"

`--scale` is the fraction of the 60,000 images (several values: one run each, and the peak RSS is then
extrapolated linearly to the full size). `--compare-with REV` also runs the script of git revision REV
(exported with `git archive` into a temp folder; the repository is not touched) on the same data, right
after the working tree's, so the rows come from the same machine state: compare their ratios. `--also-with ARGS`
adds a run of the working tree with these script arguments, between the two (e.g. "--rmia False": the audit an
older revision without RMIA ran, next to the default one with it).
On 2 CPU cores a full-size round takes tens of minutes; scale 0.1 takes a few.
"""

# One script though above 400 lines: a benchmark runs as one file (the synthetic data, the child process, the
# comparison with another revision, the tables it prints). The docstring is --help's text.

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from revisions import export_revision  # benchmarks/: the script's own folder is first on sys.path

ROOT = Path(__file__).resolve().parent.parent
FULL_SIZE = 60_000
TRAIN_FILES = 5  # data_batch_1..5, then test_batch: CIFAR-10's 50,000 / 10,000 split
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
COLLABORATORS = ("collaborator1", "collaborator2")

TUTORIAL_ARGS = [
    "--dataset", "cifar10", "--model", "alexnet", "--collaborators", "2",
    "--train_dataset_ratio", "0.4", "--test_dataset_ratio", "0.4", "--audit_dataset_ratio", "0.2",
    "--signals", "loss", "gradient_norm", "logits", "--fpr_tolerance", "0.1", "0.5", "0.9",
    "--is_features", "True", "--layer_number", "10", "--optimizer_type", "SGD", "--learning_rate", "0.005",
    "--local_epochs", "1", "--auditing_interval", "1", "--no_progress",
]  # momentum 0.9 and batch 32 are plan/plan.yaml's defaults, which the script keeps

# Runs cifar10_PM.py as __main__ (argv after `-c CODE SCRIPT`). The synthetic files cannot match the MD5
# sums torchvision checks for the real CIFAR-10: for a --compare-with revision that still reads them with
# torchvision (run by a python that has it), that check (and only it) is switched off.
CHILD_BOOT = """
import hashlib, os, runpy, sys
try:
    import torchvision.datasets as tvd
except Exception:  # none here (or unloadable with this torch): revisions that read the files themselves check no md5
    pass
else:  # the synthetic files' md5s in torchvision's table, as if they were the official files
    folder = os.path.join(sys.argv[sys.argv.index("--data-dir") + 1], tvd.CIFAR10.base_folder)
    md5 = lambda name: hashlib.md5(open(os.path.join(folder, name), "rb").read()).hexdigest()
    tvd.CIFAR10.train_list = [[name, md5(name)] for name, _ in tvd.CIFAR10.train_list]
    tvd.CIFAR10.test_list = [[name, md5(name)] for name, _ in tvd.CIFAR10.test_list]
    tvd.CIFAR10.meta = {**tvd.CIFAR10.meta, "md5": md5(tvd.CIFAR10.meta["filename"])}
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))  # the code under test, before anything imports src
sys.path.insert(1, os.environ["BENCH_PHASE_SPLIT_DIR"])
import phase_split
phase_split.install(os.environ["BENCH_PHASE_SPLIT_OUT"])
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def write_synthetic_cifar10(root: Path, n: int, seed: int = 0) -> Path:
    """n images (uint8, 3x32x32, 10 classes) in torchvision's cifar-10-batches-py layout under root."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    # A faint per-class pattern under heavy noise: something to learn, never a separable toy.
    templates = rng.normal(0.0, 20.0, size=(len(CLASSES), 3 * 32 * 32))
    n_train = n * TRAIN_FILES // (TRAIN_FILES + 1)
    bounds = np.linspace(0, n_train, TRAIN_FILES + 1).astype(int).tolist() + [n]
    names = [f"data_batch_{i}" for i in range(1, TRAIN_FILES + 1)] + ["test_batch"]
    for name, start, stop in zip(names, bounds[:-1], bounds[1:]):
        labels = rng.integers(0, len(CLASSES), size=stop - start)
        pixels = 128.0 + templates[labels] + rng.normal(0.0, 50.0, size=(stop - start, 3 * 32 * 32))
        data = np.clip(pixels, 0, 255).astype(np.uint8)  # CIFAR's rows: 1024 R, 1024 G, 1024 B
        with open(folder / name, "wb") as f:
            pickle.dump({"batch_label": name, "labels": labels.tolist(), "data": data,
                         "filenames": [f"{i}.png" for i in range(start, stop)]}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": list(CLASSES), "num_cases_per_batch": n_train // TRAIN_FILES,
                     "num_vis": 3072}, f)
    return folder


def run_script(code_root: Path, data_root: Path, log_dir: Path, rounds: int, timeout: float | None,
               extra: list[str], census: bool = False, trace: bool = False) -> dict:
    """Run code_root/cifar10_PM.py once; wall seconds, exit code and the child's own peak RSS."""
    cmd = [sys.executable, "-c", CHILD_BOOT, str(code_root / "cifar10_PM.py"), *TUTORIAL_ARGS,
           "--data-dir", str(data_root), "--comm_round", str(rounds), "--log_dir", str(log_dir), *extra]
    out_path = log_dir.parent / f"{log_dir.name}.out"
    phases_path = log_dir.parent / f"{log_dir.name}.phases.json"
    phases_path.unlink(missing_ok=True)
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1",
           "BENCH_PHASE_SPLIT_DIR": str(Path(__file__).resolve().parent), "BENCH_PHASE_SPLIT_OUT": str(phases_path),
           "BENCH_CENSUS": "1" if census else "0", "BENCH_STEP_TRACE": "1" if trace else "0"}
    start = time.perf_counter()
    with open(out_path, "w") as out:
        child = subprocess.Popen(cmd, cwd=data_root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        deadline = None if timeout is None else start + timeout
        while True:
            # wait4 gives this child's own rusage (RUSAGE_CHILDREN would mix in earlier runs).
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if deadline is not None and time.perf_counter() > deadline:
                os.killpg(child.pid, signal.SIGTERM)
                pid, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.5)
        child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    timed_out = deadline is not None and wall > timeout
    phases = json.loads(phases_path.read_text()) if phases_path.is_file() else None
    peak = usage.ru_maxrss * 1024 / 1e9  # Linux reports kilobytes
    if phases and phases.get("peak_rss_gb"):
        # phase_split resets the high-water mark at each phase (for each round's own peaks), which ru_maxrss
        # follows: the run's peak is the largest the split saw.
        peak = max(peak, phases["peak_rss_gb"])
    return {"returncode": child.returncode, "timed_out": timed_out, "wall_s": wall, "peak_rss_gb": peak,
            "output": out_path, "phases": phases}


def read_records(log_dir: Path, rounds: int) -> list[dict]:
    records = []
    for col in COLLABORATORS:
        for r in range(rounds):
            path = log_dir / col / f"round_{r:04d}" / "audit.json"
            if path.is_file():
                records.append(json.loads(path.read_text()))
    return records


# The interval widths the table shows (what sampling costs in precision): column -> (model, attack, statistic).
WIDTHS = {"AUC CI": ("local", "loss", "exact_auc"), "TPR@0.1 CI": ("local", "loss", "0.1"),
          "RMIA AUC CI": ("rmia", "independent", "exact_auc")}


def interval_width(record: dict, model: str, attack: str, statistic: str) -> float | None:
    """Upper minus lower bound of one attack's exact-AUC interval or TPR interval at a tolerance; None if absent."""
    u = (((record.get("attacks") or {}).get(model) or {}).get(attack) or {}).get("uncertainty") or {}
    interval = u.get("exact_auc") if statistic == "exact_auc" else ((u.get("at_fpr") or {}).get(statistic) or {}).get("tpr")
    if not interval or interval.get("upper") is None or interval.get("lower") is None:
        return None
    return float(interval["upper"]) - float(interval["lower"])


def summarise(records: list[dict]) -> dict:
    """Medians over (collaborator, round): train, audit, audit seconds per signal (both models), audit over train time."""
    if not records:
        return {}
    per_signal: dict[str, list[float]] = {}
    for rec in records:
        totals: dict[str, float] = {}
        for per_model in rec["timings"]["signals_s"].values():
            for name, seconds in per_model.items():
                totals[name] = totals.get(name, 0.0) + seconds
        for name, seconds in totals.items():
            per_signal.setdefault(name, []).append(seconds)
    widths = {name: [w for w in (interval_width(r, *where) for r in records) if w is not None]
              for name, where in WIDTHS.items()}
    train = statistics.median(r["timings"]["train_s"] for r in records)
    audit = statistics.median(r["timings"]["audit_s"] for r in records)
    # Each record's train and audit ran back to back: its own ratio suffers less from a busy machine.
    ratios = [r["timings"]["audit_s"] / r["timings"]["train_s"] for r in records]
    return {"train_s": train, "audit_s": audit, "ratio": statistics.median(ratios), "ratio_range": (min(ratios), max(ratios)),
            "sizes": records[0]["sizes"],
            "signals_s": {k: statistics.median(v) for k, v in sorted(per_signal.items())}, "records": len(records),
            "widths": {k: statistics.median(v) for k, v in widths.items() if v}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, nargs="+", default=[1.0],
                   help="fraction(s) of the 60,000 images, each in (0, 1] (default 1.0)")
    p.add_argument("--rounds", type=int, default=3,
                   help="federated rounds per run (default 3: memory is measured over several rounds)")
    p.add_argument("--census", action="store_true",
                   help="at each audit's and round's end, list the live tensors and arrays by holder (slow; for "
                        "finding what stays across rounds, not for timing)")
    p.add_argument("--trace", action="store_true",
                   help="record RSS and malloc at each audit step's and task's entry and exit, with the stack at each "
                        "interval's peak (benchmarks/step_trace.py; reports_*.trace.json in the work dir, --keep it)")
    p.add_argument("--compare-with", metavar="REV", default=None,
                   help="also run cifar10_PM.py of git revision REV on the same data (e.g. HEAD)")
    p.add_argument("--also-with", metavar="ARGS", action="append", default=[],
                   help="also run the working tree with these script arguments (one string, split on spaces; "
                        "repeatable), e.g. --also-with '--rmia False'")
    p.add_argument("--timeout", type=float, default=None, help="seconds per script run before it is stopped")
    p.add_argument("--keep", metavar="DIR", default=None, help="keep data, reports and script output in DIR")
    p.add_argument("--script-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for cifar10_PM.py (repeatable), e.g. --script-arg=--seed --script-arg=1")
    args = p.parse_args(argv)
    for scale in args.scale:
        if not 0 < scale <= 1:
            p.error(f"--scale: {scale} is outside (0, 1]")
        if round(FULL_SIZE * scale) < 100:
            p.error(f"--scale: {scale} gives {round(FULL_SIZE * scale)} images; need at least 100")
    if args.rounds < 1:
        p.error(f"--rounds: need at least 1, got {args.rounds}")
    if args.compare_with and subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{args.compare_with}^{{commit}}"],
            stdout=subprocess.DEVNULL).returncode != 0:
        p.error(f"--compare-with: {args.compare_with!r} is not a git revision of {ROOT}")

    work = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="bench_tutorial_"))
    work.mkdir(parents=True, exist_ok=True)
    variants = [("working tree", ROOT, [])]
    variants += [(f"wt {extra}", ROOT, extra.split()) for extra in args.also_with]
    if args.compare_with:
        variants.append((args.compare_with, export_revision(ROOT, args.compare_with, work / "baseline_code"), []))

    import torch  # only to report the thread count the child will use (same defaults)

    print(f"tutorial CIFAR-10 configuration, synthetic data, {args.rounds} round(s), "
          f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs; work dir {work}", flush=True)
    rows = []
    try:
        for scale in args.scale:
            n = round(FULL_SIZE * scale)
            data_root = work / f"data_{n}"
            if not (data_root / "cifar-10-batches-py" / "test_batch").is_file():
                write_synthetic_cifar10(data_root, n)
            for index, (label, code_root, extra) in enumerate(variants):
                log_dir = work / f"reports_{n}_{index}"
                shutil.rmtree(log_dir, ignore_errors=True)
                print(f"running {label} on {n} images ...", flush=True)
                run = run_script(code_root, data_root, log_dir, args.rounds, args.timeout, args.script_arg + extra,
                                 census=args.census, trace=args.trace)
                summary = summarise(read_records(log_dir, args.rounds))
                row = {"label": label, "scale": scale, "n": n, **run, **summary}
                phases = round_phases(row, args.rounds)
                if phases:
                    row.update(report_s=phases["reports"], comm_s=phases["communication"])
                rows.append(row)
                if run["returncode"] != 0:
                    why = "timed out" if run["timed_out"] else f"exit code {run['returncode']}"
                    tail = run["output"].read_text()[-2000:]
                    print(f"  {label} at {n} images: {why}; last output:\n{tail}", flush=True)
    finally:
        print_table(rows)
        print_round_peaks(rows, args.rounds)
        print_phases(rows, args.rounds)
        print_census(rows)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept: {work}")
    return 0 if rows and all(r["returncode"] == 0 for r in rows) else 1


PHASE_ORDER = ("train", "audit", "validation", "reports", "communication", "end of round", "checkpoint",
               "task other")


def round_phases(row: dict, rounds: int) -> dict[str, float] | None:
    """Seconds per round (all parties of the one process) per phase of benchmarks/phase_split.py, plus "untimed"
    (the rest of the run after set-up: progress bars, summaries); None if the child wrote no split."""
    phases = row.get("phases")
    if not phases:
        return None
    seconds = phases["seconds"]
    per_round = {name: seconds.get(name, 0.0) / rounds for name in PHASE_ORDER}
    after_setup = phases["wall_s"] - seconds.get("setup", 0.0)
    per_round["untimed"] = max(0.0, after_setup / rounds - sum(per_round.values()))
    return per_round


def print_phases(rows: list[dict], rounds: int) -> None:
    """The phase split per run: seconds per round and share of the round, set-up apart, and where the peak grew."""
    split = [(r, round_phases(r, rounds)) for r in rows]
    split = [(r, p) for r, p in split if p]
    if not split:
        return
    names = [*PHASE_ORDER, "untimed"]
    head = f"{'code':<18}{'images':>8}{'setup s':>9}{'round s':>9}" + "".join(f"{n:>15}" for n in names)
    print("\nphase split, seconds per round (both collaborators and the aggregator) and share of the round")
    print(head)
    print("-" * len(head))
    for r, p in split:
        total = sum(p.values())
        cells = "".join(f"{p[n]:>8.2f} {100 * p[n] / total:>4.1f}%" for n in names)
        print(f"{r['label']:<18}{r['n']:>8}{r['phases']['seconds'].get('setup', 0.0):>9.1f}{total:>9.1f}{cells}")
    for r, _ in split:
        peaks = " -> ".join(f"{gb:.2f} GB in {phase}" for phase, gb in r["phases"]["peaks"][-4:])
        print(f"peak RSS growth, last steps ({r['label']}, {r['n']} images): {peaks}")


ROUND_PHASES = ("train", "audit", "validation", "reports", "communication", "end of round", "task other", "between")


def print_round_peaks(rows: list[dict], rounds: int) -> None:
    """Each run's peak RSS per round (the largest of its phases') and per phase within the round (phase_split resets
    the high-water mark at every outermost phase), and the last round's peak against the second's (the first builds
    what later rounds reuse)."""
    runs = [r for r in rows if (r.get("phases") or {}).get("round_peaks")]
    if not runs:
        return
    print("\npeak RSS GB per round (each round's own; per phase: the largest of its calls in the round, both "
          "collaborators)")
    head = f"{'code':<18}{'images':>8}{'round':>6}{'peak':>7}" + "".join(f"{p:>15}" for p in ROUND_PHASES)
    print(head)
    print("-" * len(head))
    for r in runs:
        per_round = r["phases"]["round_peaks"]
        for number, phases in enumerate(per_round):
            label = str(number + 1) if number < rounds else "after"  # after: the last round's end to exit
            print(f"{r['label']:<18}{r['n']:>8}{label:>6}{max(phases.values()):>7.2f}"
                  + "".join(f"{phases[p]:>15.2f}" if p in phases else f"{'-':>15}" for p in ROUND_PHASES))
        peaks = [max(p.values()) for p in per_round[:rounds]]
        if len(peaks) >= 2:
            print(f"{r['label']}: last round's peak / second's {peaks[-1] / peaks[1]:.3f}; set-up peak "
                  f"{r['phases'].get('setup_peak_gb') or float('nan'):.2f} GB; run peak {r['peak_rss_gb']:.2f} GB")
        if not r["phases"].get("peak_resets", True):
            print("  (/proc/self/clear_refs could not reset the peak: each figure is the run's peak so far)")


def print_census(rows: list[dict], top: int = 12) -> None:
    """The live tensors and arrays by holder at each audit's and round's end (--census)."""
    for r in rows:
        for entry in (r.get("phases") or {}).get("census") or []:
            malloc = (f"; malloc in use {entry['malloc_in_use_gb']:.2f} GB, free but kept "
                      f"{entry['malloc_free_kept_gb']:.2f} GB" if "malloc_in_use_gb" in entry else "")
            resident = (f" (anonymous {entry['rss_anon_gb']:.2f}, files {entry['rss_file_gb']:.2f})"
                        if "rss_anon_gb" in entry else "")
            small = f", smaller ones {entry['small_gb']:.3f} GB" if "small_gb" in entry else ""
            print(f"\ncensus ({r['label']}, round {entry['round'] + 1}, {entry['at']}): RSS {entry['rss_gb']:.2f} GB"
                  f"{resident}, tensors {entry['tensors_gb']:.3f} GB, arrays {entry['arrays_gb']:.3f} GB (>= 1 MB each)"
                  f"{small}{malloc}")
            if entry.get("mappings"):
                m = entry["mappings"]
                print(f"  anonymous memory {m['anonymous_gb']:.3f} GB: found buffers {m['known_gb']:.3f}, copies of them "
                      f"{sum(g for _, g in m['copies_gb']):.3f}, zero pages {m['zero_pages_gb']:.3f}, "
                      f"other {m['other_gb']:.3f}")
                for label, gb in m["copies_gb"][:top]:
                    print(f"  {gb:8.3f} GB  copies of {label}")
            if entry.get("graph_tensors", {}).get("with_grad_fn"):
                print(f"  tensors with an autograd graph: {entry['graph_tensors']}")
            if "traced_gb" in entry:
                print(f"  tracemalloc: {entry['traced_gb']:.3f} GB traced")
                for gb, count, where in entry.get("since_previous") or []:
                    print(f"    {gb:+8.1f} MB {count:+7d} blocks  {' < '.join(where[:4])}")
            for store, gb in (entry.get("tensor_dbs_gb") or {}).items():
                print(f"  {gb:8.3f} GB  held by {store}")
            for holder, gb in entry["by_holder"][:top]:
                print(f"  {gb:8.3f} GB  {holder}")


def print_table(rows: list[dict]) -> None:
    if not rows:
        return
    signals = sorted({s for r in rows for s in r.get("signals_s", {})})
    head = (f"{'code':<18}{'images':>8}{'members':>9}{'peak RSS GB':>13}{'train s/rnd':>13}{'audit s/rnd':>13}"
            + "".join(f"{s + ' s':>17}" for s in signals) + f"{'audit/train':>13}{'(min-max)':>12}"
            + f"{'report s/rnd*':>15}{'comm s/rnd*':>13}{'wall s':>9}" + "".join(f"{w:>13}" for w in WIDTHS))
    print("\n" + head)
    print("-" * len(head))
    for r in rows:
        if "train_s" not in r:
            print(f"{r['label']:<18}{r['n']:>8}{'':>9}{r['peak_rss_gb']:>13.2f}  no round record "
                  f"({'timed out' if r['timed_out'] else 'exit ' + str(r['returncode'])})")
            continue
        print(f"{r['label']:<18}{r['n']:>8}{r['sizes']['members']:>9}{r['peak_rss_gb']:>13.2f}"
              f"{r['train_s']:>13.1f}{r['audit_s']:>13.1f}"
              + "".join(f"{r['signals_s'].get(s, float('nan')):>17.1f}" for s in signals)
              + f"{r['ratio']:>13.2f}{r['ratio_range'][0]:>6.2f}-{r['ratio_range'][1]:<5.2f}"
              + f"{r.get('report_s', float('nan')):>15.2f}{r.get('comm_s', float('nan')):>13.2f}{r['wall_s']:>9.0f}"
              + "".join(f"{r['widths'].get(w, float('nan')):>13.4f}" for w in WIDTHS))
    print("seconds per round and collaborator (medians over them); audit and signal seconds cover the local and the "
          "received global model, each signal column adds up members, non-members and population; audit/train is "
          "the median of each record's own ratio; * whole round, both collaborators and the aggregator (the phase "
          "split below: report writing; the tensors' way between the parties); CI columns: median width (upper - "
          "lower) of the local model's loss attack's exact-AUC and TPR-at-FPR-0.1 intervals and of RMIA's "
          "(independent references) exact-AUC interval: what sampling (members column: the audited count) costs in "
          "precision")
    for label in dict.fromkeys(r["label"] for r in rows):  # each code's own line: before and after side by side
        line = extrapolation(rows, label)
        if line:
            print(f"{label}: {line}")


def extrapolation(rows: list[dict], label: str) -> str | None:
    """Peak RSS of `label`'s runs extrapolated linearly in the image count to the full size (None: fewer than two
    finished runs of it, or one at full size already)."""
    runs = [r for r in rows if r["label"] == label and r["returncode"] == 0]
    if len({r["n"] for r in runs}) < 2 or max(r["n"] for r in runs) >= FULL_SIZE:
        return None
    # Peak RSS = fixed part (model, optimizer, OpenFL's copies) + a part proportional to the data.
    xs = np.array([r["n"] for r in runs], dtype=float)
    ys = np.array([r["peak_rss_gb"] for r in runs])
    slope, intercept = np.polyfit(xs, ys, 1)
    ratios = ", ".join(f"{r['ratio']:.2f}" for r in runs if "ratio" in r)
    return (f"extrapolated to {FULL_SIZE} images (linear in the image count, not measured): peak RSS "
            f"~{intercept + slope * FULL_SIZE:.2f} GB ({slope * 1e6:.1f} KB per image); audit/train ratios measured: "
            f"{ratios} (with audit.sample_size the audit stops growing once the sets exceed the sample while the "
            f"training grows on: the ratio falls with the size, so measure it at full size, --scale 1)")


if __name__ == "__main__":
    sys.exit(main())
