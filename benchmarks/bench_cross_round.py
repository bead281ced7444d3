"""Benchmark: the cross-round attack (audit.cross_round) against the single-round attacks on the same members, its
false-positive rate under the null, its cost per round and its private state over rounds.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_cross_round.py [--seeds 3] [--rounds 10] [--parts A B C]
        [--null-runs 60] [--out reports/cross_round_benchmark]

A. Real in-process federations (workspace.in_process.run_in_process: OpenFL's Aggregator and Collaborators, the
   plan's GatedWeightedAverage and the party's own audit): digits, the workspace's CNN, 2 collaborators (90 members,
   404 non-members, 404 population each), the demo's training (5 local epochs, Adam 0.003, batch 32), IID and
   Dirichlet alpha 0.3, `--rounds` rounds (one more is run: its audit attacks the last update), seeds 0..N-1, the
   default audit (loss, logits, gradient norm on the local and received model, the update attack, RMIA with the
   received model and one independent reference) plus the cross-round step. On the same members: the cross-round
   attack after the last update (every update sent) against each single-round attack on the last update, and against
   the best single round of each (the largest TPR over the rounds: picked, so optimistic). Per attack: TPR at FPR 1%
   pooled over parties and seeds (members flagged / members, Clopper-Pearson interval), the exact AUC (mean with its
   t-interval). Cost: the step's seconds over the rest of the round's audit (the same round, side by side). Private
   state: its bytes after each round (rounds_kept 20).
B. The null through the real audit (audit.round_audit.audit_round with the party's store and after_sending, as the
   party drives them): 2 parties, the digits CNN, the party trains on samples other than its audit's members, so
   members, non-members and population are one distribution; 3 rounds attacked, the step alone in the verdict at the
   default confidence 0.95: how often "leak detected" (at most 5% expected).
C. FedMIA's own setting at small scale: 5 parties (digits, 72 members a party), IID, the aggregator sees every update:
   FedMIA as its authors run it (per sample, the other 4 parties' updates give the non-members' mean and spread; the
   rounds' CDF values averaged) beside the party's own derivation (the others' combined update only) and the
   single-round attacks, on the same members.
D. The private state over rounds with rounds_kept 4: its bytes after each round, and the Python heap held.

Writes <out>/runs.json and <out>/table.md and prints the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

SINGLE = (("population loss", "local", "loss"), ("population logits", "local", "logits"),
          ("population gradient_norm", "local", "gradient_norm"), ("update", "update", "loss_reduction"),
          ("rmia global", "rmia", "global"), ("rmia independent", "rmia", "independent"))
# The step runs on the logit margin (its default); the loss variant is recomputed from its private files (the same
# run).
STEP_SIGNAL = "logits"
CROSS = ("cross-round (logits)", "cross_round", STEP_SIGNAL)
OTHER_CROSS = ("cross-round (loss)", "cross_round", "loss")
TOL = "0.01"


def _at(result, tol=TOL) -> dict:
    rates = result["uncertainty"]["at_fpr"][tol]
    return {"k": rates["tpr"]["k"], "n": rates["tpr"]["n"], "fpr_k": rates["fpr"]["k"], "fpr_n": rates["fpr"]["n"],
            "resolvable": rates["resolvable"], "exact_auc": result["exact_auc"]}


def _recomputed(party_dir: Path, rounds: int, signal: str, tolerances, labels: dict) -> dict:
    """The cross-round attack on `signal` over every update, recomputed from the party's private files (each round's
    cross_round.npz holds the signals of the round it attacked: the loss always, and the step's own signal) by the
    step's own functions: the other signal's variant on the same run."""
    from audit import cross_round_attack, population_attack

    rounds_found = []
    for r in range(1, rounds + 1):
        with np.load(party_dir / f"round_{r:04d}" / "cross_round.npz") as saved:
            key = f"round_{r - 1}_{{}}_{signal}_{{}}"
            if key.format("own", "members") not in saved.files:
                continue
            rounds_found.append({name: cross_round_attack.round_statistic(
                saved[key.format("own", name)], saved[key.format("others", name)], signal)
                for name in cross_round_attack.SETS})
    scores = cross_round_attack.combined_scores(rounds_found, labels)
    return _at(population_attack(scores["members"], scores["nonmembers"], scores["population"], tolerances,
                                 member_if_lower=False).to_dict())


def _overrides(seed: int, alpha, rounds_kept: int, signal: str = "loss") -> dict:
    return {
        "tasks": {"train": {"kwargs": {"epochs": 5}}},
        "data_loader": {"settings": {"dataset": "digits", "seed": seed, "train_dataset_ratio": 0.1,
                                     "test_dataset_ratio": 0.45, "audit_dataset_ratio": 0.45,
                                     "dirichlet_alpha": alpha}},
        "aggregator": {"settings": {"db_store_rounds": 1}},
        "collaborator": {"settings": {"db_store_rounds": 1}},
        "task_runner": {"settings": {
            "model": "cnn", "seed": seed, "optimizer": "Adam", "learning_rate": 0.003,
            "audit": {"fpr_tolerance": [0.001, 0.01, 0.1],
                      "cross_round": {"enabled": True, "rounds_kept": rounds_kept, "signal": signal}}}},
    }


@contextlib.contextmanager
def _no_drawing():
    """The report worker takes no jobs (the records and private files are still written): the drawing of each round's
    images would be most of a small federation's CPU, and nothing here reads them."""
    from audit import render_queue

    submit = render_queue.submit
    render_queue.submit = lambda writer, round_num: None
    try:
        yield
    finally:
        render_queue.submit = submit


def part_a(seeds: int, rounds: int) -> list[dict]:
    """Federations; per party the figures of every round's record."""
    from audit import RoundRecord
    from workspace.in_process import run_in_process
    from workspace.plan_file import collaborator_names

    from src.data.datasets import load_dataset
    from src.data.split import split_federation

    x, y = load_dataset("digits")
    runs = []
    configs = [(alpha, seed, 20) for alpha in (None, 0.3) for seed in range(seeds)]
    for alpha, seed, kept in configs:
        start = time.perf_counter()
        # the parties' labels, as the data loader splits them (the class-wise fit of the recomputed variant)
        parts = split_federation(x, y, 2, train_ratio=0.1, test_ratio=0.45, audit_ratio=0.45, seed=seed,
                                 dirichlet_alpha=alpha)
        with tempfile.TemporaryDirectory() as tmp, _no_drawing():
            result = run_in_process(Path(tmp), collaborators=2, rounds=rounds + 1,
                                    overrides=_overrides(seed, alpha, kept, signal=STEP_SIGNAL))
            parties = {}
            for index, name in enumerate(collaborator_names(2)):
                labels = {"members": parts[index].train_y, "nonmembers": parts[index].test_y,
                          "population": parts[index].population_y}
                per_round = []
                for r in range(rounds + 1):
                    record = RoundRecord.read(result.report_dir / name / f"round_{r:04d}" / "audit.json")
                    entry = {"round": r, "state_bytes": (record.extra.get("cross_round") or {}).get("state", {}),
                             "cross_round_s": record.timings.get("cross_round_s", 0.0),
                             "audit_s": record.timings.get("audit_s", math.nan),
                             "train_s": record.timings.get("train_s", math.nan), "attacks": {}}
                    for label, model, signal in (*SINGLE, CROSS):
                        found = record.attack(model, signal)
                        if found is not None:
                            entry["attacks"][label] = _at(found)
                    entry["source"] = (record.extra.get("cross_round") or {}).get("source")
                    entry["log"] = (record.extra.get("cross_round") or {}).get("log")
                    entry["leak"] = {"detected": record.leak["detected"],
                                     "headline": record.leak["headline"]["attack"] if record.leak["headline"] else None}
                    per_round.append(entry)
                last = RoundRecord.read(result.report_dir / name / f"round_{rounds:04d}" / "audit.json")
                assert {n: len(v) for n, v in labels.items()} == last.sizes
                per_round[rounds]["attacks"][OTHER_CROSS[0]] = _recomputed(
                    result.report_dir / name, rounds, OTHER_CROSS[2], [0.001, 0.01, 0.1], labels)
                parties[name] = per_round
        runs.append({"alpha": alpha, "seed": seed, "rounds_kept": kept, "seconds": time.perf_counter() - start,
                     "parties": parties})
        print(f"A alpha {alpha} seed {seed} kept {kept}: {runs[-1]['seconds']:.0f}s", flush=True)
    return runs


def _pooled(entries: list[dict]) -> str:
    from audit import clopper_pearson

    k, n = sum(e["k"] for e in entries), sum(e["n"] for e in entries)
    ci = clopper_pearson(k, n)
    fk, fn = sum(e["fpr_k"] for e in entries), sum(e["fpr_n"] for e in entries)
    return f"{k / n:.3f} [{ci.lower:.3f}, {ci.upper:.3f}] ({k}/{n}; FPR {fk}/{fn})", k / n


def _auc(entries: list[dict]) -> str:
    from scipy.stats import t as student

    values = [e["exact_auc"] for e in entries]
    mean = statistics.fmean(values)
    half = student.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)) \
        if len(values) > 1 else math.nan
    return f"{mean:.3f} ± {half:.3f}"


def table_a(runs: list[dict], rounds: int) -> str:
    lines = ["| data | attack | on | TPR @ 1% FPR (pooled) | cross-round (logits) / it | exact AUC |",
             "|---|---|---|---|---|---|"]
    for alpha in (None, 0.3):
        chosen = [r for r in runs if r["alpha"] == alpha and r["rounds_kept"] == 20]
        parties = [p for r in chosen for p in r["parties"].values()]
        if not parties:
            continue
        data = "IID" if alpha is None else f"Dirichlet {alpha}"
        rates = {}
        for label in (CROSS[0], OTHER_CROSS[0]):
            cross = [p[rounds]["attacks"][label] for p in parties if label in p[rounds]["attacks"]]
            text, rates[label] = _pooled(cross)
            lines.append(f"| {data} | {label} | updates 1-{rounds} (audit of round {rounds + 1}) | {text} | "
                         f"{rates[CROSS[0]] / rates[label] if rates[label] else math.inf:.1f} | {_auc(cross)} |")
        cross_rate = rates[CROSS[0]]
        for label, _, _ in SINGLE:
            last = [p[rounds - 1]["attacks"][label] for p in parties if label in p[rounds - 1]["attacks"]]
            if not last:
                continue
            text, rate = _pooled(last)
            lines.append(f"| {data} | {label} | update {rounds} | {text} | "
                         f"{cross_rate / rate if rate else math.inf:.1f} | {_auc(last)} |")
            best = [max((p[r]["attacks"][label] for r in range(rounds) if label in p[r]["attacks"]),
                        key=lambda e: e["k"]) for p in parties]
            text, rate = _pooled(best)
            lines.append(f"| {data} | {label} | its best round (picked) | {text} | "
                         f"{cross_rate / rate if rate else math.inf:.1f} | {_auc(best)} |")
    return "\n".join(lines)


def part_d(rounds: int, rounds_kept: int = 4) -> dict:
    """The private state over rounds: its bytes after each round (the step alone, 2 parties, the digits CNN), and
    the Python heap the step's store holds (tracemalloc: what is allocated and still held, the spilled update on disk
    aside)."""
    import tracemalloc

    from audit import step

    federation = _ByHand(2, 0, steps=(step("cross_round"),), rounds_kept=rounds_kept)
    series, heap, mine = [], [], []
    ours = [tracemalloc.Filter(True, "*/audit/cross_round/*")]
    tracemalloc.start()
    for round_num in range(rounds + 1):
        record, _ = federation.round(round_num)
        series.append((record.extra.get("cross_round") or {}).get("state", {}))
        heap.append(tracemalloc.get_traced_memory()[0])
        # what is still held of the memory allocated by the step's own lines (its state, its last result)
        mine.append(sum(s.size for s in tracemalloc.take_snapshot().filter_traces(ours).statistics("filename")))
    tracemalloc.stop()
    print("D state over rounds done", flush=True)
    return {"rounds_kept": rounds_kept, "state": series, "heap_bytes": heap, "step_heap_bytes": mine}


def cost_and_state(runs: list[dict], rounds: int) -> str:
    ratios, per_train = [], []
    for run in runs:
        for per_round in run["parties"].values():
            for e in per_round[1:]:
                rest = e["audit_s"] - e["cross_round_s"]
                if rest > 0:
                    ratios.append(e["cross_round_s"] / rest)
                    per_train.append(e["cross_round_s"] / e["train_s"])
    lines = [f"cost: cross-round seconds / the rest of the round's audit, rounds 2-{rounds + 1}, every party and run: "
             f"median {statistics.median(ratios):.3f}, mean {statistics.fmean(ratios):.3f}, max {max(ratios):.3f} "
             f"({len(ratios)} rounds); per local-training second: median {statistics.median(per_train):.3f}"]
    for run in runs:
        if run["seed"] == 0 and run["alpha"] is None:
            name = sorted(run["parties"])[0]
            series = [e["state_bytes"].get("bytes") for e in run["parties"][name]]
            bound = run["parties"][name][-1]["state_bytes"].get("bound_bytes")
            lines.append(f"state bytes after each round, rounds_kept {run['rounds_kept']} (bound {bound}): {series}")
    return "\n".join(lines)


def table_d(found: dict) -> str:
    bytes_ = [entry.get("bytes") for entry in found["state"]]
    bound = found["state"][-1].get("bound_bytes")
    heap = [round(h / 1024) for h in found["heap_bytes"]]
    mine = [round(h / 1024, 1) for h in found["step_heap_bytes"]]
    return (f"state bytes after each round, rounds_kept {found['rounds_kept']} (bound {bound}): {bytes_}\n"
            f"heap held by what the step's own lines allocated, after each round (KiB, tracemalloc): {mine}\n"
            f"the whole process's Python heap after each round (KiB): {heap}")


# ---------------------------------------------------------------------------------------------- B and C: by hand


class _ByHand:
    """K parties of digits with the workspace's split and CNN, FedAvg by the plan's aggregation function; party 0
    audited each round by the real audit (every default step and the cross-round one), its store and after_sending
    driven as the party's audit drives them. `null`: party 0 trains on other samples than its audit's members."""

    def __init__(self, parties: int, seed: int, *, alpha=None, null=False, steps=None, epochs=5, rounds_kept=20,
                 signal=STEP_SIGNAL):
        import torch

        from audit import AuditSets, AuditSettings, LocalTraining, TrainingRecipe, parse_per_collaborator
        from src.data.datasets import load_dataset
        from src.data.split import split_federation
        from src.runner.models import build_model

        x, y = load_dataset("digits")
        train = 0.1 if parties == 2 else 0.2
        self.parts = split_federation(x, y, parties, train_ratio=train, test_ratio=(1 - train) / 2,
                                      audit_ratio=(1 - train) / 2, seed=seed, dirichlet_alpha=alpha)
        p = self.parts[0]
        members = (p.train_x, p.train_y)
        if null:  # the audit's members: half the non-member shard, never trained on; the other half the non-members
            half = len(p.test_y) // 2
            members, nonmembers = (p.test_x[:half], p.test_y[:half]), (p.test_x[half:], p.test_y[half:])
        else:
            nonmembers = (p.test_x, p.test_y)
        self.sets = AuditSets(members, nonmembers, (p.population_x, p.population_y), label=f"bench-{seed}")
        self.settings = AuditSettings.from_mapping({"fpr_tolerance": [0.01, 0.1],
                                                    "cross_round": {"enabled": True, "rounds_kept": rounds_kept,
                                                                    "signal": signal}})
        self.sizes = [len(q.train_y) for q in self.parts]
        self.data = type("Data", (), {"train_sizes": tuple(self.sizes), "shard": 1, "X_train": p.train_x})()
        self.collaborators = parse_per_collaborator(None, gate=None, audit_settings=self.settings)
        torch.manual_seed(seed)
        self.model = build_model("cnn", x.shape[1:], 10)
        self.initial = copy.deepcopy(self.model)
        self.recipe = TrainingRecipe("Adam", 0.003, 0.9, epochs, 32)
        self.training = LocalTraining(self.recipe, member_count=len(p.train_y), federation_alpha=alpha)
        self.rngs = [np.random.default_rng([seed, k]) for k in range(parties)]
        self.store, self.steps, self.seed, self.epochs = {}, steps, seed, epochs

    def _local(self, k: int):
        import torch
        from torch import nn

        model = copy.deepcopy(self.model)
        optimiser = torch.optim.Adam(model.parameters(), lr=0.003)
        q = self.parts[k]
        xs, ys = torch.as_tensor(q.train_x).float(), torch.as_tensor(q.train_y).long()
        for _ in range(self.epochs):
            order = self.rngs[k].permutation(len(ys))
            for i in range(0, len(ys), 32):
                batch = order[i:i + 32]
                optimiser.zero_grad()
                nn.functional.cross_entropy(model(xs[batch]), ys[batch]).backward()
                optimiser.step()
        return model

    def round(self, round_num: int):
        """Every party trains; party 0's update is audited; the aggregate becomes the next global model. Returns the
        record and the local models."""
        import torch
        from openfl.utilities import LocalTensor

        from audit import SentUpdate, audit_round, step
        from src.aggregation import GatedWeightedAverage

        updates = [self._local(k) for k in range(len(self.parts))]
        record = audit_round(updates[0], self.model, self.sets, self.settings, party="p0", round_num=round_num,
                             seed=self.seed, training=self.training, initial_model=self.initial, store=self.store,
                             steps=self.steps)
        after_sending = step("cross_round").load("after_sending")  # as the party's audit calls it
        after_sending(self.store, SentUpdate("p0", round_num, updates[0], True, self.data, self.collaborators),
                      self.settings.cross_round)
        total, function = sum(self.sizes), GatedWeightedAverage()
        state = {name: torch.as_tensor(function.call(
            [LocalTensor(f"p{k}", m.state_dict()[name].detach().numpy(), self.sizes[k] / total)
             for k, m in enumerate(updates)], [], name, round_num, ("trained",)))
            for name in self.model.state_dict()}
        self.model = copy.deepcopy(self.model)
        self.model.load_state_dict(state)
        return record, updates


def part_b(runs: int, rounds: int = 4) -> dict:
    from audit import step

    detected, headline = 0, []
    for seed in range(runs):
        federation = _ByHand(2, 1000 + seed, null=True, steps=(step("cross_round"),), epochs=5)
        for round_num in range(rounds):
            record, _ = federation.round(round_num)
        detected += bool(record.leak["detected"])
        headline.append(record.leak["headline"]["p_adjusted"])
    from audit import clopper_pearson

    ci = clopper_pearson(detected, runs)
    print(f"B null: {detected}/{runs} detected", flush=True)
    return {"runs": runs, "rounds_attacked": rounds - 1, "detected": detected, "rate": detected / runs,
            "interval": [ci.lower, ci.upper], "tests": record.leak["tests"]}


def part_c(seeds: int, rounds: int) -> list[dict]:
    """FedMIA at the aggregator (per-sample fit over the other 4 parties' updates) beside the party's own."""
    from scipy.stats import norm

    from audit import loss_signal, population_attack

    out = []
    for seed in range(seeds):
        start = time.perf_counter()
        federation = _ByHand(5, seed, signal=STEP_SIGNAL)
        per_round = []
        with tempfile.TemporaryDirectory() as private:  # the party's private files, as its round folders hold them
            for round_num in range(rounds + 1):
                record, updates = federation.round(round_num)
                folder = Path(private) / f"round_{round_num:04d}"
                folder.mkdir()
                for write in record.private:
                    write(folder)
                if round_num < rounds:  # the aggregator's view of this round: each party's loss on party 0's samples
                    per_round.append({name: np.stack([loss_signal(m, *federation.sets.tensors(name)) for m in updates])
                                      for name in ("members", "nonmembers", "population")})
                if round_num == rounds - 1:
                    last = {label: _at(record.attack(model, signal).to_dict()) for label, model, signal in SINGLE
                            if record.attack(model, signal) is not None}
            cross = _at(record.attack("cross_round", STEP_SIGNAL).to_dict())
            labels = {n: np.asarray(getattr(federation.sets, n)[1]) for n in ("members", "nonmembers", "population")}
            cross_loss = _recomputed(Path(private), rounds, "loss", [0.01, 0.1], labels)  # the same signals, the loss
        scores = {}
        for name in ("members", "nonmembers", "population"):  # FedMIA-I: measurement -loss, per sample over others
            cdfs = []
            for signals in per_round:
                target, others = -signals[name][0], -signals[name][1:]
                cdfs.append(norm.cdf(target, others.mean(axis=0), np.sqrt(others.var(axis=0) + 1e-8)))
            scores[name] = np.mean(cdfs, axis=0)
        fedmia = population_attack(scores["members"], scores["nonmembers"], scores["population"], [0.01, 0.1],
                                   member_if_lower=False, attack="fedmia")
        out.append({"seed": seed, "seconds": time.perf_counter() - start, "cross": cross, "cross_loss": cross_loss,
                    "fedmia": _at(fedmia.to_dict()), "last": last})
        print(f"C seed {seed}: {out[-1]['seconds']:.0f}s", flush=True)
    return out


def table_c(runs: list[dict], rounds: int) -> str:
    lines = ["| attack (5 parties, IID) | TPR @ 1% FPR (pooled) | exact AUC |", "|---|---|---|"]
    rows = [("FedMIA at the aggregator (every update)", [r["fedmia"] for r in runs]),
            ("cross-round (logits), the party's own (combined others)", [r["cross"] for r in runs]),
            ("cross-round (loss), the party's own (combined others)", [r["cross_loss"] for r in runs])]
    rows += [(f"{label}, update {rounds}", [r["last"][label] for r in runs if label in r["last"]])
             for label, _, _ in SINGLE]
    for label, entries in rows:
        if entries:
            lines.append(f"| {label} | {_pooled(entries)[0]} | {_auc(entries)} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--null-runs", type=int, default=60)
    p.add_argument("--parts", nargs="+", choices=["A", "B", "C", "D"], default=["A", "B", "C", "D"])
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "cross_round_benchmark")
    args = p.parse_args()
    import logging

    import torch

    torch.set_num_threads(1)
    logging.getLogger("openfl").setLevel(logging.ERROR)
    args.out.mkdir(parents=True, exist_ok=True)
    found, text = {}, []
    if "A" in args.parts:
        found["A"] = part_a(args.seeds, args.rounds)
        text += ["A. cross-round vs single-round attacks", table_a(found["A"], args.rounds),
                 cost_and_state(found["A"], args.rounds)]
    if "B" in args.parts:
        found["B"] = part_b(args.null_runs)
        b = found["B"]
        text.append(f"B. null: 'leak detected' in {b['detected']} of {b['runs']} runs ({b['rate']:.3f}, 95% "
                    f"[{b['interval'][0]:.3f}, {b['interval'][1]:.3f}]) at level 0.05, {b['tests']} tests a verdict")
    if "C" in args.parts:
        found["C"] = part_c(args.seeds, args.rounds)
        text += ["C. FedMIA's own setting, small", table_c(found["C"], args.rounds)]
    if "D" in args.parts:
        found["D"] = part_d(args.rounds)
        text += ["D. private state over rounds", table_d(found["D"])]
    (args.out / "runs.json").write_text(json.dumps(found, indent=1, default=str))
    (args.out / "table.md").write_text("\n\n".join(text) + "\n")
    print("\n\n".join(text))


if __name__ == "__main__":
    main()
