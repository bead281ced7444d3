"""The task runner loads received arrays into its model without a model-sized copy of them (OpenFL's
set_tensor_dict made a tensor of each array first): the same values, read in place, OpenFL's dict emptied as it was."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from src.taskrunner import AuditedTaskRunner


class _Holder(nn.Module):
    """What set_tensor_dict reads of a task runner: its state (the model under "model.") and its device."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Linear(5, 3))
        self.device = torch.device("cpu")


def _received(holder: nn.Module, seed: int) -> dict:
    """Read-only arrays, as decoded from a message, of other values than the holder's."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, value in holder.state_dict().items():
        array = rng.normal(size=tuple(value.shape)).astype(value.numpy().dtype) if value.is_floating_point() \
            else np.asarray(7, dtype=value.numpy().dtype)
        out[name] = np.frombuffer(array.tobytes(), dtype=array.dtype).reshape(array.shape)
    return out


def test_received_arrays_are_loaded_in_place_with_the_same_values(monkeypatch):
    holder = _Holder()
    arrays = _received(holder, seed=1)
    given = dict(arrays)
    handed = {}
    load = nn.Module.load_state_dict

    def spy(self, state, *args, **kwargs):
        handed.update({name: tensor.data_ptr() for name, tensor in state.items()})
        return load(self, state, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "load_state_dict", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the read-only arrays' warning is not the user's to see
        AuditedTaskRunner.set_tensor_dict(holder, given)
    assert given == {}  # popped, as OpenFL's set_tensor_dict does
    for name, array in arrays.items():
        assert handed[name] == array.ctypes.data, name  # no copy before load_state_dict's own
        loaded = holder.state_dict()[name]
        np.testing.assert_array_equal(loaded.numpy(), array)
        assert loaded.data_ptr() != array.ctypes.data  # the model holds its own copy
    assert int(holder.state_dict()["model.1.num_batches_tracked"]) == 7
