"""What a deanonymization adversary looks at: one layer's update, flattened and L2-normalised.

The paper (Orekondy et al., seeds 000/001) found the last layer the most telling and normalises each update so
that its size (learning rate, data volume, epochs) does not give the owner away; only its direction does.
Works on tensor dicts of numpy arrays (what OpenFL's TensorDB holds) or torch tensors (state dicts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch

__all__ = ["last_layer", "layer_tensor_names", "update_vector", "normalise_rows"]


def last_layer(model: torch.nn.Module) -> str:
    """The name of the last module (in registration order) that owns parameters: the output layer of our models."""
    name = None
    for module_name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            name = module_name
    if name is None:
        raise ValueError("the model has no parameters")
    return name


def layer_tensor_names(names: Iterable[str], layer: str) -> list[str]:
    """The tensor names of module `layer` ("<layer>.weight", "<layer>.bias", ...), in the given order."""
    names = list(names)
    prefix = f"{layer}."
    found = [n for n in names if n.startswith(prefix) and "." not in n[len(prefix):]]
    if not found:
        layers = sorted({n.rsplit(".", 1)[0] for n in names})
        raise ValueError(f"no tensor of layer {layer!r}; layers with tensors: {', '.join(layers)}")
    return found


def _flat(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.float64).ravel()


def normalise_rows(vectors: np.ndarray) -> np.ndarray:
    """Each row divided by its L2 norm (a zero row stays zero: a withheld update has no direction)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


def update_vector(received: Mapping, trained: Mapping, names: Iterable[str]) -> np.ndarray:
    """The L2-normalised, flattened `trained - received` over the tensors `names` (float64, 1-D)."""
    missing = [n for n in names if n not in received or n not in trained]
    if missing:
        raise ValueError(f"update_vector: tensors {missing} missing from the received or trained weights")
    delta = np.concatenate([_flat(trained[n]) - _flat(received[n]) for n in names])
    return normalise_rows(delta[None, :])[0]
