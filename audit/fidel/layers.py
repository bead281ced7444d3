"""The first dense layer of a model and its update: which layer Fidel attacks, what that layer sees of the samples,
dW and db of the update, and the reconstructions dW_i / db_i."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from audit.fidel.scoring import check_fraction
from audit.model_io import eval_mode, model_input

__all__ = ["DEFAULT_MIN_REL_BIAS", "find_first_dense_layer", "layer_inputs", "dense_update", "reconstruct"]

#: A neuron is used when |db_i| > DEFAULT_MIN_REL_BIAS * max_j |db_j|; below that, dW_i / db_i is dominated by the
#: float32 rounding of the weights (error ~ eps * |w| / |db_i|), not by the samples.
DEFAULT_MIN_REL_BIAS = 1e-3


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the wanted layer input is captured."""


# ----------------------------------------------------------------------------- validation helpers


def as_samples(samples) -> torch.Tensor:
    """The samples as a tensor of their own dtype: integer inputs (token ids for an Embedding) stay integer."""
    x = torch.as_tensor(np.asarray(samples) if not isinstance(samples, torch.Tensor) else samples)
    if x.ndim < 2 or x.shape[0] == 0:
        raise ValueError(f"samples: need an array of shape (N, ...) with N >= 1, got shape {tuple(x.shape)}")
    return x


def _linear_names(model: nn.Module) -> str:
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    return ", ".join(names) if names else "(none)"


# ----------------------------------------------------------------------------- layer and update


def find_first_dense_layer(model: nn.Module, sample_input=None, layer: str | None = None) -> str:
    """Name of the dense layer to attack.

    ``layer`` given: checked to exist and to be an ``nn.Linear`` (else ValueError naming it and its type).
    Otherwise the first ``nn.Linear`` *called* in a forward pass of ``sample_input`` (forward order, which
    registration order need not be) on one row per sample, found with forward hooks; ValueError if none runs.
    A Linear applied per position ((B, T, D) after an Embedding, a sequence-first (T, B, D)) or to the batch
    folded into rows is passed over: its dW_i / db_i averages positions, not one sample's input.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: need a torch.nn.Module, got {type(model).__name__}")
    modules = dict(model.named_modules())
    if layer is not None:
        if layer not in modules or layer == "":
            raise ValueError(f"layer {layer!r}: no such module; nn.Linear layers: {_linear_names(model)}")
        module = modules[layer]
        if not isinstance(module, nn.Linear):
            raise ValueError(
                f"layer {layer!r} is {type(module).__name__}, not nn.Linear: the Fidel attack inverts a dense "
                f"layer; nn.Linear layers: {_linear_names(model)}"
            )
        if module.bias is None:
            raise ValueError(f"layer {layer!r} has no bias: the Fidel attack divides dW_i by db_i")
        return layer
    if sample_input is None:
        raise ValueError("sample_input: needed to find the first dense layer in forward order (or give layer=)")
    x = model_input(model, as_samples(sample_input)[:1])
    found: list[str] = []

    def hook(name):
        def pre(_module, args):
            inp = args[0] if args else None
            if isinstance(inp, torch.Tensor) and inp.ndim == 2 and inp.shape[0] == len(x):
                found.append(name)
                raise _Stop

        return pre

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in modules.items() if isinstance(m, nn.Linear)]
    try:
        with eval_mode(model), torch.no_grad():
            model(x)
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    if not found:
        raise ValueError(
            f"model {type(model).__name__} calls no nn.Linear layer on one row per sample in its forward pass: the "
            f"Fidel attack needs a dense layer applied once per sample; nn.Linear layers: {_linear_names(model)}"
        )
    return find_first_dense_layer(model, layer=found[0])


def layer_inputs(model: nn.Module, layer: str, samples, *, batch_size: int = 256) -> tuple[np.ndarray, tuple]:
    """Inputs of ``layer`` for every sample (eval mode, no grad), float64 (N, in), and their unflattened shape.

    The shape is that of the input of the last ``nn.Flatten`` called before ``layer`` when it has ``in``
    elements (a CNN's (channels, h, w) activation map; an FCNN's image), else ``(in,)``.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: must be a positive integer, got {batch_size!r}")
    find_first_dense_layer(model, layer=layer)
    target = model.get_submodule(layer)
    x = model_input(model, as_samples(samples))
    state: dict[str, Any] = {"flat": None, "out": [], "rows": 0}

    def flatten_hook(_m, args):
        state["flat"] = tuple(args[0].shape[1:])

    def layer_hook(_m, args):
        inp = args[0]
        if inp.ndim == 2 and inp.shape[0] == state["rows"] and inp.shape[1] != target.in_features:
            raise ValueError(
                f"samples of shape {tuple(x.shape)} do not fit the model: layer {layer!r} gets input of shape "
                f"{tuple(inp.shape)}, expects (batch, {target.in_features})"
            )
        if inp.ndim != 2 or inp.shape[0] != state["rows"]:
            # Applied per position ((B, T, D)) or to the batch folded into rows: each neuron's dW_i / db_i then
            # averages positions, not one sample's input, and nothing lines the rows up with the samples.
            raise ValueError(
                f"layer {layer!r} gets input of shape {tuple(inp.shape)} for {state['rows']} samples, not one row "
                f"per sample: the Fidel attack inverts a dense layer applied once per sample; pick one with "
                f"task_runner.settings.audit.fidel.layer (nn.Linear layers: {_linear_names(model)})"
            )
        state["out"].append(inp.detach().to(torch.float64))
        raise _Stop

    handles = [m.register_forward_pre_hook(flatten_hook) for m in model.modules() if isinstance(m, nn.Flatten)]
    handles.append(target.register_forward_pre_hook(layer_hook))
    try:
        with eval_mode(model), torch.no_grad():
            for start in range(0, x.shape[0], batch_size):
                chunk = x[start : start + batch_size]
                state["rows"] = len(chunk)
                try:
                    model(chunk)
                except _Stop:
                    continue
                raise ValueError(f"layer {layer!r} was not called in the forward pass")
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"samples of shape {tuple(x.shape)} do not fit the model: {e}") from e
    finally:
        for h in handles:
            h.remove()
    feats = torch.cat(state["out"]).cpu().numpy()
    flat = state["flat"]
    shape = flat if flat is not None and math.prod(flat) == feats.shape[1] else (feats.shape[1],)
    return feats, shape


def _to_numpy(value, key: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().to(torch.float64).numpy()
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{key}: not a numeric array ({e})") from e
    return arr


def _state(weights, what: str) -> Mapping[str, Any]:
    if isinstance(weights, nn.Module):
        return weights.state_dict()
    if isinstance(weights, Mapping):
        return weights
    raise ValueError(f"{what}: need an nn.Module or a state dict (name -> array), got {type(weights).__name__}")


def dense_update(global_weights, local_weights, layer: str) -> tuple[np.ndarray, np.ndarray]:
    """dW = W_local - W_global (out, in) and db (out,) of ``layer``, in float64.

    Weights are ``nn.Module`` or state dicts with ``{layer}.weight`` / ``{layer}.bias``; a missing key or a
    shape mismatch raises ValueError naming it.  The difference is taken in float64 from the stored values.
    """
    g, loc = _state(global_weights, "global_weights"), _state(local_weights, "local_weights")
    keys = (f"{layer}.weight", f"{layer}.bias")
    for name, state in (("global_weights", g), ("local_weights", loc)):
        for key in keys:
            if key not in state:
                raise ValueError(f"{name}: has no {key!r} (keys: {', '.join(list(state)[:12])}...)")
    out = []
    for key in keys:
        a, b = _to_numpy(g[key], key), _to_numpy(loc[key], key)
        if a.shape != b.shape:
            raise ValueError(f"{key}: global shape {a.shape} != local shape {b.shape}")
        out.append(b - a)
    dw, db = out
    if dw.ndim != 2 or db.shape != (dw.shape[0],):
        raise ValueError(f"{layer}: weight {dw.shape} and bias {db.shape} are not a dense layer's (out, in) / (out,)")
    return dw, db


def reconstruct(dw: np.ndarray, db: np.ndarray, min_rel_bias: float = DEFAULT_MIN_REL_BIAS):
    """Reconstructions dW_i / db_i (k, in) and the indices (k,) of the neurons used.

    Neuron i is used iff |db_i| > min_rel_bias * max |db| (and db_i != 0): a neuron no sample moved (a dead
    ReLU) has dW_i = db_i = 0, and a nearly unmoved one divides rounding noise by a tiny number.
    """
    min_rel_bias = check_fraction("min_rel_bias", min_rel_bias, low=0, high=1, low_open=False, high_open=True)
    dw, db = np.asarray(dw, dtype=np.float64), np.asarray(db, dtype=np.float64)
    if dw.ndim != 2 or db.shape != (dw.shape[0],):
        raise ValueError(f"dW must be (out, in) and db (out,); got {dw.shape} and {db.shape}")
    mag = np.abs(db)
    peak = mag.max(initial=0.0)
    used = np.flatnonzero((mag > min_rel_bias * peak) & (mag > 0))
    return dw[used] / db[used, None], used
