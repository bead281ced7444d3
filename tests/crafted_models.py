"""Global models built to extract data, as the papers describe them and as an OpenFL server can send them: the
parties build the architecture from their plan, so the server only chooses the tensors (a state dict of the plan's
model, names as the model's own). Each function returns a new state dict; `public` is data of the task's
distribution the server holds (for digits, the public dataset itself).

- `imprint`: Fowl et al., "Robbing the Fed" (ICLR 2022): the first `bins` rows of a linear layer are one measurement
  direction, their biases minus the quantiles of the measurement on public data (every bin holds the same share of
  it), and the next layer's columns of those rows equal, so a sample alone in a bin is
  (dW_i - dW_i+1) / (db_i - db_i+1).
- `pass_through_convolution`: a CNN's convolution set so that its first channel copies the input (centre tap 1), the
  others are zero: the first linear layer then sees the (max-pooled) image.
- `trap_weights`: Boenisch et al., "When the Curious Abandon Honesty" (EuroS&P 2023): random rows whose positive
  weights are scaled down until each neuron fires for a small share of public samples, so most fire for one sample.
- `class_fishing`: Wen et al., "Fishing for User Data" (ICML 2022): the classifier's rows of every class but the target
  set to zero and their biases raised, so only the target class's samples send gradient down the model.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["imprint", "pass_through_convolution", "trap_weights", "class_fishing", "layer_inputs"]


def _copy(state: dict) -> dict:
    return {name: torch.as_tensor(np.array(value)).clone() for name, value in state.items()}


def layer_inputs(model: torch.nn.Module, state: dict, layer: str, x) -> np.ndarray:
    """The inputs of `layer` (flattened, float64) for samples x under `state` (eval mode)."""
    model.load_state_dict(_copy(state))
    got = []
    handle = model.get_submodule(layer).register_forward_pre_hook(lambda m, args: got.append(args[0].detach()))
    try:
        model.eval()
        with torch.no_grad():
            model(torch.as_tensor(np.asarray(x), dtype=torch.float32))
    finally:
        handle.remove()
    return got[0].reshape(len(got[0]), -1).double().numpy()


def imprint(state: dict, layer: str, next_layer: str, public_inputs: np.ndarray, bins: int, seed: int = 0) -> dict:
    out = _copy(state)
    weight, bias = out[f"{layer}.weight"], out[f"{layer}.bias"]
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=weight.shape[1])
    direction /= np.linalg.norm(direction)
    measured = public_inputs @ direction
    weight[:bins] = torch.as_tensor(direction, dtype=weight.dtype)
    bias[:bins] = torch.as_tensor(-np.quantile(measured, np.arange(bins) / bins), dtype=bias.dtype)
    following = out[f"{next_layer}.weight"]
    following[:, :bins] = following[:, :1].clone()
    return out


def pass_through_convolution(state: dict, conv: str) -> dict:
    out = _copy(state)
    weight = torch.zeros_like(out[f"{conv}.weight"])
    weight[0, 0, weight.shape[2] // 2, weight.shape[3] // 2] = 1.0
    out[f"{conv}.weight"], out[f"{conv}.bias"] = weight, torch.zeros_like(out[f"{conv}.bias"])
    return out


def trap_weights(state: dict, layer: str, public_inputs: np.ndarray, rate: float = 0.03, seed: int = 0) -> dict:
    out = _copy(state)
    weight = out[f"{layer}.weight"]
    rng = np.random.default_rng(seed)
    rows, width = weight.shape
    draws = np.abs(rng.normal(size=(rows, width))) * np.where(rng.random((rows, width)) < 0.5, 1.0, -1.0)
    positive, negative = np.clip(draws, 0, None), np.clip(draws, None, 0)
    trapped = np.empty_like(draws)
    for i in range(rows):  # bisect the scale of the positive weights: the neuron fires for `rate` of public samples
        low, high = 0.0, 16.0
        for _ in range(40):
            scale = (low + high) / 2
            if np.mean(public_inputs @ (scale * positive[i] + negative[i]) > 0) > rate:
                high = scale
            else:
                low = scale
        trapped[i] = low * positive[i] + negative[i]
    trapped *= float(weight.abs().mean()) / np.abs(trapped).mean()  # the layer's usual weight magnitude
    out[f"{layer}.weight"] = torch.as_tensor(trapped, dtype=weight.dtype)
    out[f"{layer}.bias"] = torch.zeros_like(out[f"{layer}.bias"])
    return out


def class_fishing(state: dict, layer: str, target: int, raise_by: float = 1000.0) -> dict:
    out = _copy(state)
    weight, bias = out[f"{layer}.weight"], out[f"{layer}.bias"]
    keep_weight, keep_bias = weight[target].clone(), bias[target].clone()
    weight.zero_()
    weight[target] = keep_weight
    bias.fill_(raise_by)
    bias[target] = keep_bias
    return out
