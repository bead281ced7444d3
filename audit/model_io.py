"""Running a model on samples: inputs in the form the model takes, the train/eval mode it runs in, and chunking.

Shared by the signals, Fidel and the many-copies training: floating inputs are cast to the model's dtype and device,
integer inputs (token ids for an Embedding) stay integer; a mode is set for a block and every submodule's own flag
comes back after it.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Iterable, Iterator

import numpy as np
import torch
from torch import nn

from audit.scaled_pixels import ScaledPixels

__all__ = ["check_batch_size", "host_tensor", "model_device", "model_input", "prepare", "module_mode", "eval_mode",
           "chunks", "load_weights", "weights_fingerprint"]


def _model_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            return tensor.device, tensor.dtype
    return torch.device("cpu"), torch.get_default_dtype()


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first floating parameter or buffer (the CPU for a model without any)."""
    return _model_device_dtype(model)[0]


def host_tensor(value) -> torch.Tensor:
    """A tensor as it is; anything else (numpy arrays, lists: host memory) as a CPU tensor, whatever torch's default
    device: the data then moves to the model's device once, by an explicit .to(), never by a default."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, ScaledPixels):  # torch.as_tensor does not read __array__: it would walk it as a sequence
        return torch.from_numpy(np.asarray(value))
    return torch.as_tensor(value, device="cpu")


def model_input(model: nn.Module, x) -> torch.Tensor:
    """`x` as a tensor `model` can take: on its device; floating values in its dtype (numpy inputs are often float64),
    integer values (token ids, indices for an Embedding) left integer."""
    x = host_tensor(x)
    device, dtype = _model_device_dtype(model)
    if x.is_floating_point():
        return x.to(device=device, dtype=dtype)
    return x.to(device)


def check_batch_size(batch_size) -> None:
    """A batch size must be a positive integer (not a bool): one line naming the value otherwise."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


def prepare(model: nn.Module, x, y, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) checked as a labelled sample set for `model`: x on its device and dtype, y as int64 labels."""
    check_batch_size(batch_size)
    x = host_tensor(x)
    y = host_tensor(y)
    if x.ndim == 0 or y.ndim != 1:
        raise ValueError(f"x must have shape (N, ...) and y shape (N,); got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} samples but y has {y.shape[0]} labels")
    if x.shape[0] == 0:
        raise ValueError("empty sample set (N=0): signals need at least one sample")
    if y.is_floating_point() or y.is_complex():
        raise ValueError(f"y must hold integer class labels, got dtype {y.dtype}")
    x = model_input(model, x)
    return x, y.to(device=x.device, dtype=torch.long)


@contextlib.contextmanager
def module_mode(model: nn.Module, *, training: bool) -> Iterator[None]:
    """Run a block with the model in train (`training`) or eval mode, then give every submodule its own flag back."""
    # Remember every submodule's flag, not only the top one: a caller may keep e.g. a frozen BatchNorm in eval mode
    # inside a model that is in train mode.
    flags = [(module, module.training) for module in model.modules()]
    model.train(training)
    try:
        yield
    finally:
        for module, training_flag in flags:
            module.training = training_flag


def eval_mode(model: nn.Module):
    """Run a block with the model in eval mode, then give every submodule its own train/eval flag back."""
    return module_mode(model, training=False)


def chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def load_weights(model: nn.Module, weights) -> None:
    """Load a state dict in the model's names into `model`: torch tensors as they are, numpy arrays copied onto the
    model's device (every one of the model's entries must be there)."""
    if any(isinstance(v, torch.Tensor) for v in weights.values()):
        model.load_state_dict(weights)
        return
    state = model.state_dict()
    device = next(iter(state.values())).device
    model.load_state_dict({k: torch.tensor(weights[k]).to(device) for k in state})


def weights_fingerprint(named: Iterable[tuple[str, object]]) -> str:
    """SHA-256 over named tensors or arrays: each one's name, shape, dtype and bytes, in the order given. Equal for the
    same weights however they are held (a model's state, a copy of it, the arrays a party received), so what was
    computed for them can be found again by content, never by object identity (an id can be reused once its object
    is gone)."""
    digest = hashlib.sha256()
    for name, value in named:
        if isinstance(value, torch.Tensor):
            value = value.detach().contiguous().cpu()
            if value.dtype == torch.bfloat16:  # no numpy dtype: its bytes, through a 16-bit integer view
                value = value.view(torch.int16)
            value = value.numpy()
        array = np.ascontiguousarray(value)
        digest.update(f"{name}|{array.shape}|{array.dtype.str}".encode())
        if array.dtype.hasobject:
            digest.update(repr(array.tolist()).encode())
        elif array.size:
            digest.update(array.reshape(-1).view(np.uint8))
    return digest.hexdigest()
