"""Benchmark: per-sample gradient norms by audit.membership.signals vs Privacy Meter 1.0.1 vs a naive per-sample loop.

Run on demand (not a test):  .venv/bin/python benchmarks/bench_gradient_norm.py [--samples 200] [--threads 2]

Same model, same samples, same eval-equivalent forward for all three, so the values must agree; prints seconds,
the ratio of Privacy Meter's time to ours and the largest relative difference between the value vectors.
Every method runs once on a few samples before it is timed (imports, opacus' hooks, first-call allocations and our
once-per-structure check against per-sample autograd are not in the figures); our calls are then timed as the
median of --repeats runs. Timings are wall-clock: on a shared machine compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import os
import statistics
import sys
import time
import types
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from audit import gradient_norm_signal, gradient_parameter_names, layerwise_targets, loss_signal  # noqa: E402


def import_privacy_meter_model():
    """privacy_meter.model, even though tensorflow is not installed.

    privacy_meter/model.py does `import tensorflow as tf` at module level but only its TensorflowModel class uses it;
    PytorchModelTensor never touches tf. An empty placeholder module satisfies the import without pulling in the
    ~1.3 GB tensorflow wheel. The placeholder is removed again right after the import: left in sys.modules (it has
    no __spec__), it makes torch._dynamo's lazy import -- triggered by torch.func.grad -- fail with
    "ValueError: tensorflow.__spec__ is None".
    """
    if importlib.util.find_spec("tensorflow") is not None:
        return importlib.import_module("privacy_meter.model")
    sys.modules["tensorflow"] = types.ModuleType("tensorflow")
    try:
        return importlib.import_module("privacy_meter.model")
    finally:
        del sys.modules["tensorflow"]


class TutorialNet(nn.Module):
    """The OpenFL Privacy Meter tutorial's AlexNet-style Net (5 conv + 3 FC, ~23.3M parameters), made comparable.

    Two changes, both needed so Privacy Meter's path and ours compute the same thing:
    - ReLU(inplace=False): opacus' backward hooks fail on in-place ReLU with recent torch/opacus.
    - Dropout(p=0): PytorchModelTensor.get_gradnorm forces the model into train mode, so real Dropout would make its
      values random; p=0 keeps the module layout (features.10 is still the tutorial's audited conv) while train and
      eval mode give the same forward (there is no BatchNorm).
    """

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2),
            nn.Conv2d(64, 192, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2),
        )
        self.classifier = nn.Sequential(
            nn.Dropout(p=0.0),
            nn.Linear(256 * 2 * 2, 4096),
            nn.ReLU(),
            nn.Dropout(p=0.0),
            nn.Linear(4096, 4096),
            nn.ReLU(),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def digits_net(num_classes: int = 10) -> nn.Module:
    """The workspace's own CNN (src.runner.models) on 1x8x8 digits, as the audit runs it."""
    from src.runner.models import build_model

    return build_model("cnn", (1, 8, 8), num_classes)


def naive_grad_norm(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """One backward per sample on a copy of the model; the reference everyone understands."""
    model = copy.deepcopy(model).eval()
    params = [p for p in model.parameters() if p.requires_grad]
    out = np.empty(len(x))
    for i in range(len(x)):
        # Zero in place: re-allocating ~93 MB of .grad per sample (set_to_none) costs more in page faults than the
        # backward itself on the big net, which would make this baseline look worse than it need be.
        model.zero_grad(set_to_none=False)
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        out[i] = float(torch.sqrt(sum(p.grad.double().pow(2).sum() for p in params)))
    return out


def float64_grad_norm(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """The naive loop on a float64 copy of the model and samples: the truth both float32 methods are judged by."""
    return naive_grad_norm(copy.deepcopy(model).double(), x.double(), y)


def privacy_meter_grad_norm(pm_model_module, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    # A copy: GradSampleModule leaves opacus hooks on the modules it wraps, and get_gradnorm switches to train mode.
    wrapped = pm_model_module.PytorchModelTensor(copy.deepcopy(model), nn.CrossEntropyLoss(), device="cpu")
    with warnings.catch_warnings():
        # Benign: opacus' hooks fire on module outputs because the inputs do not require grad.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        return np.asarray(wrapped.get_gradnorm(x, y), dtype=np.float64)


def timed(fn, repeats: int):
    """Value and median wall seconds of `repeats` calls of fn()."""
    values, seconds = None, []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        values = fn()
        seconds.append(time.perf_counter() - start)
    return values, statistics.median(seconds)


def max_rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), np.finfo(np.float64).tiny)))


def path_of(model: nn.Module, layer: str | None) -> str:
    """Which computation audit.membership.gradient_norms takes for these parameters (before any probe)."""
    names = gradient_parameter_names(model, layer)
    if layerwise_targets(model, names) is not None:
        return "layer-wise: ghost norms from layer inputs and output gradients"
    return "torch.func vmap of grad"


def bench(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, pm_model_module, layer: str | None,
          repeats: int, naive: bool, reference_samples: int) -> None:
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"\n== {name}: {n_params:,} parameters, {len(x)} samples of shape {tuple(x.shape[1:])}")

    # Warm-up on a few samples: one-off costs (imports, hooks, allocator) stay out of the times. The all-parameter
    # signal is not warmed: its first call in a process checks the layer-wise norms against per-sample autograd on
    # 4 samples, which the next row times.
    few = slice(0, min(4, len(x)))
    loss_signal(model, x[few], y[few])
    privacy_meter_grad_norm(pm_model_module, model, x[few], y[few])
    if layer is not None:
        gradient_norm_signal(model, x[few], y[few], layer=layer)

    loss, t_loss = timed(lambda: loss_signal(model, x, y), repeats)
    _, t_first = timed(lambda: gradient_norm_signal(model, x, y), 1)
    ours, t_ours = timed(lambda: gradient_norm_signal(model, x, y), repeats)
    pm, t_pm = timed(lambda: privacy_meter_grad_norm(pm_model_module, model, x, y), 1)
    rows = [
        ("loss_signal (one forward, for scale)", t_loss),
        (f"ours, all parameters ({path_of(model, None)})", t_ours),
        ("ours, all parameters, first call of a process (+ check against per-sample autograd)", t_first),
        ("Privacy Meter 1.0.1 get_gradnorm (opacus, batch 25)", t_pm),
    ]
    if naive:
        naive_values, t_naive = timed(lambda: naive_grad_norm(model, x, y), 1)
        rows.append(("naive per-sample backward loop", t_naive))
    if layer is not None:
        _, t_layer = timed(lambda: gradient_norm_signal(model, x, y, layer=layer), repeats)
        rows.append((f"ours, layer={layer!r} only ({path_of(model, layer).split(':')[0]})", t_layer))
    for label, seconds in rows:
        print(f"  {label:<88s} {seconds:9.3f} s")
    print(f"  Privacy Meter / ours (all parameters): {t_pm / t_ours:7.2f}x (first call {t_pm / t_first:.2f}x)   "
          f"max relative difference ours vs Privacy Meter: {max_rel_diff(ours, pm):.2e}")
    k = min(reference_samples, len(x))
    truth = float64_grad_norm(model, x[:k], y[:k])
    print(f"  max relative difference from float64 per-sample autograd (first {k} samples): ours "
          f"{max_rel_diff(ours[:k], truth):.2e}, Privacy Meter {max_rel_diff(pm[:k], truth):.2e}")
    if naive:
        print(f"  naive loop / ours: {t_naive / t_ours:7.2f}x   max relative difference ours vs naive loop: "
              f"{max_rel_diff(ours, naive_values):.2e}; Privacy Meter vs naive: {max_rel_diff(pm, naive_values):.2e}")
    print(f"  (loss range {loss.min():.3f}..{loss.max():.3f}; grad-norm range {ours.min():.3g}..{ours.max():.3g})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="samples per model (default 200)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of our calls, median (default 3)")
    parser.add_argument("--no-naive", dest="naive", action="store_false",
                        help="skip the naive per-sample loop (the slowest row; not needed for the ratio)")
    parser.add_argument("--reference-samples", type=int, default=8,
                        help="samples checked against float64 per-sample autograd (default 8)")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be >= 1")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    torch.set_num_threads(args.threads)
    pm_model_module = import_privacy_meter_model()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads (OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}), {args.samples} samples per model")
    # Timings are wall-clock: other processes on the machine inflate them, so show how busy it was.
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))

    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    cifar_x = torch.randn(args.samples, 3, 32, 32, generator=gen)
    cifar_y = torch.randint(0, 10, (args.samples,), generator=gen)
    bench("CIFAR-size tutorial net", TutorialNet(), cifar_x, cifar_y, pm_model_module, layer="features.10",
          repeats=args.repeats, naive=args.naive, reference_samples=args.reference_samples)

    digits_x = torch.randn(args.samples, 1, 8, 8, generator=gen)
    digits_y = torch.randint(0, 10, (args.samples,), generator=gen)
    bench("digits-size CNN (src.runner.models cnn)", digits_net(), digits_x, digits_y, pm_model_module,
          layer="classifier.fc1",
          repeats=args.repeats, naive=args.naive, reference_samples=args.reference_samples)
    print("\nload average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
