"""The received-model check's probe step (audit.received_model.probe.capture_linear_layers) alone: its seconds and how
far it lifts the process's resident size, on one of the workspace's models at the party's batch size.

Run on demand (not a test). `--root DIR` imports `audit` and `src` from another tree (e.g. a `git worktree` of an
earlier revision), so that two revisions are compared by the same script, one after the other:

    .venv/bin/python benchmarks/bench_probe_step.py                       # alexnet, batch 32, CIFAR-shaped
    .venv/bin/python benchmarks/bench_probe_step.py --root /tmp/old      # the same on the code in /tmp/old

Each run is a new process; the rise is the peak resident size (VmHWM, reset before the calls) over the resident size
before them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def peak_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=ROOT, help="the tree whose audit and src are measured")
    p.add_argument("--model", default="alexnet", help="a workspace model name (src.runner.models)")
    p.add_argument("--batch", type=int, default=32, help="the probe's batch (the party's batch size)")
    p.add_argument("--shape", type=int, nargs=3, default=[3, 32, 32], metavar=("C", "H", "W"))
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if args.batch < 1 or args.calls < 1 or args.threads < 1:
        p.error("--batch, --calls and --threads must be at least 1")
    if not (args.root / "audit" / "received_model" / "probe.py").is_file():
        p.error(f"--root: {args.root} holds no audit/received_model/probe.py")
    sys.path.insert(0, str(args.root))

    import numpy as np
    import torch

    from audit import capture_linear_layers
    from src.runner.models import build_model

    torch.set_num_threads(args.threads)
    model = build_model(args.model, tuple(args.shape), args.classes)
    tensors = {name: t.detach().clone() for name, t in model.state_dict().items()}
    rng = np.random.default_rng(0)
    x = rng.random((args.batch, *args.shape), dtype=np.float32)
    y = rng.integers(0, args.classes, args.batch)
    capture_linear_layers(model, tensors, x, y)  # first call: lazy initialisations, not the step's own cost
    before = resident_mb()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    start = time.perf_counter()
    for _ in range(args.calls):
        captures = capture_linear_layers(model, tensors, x, y)
        del captures
    seconds = (time.perf_counter() - start) / args.calls
    model_mb = sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20
    print(f"{args.root}: {args.model} ({model_mb:.0f} MB of tensors), batch {args.batch}: "
          f"{seconds:.3f} s a call (mean of {args.calls}), resident {before:.0f} MB before, "
          f"peak rise {peak_mb() - before:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
