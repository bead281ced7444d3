"""The received model the audit reads is built on OpenFL's arrays of the received weights (src/runner/
shared_received_model.py): no copy of the model, the same outputs as the model loaded with them, and a write into
it (which would change what a withheld round sends) fails the round."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from src.runner.shared_received_model import SharedReceivedModel


class TiedBatchNormNet(nn.Module):
    """BatchNorm (running statistics, an int64 counter), tied weights, a buffer outside the state dict."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 4, bias=False)
        self.bn = nn.BatchNorm1d(4)
        self.out = nn.Linear(4, 6, bias=False)
        self.decode = nn.Linear(6, 4, bias=False)
        self.decode.weight = self.embed.weight  # tied: one tensor under two names
        self.register_buffer("scale", torch.full((4,), 0.5), persistent=False)

    def forward(self, x):
        h = torch.relu(self.bn(self.embed(x))) * self.scale
        return self.out(h) + self.decode(x).sum(dim=1, keepdim=True)


def _received(model: nn.Module, seed: int = 1) -> dict:
    """Arrays as OpenFL holds them: one per state-dict name (a tied tensor under each of its names, one array)."""
    torch.manual_seed(seed)
    other = type(model)()
    other.train()
    other(torch.randn(16, 6))  # running statistics that differ from the model's
    for p in other.parameters():
        p.data.add_(torch.randn_like(p))
    return {name: tensor.detach().numpy().copy() for name, tensor in other.state_dict().items()}


def test_the_model_is_the_received_arrays_with_the_loaded_models_outputs():
    torch.manual_seed(0)
    model = TiedBatchNormNet().eval()
    received = _received(model)
    shared = SharedReceivedModel(model, received)
    got = shared.model
    state = got.state_dict()
    # a tied tensor is the array of its first name (OpenFL sends it under each name, with the same values)
    assert sorted(shared.shared_names) == sorted(set(received) - {"decode.weight"})
    for name, array in received.items():
        assert np.shares_memory(state[name].numpy(), received["embed.weight" if name == "decode.weight" else name])
        assert np.array_equal(state[name].numpy(), array), name
    assert got.decode.weight is got.embed.weight  # still tied
    assert not np.shares_memory(got.scale.numpy(), model.scale.numpy()) and torch.equal(got.scale, model.scale)
    assert got.training is model.training and got.embed.weight.requires_grad
    loaded = TiedBatchNormNet().eval()
    loaded.load_state_dict({name: torch.from_numpy(array) for name, array in received.items()})
    x = torch.randn(8, 6)
    assert torch.equal(got(x), loaded(x))
    # the runner's model is not touched
    assert not any(np.shares_memory(t.detach().numpy(), a) for t in model.state_dict().values()
                   for a in received.values())
    shared.check_unchanged()


@pytest.mark.parametrize("what", ["parameter", "buffer", "counter"])
def test_a_write_into_the_received_model_fails_naming_the_tensor(what):
    model = TiedBatchNormNet().eval()
    shared = SharedReceivedModel(model, _received(model))
    with torch.no_grad():
        if what == "parameter":
            shared.model.out.weight[0, 0] += 1e-6
        elif what == "buffer":
            shared.model.bn.running_var.mul_(1.0 + 2 ** -20)
        else:
            shared.model.bn.num_batches_tracked += 1
    name = {"parameter": "out.weight", "buffer": "bn.running_var", "counter": "bn.num_batches_tracked"}[what]
    with pytest.raises(RuntimeError, match=rf"wrote into the received model \({name}\)"):
        shared.check_unchanged()


def test_arrays_that_cannot_be_the_models_tensors_are_copied_and_bad_ones_named():
    model = TiedBatchNormNet().eval()
    received = _received(model)
    received["bn.running_mean"] = received["bn.running_mean"].astype(np.float64)  # not the model's dtype
    received["out.weight"] = received["out.weight"][::-1, ::-1]  # negative strides: torch cannot wrap it
    shared = SharedReceivedModel(model, received)
    assert "bn.running_mean" not in shared.shared_names and "out.weight" not in shared.shared_names
    assert shared.model.bn.running_mean.dtype == torch.float32
    assert torch.equal(shared.model.bn.running_mean, torch.from_numpy(received["bn.running_mean"]).float())
    assert np.array_equal(shared.model.out.weight.detach().numpy(), received["out.weight"])
    shared.check_unchanged()
    with pytest.raises(KeyError, match="bn.running_var"):
        SharedReceivedModel(model, {k: v for k, v in received.items() if k != "bn.running_var"})
    with pytest.raises(ValueError, match=r"embed.weight has shape \(4, 5\)"):
        SharedReceivedModel(model, {**received, "embed.weight": np.zeros((4, 5), np.float32)})
