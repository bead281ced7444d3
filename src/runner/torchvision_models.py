"""torchvision's classifiers fitted to a dataset's images (src.runner.models builds them by name).

A name of ``MODELS`` other than the workspace's own (src.runner.model_names: torchvision's own registry of
classification models, less the families that cannot take a dataset's small images) is built by torchvision
(``torchvision.models.get_model(name, weights=None, num_classes=...)``: no pretrained weights, which would need a
download) with two changes for the dataset's input (``_fit_input``), both on the first convolution, the one the
input meets first:

- it takes the dataset's channels (1 for MNIST and digits) instead of 3: the same layer with another input width;
- on images under 64 pixels a side it has stride 1 (the usual CIFAR variant's change): torchvision's models halve
  the image five times (224 -> 7), so a 32x32 image would leave a 1x1 map to their last stage; with stride 1 a
  32x32 or 28x28 image keeps 2x2.

Everything else is torchvision's, BatchNorm included, so the update a party sends has torchvision's architecture.
Inputs of any other shape are checked by one forward pass when the model is built (in eval mode, and in train mode on
one sample, as the last batch of a local training may be): a model that cannot take them fails there in one line
naming the model and the shape. Activations that torchvision runs in place (``inplace=True``: ReLU, Hardswish,
...) are set to return a new tensor instead, as the workspace's models do: the same values and weights, and the
per-sample gradient hooks of opacus and the audit see each layer's own output.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["torchvision_model"]

# Under this many pixels a side the first convolution has stride 1 (see the module docstring).
_SMALL_INPUT = 64


def torchvision_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """torchvision's classifier `name` (no pretrained weights) for `input_shape` (C, H, W) and `num_classes`, its
    first convolution fitted to the input and one forward pass checked (ValueError naming the model and the shape)."""
    import torchvision.models

    model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    for module in model.modules():
        if getattr(module, "inplace", False) is True:
            module.inplace = False
    _fit_input(model, input_shape)
    _check_input(model, name, input_shape, num_classes)
    return model


class _FirstConv(Exception):
    def __init__(self, module):
        self.module = module


def _first_conv(model: nn.Module) -> str:
    """The name of the convolution the input meets first (a forward pass on a 3-channel image, stopped there)."""
    names = {id(m): n for n, m in model.named_modules()}

    def stop(module, _inputs):
        raise _FirstConv(module)

    hooks = [m.register_forward_pre_hook(stop) for m in model.modules() if isinstance(m, nn.Conv2d)]
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, 3, _SMALL_INPUT, _SMALL_INPUT))
    except _FirstConv as found:
        return names[id(found.module)]
    finally:
        for hook in hooks:
            hook.remove()
        model.train()
    raise ValueError("the model has no convolution its input meets first")


def _fit_input(model: nn.Module, input_shape: tuple[int, int, int]) -> None:
    """The first convolution takes the dataset's channels, and stride 1 on images under _SMALL_INPUT pixels a side.
    A new layer only when something changes (it is initialised as torchvision initialised the one it replaces:
    kaiming normal, fan out, as every torchvision classifier with a conv stem does; bias zero)."""
    c, h, w = input_shape
    name = _first_conv(model)
    conv = model.get_submodule(name)
    stride = (1, 1) if min(h, w) < _SMALL_INPUT else conv.stride
    if conv.in_channels == c and tuple(conv.stride) == tuple(stride):
        return
    fitted = nn.Conv2d(c, conv.out_channels, conv.kernel_size, stride=stride, padding=conv.padding,
                       dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
                       padding_mode=conv.padding_mode)
    if conv.in_channels == c:
        fitted.load_state_dict(conv.state_dict())  # only the stride changed: keep torchvision's initial weights
    else:
        nn.init.kaiming_normal_(fitted.weight, mode="fan_out", nonlinearity="relu")
        if fitted.bias is not None:
            nn.init.zeros_(fitted.bias)
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, fitted)


def _check_input(model: nn.Module, name: str, input_shape: tuple[int, int, int], num_classes: int) -> None:
    """One forward pass in eval mode (2 samples) and one in train mode (1 sample): a model that cannot take the
    input fails here in one line. The model's buffers (BatchNorm's statistics) and torch's generator are left as
    they were."""
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            for train, batch in ((False, 2), (True, 1)):
                out = model.train(train)(torch.zeros(batch, *input_shape))
                if not isinstance(out, torch.Tensor) or tuple(out.shape) != (batch, num_classes):
                    raise ValueError(f"its output is {type(out).__name__} "
                                     f"{tuple(out.shape) if isinstance(out, torch.Tensor) else ''}, not "
                                     f"({batch}, {num_classes}) logits")
    except (RuntimeError, ValueError) as err:
        c, h, w = input_shape
        what = " ".join(str(err).split())
        raise ValueError(f"model {name!r} cannot take inputs of shape {c}x{h}x{w}: {what[:300]}") from None
    finally:
        for n, b in model.named_buffers():
            b.copy_(buffers[n])
        model.train()
