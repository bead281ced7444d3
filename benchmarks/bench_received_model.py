"""Benchmark: the received-model check (audit.before_training, docs/received-model.md) against published
constructions, its honest baseline, and its cost beside one local training.

Run on demand (not a test):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_received_model.py [--quick] \
        [--out reports/bench_received_model.json]

1. Constructions. Two parties on digits train the plan's recipe (Adam lr 0.003, 5 local epochs, batch 32, train ratio
   0.1: ~90 members each) for ROUNDS honest FedAvg rounds while party 1 checks every received model as its task
   runner does; then the server sends party 1 a model built from the current global one (tests/crafted_models.py):
   Fowl et al.'s imprint (FCNN: first linear layer; CNN: convolution set to pass the input through, imprint in the
   first linear layer) at 32/64/128 bins, Boenisch et al.'s trap weights, Wen et al.'s class fishing, a tensor of
   another shape. Per construction: samples of one training batch of 32 members (not the probe's batch) that the
   matching attack recovers from the update of one local step on it (what the party would have leaked: Fowl's
   consecutive-bin differences with the attacker's own bin order; Boenisch's and Fidel's dW_i / db_i; for fishing,
   dW_i / db_i of the gradient the target class alone sends), matched one-to-one at Pearson r >= 0.98 in the first
   linear layer's input space (pixels for the FCNN, the pooled map for the CNN); the check's verdict, the checks that
   fired, and the probe's own count.
2. Honest baseline: the probe's count (first dense layer, of 32) on the plan's models at initialisation over 10 seeds
   and 5 batches, and the extremes of every figure over the honest rounds against its threshold.
3. Cost: the check (median over repeats, CPU and wall seconds) beside one local training with the plan's recipe,
   measured alternately in one run; digits as the plan has it, and MNIST- and CIFAR-shaped shards (random pixels:
   the cost does not depend on them).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere
sys.path.insert(0, str(ROOT / "tests"))  # the constructions, shared with the tests
from audit import (AuditSettings, capture_linear_layers, check_received, count_revealed, leakage_probe,  # noqa: E402
                   pearson_matrix, reconstruct)
from crafted_models import class_fishing, imprint, layer_inputs, pass_through_convolution, trap_weights  # noqa: E402
from src.dataloader import AuditDataLoader  # noqa: E402
from src.runner.models import build_model  # noqa: E402

SHAPE = (1, 8, 8)
BATCH, EPOCHS, LR = 32, 5, 0.003
SETTINGS = AuditSettings()


def loaders(alpha=None):
    return [AuditDataLoader(data_path=str(i), batch_size=BATCH, dataset="digits", collaborator_count=2,
                            train_dataset_ratio=0.1, test_dataset_ratio=0.45, audit_dataset_ratio=0.45,
                            dirichlet_alpha=alpha, seed=0) for i in (1, 2)]


def plan_model(name: str, shape=SHAPE, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(name, shape, 10)


def local_training(model, x, y, seed: int, epochs: int = EPOCHS):
    """The plan's recipe: Adam, `epochs` epochs of shuffled batches of 32."""
    torch.manual_seed(seed)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    for _ in range(epochs):
        order = torch.randperm(len(yt))
        for start in range(0, len(yt), BATCH):
            index = order[start:start + BATCH]
            optimizer.zero_grad()
            F.cross_entropy(model(xt[index]), yt[index]).backward()
            optimizer.step()
    return model


def numpy_state(model) -> dict:
    return {n: t.detach().cpu().numpy().copy() for n, t in model.state_dict().items()}


def honest_rounds(name: str, rounds: int):
    """FedAvg of two parties; party 1 checks each received model. Returns its store, the last global state, the
    figures of every round's verdict."""
    parties = loaders()
    members = (np.asarray(parties[0].X_train), parties[0].y_train)
    template = plan_model(name)
    store: dict = {}
    global_model = plan_model(name)
    verdicts = []
    for r in range(rounds):
        received = numpy_state(global_model)
        verdict = check_received(received, template, members, BATCH, SETTINGS, party="p1", round_num=r, seed=0,
                                 plan_initial=lambda: plan_model(name), store=store)
        verdicts.append(verdict.details())
        states, sizes = [], []
        for i, party in enumerate(parties):
            local = local_training(copy.deepcopy(global_model), np.asarray(party.X_train), party.y_train,
                                   seed=r * 7 + i)
            states.append(numpy_state(local))
            sizes.append(len(party.y_train))
            if i == 0:
                verdict.remember(states[-1])
        weights = np.asarray(sizes, dtype=np.float64) / sum(sizes)
        averaged = {n: sum(w * s[n].astype(np.float64) for w, s in zip(weights, states)).astype(received[n].dtype)
                    for n in received}
        global_model.load_state_dict({n: torch.as_tensor(v) for n, v in averaged.items()})
    return store, numpy_state(global_model), verdicts, template, members


def public_digits():
    from src.data.datasets import load_dataset

    x, _ = load_dataset("digits")
    return np.asarray(x, dtype=np.float32)


def constructions(name: str, state: dict) -> dict:
    public = public_digits()
    template = plan_model(name)
    flat = public.reshape(len(public), -1).astype(np.float64)
    built = {}
    base = state
    if name == "cnn":
        base = pass_through_convolution(state, "features.conv1")
    inputs = flat if name == "fcnn" else layer_inputs(template, base, "classifier.fc1", public)
    for bins in (32, 64, 128):
        built[f"imprint {bins} bins"] = ("imprint", bins,
                                         imprint(base, "classifier.fc1", "classifier.fc2", inputs, bins))
    built["trap weights"] = ("trap", None, trap_weights(base, "classifier.fc1", inputs))
    built["class fishing"] = ("fishing", 3, class_fishing(state, "classifier.out", target=3))
    shape = dict(state)
    shape["classifier.fc1.weight"] = np.zeros((64, state["classifier.fc1.weight"].shape[1]), dtype=np.float32)
    built["another shape"] = ("shape", None, shape)
    return built


def recovered_by_attack(kind: str, bins, model_name: str, state: dict, x, y) -> tuple[int, int]:
    """Samples of (x, y) the construction's own attack recovers from one local step's update, and of how many."""
    template = plan_model(model_name)
    tensors = {n: torch.as_tensor(np.asarray(v)) for n, v in state.items()}
    first = capture_linear_layers(template, tensors, x, y)[0]
    if kind == "imprint":  # Fowl et al.: the attacker knows its bin order (by threshold)
        order = np.argsort(-np.asarray(state["classifier.fc1.bias"])[:bins])  # thresholds -b, ascending
        dw, db = first.dw[order], first.db[order]
        diff_w = np.concatenate([dw[:-1] - dw[1:], dw[-1:]])
        diff_b = np.concatenate([db[:-1] - db[1:], db[-1:]])
        used = np.abs(diff_b) > 1e-3 * np.abs(db).max(initial=0)
        recs = diff_w[used] / diff_b[used, None]
    else:  # trap weights (Boenisch et al.), fishing (Wen et al.), honest models (Fidel): single neurons
        recs, _ = reconstruct(first.dw, first.db)
    revealed = 0
    if len(recs):
        _rows, cols = count_revealed(pearson_matrix(recs, first.inputs))
        revealed = len(cols)
    return revealed, len(y)


def attack_batch(members, seed: int = 11):
    x, y = members
    rows = np.sort(np.random.default_rng(seed).choice(len(y), size=BATCH, replace=False))
    return np.asarray(x[rows], dtype=np.float32), np.asarray(y[rows])


def section_constructions(rounds: int) -> list[dict]:
    out = []
    for name in ("fcnn", "cnn"):
        store, state, verdicts, template, members = honest_rounds(name, rounds)
        x, y = attack_batch(members)
        honest_count, n = recovered_by_attack("honest", None, name, state, x, y)
        verdict = check_received(state, template, members, BATCH, SETTINGS, party="p1", round_num=rounds, seed=0,
                                 plan_initial=lambda: plan_model(name), store=copy.deepcopy(store))
        out.append(row(name, f"honest global model, round {rounds}", honest_count, n, verdict))
        for label, (kind, arg, crafted) in constructions(name, state).items():
            crafted = {k: np.asarray(v, dtype=np.float32) if np.asarray(v).dtype.kind == "f" else np.asarray(v)
                       for k, v in crafted.items()}
            recovered = recovered_by_attack(kind, arg, name, crafted, x, y) if kind != "shape" else (None, n)
            verdict = check_received(crafted, template, members, BATCH, SETTINGS, party="p1", round_num=rounds,
                                     seed=0, plan_initial=lambda: plan_model(name), store=copy.deepcopy(store))
            out.append(row(name, label, recovered[0], n, verdict))
    return out


def row(model: str, label: str, recovered, n: int, verdict) -> dict:
    details = verdict.details()["received_model"]
    probe_figures = details.get("probe") or {}
    fired = sorted({a.split(":")[0] for a in details.get("alarms", [])})
    return {"model": model, "received": label, "recovered": recovered, "batch": n,
            "verdict": "rejected" if verdict.rejected else ("alarm" if verdict.alarms else "accepted"),
            "checks_fired": fired, "probe_revealed": probe_figures.get("revealed"),
            "probe_references_max": max((r["revealed"] for r in (probe_figures.get("references") or {}).values()),
                                        default=None),
            "check_s": verdict.timings.get("received_model_s")}


def section_baseline(quick: bool) -> dict:
    parties = loaders()
    x, y = np.asarray(parties[0].X_train), parties[0].y_train
    out = {}
    for name in ("fcnn", "cnn"):
        counts = []
        for seed in range(3 if quick else 10):
            model = plan_model(name, seed=seed)
            tensors = {n: t.detach().clone() for n, t in model.state_dict().items()}
            for b in range(2 if quick else 5):
                bx, by = attack_batch((x, y), seed=100 + b)
                counts.append(leakage_probe(model, tensors, bx, by).count)
        out[name] = {"mean": float(np.mean(counts)), "min": int(min(counts)), "max": int(max(counts)),
                     "draws": len(counts), "batch": BATCH}
    return out


def honest_extremes(verdicts: list[dict]) -> dict:
    """The extremes of every figure over honest rounds (round 0 has no history)."""
    ratio, rows, support, isolating, cls, excess = [], [], [], [], [], []
    for v in verdicts:
        d = v["received_model"]
        if d["history"].get("ratio") is not None:
            ratio.append(d["history"]["ratio"])
        rows += [r["rows"] for r in d["structure"]["parallel_rows"].values()]
        for s in d["structure"]["support"].values():
            if s:
                support.append(s["mean_support"])
                isolating.append(s["isolating"])
        if d["structure"]["classifier"]["class_weight_ratio"] is not None:
            cls.append(d["structure"]["classifier"]["class_weight_ratio"])
        refs = d["probe"].get("references") or {}
        if refs:
            excess.append(d["probe"]["revealed"] - max(r["revealed"] for r in refs.values()))
    t = SETTINGS.received_model
    return {"max_change_ratio": (max(ratio), t.max_change_ratio), "parallel_rows": (max(rows), t.parallel_rows),
            "min_mean_support": (min(support), t.min_support), "max_isolating": (max(isolating), t.max_isolating),
            "class_weight_ratio": (max(cls), t.class_weight_ratio),
            "probe_excess": (max(excess), t.probe_margin * BATCH), "rounds": len(verdicts)}


def section_honest(rounds: int) -> dict:
    out = {}
    for name in ("fcnn", "cnn"):
        for alpha in (None, 0.3):
            parties = loaders(alpha)
            members = (np.asarray(parties[0].X_train), parties[0].y_train)
            store, _state, verdicts, _t, _m = honest_rounds_with(name, rounds, parties)
            out[f"{name} {'IID' if alpha is None else f'alpha {alpha}'}"] = honest_extremes(verdicts)
    return out


def honest_rounds_with(name, rounds, parties):
    global loaders
    saved = loaders
    loaders = lambda alpha=None: parties  # noqa: E731
    try:
        return honest_rounds(name, rounds)
    finally:
        loaders = saved


def section_cost(quick: bool) -> list[dict]:
    configs = [("fcnn", SHAPE, None, 5), ("cnn", SHAPE, None, 5),
               ("fcnn", (1, 28, 28), 600, 5), ("cnn", (1, 28, 28), 600, 5), ("cnn", (3, 32, 32), 600, 5)]
    if not quick:
        configs.append(("alexnet", (3, 32, 32), 3000, 1))  # a quarter of the tutorial's CIFAR-10 shard
    out = []
    for name, shape, members_n, epochs in configs:
        if members_n is None:
            party = loaders()[0]
            x, y = np.asarray(party.X_train, dtype=np.float32), party.y_train
        else:
            rng = np.random.default_rng(0)
            x = rng.random((members_n, *shape), dtype=np.float32)
            y = rng.integers(0, 10, members_n)
        template = plan_model(name, shape)
        store: dict = {}
        received = numpy_state(plan_model(name, shape))
        check_received(received, template, (x, y), BATCH, SETTINGS, party="p", round_num=0, seed=0,
                       plan_initial=lambda: plan_model(name, shape), store=store)  # the once-per-party reference
        check_cpu, check_wall, train_cpu, train_wall = [], [], [], []
        for r in range(1, 3 if quick or name == "alexnet" else 6):  # alternately, in one run
            c, w = time.process_time(), time.perf_counter()
            v = check_received(received, template, (x, y), BATCH, SETTINGS, party="p", round_num=r, seed=0,
                               plan_initial=lambda: plan_model(name, shape), store=store)
            check_cpu.append(time.process_time() - c)
            check_wall.append(time.perf_counter() - w)
            v.remember(received)
            model = plan_model(name, shape)
            c, w = time.process_time(), time.perf_counter()
            local_training(model, x, y, seed=r, epochs=epochs)
            train_cpu.append(time.process_time() - c)
            train_wall.append(time.perf_counter() - w)
        out.append({"model": name, "input": "x".join(map(str, shape)), "members": len(y), "epochs": epochs,
                    "steps": epochs * -(-len(y) // BATCH), "check_cpu_s": float(np.median(check_cpu)),
                    "train_cpu_s": float(np.median(train_cpu)), "check_wall_s": float(np.median(check_wall)),
                    "train_wall_s": float(np.median(train_wall)),
                    "ratio_cpu": float(np.median(check_cpu) / np.median(train_cpu)),
                    "ratio_wall": float(np.median(check_wall) / np.median(train_wall))})
        print(f"  cost {name} {out[-1]['input']} ({len(y)} members, {epochs} epochs): check "
              f"{out[-1]['check_cpu_s']:.4f} s CPU / train {out[-1]['train_cpu_s']:.3f} s = {out[-1]['ratio_cpu']:.1%}",
              flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, seeds and repeats; no AlexNet")
    parser.add_argument("--out", default="reports/bench_received_model.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rounds = 3 if args.quick else 5
    start = time.perf_counter()
    results = {"constructions": section_constructions(rounds)}
    print(f"\nConstructions (digits, batch {BATCH}; crafted from the global model after {rounds} honest rounds)")
    print(f"{'model':6} {'received model':32} {'recovered':>10} {'verdict':>9}  {'probe':>5} {'refs':>4}  checks fired")
    for r in results["constructions"]:
        rec = "n/a" if r["recovered"] is None else f"{r['recovered']}/{r['batch']}"
        probe_count = "" if r["probe_revealed"] is None else str(r["probe_revealed"])
        refs = "" if r["probe_references_max"] is None else str(r["probe_references_max"])
        print(f"{r['model']:6} {r['received']:32} {rec:>10} {r['verdict']:>9}  {probe_count:>5} {refs:>4}  "
              f"{', '.join(r['checks_fired'])}")
    results["baseline"] = section_baseline(args.quick)
    print("\nProbe's count at initialisation (first dense layer, batch of 32; seeds x batches)")
    for name, b in results["baseline"].items():
        print(f"  {name}: mean {b['mean']:.1f}, range {b['min']}-{b['max']} over {b['draws']}")
    results["honest"] = section_honest(8 if args.quick else 20)
    print("\nHonest rounds: each figure's extreme (value, threshold)")
    for label, ext in results["honest"].items():
        print(f"  {label}: " + ", ".join(f"{k} {v[0]:.3g} vs {v[1]:g}" for k, v in ext.items() if k != "rounds")
              + f" ({ext['rounds']} rounds)")
    print("\nCost of the check beside one local training (median, one thread)")
    results["cost"] = section_cost(args.quick)
    results["seconds"] = time.perf_counter() - start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print(f"\nwrote {out} ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
