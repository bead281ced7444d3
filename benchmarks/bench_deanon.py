"""Deanonymization benchmark: the paper's shadow-device protocol on a real (in-process) OpenFL federation.

Orekondy et al. (seeds 000/001, section "Training and Evaluation Data for Attacker"): every user owns two devices
in the federation, an anonymous one (its private data) and a shadow one holding the adversary's prior data of the
user; both follow the user's own label mix (data_loader.settings.devices_per_user: 2). The aggregator keeps every
device's update of the last layer each round (src/server/deanon_callback.py's UpdateHistory); the attacks train on the
shadow devices' updates labelled by user and name the owners of the anonymous devices' updates (closed world).

    python benchmarks/bench_deanon.py               # 20 users, non-IID and the IID control: table 1
    python benchmarks/bench_deanon.py --sweep       # also the mitigation sweep (paper figure 12): table 2, plot

Utility is the global model's accuracy on every device's validation data after the last round (OpenFL's
aggregated_model_validation), normalised to 1.0 for the run without mitigation. Mitigations run on the anonymous
devices only: the shadow devices are the adversary's. Takes roughly a minute per federation on 2 cores.

This is the server's attack on real updates: the collaborators' self-audit, and with it its synthetic crowd
(audit/deanon/crowd.py), is off here. benchmarks/bench_deanon_self_audit.py measures the self-audit.
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from audit import atomic_savefig, atomic_write_json, match, reidentify  # noqa: E402
from workspace.in_process import run_in_process  # noqa: E402
from workspace.plan_file import collaborator_names  # noqa: E402

ATTACKS = ("mlp", "svm", "knn", "siamese")
# Points of the paper's grids (section 7.2; fewer, one federation each), the perturbations rescaled: our updates are ~1e-2 per coordinate, not
# MobileNet's, so the paper's noise variances 1e-2..1e2 would only show the utility floor.
SWEEP = {  # the most telling point first (see --points)
    "bkg_repl": [("alpha", a) for a in (0.5, 1.0)],
    "rand_aug": [("alpha", a) for a in (0.5, 2.0)],
    "mm_aug": [("alpha", a) for a in (0.5, 2.0)],
    "noise": [("sigma", s) for s in (3e-2, 1e-2)],
    "dp_fedavg": [("sigma", s) for s in (1e-2, 1e-3)],
}
PAPER_MM_AUG_CUT = 0.75  # OpenImages, alpha 0.5: "75% decrease in adversary's AP"


def overrides(users: int, alpha: float | None, rounds_epochs: int, seed: int, mitigation: dict | None) -> dict:
    anonymous = collaborator_names(2 * users)[0::2]  # device 0 of each user (shard p: user p // 2, device p % 2)
    per_collaborator = {name: {"mitigation": mitigation} for name in anonymous} if mitigation else {}
    return {
        "tasks": {"train": {"kwargs": {"epochs": rounds_epochs}}},
        "data_loader": {"settings": {"dataset": "digits", "seed": seed, "dirichlet_alpha": alpha,
                                     "devices_per_user": 2, "train_dataset_ratio": 0.4,
                                     "test_dataset_ratio": 0.2, "audit_dataset_ratio": 0.4}},
        "task_runner": {"settings": {"seed": seed, "audit": {"enabled": False}, "per_collaborator": per_collaborator}},
        # min_history_rounds past the end: the aggregator only collects; the benchmark attacks below.
        "aggregator": {"settings": {"deanon": {"enabled": True, "min_history_rounds": 1000}}},
    }


def run(users: int, rounds: int, epochs: int, alpha: float | None, seed: int, mitigation: dict | None) -> dict:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        fed = run_in_process(Path(tmp), collaborators=2 * users, rounds=rounds,
                             overrides=overrides(users, alpha, epochs, seed, mitigation))
    history = fed.aggregator.deanon.history
    names = collaborator_names(2 * users)
    user_of = {name: f"user{i // 2:02d}" for i, name in enumerate(names)}
    shadow_x, shadow_c = history.stack(history.rounds(), names[1::2])
    anon_x, anon_c = history.stack(history.rounds(), names[0::2])
    shadow_u = np.array([user_of[c] for c in shadow_c])
    anon_u = np.array([user_of[c] for c in anon_c])
    out = {"seconds": time.perf_counter() - start, "updates": [len(shadow_u), len(anon_u)]}
    for attack in ATTACKS:
        if attack == "siamese":
            result = match(shadow_x, shadow_u, anon_x, anon_u, shadow_x, shadow_u, seed=seed)
            out[attack] = {"ap": result.ap, "chance": result.chance_ap, "ratio": result.ap_over_chance}
        else:
            result = reidentify(shadow_x, shadow_u, anon_x, anon_u, attack, seed=seed)
            out[attack] = {"ap": result.mean_ap, "chance": result.chance_ap, "ratio": result.ap_over_chance,
                           "top1": result.top1}
    out["accuracy"] = float(fed.round_logs[-1]["aggregator/aggregated_model_validation/accuracy"])
    return out


def table(rows: list[tuple[str, dict]]) -> str:
    lines = [f"{'setting':<22} {'acc':>6} " + " ".join(f"{a + ' AP (xchance)':>22}" for a in ATTACKS)]
    for label, r in rows:
        cells = " ".join(f"{100 * r[a]['ap']:>12.1f} ({r[a]['ratio']:>5.1f}x)" for a in ATTACKS)
        lines.append(f"{label:<22} {r['accuracy']:>6.3f} {cells}")
    return "\n".join(lines)


def plot_sweep(points: dict, base: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for method, series in points.items():
        xs = [base["mlp"]["ratio"]] + [r["mlp"]["ratio"] for _, r in series]
        ys = [1.0] + [r["accuracy"] / base["accuracy"] for _, r in series]
        ax.plot(xs, ys, marker="o", label=method)
        for (value, _), x, y in zip(series, xs[1:], ys[1:]):
            ax.annotate(f"{value:g}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1, label="chance")
    ax.set_xlabel("adversary AP over chance (MLP re-identification; lower = more private)")
    ax.set_ylabel("utility (global accuracy / accuracy without mitigation)")
    ax.set_title("Mitigations: privacy vs utility (cf. paper fig. 12)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=3, help="local epochs per round")
    p.add_argument("--alpha", type=float, default=0.3, help="Dirichlet label skew of the users")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true", help="also run the mitigation sweep (figure 12)")
    p.add_argument("--methods", nargs="+", default=list(SWEEP), choices=list(SWEEP))
    p.add_argument("--points", type=int, default=None, help="only the first N points of each method's grid")
    p.add_argument("--no_iid", action="store_true", help="skip the IID control")
    p.add_argument("--out", default=str(ROOT / "reports" / "deanon_benchmark"))
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    results = {"settings": vars(args)}
    common = dict(users=args.users, rounds=args.rounds, epochs=args.epochs, seed=args.seed)
    base = run(alpha=args.alpha, mitigation=None, **common)
    results["non_iid"] = base
    rows = [(f"non-IID (alpha {args.alpha:g})", base)]
    if not args.no_iid:
        results["iid"] = run(alpha=None, mitigation=None, **common)
        rows.append(("IID control", results["iid"]))
    print(f"Closed-world re-identification, {args.users} users x 2 devices, {args.rounds} rounds "
          f"({base['seconds']:.0f} s per federation):")
    print(table(rows), flush=True)

    if args.sweep:
        points = {}
        rows = [("no mitigation", base)]
        csv_rows = []
        for method in args.methods:
            points[method] = []
            for key, value in SWEEP[method][:args.points]:
                r = run(alpha=args.alpha, mitigation={"method": method, key: value}, **common)
                points[method].append((value, r))
                rows.append((f"{method} {key}={value:g}", r))
                csv_rows.append({"method": method, key: value, "accuracy": r["accuracy"],
                                 "utility": r["accuracy"] / base["accuracy"],
                                 **{f"{a}_ap_over_chance": r[a]["ratio"] for a in ATTACKS},
                                 "mlp_ap_cut": 1 - r["mlp"]["ap"] / base["mlp"]["ap"]})
                print(f"  {rows[-1][0]}: utility {r['accuracy'] / base['accuracy']:.2f}, "
                      f"MLP AP {100 * r['mlp']['ap']:.1f} ({r['mlp']['ratio']:.1f}x)", flush=True)
        results["sweep"] = {m: [(v, r) for v, r in s] for m, s in points.items()}
        print("\nMitigation sweep (utility = accuracy / accuracy without mitigation):")
        print(table(rows))
        with (out / "sweep.csv").open("w", newline="") as f:
            fields = ["method", "alpha", "sigma", "accuracy", "utility", "mlp_ap_cut",
                      *(f"{a}_ap_over_chance" for a in ATTACKS)]
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(csv_rows)
        plot_sweep(points, base, out / "privacy_utility.png")
        mm = [r for v, r in points.get("mm_aug", []) if v == 0.5]
        if mm:
            print(f"mm_aug alpha 0.5 cuts the MLP's AP by {100 * (1 - mm[0]['mlp']['ap'] / base['mlp']['ap']):.0f}% "
                  f"(paper, OpenImages: {100 * PAPER_MM_AUG_CUT:.0f}%)")
    atomic_write_json(out / "results.json", results)
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
