"""Benchmark: the membership attacks of the per-round audit, side by side, on leaky configurations.

Real in-process federations (workspace.in_process.run_in_process: OpenFL's Aggregator and Collaborators, the plan's
train task and audit): digits, 2 collaborators with few members each (train ratio 0.1: 90 members, 404 non-members
and 404 population samples per party), many local epochs (default 20, Adam 0.003, batch 32), the workspace's CNN and
FCNN, 10 rounds, several seeds. At the 1st, 5th and 10th round (OpenFL rounds 0, 4, 9) it reads every party's round
record and compares, on the same local models:

    population      Privacy Meter's population attack on the loss of the local model
    update          loss under the received global model minus loss under the local one
    rmia global     RMIA with the received global model as the only reference (free)
    rmia fine_tuned RMIA with K references fine-tuned from the global model (what this round adds)
    rmia independent RMIA with K references that never saw the party's data (cumulative leakage)

per attack: the exact AUC (mean over parties and seeds, with the t-interval of that mean), TPR at FPR 1% and 0.1%
(pooled over parties and seeds: members flagged / members, with the Clopper-Pearson interval of the pooled rate; a
tolerance the population cannot resolve is marked), the mean empirical epsilon lower bound (delta 1e-5, 95%), and
audit seconds per second of the party's local training (for RMIA's trained kinds also the references' training
seconds per reference per local-training second).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_attacks.py [--seeds 5] [--models cnn fcnn] [--epochs 20]
        [--rounds 10] [--reference-models 2] [--temperature 2] [--gamma 1] [--out reports/attacks_benchmark]
        [--references global independent] [--rmia KEY=VALUE ...]

`--references` runs only these kinds of RMIA reference (default all three; the population and update attacks always
run); `--rmia KEY=VALUE` sets any other key of the plan's audit.rmia section (value read as YAML), e.g.
`--rmia reference_schedule=budget`. The same seeds train the same local models whatever the RMIA settings (the
references train on their own generators), so runs that differ only in them compare on the same models: their
population attack's figures are identical.

Writes <out>/runs.json (every party's figures per run) and <out>/table.md, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit import RoundRecord  # noqa: E402 (after the path)

ATTACKS = (("population", "local", "loss"), ("update", "update", "loss_reduction"), ("rmia global", "rmia", "global"),
           ("rmia fine_tuned", "rmia", "fine_tuned"), ("rmia independent", "rmia", "independent"))
KINDS = ("global", "fine_tuned", "independent")
TOLERANCES = (0.001, 0.01)


def overrides(model: str, seed: int, epochs: int, reference_models: int, temperature: float, gamma: float,
              references=KINDS, rmia_extra: dict | None = None) -> dict:
    return {
        "tasks": {"train": {"kwargs": {"epochs": epochs}}},
        "data_loader": {"settings": {"dataset": "digits", "seed": seed, "train_dataset_ratio": 0.1,
                                     "test_dataset_ratio": 0.45, "audit_dataset_ratio": 0.45}},
        "aggregator": {"settings": {"db_store_rounds": 1}},
        "collaborator": {"settings": {"db_store_rounds": 1}},
        "task_runner": {"settings": {
            "model": model, "seed": seed, "optimizer": "Adam", "learning_rate": 0.003,
            "audit": {"signals": ["loss"], "fpr_tolerance": [0.001, 0.01, 0.1],
                      "rmia": {"references": list(references), "reference_models": reference_models,
                               "temperature": temperature, "gamma": gamma, **(rmia_extra or {})}},
        }},
    }


def figures(record: RoundRecord) -> dict:
    """One party's round: per attack the exact AUC, the counts at each tolerance, the epsilon bound, the costs."""
    train = record.timings["train_s"]
    out = {}
    for name, model, signal in ATTACKS:
        result = record.attack(model, signal)
        if result is None:  # a kind of reference this run left out
            continue
        u = result["uncertainty"]
        entry = {"exact_auc": result["exact_auc"], "epsilon_lb": u["epsilon_lb"]["epsilon"], "at": {}}
        for t in TOLERANCES:
            rates = u["at_fpr"][f"{t:g}"]
            entry["at"][f"{t:g}"] = {"k": rates["tpr"]["k"], "n": rates["tpr"]["n"], "fpr_k": rates["fpr"]["k"],
                                     "fpr_n": rates["fpr"]["n"], "resolvable": rates["resolvable"]}
        if model == "rmia":
            seconds = record.timings["rmia_kinds_s"][signal]
            details = record.extra["rmia"][signal]
            entry["reference_training_per_reference"] = (details.get("training_s", 0.0)
                                                         / max(details["reference_models"], 1) / train)
            entry["offline_a"] = details["offline_a"]
        else:
            seconds = record.timings["membership_s"]  # both population-style attacks come from one step
        entry["audit_per_train"] = seconds / train
        out[name] = entry
    out["train_s"] = train
    return out


def mean_interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval."""
    from scipy.stats import t as student

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, student.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def table(runs: list[dict], rounds=(0, 4, 9)) -> str:
    from audit import clopper_pearson

    lines = ["| model | round | attack | exact AUC | TPR @ 1% FPR | TPR @ 0.1% FPR | epsilon LB | audit s / train s "
             "| ref. training s / ref. / train s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in runs):
        for rnd in rounds:
            parties = [p for r in runs if r["model"] == model for p in r["rounds"][str(rnd)]]
            if not parties:
                continue
            base = None
            for name, _, _ in ATTACKS:
                if any(name not in p for p in parties):
                    continue
                auc, half = mean_interval([p[name]["exact_auc"] for p in parties])
                cells = [f"{auc:.3f} ± {half:.3f}"]
                for t in ("0.01", "0.001"):
                    k = sum(p[name]["at"][t]["k"] for p in parties)
                    n = sum(p[name]["at"][t]["n"] for p in parties)
                    ci = clopper_pearson(k, n)
                    mark = "" if all(p[name]["at"][t]["resolvable"] for p in parties) else " †"
                    cells.append(f"{k / n:.3f} [{ci.lower:.3f}, {ci.upper:.3f}] ({k}/{n}){mark}")
                    if t == "0.01" and name == "population":
                        base = k / n
                    if t == "0.01" and name != "population" and base:
                        cells[-1] += f", {k / n / base:.1f}x"
                eps = statistics.fmean(p[name]["epsilon_lb"] for p in parties)
                cost = statistics.fmean(p[name]["audit_per_train"] for p in parties)
                ref = [p[name]["reference_training_per_reference"] for p in parties
                       if "reference_training_per_reference" in p[name]]
                lines.append(f"| {model} | {rnd + 1} | {name} | " + " | ".join(cells)
                             + f" | {eps:.2f} | {cost:.1f} | " + (f"{statistics.fmean(ref):.2f}" if ref else "–")
                             + " |")
    return "\n".join(lines) + ("\n\n† 404 population samples cannot resolve FPR 0.001 (it needs 1,000): the threshold "
                               "flags none of the population; the TPR is the TPR at population FPR 0.\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--models", nargs="+", default=["cnn", "fcnn"])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--reference-models", type=int, default=2)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "attacks_benchmark")
    p.add_argument("--references", nargs="+", choices=KINDS, default=list(KINDS),
                   help="the kinds of RMIA reference to run (default: all three)")
    p.add_argument("--rmia", action="append", default=[], metavar="KEY=VALUE",
                   help="another key of the plan's audit.rmia section (value read as YAML; repeatable)")
    args = p.parse_args()
    import yaml

    rmia_extra = {}
    for item in args.rmia:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--rmia: expected KEY=VALUE, got {item!r}")
        rmia_extra[key] = yaml.safe_load(value)
    from audit import AuditSettings

    try:  # a misspelt key or a bad value: one line naming it, before any federation runs
        AuditSettings.from_mapping({"rmia": {"references": args.references, **rmia_extra}}, prefix="--rmia")
    except ValueError as err:
        p.error(str(err))

    import logging

    import torch

    from workspace.in_process import run_in_process
    from workspace.plan_file import collaborator_names

    torch.set_num_threads(1)
    logging.getLogger("openfl").setLevel(logging.ERROR)
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = [r for r in (0, 4, 9) if r < args.rounds]
    runs = []
    for model in args.models:
        for seed in range(args.seeds):
            start = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                result = run_in_process(Path(tmp), collaborators=2, rounds=args.rounds,
                                        overrides=overrides(model, seed, args.epochs, args.reference_models,
                                                            args.temperature, args.gamma, args.references,
                                                            rmia_extra))
                per_round = {str(r): [figures(RoundRecord.read(result.report_dir / name / f"round_{r:04d}" /
                                                                   "audit.json"))
                                      for name in collaborator_names(2)] for r in wanted}
            runs.append({"model": model, "seed": seed, "epochs": args.epochs, "reference_models": args.reference_models,
                         "rmia": rmia_extra,
                         "temperature": args.temperature, "gamma": args.gamma,
                         "seconds": time.perf_counter() - start, "rounds": per_round})
            (args.out / "runs.json").write_text(json.dumps(runs, indent=1))
            print(f"{model} seed {seed}: {runs[-1]['seconds']:.0f}s", flush=True)
    text = table(runs, wanted)
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
