"""Calibration of the deanonymization self-audit (audit/deanon/self_audit.py): is it at chance where it should be?

In an IID federation no user is distinguishable, so every re-identification ratio must sit near 1x: the headline
`deanon_ap_over_chance`, the collaborator's own AP over chance and the crowd users' alike. With strongly skewed
users (Dirichlet 0.1) the collaborator must still stand out (own rank near 1). Each setting is one party of a
split, audited at a fresh model with the collaborator's real update trained the way the task runner trains it
(torch.optim, one shuffle per epoch, a last partial batch), averaged over seeds:

- digits (demo): the workspace CNN on digits split as `make demo` does (2 parties, 0.1 / 0.45 / 0.45: 90 members,
  404 non-members, 404 population samples per party), the demo's recipe (Adam 0.003, 5 epochs, batch 32);
- digits (large population): the same with 0.03 / 0.17 / 0.8 (26 members, 152 / 718), room for a crowd of 10;
- synthetic MLP (demo split): scikit-learn's make_classification (20 features, 10 classes), 1800 samples split as
  the demo does (90 members, 405 / 405), a 20-64-10 MLP, the demo's recipe;
- synthetic MLP (large population): 8000 samples, 0.025 / 0.175 / 0.8 (100 members, 700 / 3200), SGD 0.05
  (momentum 0.9), 3 epochs, batch 16;
- digits (tutorial): the OpenFL tutorial's split and recipe, as `cifar10_PM.py --dataset digits --collaborators 3
  --deanon` runs it (0.4 / 0.4 / 0.2: 240 members, 240 / 120; SGD 0.005, momentum 0.9, 1 epoch, batch 32): the
  population cannot hold two crowd users of the member count, so the audit is sized to it (2 users of 30 private +
  30 prior samples; the collaborator's own update on its 240 members).

    python benchmarks/bench_deanon_self_audit.py [--seeds 20] [--settings digits-demo synthetic-demo-split]

Prints one row per setting and skew, means over the seeds: the crowd size used, the headline, the MLP's own rank,
and per attack the collaborator's own AP over chance and the crowd users' mean AP over chance. A single audit's own
ratio is one rank (0.3x-3.6x with 11 users): use 20 seeds or more to read it to about +-0.2. With 20 seeds all
settings take about 4 minutes on 2 cores; --out writes every seed's figures as JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from audit import DEANON_SELF, DeanonSettings, TrainingRecipe, deanon_self_audit  # noqa: E402
from src.data.split import split_federation  # noqa: E402
from src.data.datasets import load_dataset  # noqa: E402
from src.runner.models import build_model  # noqa: E402

ATTACKS = ("mlp", "svm", "knn")


@dataclass(frozen=True)
class Setting:
    data: str                     # "digits" or "synthetic"
    ratios: tuple                 # train / test / audit ratios of split_federation
    recipe: TrainingRecipe
    samples: int = 0              # synthetic data: how many
    parties: int = 2


DEMO_RECIPE = TrainingRecipe("Adam", 0.003, 0.9, epochs=5, batch_size=32)
SETTINGS = {
    "digits-demo": Setting("digits", (0.1, 0.45, 0.45), DEMO_RECIPE),
    "digits-large-population": Setting("digits", (0.03, 0.17, 0.8), DEMO_RECIPE),
    "synthetic-demo-split": Setting("synthetic", (0.1, 0.45, 0.45), DEMO_RECIPE, samples=1800),
    "synthetic-large-population": Setting("synthetic", (0.025, 0.175, 0.8),
                                          TrainingRecipe("SGD", 0.05, 0.9, epochs=3, batch_size=16), samples=8000),
    # The OpenFL tutorial's split and recipe (cifar10_PM.py's defaults): the population shard (120) is half the member
    # count (240), so the audit is sized to it: 2 crowd users of 30 private + 30 prior samples.
    "digits-tutorial": Setting("digits", (0.4, 0.4, 0.2), TrainingRecipe("SGD", 0.005, 0.9, epochs=1, batch_size=32),
                               parties=3),
}


def dataset(setting: Setting):
    if setting.data == "digits":
        return load_dataset("digits")
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=setting.samples, n_features=20, n_informative=12, n_redundant=4,
                               n_classes=10, n_clusters_per_class=1, class_sep=1.5, random_state=0)
    return x.astype(np.float32), y.astype(np.int64)


def model_for(name: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    if name == "digits":
        return build_model("cnn", (1, 8, 8), 10)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def local_training(model: torch.nn.Module, x, y, recipe: TrainingRecipe, seed: int) -> torch.nn.Module:
    """The collaborator's own round, as the task runner runs it: a fresh optimizer, one shuffle per epoch, mean
    cross-entropy per batch, the last partial batch kept."""
    trained = copy.deepcopy(model)
    optimizer = recipe.make_optimizer(list(trained.parameters()))
    rng = np.random.default_rng(seed)
    xt, yt = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y)
    trained.train()
    for _ in range(recipe.epochs):
        order = torch.as_tensor(rng.permutation(len(y)))
        for batch in order.split(recipe.batch_size):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(trained(xt[batch]), yt[batch]).backward()
            optimizer.step()
    return trained


def audit_once(setting: Setting, data, alpha, seed: int, crowd_users: int) -> dict:
    x, y = data
    train, test, audit = setting.ratios
    party = split_federation(x, y, setting.parties, train_ratio=train, test_ratio=test, audit_ratio=audit,
                             seed=seed, dirichlet_alpha=alpha)[0]
    global_model = model_for(setting.data, seed)
    trained = local_training(global_model, party.train_x, party.train_y, setting.recipe, seed + 1000)
    settings = DeanonSettings(enabled=True, crowd_users=crowd_users, attacks=ATTACKS)
    result = deanon_self_audit(global_model, trained, (party.test_x, party.test_y), len(party.train_y),
                               (party.population_x, party.population_y), setting.recipe, settings,
                               federation_alpha=alpha, seed=seed)
    m, details = result.metrics, result.details
    out = {"crowd_users": details["crowd_users"], "headline": m["deanon_ap_over_chance"],
           "own_rank_mlp": m["deanon_mlp_own_rank"], "seconds": details["timings"]["total_s"]}
    for a in ATTACKS:
        found = details["attacks"][a]
        chance = found["chance_ap"]  # one anonymous update per user: every user's chance AP is the same
        out[f"own_{a}"] = m[f"deanon_{a}_own_ap_over_chance"]
        out[f"crowd_{a}"] = float(np.mean([ap / chance for user, ap in found["per_user_ap"].items() if user != DEANON_SELF]))
    return out


COLUMNS = ("crowd_users", "headline", "own_rank_mlp", "own_mlp", "own_svm", "own_knn", "crowd_mlp", "crowd_svm",
           "crowd_knn")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--crowd_users", type=int, default=10)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--out", default=None, help="also write the per-seed results here (JSON)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    raw = {}
    print(f"{'setting':<26} {'skew':<14} " + " ".join(f"{c:>12}" for c in COLUMNS), flush=True)
    for name in args.settings:
        setting = SETTINGS[name]
        data = dataset(setting)
        for alpha, skew in ((None, "IID"), (0.1, "Dirichlet 0.1")):
            start = time.perf_counter()
            runs = [audit_once(setting, data, alpha, seed, args.crowd_users) for seed in range(args.seeds)]
            raw[f"{name}/{skew}"] = runs
            means = {c: float(np.mean([r[c] for r in runs])) for c in COLUMNS}
            print(f"{name:<26} {skew:<14} " + " ".join(f"{means[c]:>12.2f}" for c in COLUMNS)
                  + f"   ({time.perf_counter() - start:.0f} s)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"settings": vars(args), "runs": raw}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
