"""Benchmark: the Fidel paper's figure 13 on scikit-learn's 8x8 digits - samples one update reveals, vs local set size.

Run on demand (not a test):

    .venv/bin/python benchmarks/bench_fidel.py [--updates 50] [--quick] [--out reports/fidel]

Setting (paper, Table I / Sec. V-B): FCNN Dense 128 - 128 - 64 - 10, one local epoch of plain SGD (lr 0.01,
batch 50) on n private samples, n in 1, 5, 10, 20, 30, 50, 100, 200; a sample is fully revealed when a
reconstruction dW_i / db_i of the first dense layer has Pearson r >= 0.98 with it, each sample counted once
(one-to-one matching).  As in the paper's Table I only the first dense layer's activation is varied (ReLU, sigmoid,
tanh; the others stay ReLU), each with and without Dropout (the paper gives no rate; --dropout, default 0.2,
after every hidden layer, as the project's FCNN places it).  Every update starts from a fresh seeded random init (the paper
averaged 200 rounds of a federation instead); the init is shared by all n and all activations of one update, so
the variants are paired.  The CNN (Conv 3x3x32, MaxPool 2, Dense 128-64-10, ReLU) is scored on its activation
maps and, through a ridge decoder fitted on 600 population samples under the update's global model, in pixels.

Reported per variant and n: revealed samples (mean +- std over updates) by the plain reconstructions, by FastICA
components, by either (union), the count without the one-to-one rule (samples whose best r >= 0.98), the mean best
r per sample, and for the CNN the decoded (pixel-level) count.  Writes bench_fidel.json and plots to --out.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere
from audit import (FIDEL_THRESHOLD, atomic_savefig, atomic_write_json, fidel_audit, save_reveal_grid,  # noqa: E402
                   train_decoder)
from src.data.datasets import load_dataset  # noqa: E402
from src.runner.models import CNN, FCNN  # noqa: E402

SIZES = (1, 5, 10, 20, 30, 50, 100, 200)
QUICK_SIZES = (1, 10, 30, 100)
ACTIVATIONS = ("relu", "sigmoid", "tanh")
POPULATION = 600  # decoder training samples; the rest of digits is the private pool
_ACT = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}


def variant_name(kind: str, act: str = "relu", dropout: float = 0.0) -> str:
    return "cnn" if kind == "cnn" else f"fcnn-{act}" + (f"-dropout{dropout:g}" if dropout else "")


def build(kind: str, act: str, dropout: float, seed: int) -> nn.Module:
    torch.manual_seed(seed)  # activations and Dropout have no parameters: one seed, one init for every variant
    if kind == "cnn":
        return CNN((1, 8, 8), 10)
    model = FCNN((1, 8, 8), 10, activation="relu", dropout=dropout)
    model.classifier.act1 = _ACT[act]()  # paper Table I: only the first dense layer's activation varies
    return model


def local_update(model: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int, lr=0.01, batch_size=50):
    """One epoch of plain SGD on (x, y) in a shuffled order, Dropout active; returns the trained copy."""
    gen = torch.Generator().manual_seed(seed)
    local = copy.deepcopy(model)
    local.train()
    opt = torch.optim.SGD(local.parameters(), lr=lr)
    order = torch.randperm(len(x), generator=gen)
    torch.manual_seed(seed)  # Dropout masks
    for start in range(0, len(x), batch_size):
        batch = order[start : start + batch_size]
        opt.zero_grad()
        F.cross_entropy(local(x[batch]), y[batch]).backward()
        opt.step()
    return local


def run_variant(kind, act, dropout, *, updates, sizes, x_priv, y_priv, x_pop, seed, threshold, example_dir):
    keys = ("revealed", "revealed_ica", "revealed_union", "revealed_no_1to1", "mean_best_r", "revealed_decoded")
    rows = {n: {k: [] for k in keys} for n in sizes}
    xt, yt = torch.as_tensor(x_priv), torch.as_tensor(y_priv)
    for u in range(updates):
        useed = seed + u
        model = build(kind, act, dropout, useed)
        decoder = train_decoder(model, x_pop) if kind == "cnn" else None
        for n in sizes:
            idx = np.random.default_rng([useed, n]).choice(len(x_priv), size=n, replace=False)
            local = local_update(model, xt[idx], yt[idx], seed=useed * 1000 + n)
            res = fidel_audit(model, local, x_priv[idx], threshold=threshold, seed=useed, decoder=decoder)
            r = rows[n]
            r["revealed"].append(res.revealed)
            r["revealed_ica"].append(res.revealed_ica)
            r["revealed_union"].append(res.revealed_union)
            r["revealed_no_1to1"].append(int((res.best_r >= threshold).sum()))
            r["mean_best_r"].append(res.mean_best_r)
            r["revealed_decoded"].append(res.revealed_decoded)
            if u == 0 and n == 30 and example_dir is not None:
                save_reveal_grid(res, x_priv[idx], example_dir / f"grid_{variant_name(kind, act, dropout)}_n30.png")
    return rows


def summarise(rows):
    out = {}
    for n, r in rows.items():
        out[n] = {}
        for k, v in r.items():
            if v and v[0] is not None:
                a = np.asarray(v, dtype=np.float64)
                out[n][k] = {"mean": float(a.mean()), "std": float(a.std()), "values": a.tolist()}
    return out


def fmt(cell):
    return f"{cell['mean']:5.2f} ± {cell['std']:4.2f}" if cell else "-"


def print_table(name, summary, seconds, updates):
    cnn = name == "cnn"
    cols = ["plain", "ICA", "union", "no 1:1", "mean best r"] + (["decoded (px)"] if cnn else [])
    keys = ["revealed", "revealed_ica", "revealed_union", "revealed_no_1to1", "mean_best_r"]
    keys += ["revealed_decoded"] if cnn else []
    space = " (activation maps; decoded = pixels)" if cnn else ""
    print(f"\n### {name}{space}: revealed of n, mean ± std over {updates} updates ({seconds:.1f} s)\n")
    print("| n | " + " | ".join(cols) + " |")
    print("|---:|" + "---:|" * len(cols))
    for n, s in summary.items():
        print(f"| {n} | " + " | ".join(fmt(s.get(k)) for k in keys) + " |")


def plot_variant(name, summary, path):
    from matplotlib.figure import Figure

    ns = np.array(list(summary))
    fig = Figure(figsize=(5, 3.6), layout="constrained")
    ax = fig.subplots()
    labels = {"revealed": "plain dW/db", "revealed_ica": "FastICA", "revealed_union": "either (union)",
              "revealed_decoded": "decoded (pixels)"}
    for key, label in labels.items():
        if key not in summary[ns[0]]:
            continue
        m = np.array([summary[n][key]["mean"] for n in ns])
        s = np.array([summary[n][key]["std"] for n in ns])
        ax.errorbar(ns, m, yerr=s, marker="o", ms=3, capsize=2, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("local samples n (one epoch, SGD lr 0.01, batch 50)")
    ax.set_ylabel(f"samples revealed (r >= {FIDEL_THRESHOLD:g})")
    ax.set_title(f"Fidel on digits: {name}", fontsize=9)
    ax.legend(fontsize=7)
    atomic_savefig(fig, path, dpi=110)


def plot_summary(results, path):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for name, summary in results.items():
        ns = np.array(list(summary))
        m = np.array([summary[n]["revealed"]["mean"] for n in ns])
        ax.plot(ns, m, marker="o", ms=3, ls="--" if "dropout" in name else "-", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("local samples n")
    ax.set_ylabel(f"fully revealed samples (plain, r >= {FIDEL_THRESHOLD:g})")
    ax.set_title("Fidel paper fig. 13 setting on 8x8 digits", fontsize=9)
    ax.legend(fontsize=7)
    atomic_savefig(fig, path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=50, help="updates (fresh inits) averaged per n (default 50)")
    p.add_argument("--quick", action="store_true", help=f"5 updates, n in {QUICK_SIZES}")
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "fidel", help="folder for json and plots")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threshold", type=float, default=FIDEL_THRESHOLD)
    p.add_argument("--dropout", type=float, default=0.2, help="Dropout rate of the dropout variants (default 0.2)")
    p.add_argument("--threads", type=int, default=1, help="torch and BLAS threads (default 1)")
    p.add_argument("--variants", default="all", help="comma list of: fcnn, cnn (default all)")
    args = p.parse_args(argv)
    if args.updates < 1:
        p.error("--updates must be >= 1")
    if not 0.0 < args.dropout < 1.0:
        p.error("--dropout must be in (0, 1)")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    kinds = {"fcnn", "cnn"} if args.variants == "all" else set(args.variants.split(","))
    if not kinds <= {"fcnn", "cnn"}:
        p.error(f"--variants: unknown {sorted(kinds - {'fcnn', 'cnn'})}; choose from fcnn, cnn")
    updates, sizes = (min(args.updates, 5), QUICK_SIZES) if args.quick else (args.updates, SIZES)

    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    x, y = load_dataset("digits")
    perm = np.random.default_rng(args.seed).permutation(len(x))
    pop, priv = perm[:POPULATION], perm[POPULATION:]
    data = dict(x_priv=x[priv], y_priv=y[priv], x_pop=x[pop])

    fcnn_variants = [(a, d) for a in ACTIVATIONS for d in (0.0, args.dropout)]
    plan = ([("fcnn", a, d) for a, d in fcnn_variants] if "fcnn" in kinds else []) + (
        [("cnn", "relu", 0.0)] if "cnn" in kinds else []
    )
    args.out.mkdir(parents=True, exist_ok=True)
    results, timings = {}, {}
    t_all = time.perf_counter()
    print(f"Fidel benchmark on digits: {updates} updates per n, n in {list(sizes)}, threshold {args.threshold}, "
          f"{args.threads} thread(s); private pool {len(priv)}, population {len(pop)}")
    with threadpool_limits(args.threads):
        for kind, act, dropout in plan:
            name = variant_name(kind, act, dropout)
            t0 = time.perf_counter()
            rows = run_variant(kind, act, dropout, updates=updates, sizes=sizes, seed=args.seed,
                               threshold=args.threshold, example_dir=args.out, **data)
            timings[name] = time.perf_counter() - t0
            results[name] = summarise(rows)
            print_table(name, results[name], timings[name], updates)
            plot_variant(name, results[name], args.out / f"revealed_vs_n_{name}.png")
            sys.stdout.flush()
    wall = time.perf_counter() - t_all
    plot_summary(results, args.out / "revealed_vs_n_all.png")
    atomic_write_json(args.out / "bench_fidel.json", {
        "setting": {"updates": updates, "sizes": list(sizes), "threshold": args.threshold, "seed": args.seed,
                    "lr": 0.01, "batch_size": 50, "epochs": 1, "dropout": args.dropout, "population": POPULATION,
                    "private_pool": int(len(priv)), "threads": args.threads},
        "seconds": timings, "wall_seconds": wall,
        "results": {name: {str(n): v for n, v in s.items()} for name, s in results.items()},
    })
    print(f"\nwall time {wall:.1f} s ({', '.join(f'{k} {v:.0f} s' for k, v in timings.items())}); "
          f"written to {args.out}")


if __name__ == "__main__":
    main()
