"""Benchmark: what the round's leak verdict and its epsilon lower bound can and cannot certify at a given sample size.

Two tables.

1. Counts alone (audit.verdict.chance): for n members and n non-members per party (the audit's sample, at most
   audit.sample_size), k tests in the family (the default audit: 9 attacks x (1 AUC + 3 resolvable tolerances) =
   36) and k_eps attacks for the epsilon bound (9), the smallest exact AUC and the smallest TPR at FPR 0.01 / 0.1
   the verdict can declare a leak, and the largest epsilon lower bound any attack could prove (perfectly separated
   scores). An epsilon budget above that ceiling can never be exceeded by the audit: it certifies nothing.

2. Real models (`--trained`): a small MLP on tabular data trained on its n members for a range of epochs (from barely
   fitted to memorised), audited with every attack on (audit.round_audit.audit_round, RMIA with the received model
   and 2 independent references): per epoch count, the share of seeds with "leak detected", the median headline
   p-value, and the family-wise epsilon lower bound (median and max over seeds) beside its ceiling.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_verdict.py [--sizes 20 50 90 200 500 1000 5000]
        [--trained] [--seeds 5]

Prints markdown tables (benchmarks/README.md keeps the figures with this command).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit import largest_certifiable_epsilon, smallest_detectable_auc, smallest_detectable_tpr


def counts_table(sizes, tests: int, attacks: int, confidence: float, delta: float) -> list[str]:
    alpha = 1 - confidence
    level = alpha / tests
    lines = [f"Counts alone: {tests} tests, {attacks} attacks, {100 * confidence:g}% family-wise, delta {delta:g}",
             "", "| members = non-members | smallest AUC detected | smallest TPR @ FPR 0.01 | smallest TPR @ FPR 0.1 "
             "| largest epsilon lower bound (ceiling) |", "|---|---|---|---|---|"]
    for n in sizes:
        auc = smallest_detectable_auc(n, n, level)
        tprs = [smallest_detectable_tpr(n, n, t, level) for t in (0.01, 0.1)]
        ceiling = largest_certifiable_epsilon(n, n, delta=delta, confidence=1 - alpha / attacks)
        cells = ["–" if v is None else f"{v:.3f}" for v in (auc, *tprs)]
        lines.append(f"| {n:,} | " + " | ".join(cells) + f" | {ceiling:.2f} |")
    return lines


def trained_table(n: int, seeds: int, epochs_list, confidence: float) -> list[str]:
    import numpy as np
    import torch
    from torch import nn

    from audit import AuditSets, AuditSettings, LocalTraining, TrainingRecipe, audit_round

    torch.set_num_threads(1)
    settings = AuditSettings.from_mapping({"confidence": confidence, "fpr_tolerance": [0.01, 0.1, 0.5],
                                           "rmia": {"references": ["global", "independent"], "reference_models": 2}})

    def data(rng, size):
        y = rng.integers(0, 3, size=size)
        x = rng.normal(size=(size, 10)).astype(np.float32)
        x[:, 0] += y
        return x, y

    def fit(model, x, y, epochs):
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        xt, yt = torch.as_tensor(x), torch.as_tensor(y)
        for _ in range(epochs):
            for part in torch.split(torch.randperm(len(y)), 32):
                opt.zero_grad()
                nn.functional.cross_entropy(model(xt[part]), yt[part]).backward()
                opt.step()
        return model

    lines = [f"Real models: MLP 10-64-3 on tabular data, {n} members, {n} non-members, {2 * n} population, every "
             f"attack on, {100 * confidence:g}% family-wise, {seeds} seeds", "",
             "| local epochs | leak detected | median headline p (adjusted) | epsilon lower bound: median / max | "
             "ceiling |", "|---|---|---|---|---|"]
    for epochs in epochs_list:
        detected, ps, eps, ceiling = 0, [], [], None
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            torch.manual_seed(seed)
            members, nonmembers, population = data(rng, n), data(rng, n), data(rng, 2 * n)
            make = lambda: nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 3))  # noqa: E731
            received = make()
            local = fit(make(), *members, epochs)
            training = LocalTraining(TrainingRecipe("Adam", 0.01, 0.9, epochs=max(1, epochs), batch_size=32),
                                     member_count=n, federation_alpha=None)
            record = audit_round(local, received, AuditSets(members, nonmembers, population), settings, party="p",
                                 round_num=0, seed=seed, training=training, initial_model=make())
            leak = record.leak
            detected += bool(leak["detected"])
            ps.append(leak["headline"]["p_adjusted"])
            eps.append(leak["epsilon"]["value"])
            ceiling = leak["epsilon"]["ceiling"]
        lines.append(f"| {epochs} | {detected}/{seeds} | {statistics.median(ps):.2g} | "
                     f"{statistics.median(eps):.2f} / {max(eps):.2f} | {ceiling:.2f} |")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[20, 50, 90, 200, 500, 1000, 5000])
    p.add_argument("--tests", type=int, default=36)
    p.add_argument("--attacks", type=int, default=9)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--trained", action="store_true", help="also audit real models trained for several epochs")
    p.add_argument("--members", type=int, default=200)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, nargs="+", default=[1, 5, 20, 100])
    args = p.parse_args(argv)
    print("\n".join(counts_table(args.sizes, args.tests, args.attacks, args.confidence, args.delta)))
    if args.trained:
        print()
        print("\n".join(trained_table(args.members, args.seeds, args.epochs, args.confidence)))


if __name__ == "__main__":
    main()
