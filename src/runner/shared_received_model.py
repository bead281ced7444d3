"""The received model the audit reads, built on OpenFL's own arrays of the received weights instead of a copy.

OpenFL's collaborator keeps the weights the aggregator sent in its TensorDB for the whole round (a withheld round
sends them back). The audit needs them as a model from before the local training to the end of the audit; a copy of
the model would hold one more model's size through both. Here the model's parameters and buffers are those arrays
themselves (on the CPU, where dtype and shape match; any other tensor is a copy on the model's device).

Nothing in the audit writes into the received model: the steps that train from it (RMIA's references, the DP
retrain, the canary's shadow, Fidel) start from their own copies. A write would change what a withheld round sends,
so `check_unchanged` compares a checksum of the shared arrays after the audit with the one taken when the model was
built, and fails the round naming the tensor.
"""

from __future__ import annotations

import warnings
import zlib
from typing import Mapping

import numpy as np
import torch
from torch import nn

from audit import model_with_tensors

__all__ = ["SharedReceivedModel"]


class SharedReceivedModel:
    """`model` (the runner's, for its architecture, device and flags) holding `received` (model names -> arrays):
    `.model` is the received model; `check_unchanged()` raises if anything wrote into the shared arrays."""

    def __init__(self, model: nn.Module, received: Mapping[str, np.ndarray]):
        state = model.state_dict(keep_vars=True)
        missing = [name for name in state if name not in received]
        if missing:
            raise KeyError(f"received model: no received value for {', '.join(missing[:5])}"
                           f"{' ...' if len(missing) > 5 else ''}")
        names_of = {}
        for name, tensor in state.items():
            names_of.setdefault(id(tensor), name)
        self._shared: dict[str, tuple[np.ndarray, int]] = {}

        def received_tensor(name: str, tensor: torch.Tensor) -> torch.Tensor:
            name = names_of.get(id(tensor), name)  # a state-dict name: what OpenFL sent it under
            if name not in received:  # a buffer outside the state dict (persistent=False): OpenFL never sends it
                return tensor.detach().clone()
            array = np.asarray(received[name])
            if tensor.dim() == 0 and array.shape == (1,):  # OpenFL sends a 0-d tensor as (1,); load_state_dict takes it
                array = array.reshape(())
            try:
                with warnings.catch_warnings():  # arrays decoded from a message are read-only; nothing writes them
                    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                    host, own = torch.from_numpy(array), False
            except (TypeError, ValueError):  # negative strides and the like: a copy of its own
                host, own = torch.as_tensor(np.array(array)), True
            if tuple(host.shape) != tuple(tensor.shape):
                raise ValueError(f"received model: {name} has shape {tuple(host.shape)}, the model's is "
                                 f"{tuple(tensor.shape)}")
            if not own and tensor.device.type == "cpu" and host.dtype == tensor.dtype:
                self._shared[name] = (array, _checksum(array))
                return host
            return host.to(device=tensor.device, dtype=tensor.dtype, copy=not own)  # one copy, on the model's device

        self.model = model_with_tensors(model, received_tensor)

    @property
    def shared_names(self) -> list[str]:
        """The tensors that are OpenFL's arrays themselves (not copies)."""
        return list(self._shared)

    def check_unchanged(self) -> None:
        """Raise if any shared array differs from what was received (something wrote into the received model)."""
        changed = [name for name, (array, checksum) in self._shared.items() if _checksum(array) != checksum]
        if changed:
            raise RuntimeError(f"the audit wrote into the received model ({', '.join(changed[:5])}): what a withheld "
                               "round sends is no longer what was received; the round is not sent")


def _checksum(array: np.ndarray) -> int:
    # zlib's CRC-32 over the bytes (stdlib, one pass over the model): a write of any value changes it.
    return zlib.crc32(np.ascontiguousarray(array))  # (a 0-d array reads as one element: the same bytes)
