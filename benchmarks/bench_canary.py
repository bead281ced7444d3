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

`--part` runs one of the DP check's own benchmarks instead (the four tests of audit.canary.dp, each at alpha / 4:
Steinke et al.'s bound, the f-DP bound, the independent-canary bound, the white-box estimate; `--seeds` per cell):

    ideal    the perfect white-box auditor of DP-SGD (q 1/7, 140 steps, accountant's epsilon 1, 4, 8; m 1,000 and
             10,000, simulated): every figure / the accountant's epsilon, the exact mechanism's own epsilon beside it;
             the Gaussian mechanism (mu 1 and 2) and one subsampled Gaussian step (mu 2, q 0.2) with 1,000 to 100,000
             canaries, the bounds / the true epsilon, beside Xiang et al.'s published figures on the same mechanisms
    correct  correct DP trainings (a tabular MLP, the digits CNN, an Embedding model; accountant's epsilon 0.5 to 16):
             figures above the accountant, false alarms, the real bounds / accountant, the check's cost
    broken   DP trainings that draw a fraction of the noise they claim (0.5x to 1.0x), or clip to twice the claimed
             bound with the claimed bound's noise: how often the check withholds them
    input    the canary step without DP (input canaries, Steinke et al.'s and the f-DP bound) against the best
             attack-based bound of the same round
    cost     where the check's CPU goes (the training with canaries, the tests cold and warm) beside a plain DP
             training, per model
    coverage the white-box estimate's interval on simulated correct DP-SGD (sigma 0.3 to 13, the check's counts and
             few observations): each limit's miss rate on its own side, `--seeds` runs per row

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_canary.py --part ideal [--seeds 3]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_canary.py --part correct [--seeds 17]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_canary.py --part broken [--seeds 10] [--factors 0.5 0.8]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_canary.py --part input [--seeds 3]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_canary.py --part coverage [--seeds 3000]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_canary.py --part cost [--seeds 3]

Each writes <out>/<part>.json (as it goes; `--resume` keeps it and runs only the missing cells of correct and
broken) and <out>/<part>.md.
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
    if args.no_dp_only:
        settings_list = settings_list[:1]
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
                              "fdp": rec.metrics["canary_fdp_epsilon"],
                              "ceiling": rec.metrics["canary_epsilon_ceiling"],
                              "claimed": (details.get("dp") or {}).get("claimed_epsilon"),
                              "seconds": details["training_s"], "training_set": details["training_set_size"]}
            if trainer is not None:
                kinds = canary_vocabulary.GRADIENT_KINDS if m == max(args.counts) else (DIRAC,)
                for kind in kinds:
                    check = audit_dp_training(trainer, received, members, CanarySettings(gradient_count=m,
                                                                                         gradient_kind=kind),
                                              delta=DELTA, alpha=ALPHA, seed=30_000 + seed).to_dict()
                    entry[f"gradient_{kind}"] = {"epsilon": check["bound"]["epsilon"],
                                                 "ceiling": check["bound"]["ceiling"],
                                                 "figures": check["figures"], "check": check["epsilon_lb"],
                                                 "violated": check["violated"],
                                                 "claimed": check["claimed_epsilon"], "seconds": check["seconds"]}
                entry["ideal"] = statistics.fmean(ideal_bound(m, sigma, q, steps, 40_000 + seed + k) for k in range(3))
            row["counts"][str(m)] = entry
        if trainer is None and not args.no_dp_only:  # the input canaries' constructions and scores (no DP)
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

# ------------------------------------------------------------------------------------------------ the DP check's parts

EACH = ALPHA / 4  # the DP check's share of alpha for each of its four tests (audit.canary.dp.DP_SGD_TESTS)


def _ideal_dp_sgd(sigma: float, q: float, steps: int, m: int, seed: int, noise_factor: float = 1.0):
    """The perfect white-box view of m gradient canaries of DP-SGD: each included canary in each step with
    probability q, every step's observation with the mechanism's exact noise. Scores (the likelihood ratio), the
    inclusion, the per-step statistics of the white-box estimate."""
    from audit import StepStatistics

    rng = np.random.default_rng([seed, m])
    included = rng.random(m) < 0.5
    present = (rng.random((m, steps)) < q) & included[:, None]
    y = present / sigma + noise_factor * rng.standard_normal((m, steps))
    scores = np.logaddexp(math.log1p(-q), math.log(q) + y / sigma - 1 / (2 * sigma ** 2)).sum(axis=1)
    noise, signal = y[~present], y[present]
    stats = StepStatistics(noise.size, noise.sum(), noise @ noise, signal.size, signal.sum(), signal @ signal)
    return scores, included, stats


def _four_tests(scores, included, stats, family, sigma: float, max_grad_norm: float = 1.0) -> dict:
    """The DP check's four figures (each at EACH), by the check's own code (dp_sgd_tests)."""
    from audit import dp_sgd_tests

    check = dp_sgd_tests(scores, included, stats, noise_multiplier=sigma, max_grad_norm=max_grad_norm,
                         sample_rate=family.sample_rate, steps=family.steps, delta=DELTA, alpha=ALPHA)
    found = check.estimate
    return {"steinke": check.bound.epsilon, "steinke_ceiling": check.bound.ceiling, "fdp": check.fdp.epsilon,
            "fdp_ceiling": check.fdp.ceiling, "independent": check.independent.epsilon,
            "independent_ceiling": check.independent.ceiling, "estimate": found.epsilon,
            "estimate_low": found.epsilon_interval[0], "noise": found.noise_multiplier,
            "noise_interval": list(found.noise_interval), "violated": check.violated}


def _gaussian_bounds(mu: float, m: int, seed: int, alpha: float) -> dict:
    """m canaries each through its own mu-GDP Gaussian mechanism (the papers' simulated outcomes), every bound at
    alpha (the papers' level), in true epsilons (mu-GDP's exact conversion)."""
    from scipy.stats import norm

    from audit import (CANARY_FPR_TARGETS, counts_from_scores, fdp_bound, gdp_family, independent_bound,
                       threshold_counts)

    rng = np.random.default_rng([seed, m, int(mu * 100)])
    included = rng.random(m) < 0.5
    scores = rng.standard_normal(m) + mu * included
    thresholds = tuple(float(norm.isf(a)) for a in CANARY_FPR_TARGETS)
    out = {"independent": independent_bound(threshold_counts(scores, included, thresholds), gdp_family(),
                                            delta=DELTA, alpha=alpha).epsilon}
    if m <= 10_000:  # the recursion walks every right guess: 100,000 canaries take minutes
        counts = counts_from_scores(scores, included)
        out["steinke"] = counts.bound(DELTA, alpha).epsilon
        out["fdp"] = fdp_bound(counts, gdp_family(), delta=DELTA, alpha=alpha).epsilon
    return out


def _subsampled_step_bounds(m: int, seed: int, alpha: float, sigma: float = 0.5, q: float = 0.2) -> dict:
    """One Poisson-subsampled Gaussian step (mu 2, q 0.2: Xiang et al.'s subsampled case), bounds as the exact
    mechanism's epsilon of the least noise rejected."""
    from audit import (counts_from_scores, curve_epsilon, dp_sgd_family, fdp_bound, least_rejected_noise,
                       null_thresholds, subsampled_gaussian, threshold_counts)

    family = dp_sgd_family(q, 1)
    rng = np.random.default_rng([seed, m, 7])
    included = rng.random(m) < 0.5
    y = ((rng.random(m) < q) & included) / sigma + rng.standard_normal(m)
    scores = np.logaddexp(math.log1p(-q), math.log(q) + y / sigma - 1 / (2 * sigma ** 2))
    counts = threshold_counts(scores, included, null_thresholds(subsampled_gaussian(sigma, q, 1)))
    noise = least_rejected_noise(lambda s: counts.rejects(family.curve(s), alpha), sigma)
    fdp = fdp_bound(counts_from_scores(scores, included), family, delta=DELTA, alpha=alpha, claimed_noise=sigma)
    return {"independent": 0.0 if noise is None else curve_epsilon(family.curve(noise), DELTA),
            "fdp": 0.0 if fdp.noise is None else curve_epsilon(family.curve(fdp.noise), DELTA),
            "steinke": counts_from_scores(scores, included).bound(DELTA, alpha).epsilon}


def ideal_part(args) -> tuple[list, str]:
    from audit import curve_epsilon, dp_sgd_family, gdp_epsilon, subsampled_gaussian

    q, steps = 1 / 7, 140
    family = dp_sgd_family(q, steps)
    runs, lines = [], []
    for target in TARGETS:
        sigma = noise_for(target, q, steps)
        claimed = family.epsilon(sigma, DELTA)
        exact = curve_epsilon(subsampled_gaussian(sigma, q, steps), DELTA)
        for m in (1000, 10_000):
            for seed in range(args.seeds):
                scores, included, stats = _ideal_dp_sgd(sigma, q, steps, m, seed)
                row = {"kind": "dp_sgd", "target": target, "sigma": sigma, "claimed": claimed, "exact": exact, "m": m,
                       "seed": seed, **_four_tests(scores, included, stats, family, sigma)}
                runs.append(row)
                print(f"ideal DP-SGD eps {target:g} m {m} seed {seed}: " + ", ".join(
                    f"{k} {row[k] / claimed:.2f}" for k in ("steinke", "fdp", "independent", "estimate_low")),
                    flush=True)
    lines += ["Perfect white-box auditor of DP-SGD (q 1/7, 140 steps, simulated), each figure at alpha / 4 "
              f"(alpha {ALPHA}), mean [min, max] over {args.seeds} seeds, as a fraction of the accountant's epsilon "
              "(RDP, delta 1e-5):", "",
              "| accountant ε | exact mechanism's ε | m | Steinke et al. | f-DP | independent canaries | "
              "estimate's lower ε | estimate σ̂ / σ | ceilings: Steinke, f-DP |",
              "|---|---|---|---|---|---|---|---|---|"]
    for target in TARGETS:
        for m in (1000, 10_000):
            sel = [r for r in runs if r["kind"] == "dp_sgd" and r["target"] == target and r["m"] == m]
            claimed = sel[0]["claimed"]
            lines.append(f"| {claimed:.2f} | {sel[0]['exact']:.2f} ({sel[0]['exact'] / claimed:.2f}) | {m} | "
                         + " | ".join(_cell([r[k] / claimed for r in sel]) for k in
                                      ("steinke", "fdp", "independent", "estimate_low"))
                         + f" | {_cell([r['noise'] / r['sigma'] for r in sel], 3)} | "
                         f"{_cell([r['steinke_ceiling'] for r in sel])}, {_cell([r['fdp_ceiling'] for r in sel])} |")
    # the papers' simulated mechanisms, at their level (95%), in true epsilons
    published = {(1.0, 1000): "3.76 (Steinke at most 1.63)", (2.0, 1000): "9.00", (1.0, 10_000): "89% on average",
                 (2.0, 10_000): "89% on average", (1.0, 100_000): "96.5% on average",
                 (2.0, 100_000): "96.5% on average"}
    lines += ["", f"Simulated mechanisms of Xiang et al. (one observation per canary), every bound at {1 - ALPHA:.0%}, "
              "in true epsilons at delta 1e-5, mean [min, max] over seeds:", "",
              "| mechanism | true ε | m | Steinke et al. | f-DP | independent canaries | ratio (independent) | "
              "Xiang et al., published |", "|---|---|---|---|---|---|---|---|"]
    for mu in (1.0, 2.0):
        true = gdp_epsilon(mu, DELTA)
        for m in (1000, 10_000, 100_000):
            sel = [_gaussian_bounds(mu, m, seed, ALPHA) for seed in range(args.seeds)]
            runs += [{"kind": "gaussian", "mu": mu, "m": m, "true": true, **r} for r in sel]
            lines.append(f"| Gaussian, μ = {mu:g} | {true:.2f} | {m} | " + " | ".join(
                _cell([r[k] for r in sel if k in r]) for k in ("steinke", "fdp", "independent"))
                + f" | {_cell([r['independent'] / true for r in sel])} | {published[(mu, m)]} |")
            print(lines[-1], flush=True)
    true = curve_epsilon(subsampled_gaussian(0.5, 0.2, 1), DELTA)
    sel = [_subsampled_step_bounds(1000, seed, ALPHA) for seed in range(args.seeds)]
    runs += [{"kind": "subsampled_step", "m": 1000, "true": true, **r} for r in sel]
    lines.append(f"| one subsampled Gaussian step, μ = 2, q = 0.2 | {true:.2f} | 1000 | "
                 + " | ".join(_cell([r[k] for r in sel]) for k in ("steinke", "fdp", "independent"))
                 + f" | {_cell([r['independent'] / true for r in sel])} | 4.62 (Steinke 0.85) |")
    return runs, "\n".join(lines) + "\n"


def _token_data(seed: int, n: int, vocab: int = 1000, length: int = 10):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab, size=(n, length))
    return x.astype(np.int64), (x.sum(axis=1) % 4).astype(np.int64)


def _models():
    """(name, make(seed) -> model, members(seed) -> (x, y)): the check's correct-DP models."""
    import torch
    from src.runner.models import build_model

    class Bag(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(1000, 16)
            self.out = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.out(self.embed(x).mean(dim=1))

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                   torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def members(name, seed):
        x, y, _, _, split = dataset(name, seed)
        return x[split["members"]], y[split["members"]]

    return [("tabular MLP", mlp, lambda seed: members("tabular", seed)),
            ("digits CNN", lambda: build_model("cnn", (1, 8, 8), 10), lambda seed: members("digits", seed)),
            ("Embedding", Bag, lambda seed: _token_data(seed, MEMBERS))]


def _check_run(name, make, members, target, seed, *, bug=None, factor=1.0, with_plain=False) -> dict:
    """One DP check (audit.canary.dp.audit_dp_training, the plan's defaults: auto canaries) of a DP training with
    the bench's recipe at the noise whose accountant's epsilon is `target`; `bug` 'noise' (the training draws
    `factor` x the claimed noise) or 'clip' (clips to 2x the claimed bound, noise of the claimed bound)."""
    import torch
    from opacus.optimizers import optimizer as opacus_optimizer

    from audit import CanarySettings, DPTraining, audit_dp_training

    batches = math.ceil(MEMBERS / BATCH)
    q, steps = 1 / batches, batches * 20
    sigma = noise_for(target, q, steps)
    trainer = DPTraining(lambda m: torch.optim.Adam(m.parameters(), lr=LR), BATCH, 20, sigma, CLIP)
    torch.manual_seed(seed)
    start = make()
    x, y = members(seed)
    # every run its own noise and canary draws (the same seed at another epsilon or bug would repeat them)
    run_seed_ = 60_000 + 1000 * seed + int(target * 10) + 100 * NOISE_FACTORS.index(factor) + (500 if bug else 0)
    row = {"model": name, "target": target, "seed": seed, "sigma": sigma, "bug": bug, "factor": factor}
    if with_plain:
        began = time.process_time()
        trainer(start, x, y, seed=run_seed_)
        row["plain_cpu_s"] = time.process_time() - began
    add_noise, clip = opacus_optimizer.DPOptimizer.add_noise, opacus_optimizer.DPOptimizer.clip_and_accumulate

    def scaled_noise(self):
        claimed = self.noise_multiplier
        self.noise_multiplier = claimed * factor
        try:
            add_noise(self)
        finally:
            self.noise_multiplier = claimed

    def wide_clip(self):
        claimed = self.max_grad_norm
        self.max_grad_norm = claimed * 2
        try:
            clip(self)
        finally:
            self.max_grad_norm = claimed

    try:
        if bug == "noise":
            opacus_optimizer.DPOptimizer.add_noise = scaled_noise
        elif bug == "clip":
            opacus_optimizer.DPOptimizer.clip_and_accumulate = wide_clip
        began = time.process_time()
        check = audit_dp_training(trainer, start, (x, y), CanarySettings(), delta=DELTA, alpha=ALPHA,
                                  seed=run_seed_).to_dict()
        row["check_cpu_s"] = time.process_time() - began
    finally:
        opacus_optimizer.DPOptimizer.add_noise, opacus_optimizer.DPOptimizer.clip_and_accumulate = add_noise, clip
    row.update(claimed=check["claimed_epsilon"], canaries=check["canaries"], violated=check["violated"],
               figures=check["figures"], by=check["by"], epsilon_lb=check["epsilon_lb"],
               noise=check["estimate"]["noise_multiplier"], noise_interval=check["estimate"]["noise_interval"],
               estimate_rejects=check["estimate"]["claim_rejected"],
               independent_rejects=check["independent"]["claim_rejected"], fdp_rejects=check["fdp"]["claim_rejected"],
               training_s=check["training_s"], seconds=check["seconds"])
    return row


CORRECT_TARGETS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def correct_part(args) -> tuple[list, str]:
    path = args.out / "correct.json"
    runs, done = _earlier(args, path, ("model", "target", "seed"))
    for name, make, members in _models():
        for target in CORRECT_TARGETS:
            for seed in range(args.seeds):
                if (name, target, seed) in done:
                    continue
                row = _check_run(name, make, members, target, seed, with_plain=seed == 0)
                runs.append(row)
                path.write_text(json.dumps(runs, indent=1))
                print(f"{name} eps {target:g} seed {seed}: violated {row['violated']}, figures "
                      + ", ".join(f"{k} {v:.2f}" for k, v in row["figures"].items())
                      + f" (accountant {row['claimed']:.2f}), sigma {row['noise']:.3f} / {row['sigma']:.3f}",
                      flush=True)
    above = {k: sum((r["figures"].get(k) or 0) > r["claimed"] for r in runs) for k in
             ("one_run", "fdp", "independent", "estimate")}
    alarms = sum(r["violated"] for r in runs)
    lines = [f"Correct DP trainings: {len(runs)} runs ({len(CORRECT_TARGETS)} accountant's epsilons "
             f"{', '.join(f'{t:g}' for t in CORRECT_TARGETS)} x 3 models, {_seeds(runs)} seeds each); each figure at "
             f"alpha / 4, alpha {ALPHA}.", "",
             f"Figures above the accountant's epsilon: Steinke et al. {above['one_run']}, f-DP {above['fdp']}, "
             f"independent canaries {above['independent']}, the estimate's lower epsilon {above['estimate']}; "
             f"checks that alarmed (any test): {alarms} of {len(runs)} ({alarms / len(runs):.1%}, "
             f"95% upper bound {_cp_upper(alarms, len(runs)):.1%}).", "",
             "| model | canaries | accountant ε | Steinke / acc. | f-DP / acc. | independent / acc. | "
             "estimate σ̂ / σ | alarms | check's CPU s / DP training's |", "|---|---|---|---|---|---|---|---|---|"]
    for name, _, _ in _models():
        for target in CORRECT_TARGETS:
            sel = [r for r in runs if r["model"] == name and r["target"] == target]
            if not sel:
                continue
            plain = [r["plain_cpu_s"] for r in sel if "plain_cpu_s" in r]
            cost = (f"{statistics.fmean(r['check_cpu_s'] for r in sel) / plain[0]:.1f}x ({plain[0]:.1f} s)"
                    if plain else "–")
            lines.append(f"| {name} | {sel[0]['canaries']} | {sel[0]['claimed']:.2f} | "
                         + " | ".join(_cell([(r['figures'].get(k) or 0) / r['claimed'] for r in sel])
                                      for k in ("one_run", "fdp", "independent"))
                         + f" | {_cell([r['noise'] / r['sigma'] for r in sel], 3)} | "
                         f"{sum(r['violated'] for r in sel)} of {len(sel)} | {cost} |")
    return runs, "\n".join(lines) + "\n"


def _earlier(args, path: Path, key: tuple[str, ...]) -> tuple[list, set]:
    """With --resume, the runs an interrupted run of the part wrote to `path` (kept; their cells are not run again;
    every run's seeds are fixed by its cell, so a resumed part gives the same figures) and their cells."""
    if not (args.resume and path.exists()):
        return [], set()
    runs = json.loads(path.read_text())
    return runs, {tuple(r[k] for k in key) for r in runs}


def _seeds(runs: list) -> str:
    """The seeds per cell of a part's runs (a resumed part may hold more in some cells): "17" or "6 to 17"."""
    cells = {}
    for r in runs:
        key = tuple(r[k] for k in ("model", "bug", "factor", "target") if k in r)
        cells[key] = cells.get(key, 0) + 1
    low, high = min(cells.values()), max(cells.values())
    return f"{low}" if low == high else f"{low} to {high}"


NOISE_FACTORS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
BROKEN_TARGETS = (1.0, 4.0, 8.0)


def broken_part(args) -> tuple[list, str]:
    path = args.out / "broken.json"
    runs, done = _earlier(args, path, ("bug", "factor", "target", "seed"))
    name, make, members = _models()[0]  # the tabular MLP: one canary per trainable value (5,828)
    cases = [("noise", f) for f in NOISE_FACTORS if f in args.factors] + [("clip", 1.0)]
    for bug, factor in cases:
        for target in BROKEN_TARGETS:
            for seed in range(args.seeds):
                if (bug, factor, target, seed) in done:
                    continue
                row = _check_run(name, make, members, target, seed, bug=bug, factor=factor)
                runs.append(row)
                path.write_text(json.dumps(runs, indent=1))
                print(f"{bug} {factor:g} eps {target:g} seed {seed}: caught {row['violated']} (estimate "
                      f"{row['noise']:.3f} of claimed {row['sigma']:.3f})", flush=True)
    lines = [f"DP trainings of the {name} (canaries: {runs[0]['canaries']}) that draw a fraction of the noise they "
             "claim, or clip to twice the claimed bound with the claimed bound's noise: share withheld "
             f"(dp_guarantee_violated) over {_seeds(runs)} seeds each, [95% Clopper-Pearson interval]; which test "
             "caught them; the estimate's noise multiplier / the claim's.", "",
             "| training | accountant ε | caught | by the estimate | by independent canaries | by f-DP | "
             "estimate σ̂ / claimed σ |", "|---|---|---|---|---|---|---|"]
    for bug, factor in cases:
        for target in BROKEN_TARGETS:
            sel = [r for r in runs if r["bug"] == bug and r["factor"] == factor and r["target"] == target]
            if not sel:
                continue
            caught = sum(r["violated"] for r in sel)
            label = f"noise {factor:g}x" if bug == "noise" else "clipping at 2x (noise of 1x)"
            lines.append(f"| {label} | {sel[0]['claimed']:.2f} | {caught} of {len(sel)} "
                         f"[{_cp_lower(caught, len(sel)):.0%}, {_cp_upper(caught, len(sel)):.0%}] | "
                         f"{sum(r['estimate_rejects'] for r in sel)} | {sum(r['independent_rejects'] for r in sel)} | "
                         f"{sum(r['fdp_rejects'] for r in sel)} | {_cell([r['noise'] / r['sigma'] for r in sel], 3)} |")
    return runs, "\n".join(lines) + "\n"


def input_part(args) -> tuple[list, str]:
    args.no_dp_only = True
    runs = []
    for name in args.datasets:
        for seed in range(args.seeds):
            runs += run_seed(name, seed, args)
            (args.out / "input.json").write_text(json.dumps(runs, indent=1))
    lines = ["Input canaries without DP (the step's defaults: noise canaries scored by their loss) against the best "
             "attack-based bound of the same round (each at 95%), mean [min, max] over seeds:", "",
             "| data | m | Steinke et al. ε ≥ | f-DP (μ-GDP's ε) | best attack ε ≥ | Steinke / attack | "
             "f-DP / attack |", "|---|---|---|---|---|---|---|"]
    for name in args.datasets:
        sel = [r for r in runs if r["dataset"] == name]
        for m in args.counts:
            entries = [r["counts"][str(m)]["input"] for r in sel]
            attack = [r["attack"] for r in sel]
            lines.append(f"| {name} | {m} | {_cell([e['epsilon'] for e in entries])} | "
                         f"{_cell([e['fdp'] for e in entries])} | {_cell(attack)} | "
                         f"{_cell([e['epsilon'] / a for e, a in zip(entries, attack) if a > 0], 1)}x | "
                         f"{_cell([e['fdp'] / a for e, a in zip(entries, attack) if a > 0], 1)}x |")
    return runs, "\n".join(lines) + "\n"


def _cost_of(index: int, seeds: int) -> list[dict]:
    """One model's check costs (see cost_part), in a fresh interpreter: its first check meets no cached curve."""
    import warnings

    import torch

    from audit import CanarySettings, DPTraining, audit_dp_training

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*Optimal order is the largest alpha.*")
    warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
    name, make, members = _models()[index]
    clock = time.process_time
    batches = math.ceil(MEMBERS / BATCH)
    sigma = noise_for(4.0, 1 / batches, batches * 20)
    trainer = DPTraining(lambda m: torch.optim.Adam(m.parameters(), lr=LR), BATCH, 20, sigma, CLIP)
    torch.manual_seed(0)
    start = make()
    x, y = members(0)
    trainer(start, x, y, seed=1)  # opacus' first use in the process
    out = []
    for seed in range(seeds + 1):  # the first check is cold, the others warm
        began = clock()
        trainer(start, x, y, seed=70_000 + seed)
        plain = clock() - began
        began = clock()
        check = audit_dp_training(trainer, start, (x, y), CanarySettings(), delta=DELTA, alpha=ALPHA,
                                  seed=71_000 + seed)
        out.append({"model": name, "seed": seed, "state": "cold" if seed == 0 else "warm",
                    "canaries": check.details["canaries"], "plain_s": plain, "check_s": clock() - began,
                    "training_share": check.details["training_s"] / check.details["seconds"]})
        print(out[-1], flush=True)
    return out


def cost_part(args) -> tuple[list, str]:
    """Where the DP check's CPU goes, per model at accountant's epsilon 4, in CPU-seconds (time.process_time, one
    thread) beside a plain DP training of the same recipe: the check cold (the first of its claim in the process:
    trade-off curves and accountant's epsilons computed) and warm (the same claim again, as in a federation's later
    rounds: the curves cached), and the share of the check's time its training with canaries took (wall clock)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        runs = [r for i in range(len(_models())) for r in pool.apply(_cost_of, (i, args.seeds))]
    lines = ["The DP check's CPU (CPU-seconds, one thread) beside a plain DP training of the same recipe (accountant's "
             f"epsilon 4, 140 steps, 200 members); warm: mean [min, max] over {args.seeds} checks:", "",
             "| model | canaries | plain DP training | check, cold | check / plain, cold | check, warm | "
             "check / plain, warm | training's share of the check, cold; warm |", "|---|---|---|---|---|---|---|---|"]
    for name, _, _ in _models():
        cold = [r for r in runs if r["model"] == name and r["state"] == "cold"]
        warm = [r for r in runs if r["model"] == name and r["state"] == "warm"]
        lines.append(f"| {name} | {cold[0]['canaries']:,} | {_cell([r['plain_s'] for r in cold + warm])} s | "
                     f"{_cell([r['check_s'] for r in cold])} s | "
                     f"{_cell([r['check_s'] / r['plain_s'] for r in cold], 1)}x | "
                     f"{_cell([r['check_s'] for r in warm])} s | "
                     f"{_cell([r['check_s'] / r['plain_s'] for r in warm], 1)}x | "
                     f"{_cell([r['training_share'] for r in cold])}; {_cell([r['training_share'] for r in warm])} |")
    return runs, "\n".join(lines) + "\n"


COVERAGE_SIGMAS = (0.3, 0.5, 0.9085, 1.355, 2.195, 3.838, 7.031, 13.125)  # the correct part's, and 0.3 and 0.5


def coverage_part(args) -> tuple[list, str]:
    """The white-box estimate's interval (audit.canary.whitebox, at the check's share alpha / 4) on observations
    y = b / sigma + z of a correct Gaussian DP-SGD: how often each limit misses the truth on its own side. The
    statistics the estimate reads (each group's count, mean and sum of squared deviations) are drawn from their exact
    distributions (normal means, chi-square sums of squares), at the counts of the correct part's checks (140 steps,
    q 1/7: 5,764 and 10,000 canaries) and at few observations of the contribution (few canaries, few steps)."""
    from audit import StepStatistics, whitebox_estimate

    q, steps = 1 / 7, 140
    cells = [(f"{m:,} canaries, 140 steps", m * steps - round(m / 2 * q * steps), round(m / 2 * q * steps))
             for m in (5764, 10_000)] + [("few steps and canaries", 200, 5), ("few steps and canaries", 130, 20),
                                          ("few steps and canaries", 1300, 100)]
    runs, lines = [], []
    for label, n0, n1 in cells:
        for sigma in COVERAGE_SIGMAS:
            rng = np.random.default_rng([n0, n1, round(sigma * 1000)])
            misses = np.zeros(5, dtype=int)
            for _ in range(args.seeds):
                mean0 = rng.standard_normal() / math.sqrt(n0)
                mean1 = 1 / sigma + rng.standard_normal() / math.sqrt(n1)
                stats = StepStatistics(n0, n0 * mean0, rng.chisquare(n0 - 1) + n0 * mean0 ** 2,
                                       n1, n1 * mean1, rng.chisquare(n1 - 1) + n1 * mean1 ** 2)
                found = whitebox_estimate(stats, noise_multiplier=sigma, max_grad_norm=1.0,
                                          epsilon_of=lambda v, up: 0.0, alpha=EACH)
                lo, hi = found.noise_interval
                misses += [found.claim_rejected, sigma > hi, sigma < lo, 1.0 > found.clipping_interval[1],
                           1.0 < found.clipping_interval[0]]
            row = {"cell": label, "noise_observations": n0, "signal_observations": n1, "sigma": sigma,
                   "runs": args.seeds, "rejected": int(misses[0]), "sigma_above": int(misses[1]),
                   "sigma_below": int(misses[2]), "clip_above": int(misses[3]), "clip_below": int(misses[4])}
            runs.append(row)
            print(label, sigma, misses, flush=True)
    lines += [f"The white-box estimate's misses on correct Gaussian DP-SGD, {args.seeds} simulated runs per row, each "
              f"limit at alpha / 4 = {EACH} (its nominal miss rate), count and [95% Clopper-Pearson interval]:", "",
              "| observations (noise + contribution) | σ | claim rejected (σ above the upper limit) | "
              "σ below the lower limit | clipping bound above its interval | below it |", "|---|---|---|---|---|---|"]
    for r in runs:
        def rate(k):
            return (f"{k / r['runs']:.2%} [{_cp_lower(k, r['runs']):.2%}, {_cp_upper(k, r['runs']):.2%}]")
        lines.append(f"| {r['cell']} ({r['noise_observations']:,} + {r['signal_observations']:,}) | {r['sigma']:g} | "
                     f"{rate(r['rejected'])} | {rate(r['sigma_below'])} | {rate(r['clip_above'])} | "
                     f"{rate(r['clip_below'])} |")
    return runs, "\n".join(lines) + "\n"


def _cp_upper(k: int, n: int) -> float:
    from audit import clopper_pearson

    return clopper_pearson(k, n, 0.95).upper


def _cp_lower(k: int, n: int) -> float:
    from audit import clopper_pearson

    return clopper_pearson(k, n, 0.95).lower


PARTS = {"ideal": ideal_part, "correct": correct_part, "broken": broken_part, "input": input_part,
         "coverage": coverage_part, "cost": cost_part}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--counts", type=int, nargs="+", default=[100, 500, 1000])
    p.add_argument("--compare-count", type=int, default=500)
    p.add_argument("--datasets", nargs="+", default=["digits", "tabular"], choices=["digits", "tabular"])
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "canary_benchmark")
    p.add_argument("--part", choices=sorted(PARTS), default=None, help="one of the DP check's benchmarks (above)")
    p.add_argument("--factors", type=float, nargs="+", default=list(NOISE_FACTORS), choices=NOISE_FACTORS,
                   metavar="F", help=f"--part broken: the noise fractions to run (of {NOISE_FACTORS}; clipping at 2x "
                   "always runs)")
    p.add_argument("--resume", action="store_true",
                   help="--part correct or broken: keep the runs in <out>/<part>.json, run only the missing ones")
    args = p.parse_args()
    args.no_dp_only = False

    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*Optimal order is the largest alpha.*")
    warnings.filterwarnings("ignore", message=".*Secure RNG turned off.*")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if args.part is not None:
        runs, text = PARTS[args.part](args)
        text += f"\n{time.perf_counter() - start:.0f} s in all.\n"
        (args.out / f"{args.part}.json").write_text(json.dumps(runs, indent=1))
        (args.out / f"{args.part}.md").write_text(text)
        print(text)
        return
    runs: list[dict] = []
    for name in args.datasets:
        for seed in range(args.seeds):
            runs += run_seed(name, seed, args)
            (args.out / "runs.json").write_text(json.dumps(runs, indent=1))
    text = table(runs, args.counts) + f"\n{time.perf_counter() - start:.0f} s in all.\n"
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
