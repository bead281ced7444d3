"""Tests of audit.membership.signals against naive one-sample-at-a-time references."""

import copy
import functools
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import audit.membership.gradient_norms as gradient_norms_module
import audit.membership.signals as signals_module
from audit.membership.signals import (
    SIGNALS,
    compute_signals,
    gradient_norm_signal,
    logit_signal,
    loss_signal,
    member_if_lower,
)

N_CLASSES = 5
# The audit's float32 signals (batched, layer-wise or torch.func) against float32 one-sample-at-a-time autograd: two
# float32 evaluations of small untrained nets (at most 5 layers of at most 72 inputs; no class probability near 1, so
# no cancellation in the loss or its gradient). Each product chain rounds by about sqrt(72) u = 5e-7 of its terms'
# magnitudes in practice (72 u = 4e-6 at worst), forward and backward ten chains at most: 5e-6, 4e-5 at worst.
RTOL = 1e-4
# A logit margin is a difference of two logits (terms of magnitude about 1 here): its absolute rounding is about twice
# a logit's, 2 x 5e-7
MARGIN_ATOL = 1e-6


def make_cnn(seed: int = 0) -> nn.Module:
    """Small CNN with the layer kinds the tutorial net uses (inplace ReLU, Dropout) plus a BatchNorm."""
    torch.manual_seed(seed)
    model = nn.Sequential()
    model.add_module(
        "features",
        nn.Sequential(
            nn.Conv2d(3, 6, kernel_size=3, padding=1),
            nn.BatchNorm2d(6),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 8, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        ),
    )
    model.add_module("flatten", nn.Flatten())
    model.add_module(
        "classifier",
        nn.Sequential(
            nn.Dropout(0.5),
            nn.Linear(8 * 2 * 2, 16),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(16, N_CLASSES),
        ),
    )
    # Non-trivial running statistics, so eval mode (running stats) and train mode (batch stats) really differ.
    bn = model.features[1]
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.2, 0.2)
    return model


def make_data(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, N_CLASSES, (n,), generator=g)


@pytest.fixture
def cnn():
    return make_cnn()


@pytest.fixture
def data():
    return make_data(13)


# ---------------------------------------------------------------- naive references (one sample at a time, eval mode)


def naive_loss(model, x, y):
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        return np.array([F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).item() for i in range(len(x))])


def naive_logit_margin(model, x, y):
    model = copy.deepcopy(model).eval()
    out = []
    with torch.no_grad():
        for i in range(len(x)):
            z = model(x[i : i + 1]).double()[0]
            others = [z[j].item() for j in range(len(z)) if j != int(y[i])]
            out.append(z[int(y[i])].item() - max(others))
    return np.array(out)


def naive_grad_norm(model, x, y, layer=None):
    model = copy.deepcopy(model).eval()
    params = list(model.parameters() if layer is None else model.get_submodule(layer).parameters())
    out = []
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        out.append(math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params)))
    return np.array(out)


# ---------------------------------------------------------------- values


def test_member_if_lower():
    assert member_if_lower("loss") is True
    assert member_if_lower("gradient_norm") is True
    assert member_if_lower("logits") is False
    assert SIGNALS == ("loss", "logits", "gradient_norm")


@pytest.mark.numerics
def test_loss_matches_naive(cnn, data):
    x, y = data
    got = loss_signal(cnn, x, y, batch_size=4)
    assert got.dtype == np.float64 and got.shape == (len(x),)
    np.testing.assert_allclose(got, naive_loss(cnn, x, y), rtol=RTOL)


@pytest.mark.numerics
def test_logits_matches_naive_margin(cnn, data):
    x, y = data
    got = logit_signal(cnn, x, y, batch_size=4)
    assert got.dtype == np.float64 and got.shape == (len(x),)
    np.testing.assert_allclose(got, naive_logit_margin(cnn, x, y), rtol=RTOL, atol=MARGIN_ATOL)


class FixedLogits(nn.Module):
    """Returns the logits it was given, row by row, whatever the input."""

    def __init__(self, logits):
        super().__init__()
        self.register_buffer("table", torch.tensor(logits, dtype=torch.float32))
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return self.table[x[:, 0].long()] + 0 * self.dummy


@pytest.mark.numerics
def test_logits_signal_is_not_the_loss_again():
    """The tutorial's "logits" signal ranked samples exactly as the loss did; the margin does not."""
    # A: margin 1.0, loss 0.551;  B: margin 0.5, loss 0.474 - B has the lower loss but the smaller margin.
    model = FixedLogits([[2.0, 1.0, 1.0], [2.0, 1.5, -10.0]])
    x, y = torch.tensor([[0.0], [1.0]]), torch.tensor([0, 0])
    loss, margin = loss_signal(model, x, y), logit_signal(model, x, y)
    np.testing.assert_allclose(margin, [1.0, 0.5], rtol=1e-6)  # float32 logits 2, 1, 1.5: exact; 1e-6 = 17 u
    assert loss[1] < loss[0] and margin[1] < margin[0]  # members: low loss but HIGH margin -> opposite verdicts


@pytest.mark.numerics
@pytest.mark.parametrize("layer", [None, "features.0", "features.4", "classifier.4", "features"])
def test_gradient_norm_matches_naive(cnn, data, layer):
    x, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the vmap path must handle inplace ReLU without falling back
        got = gradient_norm_signal(cnn, x, y, layer=layer, batch_size=4)
    assert got.dtype == np.float64 and got.shape == (len(x),)
    np.testing.assert_allclose(got, naive_grad_norm(cnn, x, y, layer), rtol=RTOL)


@pytest.mark.numerics
def test_layer_norm_is_part_of_full_norm(cnn, data):
    x, y = data
    full = gradient_norm_signal(cnn, x, y)
    parts = [gradient_norm_signal(cnn, x, y, layer=name) for name in ("features", "classifier")]
    np.testing.assert_allclose(full, np.sqrt(parts[0] ** 2 + parts[1] ** 2), rtol=RTOL)


@pytest.mark.numerics
def test_frozen_parameters_are_left_out(cnn, data):
    x, y = data
    for p in cnn.features.parameters():
        p.requires_grad_(False)
    np.testing.assert_allclose(  # the same float32 gradients either way: float64 sums of the same squares
        gradient_norm_signal(cnn, x, y), gradient_norm_signal(cnn, x, y, layer="classifier"), rtol=1e-12
    )


@pytest.mark.numerics
def test_compute_signals_order_and_values(cnn, data):
    x, y = data
    names = ["gradient_norm", "loss", "logits"]
    got = compute_signals(cnn, x, y, names, layer="classifier.1", batch_size=4)
    assert list(got) == names
    # the same float32 forward and gradients read through two entry points: equal to float64's rounding (1e-16)
    np.testing.assert_allclose(got["loss"], loss_signal(cnn, x, y, batch_size=4), rtol=1e-12)
    np.testing.assert_allclose(got["logits"], logit_signal(cnn, x, y, batch_size=4), rtol=1e-12)
    want = gradient_norm_signal(cnn, x, y, layer="classifier.1", batch_size=4)
    np.testing.assert_allclose(got["gradient_norm"], want, rtol=1e-12)


@pytest.mark.numerics
def test_numpy_inputs(cnn, data):
    x, y = data
    got = compute_signals(cnn, x.numpy().astype(np.float64), y.numpy().astype(np.int32), SIGNALS)
    want = compute_signals(cnn, x, y, SIGNALS)
    for name in SIGNALS:  # float64 inputs cast to the model's float32: the same numbers, so the same values
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)


@pytest.mark.numerics
@pytest.mark.parametrize("n", [1, 7, 5])  # 5 = batch_size + 1
def test_set_sizes(cnn, n):
    x, y = make_data(n, seed=n)
    got = compute_signals(cnn, x, y, SIGNALS, batch_size=4)
    for name in SIGNALS:
        assert got[name].shape == (n,)
        assert np.isfinite(got[name]).all()
    np.testing.assert_allclose(got["loss"], naive_loss(cnn, x, y), rtol=RTOL)
    np.testing.assert_allclose(got["logits"], naive_logit_margin(cnn, x, y), rtol=RTOL, atol=MARGIN_ATOL)
    np.testing.assert_allclose(got["gradient_norm"], naive_grad_norm(cnn, x, y), rtol=RTOL)


# ---------------------------------------------------------------- eval mode, no side effects


@pytest.mark.numerics
def test_eval_mode_deterministic_and_state_restored(cnn, data):
    x, y = data
    cnn.train()
    cnn.features[1].eval()  # a submodule kept in eval mode inside a training model must stay so
    before = {n: t.clone() for n, t in cnn.state_dict().items()}
    first = gradient_norm_signal(cnn, x, y, batch_size=4)
    second = gradient_norm_signal(cnn, x, y, batch_size=4)
    np.testing.assert_array_equal(first, second)  # Dropout off: no noise between calls
    np.testing.assert_array_equal(loss_signal(cnn, x, y), loss_signal(cnn, x, y))
    assert cnn.training and cnn.classifier[0].training and not cnn.features[1].training
    for name, tensor in cnn.state_dict().items():  # parameters and BatchNorm running stats untouched
        assert torch.equal(tensor, before[name]), name
    assert all(p.grad is None for p in cnn.parameters())


@pytest.mark.numerics
def test_existing_grads_untouched(cnn, data):
    x, y = data
    for p in cnn.parameters():
        p.grad = torch.full_like(p, 0.5)
    cnn.eval()
    compute_signals(cnn, x, y, SIGNALS)
    assert not cnn.training
    assert all(torch.equal(p.grad, torch.full_like(p, 0.5)) for p in cnn.parameters())


@pytest.mark.numerics
def test_mode_restored_after_error(cnn):
    cnn.train()
    bad_x = torch.randn(3, 3, 5, 5)  # wrong spatial size: the classifier's Linear fails
    with pytest.raises(RuntimeError):
        loss_signal(cnn, bad_x, torch.zeros(3, dtype=torch.long))
    assert cnn.training and all(m.training for m in cnn.modules())


# ---------------------------------------------------------------- numerical stability


class Scaled(nn.Module):
    def __init__(self, inner, scale):
        super().__init__()
        self.inner, self.scale = inner, scale

    def forward(self, x):
        return self.inner(x) * self.scale


@pytest.mark.numerics
def test_logits_stable_for_huge_logits(cnn, data):
    x, y = data
    model = Scaled(cnn, 1e4)  # softmax saturates: p_y is exactly 0 or 1 in float64
    got = logit_signal(model, x, y)
    assert np.isfinite(got).all()
    assert np.abs(got).max() > 100  # really saturated, not a trivially small case
    np.testing.assert_allclose(got, naive_logit_margin(model, x, y), rtol=RTOL)
    with torch.no_grad():
        correct = (model.eval()(x).argmax(dim=1) == y).numpy()
    assert np.all((got > 0) == correct)
    loss = loss_signal(model, x, y)
    assert np.isfinite(loss).all() and (loss >= 0).all()


@pytest.mark.numerics
def test_gradient_norm_finite_for_huge_logits(cnn, data):
    x, y = data
    got = gradient_norm_signal(Scaled(cnn, 1e4), x, y)
    assert np.isfinite(got).all()


# ---------------------------------------------------------------- fallback when vmap cannot batch the forward


class VmapUnfriendly(nn.Module):
    """Writes its output in place into a freshly allocated tensor: fine for autograd, impossible under vmap."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        # The LayerNorm's parameters are not a Linear's or Conv2d's: they need the general (torch.func) path.
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10), nn.LayerNorm(10), nn.ReLU(inplace=True),
                                  nn.Dropout())
        self.head = nn.Linear(10, N_CLASSES)

    def forward(self, x):
        out = torch.zeros(x.shape[0], N_CLASSES)
        out.copy_(self.head(self.body(x)))
        return out


@pytest.mark.numerics
@pytest.mark.parametrize("layer", [None, "body.2"])
def test_fallback_when_vmap_fails(data, layer):
    x, y = data
    model = VmapUnfriendly().train()
    with pytest.warns(RuntimeWarning, match="falling back"):
        got = gradient_norm_signal(model, x, y, layer=layer, batch_size=4)
    np.testing.assert_allclose(got, naive_grad_norm(model, x, y, layer), rtol=RTOL)
    assert model.training and all(p.grad is None for p in model.parameters())


@pytest.mark.numerics
def test_layerwise_path_needs_no_vmap(data):
    """A Linear layer's norms come from one batched backward, so a forward vmap cannot batch is no obstacle."""
    x, y = data
    model = VmapUnfriendly().train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = gradient_norm_signal(model, x, y, layer="head", batch_size=4)
    np.testing.assert_allclose(got, naive_grad_norm(model, x, y, "head"), rtol=RTOL)
    assert model.training and all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------- layer-wise (Linear / Conv2d) per-sample norms


@functools.lru_cache(maxsize=None)
def _project_model(name, shape):
    """Built once per module run (the signals leave models untouched, as tests above check)."""
    from src.runner.models import build_model

    torch.manual_seed(0)
    return build_model(name, shape, 10)


def _no_functorch(monkeypatch):
    """Make the general torch.func path fail loudly: the layer-wise path must be the one that runs."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the torch.func path ran")

    monkeypatch.setattr(gradient_norms_module, "_functorch_squared_norms", forbidden)


@pytest.mark.parametrize(
    "model_name, shape, layer",
    [
        ("alexnet", (3, 32, 32), "features.conv5"),  # the tutorial's --layer_number 10: Gram matrices (16 positions)
        ("alexnet", (3, 32, 32), "features.conv1"),  # 256 positions: per-sample gradients built in full
        ("cnn", (1, 8, 8), None),  # every parameter: convolution and dense layers in one backward
        ("fcnn", (1, 8, 8), "classifier.fc1"),
    ],
)
@pytest.mark.slow
def test_layerwise_matches_naive_on_project_models(monkeypatch, model_name, shape, layer):
    model = _project_model(model_name, shape)
    torch.manual_seed(0)
    x = torch.randn(6, *shape)
    y = torch.randint(0, 10, (6,))
    _no_functorch(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = gradient_norm_signal(model, x, y, layer=layer, batch_size=4)
    np.testing.assert_allclose(got, naive_grad_norm(model, x, y, layer), rtol=RTOL)


class Odd(nn.Module):
    """Layers with positions: a Linear over a sequence (3-D input) and strided, dilated, bias-free convolutions."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.conv_a = nn.Conv2d(3, 4, kernel_size=3, stride=2, padding=2, dilation=2, bias=False)
        self.conv_b = nn.Conv2d(4, 64, kernel_size=(1, 3), padding=(0, 1))
        self.seq = nn.Linear(64, 3)  # applied at each of the conv's positions
        self.out = nn.Linear(3 * 16, N_CLASSES)

    def forward(self, x):
        h = torch.relu(self.conv_b(torch.relu(self.conv_a(x))))  # (B, 64, 4, 4)
        h = self.seq(h.flatten(2).transpose(1, 2))  # (B, 16, 3)
        return self.out(h.flatten(1))


@pytest.mark.numerics
@pytest.mark.parametrize("layer", ["conv_a", "conv_b", "seq", None])
def test_layerwise_strided_dilated_and_sequence_layers(monkeypatch, data, layer):
    x, y = data
    model = Odd()
    _no_functorch(monkeypatch)
    got = gradient_norm_signal(model, x, y, layer=layer, batch_size=5)
    np.testing.assert_allclose(got, naive_grad_norm(model, x, y, layer), rtol=RTOL)


@pytest.mark.numerics
def test_layerwise_frozen_weight_trainable_bias(monkeypatch, data):
    x, y = data
    model = Odd()
    model.seq.weight.requires_grad_(False)
    _no_functorch(monkeypatch)
    got = gradient_norm_signal(model, x, y, layer="seq")
    model_ref = copy.deepcopy(model).eval()
    want = []
    for i in range(len(x)):
        model_ref.zero_grad()
        F.cross_entropy(model_ref(x[i : i + 1]), y[i : i + 1]).backward()
        want.append(float(model_ref.seq.bias.grad.norm()))
    np.testing.assert_allclose(got, want, rtol=RTOL)


class Reused(nn.Module):
    """The same Linear applied twice: its output at one call is not the whole story."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.inp = nn.Linear(3 * 8 * 8, 8)
        self.twice = nn.Linear(8, 8)
        self.out = nn.Linear(8, N_CLASSES)

    def forward(self, x):
        return self.out(self.twice(torch.tanh(self.twice(self.inp(x.flatten(1))))))


class WeightUsedElsewhere(Reused):
    """A layer whose weight also enters the forward outside the layer's own call (invisible to a hook)."""

    def forward(self, x):
        return self.out(torch.tanh(self.twice(self.inp(x.flatten(1))))) * self.twice.weight.mean().exp()


class MixesSamples(Reused):
    """Centres each batch in eval mode too: a sample's output depends on the others in its batch."""

    def forward(self, x):
        h = self.inp(x.flatten(1))
        return self.out(torch.tanh(self.twice(h - h.mean(dim=0, keepdim=True))))


@pytest.mark.numerics
def test_layer_called_twice_uses_general_path(data):
    x, y = data
    model = Reused()
    got = gradient_norm_signal(model, x, y, layer="twice", batch_size=4)
    np.testing.assert_allclose(got, naive_grad_norm(model, x, y, "twice"), rtol=RTOL)


@pytest.mark.numerics
@pytest.mark.parametrize("cls", [WeightUsedElsewhere, MixesSamples])
def test_layerwise_checked_against_per_sample_autograd(data, cls):
    """Forwards the layer-wise computation cannot see through are caught by the check on the first samples."""
    x, y = data
    model = cls()
    with pytest.warns(RuntimeWarning, match="disagree with per-sample autograd"):
        got = gradient_norm_signal(model, x, y, layer="twice", batch_size=8)
    np.testing.assert_allclose(got, naive_grad_norm(model, x, y, "twice"), rtol=RTOL)


@pytest.mark.numerics
def test_compute_signals_shares_the_gradient_forward(monkeypatch, cnn, data):
    """With a layer-wise gradient norm, loss and logits come from its forward pass: no separate one."""
    x, y = data
    want = {"loss": loss_signal(cnn, x, y, batch_size=4), "logits": logit_signal(cnn, x, y, batch_size=4)}

    def forbidden(*args, **kwargs):
        raise AssertionError("a separate forward pass ran")

    monkeypatch.setattr(signals_module, "_logits", forbidden)
    timings = {}
    got = compute_signals(cnn, x, y, ["loss", "gradient_norm", "logits"], layer="classifier.4", batch_size=4,
                          timings=timings)
    # one float32 forward of the same batches by two code paths (hooked layers, plain forward): 1e-6 = 17 u, the
    # margin's absolute 1e-7 two roundings of logits of about 1
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got["gradient_norm"], naive_grad_norm(cnn, x, y, "classifier.4"), rtol=RTOL)
    assert set(timings) == {"loss", "gradient_norm", "logits"} and all(t >= 0 for t in timings.values())
    assert timings["gradient_norm"] > 0


# ---------------------------------------------------------------- layers that do not see one row per sample, odd models

T_STEPS, D_IN = 6, 5


def make_sequences(n: int, seed: int = 2):
    """Synthetic sequences (N, T, D) with labels from the sign pattern of their mean, a learnable task."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, T_STEPS, D_IN, generator=g)
    return x, (x.mean(dim=1)[:, :2] > 0).long() @ torch.tensor([1, 2]) % N_CLASSES


class FoldsBatch(nn.Module):
    """Folds (B, T, D) into (B * T, D) rows before a Linear: the Linear sees B * T rows, not B."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.step = nn.Linear(D_IN, 7)
        self.out = nn.Linear(T_STEPS * 7, N_CLASSES)

    def forward(self, x):
        b, t, d = x.shape
        h = torch.tanh(self.step(x.reshape(b * t, d)))
        return self.out(h.reshape(b, t * 7))


class SequenceFirst(nn.Module):
    """An LSTM and a Linear run sequence-first (batch_first=False): their inputs are (T, B, features)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(12)
        self.lstm = nn.LSTM(D_IN, 8)
        self.proj = nn.Linear(8, 8)
        self.out = nn.Linear(8, N_CLASSES)

    def forward(self, x):
        h, _ = self.lstm(x.transpose(0, 1))  # (T, B, 8)
        return self.out(torch.tanh(self.proj(h)).mean(dim=0))


class TransformerSequenceFirst(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(13)
        self.inp = nn.Linear(D_IN, 8)
        self.enc = nn.TransformerEncoderLayer(8, nhead=2, dim_feedforward=16, dropout=0.0)  # batch_first=False
        self.out = nn.Linear(8, N_CLASSES)

    def forward(self, x):
        h = self.enc(self.inp(x).transpose(0, 1))  # (T, B, 8)
        return self.out(h.mean(dim=0))


class NormsAndOddConvs(nn.Module):
    """Grouped and dilated convolutions with BatchNorm, GroupNorm and LayerNorm between them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(14)
        self.conv_g = nn.Conv2d(3, 6, kernel_size=3, padding=1, groups=3)
        self.bn = nn.BatchNorm2d(6)
        self.conv_d = nn.Conv2d(6, 8, kernel_size=3, padding=2, dilation=2)
        self.gn = nn.GroupNorm(2, 8)
        self.ln = nn.LayerNorm(8 * 4 * 4)
        self.out = nn.Linear(8 * 4 * 4, N_CLASSES)
        self.bn.running_mean.uniform_(-0.5, 0.5)
        self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        h = F.max_pool2d(torch.relu(self.bn(self.conv_g(x))), 2)
        h = torch.relu(self.gn(self.conv_d(h)))
        return self.out(self.ln(h.flatten(1)))


class TokenBag(nn.Module):
    """Token ids -> Embedding -> mean over the sequence -> Linear."""

    def __init__(self, vocab: int = 20):
        super().__init__()
        torch.manual_seed(15)
        self.emb = nn.Embedding(vocab, 6)
        self.hidden = nn.Linear(6, 12)
        self.out = nn.Linear(12, N_CLASSES)

    def forward(self, tokens):
        return self.out(torch.relu(self.hidden(self.emb(tokens).mean(dim=1))))


def make_tokens(n: int, vocab: int = 20, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, 7), generator=g)
    return tokens, tokens[:, 0] % N_CLASSES


@pytest.mark.numerics
@pytest.mark.parametrize(
    "cls, layer",
    [
        (FoldsBatch, None), (FoldsBatch, "step"), (FoldsBatch, "out"),
        (SequenceFirst, None), (SequenceFirst, "proj"), (SequenceFirst, "lstm"),
        (TransformerSequenceFirst, None), (TransformerSequenceFirst, "enc.linear1"), (TransformerSequenceFirst, "inp"),
    ],
)
def test_layers_without_one_row_per_sample_match_naive(cls, layer):
    """A layer fed (B * T, D) rows or (T, B, D) takes the general path at once (no probe disagreement, no crash)."""
    x, y = make_sequences(10)
    model = cls()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = gradient_norm_signal(model, x, y, layer=layer, batch_size=4)  # chunks of 4, 4, 2: none of size T
    np.testing.assert_allclose(got, naive_grad_norm(model, x, y, layer), rtol=RTOL)


@pytest.mark.numerics
def test_sequence_first_layer_with_as_many_steps_as_samples_is_caught_by_the_probe():
    """(T, B, D) with T == B looks batch-first by shape: the check against per-sample autograd catches it."""
    x, y = make_sequences(T_STEPS)
    model = SequenceFirst()
    with pytest.warns(RuntimeWarning, match="disagree with per-sample autograd"):
        got = gradient_norm_signal(model, x, y, layer="proj", batch_size=T_STEPS)
    np.testing.assert_allclose(got, naive_grad_norm(model, x, y, "proj"), rtol=RTOL)


@pytest.mark.numerics
@pytest.mark.parametrize("layer", [None, "conv_g", "bn", "conv_d", "gn", "ln", "out"])
def test_norm_layers_grouped_and_dilated_convolutions_match_naive(data, layer):
    x, y = data
    model = NormsAndOddConvs()
    got = gradient_norm_signal(model, x, y, layer=layer, batch_size=5)
    np.testing.assert_allclose(got, naive_grad_norm(model, x, y, layer), rtol=RTOL)


@pytest.mark.numerics
@pytest.mark.parametrize("layer", [None, "emb", "hidden"])
def test_embedding_token_inputs(layer):
    x, y = make_tokens(11)
    model = TokenBag()
    got = compute_signals(model, x.numpy(), y.numpy(), SIGNALS, layer=layer, batch_size=4)  # int64 numpy tokens
    np.testing.assert_allclose(got["gradient_norm"], naive_grad_norm(model, x, y, layer), rtol=RTOL)
    np.testing.assert_allclose(got["loss"], naive_loss(model, x, y), rtol=RTOL)
    np.testing.assert_allclose(got["logits"], naive_logit_margin(model, x, y), rtol=RTOL, atol=MARGIN_ATOL)
    got32 = gradient_norm_signal(model, x.int(), y, layer=layer)  # int32 ids are kept as they are, too
    np.testing.assert_allclose(got32, got["gradient_norm"], rtol=1e-6)  # the same embedding rows: 1e-6 = 17 u


class LayerNormHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D_IN)
        self.out = nn.Linear(D_IN, N_CLASSES)

    def forward(self, x):
        return self.out(self.norm(x))


@pytest.mark.numerics
@pytest.mark.parametrize(
    "model, layer, message",
    [
        (LayerNormHead(), None, r"normalized_shape=\[5\]"),  # general path: vmap fails, and so does plain autograd
        (nn.Linear(D_IN, N_CLASSES), None, r"shapes cannot be multiplied"),  # layer-wise path
    ],
)
def test_bad_input_raises_its_own_error_without_a_vmap_warning(model, layer, message):
    x = torch.randn(8, D_IN + 2)  # wrong feature size
    y = torch.randint(0, N_CLASSES, (8,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match=message):
            gradient_norm_signal(model, x, y, layer=layer)
    assert not [w for w in caught if "vmap failed" in str(w.message)]


@pytest.mark.numerics
def test_two_class_margin_is_a_monotone_function_of_the_loss():
    """The module docstring's claim: with two classes the loss is softplus(-margin), so both rank samples alike."""
    torch.manual_seed(16)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
    loss, margin = loss_signal(model, x, y), logit_signal(model, x, y)
    # float32 log-softmax (a few roundings of values about 1 in size) against float64 softplus: 1e-5 = 170 u
    np.testing.assert_allclose(loss, np.logaddexp(0.0, -margin), rtol=1e-5)
    assert (np.argsort(loss, kind="stable") == np.argsort(-margin, kind="stable")).all()


# ---------------------------------------------------------------- errors


@pytest.mark.numerics
def test_unknown_signal(cnn, data):
    x, y = data
    with pytest.raises(ValueError, match="bogus") as err:
        member_if_lower("bogus")
    assert "gradient_norm" in str(err.value)
    with pytest.raises(ValueError, match="bogus"):
        compute_signals(cnn, x, y, ["loss", "bogus"])


@pytest.mark.numerics
def test_unknown_layer(cnn, data):
    x, y = data
    with pytest.raises(ValueError, match="fc9") as err:
        gradient_norm_signal(cnn, x, y, layer="fc9")
    assert "features.0" in str(err.value) and "classifier.4" in str(err.value)
    with pytest.raises(ValueError, match="fc9"):
        compute_signals(cnn, x, y, ["gradient_norm"], layer="fc9")


@pytest.mark.numerics
def test_layer_without_parameters(cnn, data):
    x, y = data
    with pytest.raises(ValueError, match=r"features\.2"):  # the inplace ReLU
        gradient_norm_signal(cnn, x, y, layer="features.2")


@pytest.mark.numerics
@pytest.mark.parametrize("fn", [loss_signal, logit_signal, gradient_norm_signal])
def test_empty_set(cnn, fn):
    with pytest.raises(ValueError, match="empty"):
        fn(cnn, torch.empty(0, 3, 8, 8), torch.empty(0, dtype=torch.long))


@pytest.mark.numerics
def test_empty_set_compute_signals(cnn):
    with pytest.raises(ValueError, match="empty"):
        compute_signals(cnn, np.empty((0, 3, 8, 8), dtype=np.float32), np.empty(0, dtype=np.int64), SIGNALS)


@pytest.mark.numerics
def test_mismatched_lengths(cnn, data):
    x, y = data
    with pytest.raises(ValueError):
        loss_signal(cnn, x, y[:-1])
