"""audit.spill: a model waiting on disk reads back bit for bit (parameters, buffers, ties, flags) and its folder goes
with it; a weightless template runs like the model when given its tensors, at a few bytes; trained reference copies
do not keep their template model alive; the independent references read the initial model only when they start.

Models the suite's other spill tests do not use: tokens through a tied Embedding / output layer with BatchNorm, a
non-persistent buffer and a frozen parameter; a float64 grouped, dilated convolution with a cumulative BatchNorm
(momentum=None) kept in eval mode inside a model in train mode."""

from __future__ import annotations

import copy
import gc
import os
import weakref

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from audit import training as shadow_training
from audit.membership.references import independent_references
from audit.model_io import model_input
from audit.spill import SpilledModel, load_model, weightless_template
from audit.training import TrainingRecipe, train_references

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              # the cumulative BatchNorm trains its copies one at a time, with a warning (tested in test_odd_models)
              pytest.mark.filterwarnings("ignore:train_references. torch.func.vmap cannot batch:RuntimeWarning")]


class TiedTokens(nn.Module):
    def __init__(self, vocabulary: int = 40, width: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.norm = nn.BatchNorm1d(width)
        self.out = nn.Linear(width, vocabulary, bias=False)
        self.out.weight = self.embed.weight  # tied: one tensor under two names
        self.scale = nn.Parameter(torch.tensor(1.5), requires_grad=False)
        self.register_buffer("offset", torch.randn(vocabulary), persistent=False)  # not in the state_dict

    def forward(self, tokens):
        return self.out(self.norm(self.embed(tokens).mean(dim=1))) * self.scale + self.offset


def tied_tokens(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model after a few training steps (BatchNorm's running statistics and count moved), and its data."""
    torch.manual_seed(seed)
    model = TiedTokens()
    tokens, labels = torch.randint(0, 40, (64, 5)), torch.randint(0, 40, (64,))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for start in range(0, 64, 16):
        optimizer.zero_grad()
        F.cross_entropy(model(tokens[start:start + 16]), labels[start:start + 16]).backward()
        optimizer.step()
    return model, tokens, labels


def odd_conv(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(4, 8, 3, dilation=2, groups=2, padding=2), nn.BatchNorm2d(8, momentum=None),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3)).double()
    with torch.no_grad():
        model.train()(torch.randn(6, 4, 7, 5, dtype=torch.float64))  # running statistics and count
    model[1].eval()  # a frozen BatchNorm inside a model in train mode
    return model


def tensors(model: nn.Module) -> dict:
    return dict((*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)))


def assert_same_model(loaded: nn.Module, model: nn.Module) -> None:
    got, want = tensors(loaded), tensors(model)
    assert list(got) == list(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].device == value.device, name
        assert torch.equal(got[name], value), name
        assert type(got[name]) is type(value) and got[name].requires_grad == value.requires_grad, name
        assert got[name].untyped_storage().data_ptr() != value.untyped_storage().data_ptr(), name  # a copy
    assert [m.training for m in loaded.modules()] == [m.training for m in model.modules()]


@pytest.mark.slow
def test_a_spilled_model_reads_back_bit_for_bit_and_its_folder_goes_with_it():
    model, tokens, _ = tied_tokens()
    conv = odd_conv()
    for original, x in ((model, tokens), (conv, torch.randn(3, 4, 7, 5, dtype=torch.float64))):
        kept = copy.deepcopy(original)
        spilled = SpilledModel(original)
        folder = spilled.folder
        assert os.listdir(folder) == ["model.pt"]
        with torch.no_grad():  # the original changes afterwards: what was spilled does not
            next(original.parameters()).add_(1.0)
        loaded = spilled.load("cpu")
        assert_same_model(loaded, kept)
        assert_same_model(spilled.load(), kept)  # read again, as often as needed
        with torch.no_grad():
            assert torch.equal(loaded.eval()(x), kept.eval()(x))
        del spilled
        gc.collect()
        assert not os.path.exists(folder)
    loaded = SpilledModel(model).load()
    assert loaded.out.weight is loaded.embed.weight  # the tie is kept: training it moves both names


def test_a_weightless_template_runs_like_the_model_given_its_tensors_at_a_few_bytes():
    for model, x in ((tied_tokens()[0], np.random.default_rng(0).integers(0, 40, (4, 5))),
                     (odd_conv(), np.random.default_rng(0).normal(size=(4, 4, 7, 5)).astype(np.float32))):
        template = weightless_template(model)
        held = tensors(template)
        assert list(held) == list(tensors(model))
        assert sum(t.untyped_storage().nbytes() for t in held.values()) <= 8 * len(held)
        assert all(held[n].shape == t.shape and held[n].dtype == t.dtype for n, t in tensors(model).items())
        assert template.out.weight is template.embed.weight if isinstance(model, TiedTokens) else True
        given = model_input(template, x)
        assert given.dtype == model_input(model, x).dtype and given.device == model_input(model, x).device
        model.eval(), template.eval()
        with torch.no_grad():
            want = model(model_input(model, x))
            got = functional_call(template, (dict(model.named_parameters()), dict(model.named_buffers())), (given,))
        assert torch.equal(got, want)
    assert load_model(model) is model and load_model(lambda: model) is model


def pool(seed: int = 1):
    x = np.random.default_rng(seed).normal(size=(90, 4, 7, 5)).astype(np.float64)
    return x, np.random.default_rng(seed + 1).integers(0, 3, 90)


@pytest.mark.slow
def test_trained_copies_do_not_keep_their_template_model_alive():
    """The stored references would otherwise pin the model they started from (the plan's initial model, a whole
    model's size per party, as long as the party keeps its references)."""
    x, y = pool()
    model = odd_conv()
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=1, batch_size=10)
    refs = train_references(model, x, y, recipe, seed=3, subsets=np.arange(60).reshape(3, 20))
    logits = refs.logits(x[60:])
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None
    np.testing.assert_array_equal(refs.logits(x[60:]), logits)


@pytest.mark.parametrize("on_disk", [False, True])
def test_independent_references_read_the_initial_model_only_when_they_start(monkeypatch, on_disk):
    """Given a callable, the references call it when they start (and start again), not when they continue; the
    references are the same bit for bit as from the model itself, in memory or spilled to disk."""
    if on_disk:
        monkeypatch.setattr(shadow_training, "_SPILL_BYTES", 0)
    x, y = pool()
    initial = odd_conv(seed=5)
    recipe = TrainingRecipe("Adam", 0.01, 0.9, epochs=2, batch_size=10)
    calls = []

    def source():
        calls.append(1)
        return copy.deepcopy(initial)

    lazy, eager = {}, {}
    for trainings in (1, 3, 4):
        got = independent_references(lazy, source, (x, y), recipe, k=3, size=15, trainings=trainings, seed=7)
        want = independent_references(eager, initial, (x, y), recipe, k=3, size=15, trainings=trainings, seed=7)
        assert len(calls) == 1 and got.trainings == want.trainings == trainings
        assert got.copies.on_disk == on_disk
        for kind in ("params", "buffers"):
            for name, value in getattr(want.copies, kind).items():
                assert torch.equal(getattr(got.copies, kind)[name], value), name
        np.testing.assert_array_equal(got.copies.logits(x[:30]), want.copies.logits(x[:30]))
    independent_references(lazy, source, (x, y), recipe, k=3, size=20, trainings=4, seed=7)  # another subset size
    assert len(calls) == 2
