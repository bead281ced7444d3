"""The parts of audit.membership.gradient_norms, layerwise_norms and autograd_norms on their own: the convolution
patches, the per-row squared norms, the once-per-structure check against per-sample autograd, and the general path's
accuracy on a large layer, each against a float64 or library reference (F.unfold, one-sample-at-a-time autograd in
float64)."""

import copy
import math
import types
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import audit.membership.autograd_norms as autograd_norms
import audit.membership.gradient_norms as gn
import audit.membership.layerwise_norms as layerwise
from audit.membership.signals import gradient_norm_signal

pytestmark = pytest.mark.numerics  # float results whose rounding the CPU's kernels decide


# The float32 layer-wise norms of a small untrained net (at most 3 layers of at most 100 inputs, no class probability
# near 1, so no cancellation in the loss's gradient) against float64 autograd: each of the forward and backward
# products rounds by at most 100 u = 6e-6 of its terms' magnitudes in the worst case, about 10 u in practice (random
# signs), and the norm sums positive squares; 1e-5 is 170 u, 50 times what any kernel set tried gives
# (benchmarks/README.md).
FLOAT32_SMALL_NET = 1e-5


def float64_grad_norm(model, x, y, layer=None):
    """Per-sample gradient norms by plain autograd, one sample at a time, on float64 copies: the truth."""
    model = copy.deepcopy(model).double().eval()
    params = list(model.parameters() if layer is None else model.get_submodule(layer).parameters())
    out = []
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1].double()), y[i : i + 1]).backward()
        out.append(math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None)))
    return np.array(out)


# ---------------------------------------------------------------- convolution patches


@pytest.mark.parametrize(
    "shape, kernel, stride, padding, dilation",
    [
        ((3, 5, 9, 7), (3, 2), (2, 1), (1, 2), (1, 2)),  # odd sizes, asymmetric everything
        ((2, 4, 8, 8), (1, 3), (1, 1), (0, 1), (1, 1)),
        ((4, 256, 4, 4), (3, 3), (1, 1), (1, 1), (1, 1)),  # the tutorial's conv5
        ((2, 3, 32, 32), (3, 3), (2, 2), (1, 1), (1, 1)),  # its conv1
        ((2, 3, 10, 11), (4, 2), (3, 2), (0, 0), (2, 3)),
        ((1, 2, 3, 3), (5, 5), (1, 1), (2, 2), (1, 1)),  # kernel larger than the input, padded
        ((2, 6, 5, 5), (1, 1), (1, 1), (0, 0), (1, 1)),  # 1x1
    ],
)
def test_conv_patches_are_unfolds_values_bit_for_bit(shape, kernel, stride, padding, dilation):
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    want = F.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride).transpose(1, 2)
    got = layerwise._conv_patches(x, kernel, stride, padding, dilation)
    assert got.shape == want.shape and torch.equal(got, want)
    assert got.stride() == want.stride()  # the same layout: later products sum in the same order


# ---------------------------------------------------------------- squared norms of long rows


def test_squared_rows_of_a_long_float32_row_match_float64():
    """A 4M-element float32 row (a 2048x2048 layer's per-sample gradient): within 1e-6 of the float64 sum of squares;
    float32 torch.linalg.vector_norm is off by ~1e-4 here."""
    g = torch.randn(3, 2048, 2048, generator=torch.Generator().manual_seed(1))
    want = g.double().pow(2).sum(dim=(1, 2))
    got = autograd_norms.squared_rows(g)
    assert got.dtype == torch.float64
    # float32 squares (one rounding each, u = 6e-8) summed pairwise: positive terms, so the error is a weighted mean
    # of the roundings along a path of log2(4M) = 22 sums, about sqrt(22) u = 3e-7 at most in practice; 1e-6 is
    # 17 u, and 100 times under vector_norm's 1e-4
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


def test_squared_rows_one_row_at_a_time_beyond_the_cap(monkeypatch):
    g = torch.randn(5, 300, generator=torch.Generator().manual_seed(2))
    whole = autograd_norms.squared_rows(g)
    monkeypatch.setattr(autograd_norms, "_SQUARES_TEMP_BYTES", 100)  # smaller than one row: the row loop
    rows = autograd_norms.squared_rows(g)
    # 300 positive float32 squares summed in float32 by two kernels (a row at a time, all rows at once): each about
    # sqrt(9) u = 2e-7 from the exact sum (9 pairwise levels, positive terms); 1e-6 = 17 u
    np.testing.assert_allclose(rows.numpy(), whole.numpy(), rtol=1e-6)
    np.testing.assert_allclose(rows.numpy(), g.double().pow(2).sum(1).numpy(), rtol=1e-6)


class WideHead(nn.Module):
    """A LayerNorm keeps the model off the layer-wise path (torch.func for all parameters); the 2048x2048 layer gives
    4M-element per-sample gradient rows."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.inp = nn.Linear(12, 2048)
        self.norm = nn.LayerNorm(2048)
        self.wide = nn.Linear(2048, 2048)
        self.out = nn.Linear(2048, 4)

    def forward(self, x):
        return self.out(torch.tanh(self.wide(torch.tanh(self.norm(self.inp(x))))))


@pytest.mark.slow
def test_general_path_is_accurate_on_a_large_layer():
    model = WideHead()
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(6, 12, generator=g), torch.randint(0, 4, (6,), generator=g)
    assert layerwise.layerwise_targets(model, gn.gradient_parameter_names(model, None)) is None
    got = gradient_norm_signal(model, x, y, batch_size=3)
    # the per-sample gradient itself in float32 (its rounding moves each entry by a few u of its terms; the squared
    # norm sums 4M positive terms, so those roundings average out), squared and summed as above: 1e-6 = 17 u
    np.testing.assert_allclose(got, float64_grad_norm(model, x, y), rtol=1e-6)


# ---------------------------------------------------------------- the check against per-sample autograd


class Tabular(nn.Module):
    """A tabular MLP with a Conv1d-free, BatchNorm-free layer-wise structure."""

    def __init__(self, seed=0, width=16):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(7, width)
        self.fc2 = nn.Linear(width, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class MixesSamples(Tabular):
    """Centres each batch: a sample's gradient depends on the others in its batch (the check must catch it)."""

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(torch.relu(h - h.mean(dim=0, keepdim=True)))


@pytest.fixture
def probes(monkeypatch):
    """Counts the checks against per-sample autograd, starting from a process that has verified nothing."""
    monkeypatch.setattr(layerwise, "_VERIFIED", {})
    calls = []
    real = layerwise._probe_reference

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(layerwise, "_probe_reference", counting)
    return calls


def tabular_data(n=9, features=7, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, features, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_check_runs_once_per_structure_and_values_hold_for_every_model(probes):
    x, y = tabular_data()
    for seed in (0, 1, 2):  # three models of one structure, different weights (a round's local and global models)
        model = Tabular(seed)
        got = gradient_norm_signal(model, x, y, batch_size=4)
        np.testing.assert_allclose(got, float64_grad_norm(model, x, y), rtol=FLOAT32_SMALL_NET)
    assert len(probes) == 1


@pytest.mark.parametrize("change", ["layer", "width", "input", "forward", "frozen"])
def test_check_runs_again_for_another_structure(probes, change):
    x, y = tabular_data()
    gradient_norm_signal(Tabular(0), x, y)
    model, layer = Tabular(1), None
    if change == "layer":
        layer = "fc2"
    elif change == "width":
        model = Tabular(1, width=17)
    elif change == "input":
        x = x.double()  # cast to the model's float32, but another call signature: same structure, no new check
    elif change == "forward":
        model.forward = types.MethodType(lambda self, inp: self.fc2(torch.tanh(self.fc1(inp))), model)
    elif change == "frozen":
        model.fc1.bias.requires_grad_(False)
    got = gradient_norm_signal(model, x, y, layer=layer)
    np.testing.assert_allclose(got, float64_grad_norm(model, x, y, layer), rtol=FLOAT32_SMALL_NET)
    assert len(probes) == (1 if change == "input" else 2)


def test_a_failed_check_is_not_remembered(probes):
    x, y = tabular_data()
    for _ in range(2):
        with pytest.warns(RuntimeWarning, match="disagree with per-sample autograd"):
            got = gradient_norm_signal(MixesSamples(), x, y, batch_size=5)
        np.testing.assert_allclose(got, float64_grad_norm(MixesSamples(), x, y), rtol=FLOAT32_SMALL_NET)
    assert len(probes) == 2


def test_a_checked_structure_stays_exact_on_new_weights_and_samples(probes):
    """After the check, every later call (no check) is still per-sample autograd's answer, BatchNorm in eval mode."""
    model = nn.Sequential(nn.Conv2d(2, 5, 3, stride=2, padding=1), nn.BatchNorm2d(5), nn.ReLU(), nn.Flatten(),
                          nn.Linear(5 * 3 * 3, 4))
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(7, 2, 5, 5, generator=g), torch.randint(0, 4, (7,), generator=g)
    gradient_norm_signal(model, x, y, layer="0")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    x2 = torch.randn(11, 2, 5, 5, generator=g)
    y2 = torch.randint(0, 4, (11,), generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = gradient_norm_signal(model, x2, y2, layer="0", batch_size=4)
    np.testing.assert_allclose(got, float64_grad_norm(model, x2, y2, "0"), rtol=FLOAT32_SMALL_NET)
    assert len(probes) == 1


# ---------------------------------------------------------------- in-place operations after an audited layer


def inplace_model():
    """In-place ReLUs right after the audited layers: on the layer whose output starts the graph (a leaf) and on one
    downstream of another audited layer (in the graph)."""
    torch.manual_seed(7)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(inplace=True), nn.Flatten(),
                         nn.Linear(4 * 5 * 5, 6), nn.ReLU(inplace=True), nn.Linear(6, 3))


@pytest.mark.parametrize("layer", ["0", "3", None])
def test_in_place_ops_after_audited_layers_give_per_sample_autograds_norms(layer):
    model = inplace_model()
    g = torch.Generator().manual_seed(8)
    x, y = torch.randn(10, 2, 5, 5, generator=g), torch.randint(0, 3, (10,), generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the layer-wise path, no fallback
        got = gradient_norm_signal(model, x, y, layer=layer, batch_size=4)
    np.testing.assert_allclose(got, float64_grad_norm(model, x, y, layer), rtol=FLOAT32_SMALL_NET)


def test_without_in_place_ops_the_outputs_are_not_copied(monkeypatch):
    """The tutorial-like case: no copy of any audited layer's output (they were a tenth of the time)."""
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, 3))
    g = torch.Generator().manual_seed(9)
    x, y = torch.randn(6, 2, 5, 5, generator=g), torch.randint(0, 3, (6,), generator=g)
    clones = []
    real_clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda self, *a, **k: clones.append(self.shape) or real_clone(self, *a, **k))
    got = gradient_norm_signal(model, x, y, batch_size=3)
    monkeypatch.undo()
    assert clones == []
    np.testing.assert_allclose(got, float64_grad_norm(model, x, y), rtol=FLOAT32_SMALL_NET)
