"""Benchmark: peak extra memory of the aggregator's model-file writer (src/server/model_file.py, a tensor at a time)
against OpenFL's (`utils.dump_proto(utils.construct_model_proto(...))`), and whether their files are byte-identical.

Run on demand:  .venv/bin/python benchmarks/bench_model_file.py [--model alexnet | --synthetic COUNT MB]

Each writer runs in its own child process on the same tensor dict (default: the AlexNet-style net's state dict for
CIFAR-10, `src.runner.models.build_model("alexnet", (3, 32, 32), 10)`, as float32 numpy arrays, written through OpenFL's
NoCompressionPipeline). The child builds the dict, resets its peak RSS (Linux: "5" to /proc/self/clear_refs), writes
the file and reports VmHWM minus the RSS before the write: the memory the writer needed on top of the dict.
tracemalloc cannot be used: numpy's and protobuf's (upb's arena) buffers are not all allocated through Python.
glibc's mmap threshold is fixed (MALLOC_MMAP_THRESHOLD_) so that large buffers are mapped and unmapped rather than
reused from heap pages the dict's construction left resident, which would hide part of a peak.
tests/test_model_file.py runs the child mode on a synthetic dict.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WRITERS = ("openfl", "streamed")
MB = 1e6


def child_env() -> dict:
    return {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def tensor_dict(model: str | None, synthetic: tuple[int, float] | None) -> dict:
    import numpy as np

    if synthetic:
        count, size_mb = synthetic
        n = int(size_mb * MB) // 4
        return {f"t{i}": np.full(n, i + 0.5, dtype=np.float32) for i in range(count)}
    import torch

    from src.runner.models import build_model

    torch.manual_seed(0)
    state = build_model(model, (3, 32, 32), 10).state_dict()
    return {name: value.detach().numpy().astype(np.float32, copy=True) for name, value in state.items()}


def run_child(writer: str, out: str, model: str | None, synthetic: tuple[int, float] | None) -> dict:
    """Child mode: write `out` with `writer`; returns the figures (MB) printed as JSON."""
    sys.path.insert(0, str(ROOT))
    from openfl.pipelines import NoCompressionPipeline
    from openfl.protocols import utils

    from src.server.model_file import write_model_file

    tensors = tensor_dict(model, synthetic)
    pipeline = NoCompressionPipeline()
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM := the current RSS
        f.write("5")
    before = _status_kb("VmRSS")
    if writer == "openfl":
        utils.dump_proto(utils.construct_model_proto(tensors, 3, pipeline), out)
    else:
        write_model_file(out, tensors, 3, pipeline)
    extra = (_status_kb("VmHWM") - before) * 1024 / MB
    return {"writer": writer, "extra_mb": extra, "model_mb": sum(a.nbytes for a in tensors.values()) / MB,
            "largest_mb": max(a.nbytes for a in tensors.values()) / MB}


def measure(writer: str, out: str, model: str | None = None, synthetic: tuple[int, float] | None = None) -> dict:
    """Runs the child mode in a fresh process; its figures."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", writer, "--out", out]
    cmd += ["--synthetic", str(synthetic[0]), str(synthetic[1])] if synthetic else ["--model", model or "alexnet"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), cwd=ROOT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="alexnet",
                        help="a src.runner.models name, built for 3x32x32 inputs, 10 classes")
    parser.add_argument("--synthetic", nargs=2, type=float, metavar=("COUNT", "MB"),
                        help="COUNT float32 tensors of MB megabytes each instead of a model")
    parser.add_argument("--child", choices=WRITERS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    synthetic = (int(args.synthetic[0]), args.synthetic[1]) if args.synthetic else None
    if args.child:
        print(json.dumps(run_child(args.child, args.out, args.model, synthetic)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        figures = {w: measure(w, os.path.join(tmp, f"{w}.pbuf"), args.model, synthetic) for w in WRITERS}
        identical = Path(tmp, "openfl.pbuf").read_bytes() == Path(tmp, "streamed.pbuf").read_bytes()
    first = figures["openfl"]
    print(f"model {first['model_mb']:.1f} MB, largest tensor {first['largest_mb']:.1f} MB")
    for w, f in figures.items():
        print(f"{w:>9}: peak extra {f['extra_mb']:7.1f} MB = {f['extra_mb'] / f['model_mb']:.2f} x model "
              f"= {f['extra_mb'] / f['largest_mb']:.2f} x largest tensor")
    streamed = figures["streamed"]["extra_mb"]
    # The streamed writer may need no memory at all (float32 tensors are written from their own memory).
    ratio = f"{first['extra_mb'] / streamed:.2f}" if streamed >= 1 else "- (streamed under 1 MB)"
    print(f"ratio openfl / streamed: {ratio}; files byte-identical: {identical}")


if __name__ == "__main__":
    main()
