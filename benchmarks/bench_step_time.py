"""Benchmark: the CPU time of one optimizer step of the workspace's small models, the figure the bound on a round's
optimizer steps rests on (src/plan/bounds.py, STEP_CPU_MS: the cheapest step measured).

Each model trains `--steps` SGD steps of cross-entropy on one batch of random inputs of its dataset's shape, on one
thread (the bound is about the least a step can cost), after a warm-up; prints CPU-milliseconds per step, the median of
`--repeats` runs and their range.

    .venv/bin/python benchmarks/bench_step_time.py [--steps 300] [--repeats 5] [--batch 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import src  # noqa: E402,F401  (first: keeps triton out on a machine without a GPU)

CASES = (("fcnn", "digits", (1, 8, 8), 10), ("cnn", "digits", (1, 8, 8), 10), ("cnn", "cifar10", (3, 32, 32), 10))


def step_ms(name: str, shape: tuple, classes: int, steps: int, batch: int) -> float:
    import torch

    from src.runner.models import build_model

    model = build_model(name, shape, classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, *shape), torch.randint(0, classes, (batch,))

    def run(n):
        for _ in range(n):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()

    run(20)
    began = time.process_time()
    run(steps)
    return (time.process_time() - began) / steps * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    for name, dataset, shape, classes in CASES:
        runs = [step_ms(name, shape, classes, args.steps, args.batch) for _ in range(args.repeats)]
        print(f"{name} on {dataset} {shape}, batch {args.batch}: {statistics.median(runs):.3f} CPU-ms a step "
              f"(median of {args.repeats}, range {min(runs):.3f}-{max(runs):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
