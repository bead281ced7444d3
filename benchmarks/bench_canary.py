"""Benchmark: the canary audit's one-run epsilon lower bounds against the accountant's epsilon and the attack-based
bound of the same round.

For the workspace's CNN on digits and an MLP on tabular data (scikit-learn's make_classification, 20 features,
4 classes), over several seeds: a party with 200 members receives a model that one earlier local training made (on
200 other samples) and trains it with the plan's recipe (Adam 0.003, batch 32, --epochs local epochs), without DP
and with DP-SGD (audit/dp_training.py: opacus, Poisson sampling, clipping bound 1) at the noise multipliers whose
accountant epsilon (RDP, delta 1e-5) is 1, 4 and 8. For m = 100, 500, 1000 canaries it prints:

    input      the canary step (audit.canary.step, the plan's default construction and score): one shadow local
               training with m input canaries, the bound at 95%, delta 1e-5 (with DP: the shadow's own DP training,
               whose accountant epsilon, smaller with more samples, is in parentheses)
    gradient   the DP check (audit.canary.dp.audit_dp_training): one shadow DP training with m gradient canaries
    ideal      what a perfect white-box auditor gets with this theorem on this mechanism: m canaries Poisson-sampled
               at the training's rate, each step observed with the mechanism's exact Gaussian noise, no other data
               (simulated): the theorem's own reach
    attack     the best `*_epsilon_lb` of the membership audit of the real (canary-free) model of the same round:
               population and update attacks on loss, logits and gradient norm, RMIA with the global model and two
               independent references (each at 95%; the best of them, uncorrected)
    ceiling    the bound m canaries give when every guess is right (at the same level, with the grid's correction)

each as the mean over seeds [min, max], and the cost: local trainings (and their seconds per second of the party's
own local training). A second table compares the input canaries' constructions and scores without DP (m = 500).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_canary.py [--seeds 3] [--epochs 20] [--counts 100 500 1000]
        [--datasets digits tabular] [--out reports/canary_benchmark]

Writes <out>/runs.json (every figure of every run, written as it goes) and <out>/table.md, and prints the tables.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DELTA, ALPHA, CLIP, BATCH, LR = 1e-5, 0.05, 1.0, 32, 0.003
TARGETS = (1.0, 4.0, 8.0)
MEMBERS, NONMEMBERS, OTHER = 200, 400, 200


def dataset(name: str, seed: int):
    """(x, y, classes, model factory) with the seed's split: members, non-members, the earlier round's data, and
    the population shard (the rest)."""
    import torch

    if name == "digits":
        from src.data.datasets import load_dataset
        from src.runner.models import build_model

        x, y = load_dataset("digits")
        x, y, classes = np.asarray(x), np.asarray(y), 10

        def make():
            return build_model("cnn", (1, 8, 8), 10)
    else:
        from sklearn.datasets import make_classification

        x, y = make_classification(n_samples=3000, n_features=20, n_informative=12, n_redundant=4, n_classes=4,
                                   n_clusters_per_class=2, class_sep=1.0, flip_y=0.01, random_state=1000 + seed)
        x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
        classes = 4

        def make():
            return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                       torch.nn.ReLU(), torch.nn.Linear(64, 4))
    order = np.random.default_rng(seed).permutation(len(y))
    cut = np.cumsum([MEMBERS, NONMEMBERS, OTHER])
    parts = np.split(order, cut)
    return x, y.astype(np.int64), classes, make, dict(zip(("members", "nonmembers", "other", "population"), parts))


def plain_train(model, x, y, recipe, seed: int):
    from audit import LocalTraining, shadow_training

    trained, _ = shadow_training(model, x, y, LocalTraining(recipe, len(y), None), seed=seed)
    return trained


def noise_for(target: float, sample_rate: float, steps: int) -> float:
    from opacus.accountants.utils import get_noise_multiplier

    return float(get_noise_multiplier(target_epsilon=target, target_delta=DELTA, sample_rate=sample_rate, steps=steps,
                                      accountant="rdp", epsilon_tolerance=0.005))


def ideal_bound(m: int, sigma: float, q: float, steps: int, seed: int) -> float:
    """The one-run bound of a perfect white-box auditor (see the module): exact per-step Gaussian observations of
    Poisson-sampled canaries, the likelihood-ratio score."""
    from audit import counts_from_scores

    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    present = (rng.random((m, steps)) < q) & included[:, None]
    y = present / sigma + rng.standard_normal((m, steps))
    score = np.logaddexp(math.log1p(-q), math.log(q) + y / sigma - 1 / (2 * sigma ** 2)).sum(axis=1)
    return counts_from_scores(score, included).bound(DELTA, ALPHA).epsilon


def best_attack(record) -> tuple[float, str]:
    found = {k: v for k, v in record.metrics.items() if k.endswith("_epsilon_lb") and not k.startswith("canary")}
    name = max(found, key=lambda k: (found[k], k))
    return found[name], name


def run_seed(name: str, seed: int, args) -> list[dict]:
    import torch

    from audit import (AuditSets, AuditSettings, CanarySettings, DPTraining, LocalTraining, TrainingRecipe,
                       audit_dp_training, audit_round, canary_vocabulary, dp_sgd_epsilon, step)

    DIRAC = canary_vocabulary.DIRAC
    CANARY, MEMBERSHIP, RMIA = step("canary"), step("membership"), step("rmia")

    x, y, classes, make, split = dataset(name, seed)
    sets = AuditSets(*((x[split[s]], y[split[s]]) for s in ("members", "nonmembers", "population")))
    members = sets.members
    recipe = TrainingRecipe("Adam", LR, 0.9, args.epochs, BATCH)
    torch.manual_seed(seed)
    initial = make()
    received = plain_train(initial, x[split["other"]], y[split["other"]], recipe, seed=10_000 + seed)
    batches = math.ceil(MEMBERS / BATCH)  # opacus' Poisson rate is 1 / batches per epoch
    q, steps = 1 / batches, batches * args.epochs
    attack_settings = AuditSettings.from_mapping({"signals": ["loss", "logits", "gradient_norm"],
                                                  "fpr_tolerance": [0.01, 0.1],
                                                  "rmia": {"references": ["global", "independent"],
                                                           "reference_models": 2}})
    out = []
    settings_list = [("none", None)] + [(f"eps{t:g}", t) for t in TARGETS]
    for label, target in settings_list:
        sigma = None if target is None else noise_for(target, q, steps)
        trainer = None if sigma is None else DPTraining(lambda m: torch.optim.Adam(m.parameters(), lr=LR), BATCH,
                                                        args.epochs, sigma, CLIP)
        training = LocalTraining(recipe, MEMBERS, None, dp=trainer)
        start = time.perf_counter()
        if trainer is None:
            real = plain_train(received, *members, recipe, seed=20_000 + seed)
            claimed = math.inf
        else:
            run = trainer(received, *members, seed=20_000 + seed)
            real = copy.deepcopy(received)
            real.load_state_dict(run.state)
            claimed = dp_sgd_epsilon(run.noise_multiplier, run.sample_rate, run.steps, DELTA)
        train_s = time.perf_counter() - start
        record = audit_round(real, received, sets, attack_settings, party="p", round_num=1, seed=seed,
                             training=training, steps=(MEMBERSHIP, RMIA), initial_model=initial)
        attack, attack_name = best_attack(record)
        row = {"dataset": name, "seed": seed, "setting": label, "sigma": sigma, "claimed": claimed,
               "train_s": train_s, "attack": attack, "attack_name": attack_name, "counts": {}}
        for m in args.counts:
            entry = {}
            settings = AuditSettings.from_mapping({"canary": {"enabled": True, "count": m}})
            rec = audit_round(real, received, sets, settings, party="p", round_num=1, seed=seed, training=training,
                              steps=(CANARY,))
            details = rec.extra["canary"]
            entry["input"] = {"epsilon": rec.metrics["canary_epsilon_lb"],
                              "ceiling": rec.metrics["canary_epsilon_ceiling"],
                              "claimed": (details.get("dp") or {}).get("claimed_epsilon"),
                              "seconds": details["training_s"], "training_set": details["training_set_size"]}
            if trainer is not None:
                kinds = canary_vocabulary.GRADIENT_KINDS if m == max(args.counts) else (DIRAC,)
                for kind in kinds:
                    check = audit_dp_training(trainer, received, members, CanarySettings(gradient_count=m,
                                                                                         gradient_kind=kind),
                                              delta=DELTA, alpha=ALPHA, seed=30_000 + seed).to_dict()
                    entry[f"gradient_{kind}"] = {"epsilon": check["epsilon_lb"], "ceiling": check["ceiling"],
                                                 "claimed": check["claimed_epsilon"], "seconds": check["seconds"]}
                entry["ideal"] = statistics.fmean(ideal_bound(m, sigma, q, steps, 40_000 + seed + k) for k in range(3))
            row["counts"][str(m)] = entry
        if trainer is None:  # the input canaries' constructions and scores, side by side (no DP)
            row["constructions"] = {}
            for construction in canary_vocabulary.CONSTRUCTIONS:
                for score in canary_vocabulary.SCORES:
                    settings = AuditSettings.from_mapping({"canary": {"enabled": True, "count": args.compare_count,
                                                                      "construction": construction, "score": score}})
                    rec = audit_round(real, received, sets, settings, party="p", round_num=1, seed=seed,
                                      training=training, steps=(CANARY,))
                    row["constructions"][f"{construction}/{score}"] = rec.metrics["canary_epsilon_lb"]
        out.append(row)
        print(f"{name} seed {seed} {label}: attack {attack:.2f}, "
              + ", ".join(f"m={m} input {e['input']['epsilon']:.2f}"
                          + (f" gradient {e['gradient_' + DIRAC]['epsilon']:.2f}" if trainer else "")
                          for m, e in ((int(k), v) for k, v in row["counts"].items())), flush=True)
    return out


def _cell(values: list[float], digits: int = 2) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    mean = statistics.fmean(values)
    if len(values) == 1 or min(values) == max(values):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def table(runs: list[dict], counts: list[int]) -> str:
    from audit import canary_vocabulary

    DIRAC, RANDOM = canary_vocabulary.DIRAC, canary_vocabulary.RANDOM

    lines = ["| data | DP | accountant ε | m | ceiling | input ε lb (shadow's accountant ε) | gradient ε lb | "
             "gradient/accountant | ideal | best attack ε lb | input / attack | cost: input | cost: gradient |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    above = []
    for data in dict.fromkeys(r["dataset"] for r in runs):
        for setting in dict.fromkeys(r["setting"] for r in runs):
            rows = [r for r in runs if r["dataset"] == data and r["setting"] == setting]
            if not rows:
                continue
            dp = rows[0]["sigma"] is not None
            for m in counts:
                entries = [r["counts"][str(m)] for r in rows]
                inp = [e["input"]["epsilon"] for e in entries]
                grad = [e[f"gradient_{DIRAC}"]["epsilon"] for e in entries] if dp else []
                ratio = [e[f"gradient_{DIRAC}"]["epsilon"] / r["claimed"] for e, r in zip(entries, rows)] if dp else []
                attack = [r["attack"] for r in rows]
                vs = [i / a if a > 0 else math.inf for i, a in zip(inp, attack)]
                input_cost = statistics.fmean(e["input"]["seconds"] / r["train_s"] for e, r in zip(entries, rows))
                size = entries[0]["input"]["training_set"] / MEMBERS
                grad_cost = (statistics.fmean(e[f"gradient_{DIRAC}"]["seconds"] / r["train_s"]
                                              for e, r in zip(entries, rows)) if dp else None)
                for e, r in zip(entries, rows):
                    for key in ("input", f"gradient_{DIRAC}", f"gradient_{RANDOM}"):
                        c = e.get(key, {}).get("claimed")
                        if c is not None and e[key]["epsilon"] > c:
                            above.append((data, setting, m, key, r["seed"], e[key]["epsilon"], c))
                claimed = _cell([r["claimed"] for r in rows]) if dp else "∞"
                shadow = _cell([e["input"]["claimed"] for e in entries]) if dp else ""
                finite_vs = [v for v in vs if math.isfinite(v)]
                lines.append(
                    f"| {data} | {'σ ' + format(rows[0]['sigma'], '.2f') if dp else 'none'} | {claimed} | {m} | "
                    f"{_cell([e['input']['ceiling'] for e in entries])} | {_cell(inp)}"
                    + (f" ({shadow})" if dp else "") + f" | {_cell(grad)} | {_cell(ratio)} | "
                    f"{_cell([e.get('ideal') for e in entries])} | {_cell(attack)} | "
                    + (f"{_cell(finite_vs, 1)}x" + (f" ({len(vs) - len(finite_vs)} with attack 0)"
                                                   if len(finite_vs) < len(vs) else "") if finite_vs else "attack 0")
                    + f" | 1 training on {size:.1f}x the members ({input_cost:.1f}x s) | "
                    + (f"1 DP training ({grad_cost:.1f}x s)" if dp else "–") + " |")
    lines.append("")
    lines.append(f"Bounds above their accountant's epsilon: {len(above)}" + (f": {above}" if above else ""))
    largest = max(counts)
    kind_rows = [(r, r["counts"][str(largest)]) for r in runs if r["sigma"] is not None]
    if kind_rows:
        lines += ["", f"Gradient canaries, dirac against random directions (m = {largest}):", "",
                  "| data | DP | dirac | random |", "|---|---|---|---|"]
        for data in dict.fromkeys(r["dataset"] for r, _ in kind_rows):
            for setting in dict.fromkeys(r["setting"] for r, _ in kind_rows):
                sel = [e for r, e in kind_rows if r["dataset"] == data and r["setting"] == setting]
                if sel:
                    lines.append(f"| {data} | {setting} | {_cell([e['gradient_' + DIRAC]['epsilon'] for e in sel])} | "
                                 f"{_cell([e['gradient_' + RANDOM]['epsilon'] for e in sel])} |")
    compared = [r for r in runs if "constructions" in r]
    if compared:
        names = list(compared[0]["constructions"])
        lines += ["", "Input canaries without DP, by construction / score (ε lower bound, mean [min, max]):", "",
                  "| data | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for data in dict.fromkeys(r["dataset"] for r in compared):
            sel = [r for r in compared if r["dataset"] == data]
            lines.append(f"| {data} | " + " | ".join(_cell([r["constructions"][n] for r in sel]) for n in names) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--counts", type=int, nargs="+", default=[100, 500, 1000])
    p.add_argument("--compare-count", type=int, default=500)
    p.add_argument("--datasets", nargs="+", default=["digits", "tabular"], choices=["digits", "tabular"])
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "canary_benchmark")
    args = p.parse_args()

    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*Optimal order is the largest alpha.*")
    warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    start = time.perf_counter()
    for name in args.datasets:
        for seed in range(args.seeds):
            runs += run_seed(name, seed, args)
            (args.out / "runs.json").write_text(json.dumps(runs, indent=1))
    text = table(runs, args.counts) + f"\n{time.perf_counter() - start:.0f} s in all.\n"
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
