"""`--device cuda` code paths, checked on a machine with only a CPU.

On a GPU a tensor made on torch's default device (the CPU) meets the model's (CUDA) tensors and the op fails. Here
torch's default device is set to `meta` (tensors without data) while the model and the samples are on the CPU: any
tensor the audit makes on the default device instead of the model's or the samples' then meets a CPU tensor and
fails in the same way (or, where an op accepts it, leaves no data to copy out). Every result must come out as it does
without the default, bit for bit. The DP retrain's batches come from a CPU dataset (opacus samples it): a model on
`meta` shows on which device they reach it.

Models and data the suite does not use elsewhere: a convolution with BatchNorm and Dropout, an MLP with LayerNorm
(torch.func's path for the gradient norm), a tabular 3-class task.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from audit.config.audit_settings import AuditSettings
from audit.membership.signals import compute_signals
from audit.round_audit import AuditSets, LocalTraining, audit_round
from audit.training import TrainingRecipe, train_copies, train_references
from audit.dp_training import RoundAccountant, dp_retrain

RECIPE = TrainingRecipe("SGD", 0.1, 0.9, epochs=2, batch_size=4)  # SGD: torch's Adam keeps its step count on the CPU


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def conv_net() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Dropout(0.2), nn.Linear(4 * 4 * 4, 3))


def layer_norm_mlp() -> nn.Module:
    torch.manual_seed(4)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))


def images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, size=n)


def on_meta_default(fn):
    """fn() with torch's default device set to `meta`."""
    with torch.device("meta"):
        return fn()


@pytest.mark.parametrize("make_model", [conv_net, layer_norm_mlp], ids=["layer-wise", "torch.func"])
def test_signals_make_no_tensor_on_the_default_device(make_model):
    model = make_model()
    x, y = images(40, 0)
    names = ["loss", "logits", "gradient_norm"]
    expected = compute_signals(model, x, y, names, batch_size=16)
    got = on_meta_default(lambda: compute_signals(model, x, y, names, batch_size=16))
    for name in names:
        np.testing.assert_array_equal(got[name], expected[name])


def test_shadow_and_reference_training_make_no_tensor_on_the_default_device():
    model = conv_net()
    x, y = images(2 * 12, 1)
    x, y = x.reshape(2, 12, 1, 8, 8), y.reshape(2, 12)
    updates = train_copies(model, x, y, RECIPE, names=["5.weight", "1.weight"], seed=5)
    np.testing.assert_array_equal(on_meta_default(lambda: train_copies(model, x, y, RECIPE,
                                                                       names=["5.weight", "1.weight"], seed=5)),
                                  updates)
    assert np.abs(updates).max() > 0  # the copies did train

    probe, _ = images(7, 2)
    expected = train_references(model, x, y, RECIPE, seed=6).logits(probe, batch_size=3)
    got = on_meta_default(lambda: train_references(model, x, y, RECIPE, seed=6).logits(probe, batch_size=3))
    np.testing.assert_array_equal(got, expected)


@pytest.mark.slow
def test_a_round_audit_with_rmia_makes_no_tensor_on_the_default_device():
    """The whole round: signals of both models, the update attack, RMIA with fine-tuned and independent references."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(150, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
    sets = AuditSets(members=(x[:30], y[:30]), nonmembers=(x[30:70], y[30:70]), population=(x[70:], y[70:]))
    torch.manual_seed(8)
    initial = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    received = copy.deepcopy(initial)
    local = copy.deepcopy(received)
    with torch.no_grad():
        for p in local.parameters():
            p.add_(0.05 * torch.randn(p.shape))
    settings = AuditSettings(signals=("loss", "logits", "gradient_norm"), fpr_tolerance=(0.1,),
                             sections={"rmia": {"references": ["global", "fine_tuned", "independent"],
                                                "reference_models": 2}})
    training = LocalTraining(RECIPE, member_count=30, federation_alpha=None)

    def audit():
        return audit_round(local, received, sets, settings, party="p1", round_num=1, seed=0, training=training,
                           initial_model=initial, store={})

    expected = audit().metrics
    got = on_meta_default(audit).metrics
    assert got == expected
    assert any(name.startswith("rmia_independent") for name in got)


def test_dp_retrain_feeds_its_batches_on_the_models_device():
    x, y = images(12, 9)
    model = layer_norm_mlp().to("meta")  # a device the CPU dataset is not on
    seen = []

    class Seen(Exception):
        pass

    def first_input(module, args):
        seen.append(args[0].device)
        raise Seen  # one batch is enough: the rest of DP-SGD needs values a meta tensor does not have

    model[0].register_forward_pre_hook(first_input)
    with pytest.raises(Seen):
        dp_retrain(model, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), RoundAccountant((x, y)), batch_size=4,
                   epochs=1, noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    assert seen == [torch.device("meta")]
