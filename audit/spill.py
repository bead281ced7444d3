"""Models and tensors kept out of memory between uses: on disk in a private temporary folder, or built on demand.

A party keeps things across rounds that it reads rarely: RMIA's trained references (audit.training), the plan's
initial model (read only when the independent references start). `SpillFolder` is where such tensors wait
(torch.save: the same values, bit for bit, when read back); `SpilledModel` is one model waiting there;
`weightless_template` is a model's architecture without its weights, for code that needs only the structure (the
references' functional calls); `model_with_tensors` is a copy of a model around tensors given in place of its own;
`ModelSource` is a model or a zero-argument callable giving it, so that a caller can hand over a model that is only
built or read when it is used (`load_model`).
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import weakref
from typing import Callable, Union

import torch
from torch import nn

__all__ = ["SpillFolder", "SpilledModel", "weightless_template", "model_with_tensors", "ModelSource", "load_model"]

# A model, or a zero-argument callable that builds or reads it when (and only if) it is needed.
ModelSource = Union[nn.Module, Callable[[], nn.Module]]


def load_model(source: ModelSource) -> nn.Module:
    """The model itself (an nn.Module, itself callable, is taken as it is), or what the callable gives."""
    return source if isinstance(source, nn.Module) else source()


class SpillFolder:
    """A private temporary folder of torch.save'd files (read back with weights_only: tensors and containers only);
    the folder goes with the object (weakref.finalize: also at interpreter exit)."""

    def __init__(self, prefix: str):
        self.folder = tempfile.mkdtemp(prefix=prefix)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, True)

    def path(self, name: str) -> str:
        return os.path.join(self.folder, f"{name}.pt")

    def save(self, name: str, tensors) -> None:
        torch.save(tensors, self.path(name))

    def load(self, name: str, map_location=None):
        return torch.load(self.path(name), map_location=map_location, weights_only=True)


def model_with_tensors(model: nn.Module, replace: Callable[[str, torch.Tensor], torch.Tensor]) -> nn.Module:
    """A deep copy of `model` whose every parameter and buffer is replace(name, tensor), the model's own never copied.
    A tensor the model holds under several names (tied weights) gets one replacement, still shared."""
    memo: dict = {}
    for name, tensor in (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)):
        if id(tensor) not in memo:
            new = replace(name, tensor)
            if isinstance(tensor, nn.Parameter):
                new = nn.Parameter(new, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = new
    return copy.deepcopy(model, memo)


def weightless_template(model: nn.Module) -> nn.Module:
    """`model`'s architecture without its weights: a copy whose every parameter and buffer is a broadcast view of one
    element, with the tensor's shape, dtype, device and requires_grad, so that code reading those (the input's device
    and dtype, sizes, names) and torch.func.functional_call with every parameter and buffer given work as on
    `model`, at a few bytes per tensor. Its values are meaningless: never run it without giving all of them.
    (The meta device would keep no element at all, but loses the device the inputs must go to.)"""
    return model_with_tensors(model, lambda name, t: torch.empty((), dtype=t.dtype, device=t.device).expand(t.shape))


class SpilledModel:
    """A model whose parameters and buffers wait on disk (its own private folder, gone with the object); `load`
    gives back a module with the same values bit for bit (and the same modules, ties, train/eval flags)."""

    def __init__(self, model: nn.Module):
        self._template = weightless_template(model)
        self._folder = SpillFolder("spilled_model_")
        # Every name, tied ones too: torch.save keeps shared storage shared, and the template maps a tie to one tensor.
        self._folder.save("model", {name: t.detach() for name, t in (*model.named_parameters(remove_duplicate=False),
                                                                      *model.named_buffers(remove_duplicate=False))})

    @property
    def folder(self) -> str:
        return self._folder.folder

    def load(self, device=None) -> nn.Module:
        """The model read back, on `device` (None: the device each tensor was saved from)."""
        tensors = self._folder.load("model", map_location=None if device is None else torch.device(device))
        return model_with_tensors(self._template, lambda name, t: tensors[name])
