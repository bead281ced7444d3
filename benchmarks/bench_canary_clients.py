"""Benchmark: the aggregator's canary clients (audit/canary/clients.py) in a real in-process federation: their effect
on the global model's accuracy, and their user-level epsilon estimate beside the accountant's.

Digits, the workspace's CNN, 3 parties (or --parties), each sending dp_fedavg updates (clip --clip, noise multiplier
each of --sigmas), --rounds rounds of the plan's recipe (Adam 0.003, --epochs local epochs). For each noise multiplier
and seed: a run without canary clients, and runs with `count` canaries at each --scales, side by side (the same plan
and seed otherwise). Printed per configuration, over the seeds: the global model's accuracy on the parties'
validation sets after the last round (mean [min, max]) and its change against the run without canaries; the last
round's epsilon estimate [its interval] and the run's (all rounds composed), and the accountant's of the same.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_canary_clients.py [--seeds 2] [--rounds 5] [--parties 3]
        [--clip 50] [--sigmas 0 0.0005] [--scales 0.01 0.1 1] [--count 16] [--out reports/canary_clients_benchmark]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def overrides(seed: int, sigma: float, clip: float, epochs: int, canaries: dict | None) -> dict:
    aggregator = {"db_store_rounds": 1}
    if canaries is not None:
        aggregator["canary_clients"] = {"enabled": True, **canaries}
    return {
        "tasks": {"train": {"kwargs": {"epochs": epochs}}},
        "data_loader": {"settings": {"dataset": "digits", "seed": seed}},
        "aggregator": {"settings": aggregator},
        "collaborator": {"settings": {"db_store_rounds": 1}},
        "task_runner": {"settings": {"seed": seed, "mitigation": {"method": "dp_fedavg", "sigma": sigma, "clip": clip},
                                     "audit": {"enabled": False}}},
    }


def run(seed: int, args, sigma: float, canaries: dict | None) -> dict:
    from workspace.in_process import run_in_process

    with tempfile.TemporaryDirectory() as tmp:
        result = run_in_process(Path(tmp), collaborators=args.parties, rounds=args.rounds,
                                overrides=overrides(seed, sigma, args.clip, args.epochs, canaries))
        accuracy = final_accuracy(result, args.rounds)
        estimate = None
        if canaries is not None:
            record = json.loads((result.aggregator_report_dir / f"round_{args.rounds - 1:04d}.json").read_text())
            estimate = record.get("canary_clients")
    return {"accuracy": accuracy, "estimate": estimate}


def final_accuracy(result, rounds: int) -> float:
    """The accuracy of the model the last round made (OpenFL validates each round's starting model only), on every
    party's validation set together."""
    import numpy as np
    import torch

    weights = result.global_weights(rounds)
    right = total = 0
    for name in result.collaborators:
        runner = result.runner(name)
        runner.set_tensor_dict(dict(weights), with_opt_vars=False)  # the run is over: its model may take them
        model = runner.model
        x, y = np.asarray(runner.data_loader.X_valid), np.asarray(runner.data_loader.y_valid)
        with torch.no_grad():
            model.eval()
            right += int((model(torch.as_tensor(x)).argmax(1).numpy() == y).sum())
        total += len(y)
    return right / total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--parties", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--clip", type=float, default=50.0)
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.0, 0.0005])
    p.add_argument("--scales", type=float, nargs="+", default=[0.01, 0.1, 1.0])
    p.add_argument("--count", type=int, default=16)
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "canary_clients_benchmark")
    args = p.parse_args()

    import logging
    import warnings

    import torch

    torch.set_num_threads(1)
    logging.getLogger("openfl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*Optimal order is the (smallest|largest) alpha.*")
    args.out.mkdir(parents=True, exist_ok=True)
    runs, start = [], time.perf_counter()
    for sigma in args.sigmas:
        for seed in range(args.seeds):
            base = run(seed, args, sigma, None)
            runs.append({"sigma": sigma, "seed": seed, "scale": None, **base})
            for scale in args.scales:
                out = run(seed, args, sigma, {"count": args.count, "scale": scale, "seed": seed})
                runs.append({"sigma": sigma, "seed": seed, "scale": scale, **out,
                             "accuracy_change": out["accuracy"] - base["accuracy"]})
            (args.out / "runs.json").write_text(json.dumps(runs, indent=1))
            print(f"sigma {sigma} seed {seed} done ({time.perf_counter() - start:.0f} s)", flush=True)

    def cell(values, digits=3):
        values = [v for v in values if v is not None]
        if not values:
            return "–"
        mean = statistics.fmean(values)
        return (f"{mean:.{digits}g}" if len(values) < 2 else
                f"{mean:.{digits}g} [{min(values):.{digits}g}, {max(values):.{digits}g}]")

    lines = [f"{args.parties} parties, digits CNN, dp_fedavg clip {args.clip:g}, {args.rounds} rounds of {args.epochs} "
             f"local epochs, {args.count} canary clients (and as many held out), {args.seeds} seeds:", "",
             "| sigma | canaries' scale | global accuracy | change | ε estimate, last round [interval] | "
             "accountant ε, last round | ε estimate, run | accountant ε, run |", "|---|---|---|---|---|---|---|---|"]
    for sigma in args.sigmas:
        for scale in [None, *args.scales]:
            sel = [r for r in runs if r["sigma"] == sigma and r["scale"] == scale]
            est = [r["estimate"] for r in sel if r["estimate"] and r["estimate"].get("estimated")]
            interval = (f" [{cell([e['epsilon_interval'][0] for e in est])}, "
                        f"{cell([e['epsilon_interval'][1] for e in est])}]" if est else "")
            lines.append(f"| {sigma:g} | {'none' if scale is None else format(scale, 'g')} | "
                         f"{cell([r['accuracy'] for r in sel])} | "
                         f"{'–' if scale is None else cell([r['accuracy_change'] for r in sel], 2)} | "
                         f"{cell([e['epsilon'] for e in est]) if est else '–'}{interval} | "
                         f"{cell([e['accountant_epsilon'] for e in est]) if est else '–'} | "
                         f"{cell([e['epsilon_run'] for e in est]) if est else '–'} | "
                         f"{cell([e['accountant_epsilon_run'] for e in est]) if est else '–'} |")
    text = "\n".join(lines) + f"\n\n{time.perf_counter() - start:.0f} s in all.\n"
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
