"""Models from the Fidel reconstruction paper, for any (C, H, W) input.

Both models are ``features`` -> ``classifier``, where ``features(x)`` is exactly the
(flattened) input of the first dense layer ``classifier.fc1`` -- the layer the Fidel
attack inverts (x = dW_i / db_i) and a natural choice for a gradient-norm signal.
Sub-modules are named ``nn.Sequential`` entries, so they can be reached by name
(``model.get_submodule("classifier.fc1")``) or by index (``model.classifier[0]``), and
state-dict keys are stable (``classifier.fc1.weight`` ...).

``CNN(input_shape, num_classes)``::

    features    conv1  Conv2d(C, 32, 3, padding=1)   [features.0]
                act1   ReLU                          [features.1]
                pool1  MaxPool2d(2)                  [features.2]
                flatten Flatten                      [features.3]   -> 32 * (H//2) * (W//2)
    classifier  fc1    Linear(32*(H//2)*(W//2), 128) [classifier.0]
                act1   ReLU                          [classifier.1]
                fc2    Linear(128, 64)               [classifier.2]
                act2   ReLU                          [classifier.3]
                out    Linear(64, num_classes)       [classifier.4]

``FCNN(input_shape, num_classes, activation="relu", dropout=0.0)``::

    features    flatten Flatten                      [features.0]   -> C*H*W
    classifier  fc1 Linear(C*H*W, 128), act1, drop1  [classifier.0-2]
                fc2 Linear(128, 128),   act2, drop2  [classifier.3-5]
                fc3 Linear(128, 64),    act3, drop3  [classifier.6-8]
                out Linear(64, num_classes)          [classifier.9]

``act*`` is ReLU / Sigmoid / Tanh; ``drop*`` is ``Dropout(dropout)`` when dropout > 0,
else ``Identity`` (so names and indices do not depend on the dropout setting).

``AlexNet(input_shape, num_classes)`` -- the Net of OpenFL's Privacy Meter tutorial (5 conv + 3 FC,
Dropout, ~23.3M parameters on 3x32x32), with the tutorial's indices in ``features`` (its
``--layer_number 10`` is ``features[10]`` = ``features.conv5``) and no in-place ReLU::

    features    conv1  Conv2d(C, 64, 3, stride=2, padding=1)  [features.0]
                act1   ReLU                                 [features.1]
                pool1  MaxPool2d(2)                         [features.2]
                conv2  Conv2d(64, 192, 3, padding=1)        [features.3]
                act2   ReLU                                 [features.4]
                pool2  MaxPool2d(2)                         [features.5]
                conv3  Conv2d(192, 384, 3, padding=1)       [features.6]
                act3   ReLU                                 [features.7]
                conv4  Conv2d(384, 256, 3, padding=1)       [features.8]
                act4   ReLU                                 [features.9]
                conv5  Conv2d(256, 256, 3, padding=1)       [features.10]
                act5   ReLU                                 [features.11]
                pool3  MaxPool2d(2)                         [features.12]
                avgpool AdaptiveAvgPool2d((2, 2))           [features.13]
                flatten Flatten                             [features.14]  -> 256 * 2 * 2
    classifier  drop1  Dropout(0.5)                         [classifier.0]
                fc1    Linear(1024, 4096)                   [classifier.1]
                act1   ReLU                                 [classifier.2]
                drop2  Dropout(0.5)                         [classifier.3]
                fc2    Linear(4096, 4096)                   [classifier.4]
                act2   ReLU                                 [classifier.5]
                out    Linear(4096, num_classes)            [classifier.6]

On 3x32x32 the stack reaches 2x2 at ``pool3`` and ``avgpool`` changes nothing (the tutorial's net).
Small inputs still build: a ``pool*`` whose input is already 1x1 is an ``Identity`` (same name and
index), and ``avgpool`` brings any map to 2x2 (1x8x8 digits: 4 -> 2 -> 1 -> 1 -> 2x2 by replication).

Every model exposes the class attributes ``FIRST_DENSE_LAYER = "classifier.fc1"`` and
``OUTPUT_LAYER = "classifier.out"`` (module names for ``get_submodule``).
No activation is in-place (``inplace=True`` breaks per-sample-gradient tools such as
opacus and torch.func).  Outputs are logits (no softmax).

torchvision's classifiers
-------------------------
Any other name of ``MODELS`` (src.runner.model_names: torchvision's own registry of classification models, less the
families that cannot take a dataset's small images) is built by torchvision, its first convolution fitted to the
dataset's input (src.runner.torchvision_models).
"""

from __future__ import annotations

import difflib
import inspect
import numbers
from collections import OrderedDict

import torch
from torch import nn

from src.runner import model_names as names
from src.runner.model_names import WORKSPACE_MODELS, in_models
from src.runner.torchvision_models import torchvision_model

__all__ = ["model_names", "is_model_name", "PAPER_MODELS", "ACTIVATIONS", "CNN", "FCNN", "AlexNet", "build_model",
           "feature_layers"]

#: The Fidel-paper models (``classifier.fc1`` is ``classifier[0]``, 128 units; tests parametrize over these).
PAPER_MODELS = ("cnn", "fcnn")
ACTIVATIONS = ("relu", "sigmoid", "tanh")

_ACT = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}


def _check_shape(input_shape) -> tuple[int, int, int]:
    try:
        shape = tuple(int(v) for v in input_shape)
        ok = len(shape) == 3 and all(v >= 1 for v in shape) and all(
            float(a) == float(b) for a, b in zip(shape, input_shape)
        )
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"input_shape must be three positive ints (C, H, W), got {input_shape!r}")
    return shape


def _check_classes(num_classes) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
    return int(num_classes)


class CNN(nn.Module):
    """Fidel-paper CNN: Conv 3x3x32 + ReLU + MaxPool 2, then Dense 128-64-classes (ReLU).

    Module names: see the module docstring (``features.conv1`` ... ``classifier.out``).
    """

    FIRST_DENSE_LAYER = "classifier.fc1"
    OUTPUT_LAYER = "classifier.out"

    def __init__(self, input_shape, num_classes):
        super().__init__()
        c, h, w = _check_shape(input_shape)
        if h < 2 or w < 2:
            raise ValueError(f"CNN needs images of at least 2x2 (MaxPool2d(2)), got input_shape {input_shape!r}")
        num_classes = _check_classes(num_classes)
        self.input_shape = (c, h, w)
        self.num_classes = num_classes
        flat = 32 * (h // 2) * (w // 2)
        self.features = nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(c, 32, kernel_size=3, padding=1),
                act1=nn.ReLU(),
                pool1=nn.MaxPool2d(2),
                flatten=nn.Flatten(),
            )
        )
        self.classifier = nn.Sequential(
            OrderedDict(
                fc1=nn.Linear(flat, 128),
                act1=nn.ReLU(),
                fc2=nn.Linear(128, 64),
                act2=nn.ReLU(),
                out=nn.Linear(64, num_classes),
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class FCNN(nn.Module):
    """Fidel-paper FCNN: Flatten, Dense 128-128-64 (activation, optional Dropout), classes.

    Module names: see the module docstring (``features.flatten``, ``classifier.fc1`` ...).
    """

    FIRST_DENSE_LAYER = "classifier.fc1"
    OUTPUT_LAYER = "classifier.out"

    def __init__(self, input_shape, num_classes, activation="relu", dropout=0.0):
        super().__init__()
        c, h, w = _check_shape(input_shape)
        num_classes = _check_classes(num_classes)
        if activation not in _ACT:
            raise ValueError(f"activation: unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, numbers.Real)
            or not 0.0 <= float(dropout) < 1.0
        ):
            raise ValueError(f"dropout: must be a number in [0, 1), got {dropout!r}")
        self.input_shape = (c, h, w)
        self.num_classes = num_classes
        self.activation = activation
        self.dropout = float(dropout)
        act = _ACT[activation]

        def drop():
            return nn.Dropout(self.dropout) if self.dropout > 0 else nn.Identity()

        self.features = nn.Sequential(OrderedDict(flatten=nn.Flatten()))
        self.classifier = nn.Sequential(
            OrderedDict(
                fc1=nn.Linear(c * h * w, 128),
                act1=act(),
                drop1=drop(),
                fc2=nn.Linear(128, 128),
                act2=act(),
                drop2=drop(),
                fc3=nn.Linear(128, 64),
                act3=act(),
                drop3=drop(),
                out=nn.Linear(64, num_classes),
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class AlexNet(nn.Module):
    """The AlexNet-style Net of OpenFL's Privacy Meter tutorial, for any (C, H, W) input.

    Module names and indices: see the module docstring (``features.conv1`` ... ``classifier.out``);
    ``features[10]`` is ``features.conv5`` as in the tutorial. Outputs are logits.
    """

    FIRST_DENSE_LAYER = "classifier.fc1"
    OUTPUT_LAYER = "classifier.out"

    def __init__(self, input_shape, num_classes):
        super().__init__()
        c, h, w = _check_shape(input_shape)
        num_classes = _check_classes(num_classes)
        self.input_shape = (c, h, w)
        self.num_classes = num_classes
        size = [(h + 2 - 3) // 2 + 1, (w + 2 - 3) // 2 + 1]  # after conv1 (stride 2, padding 1)

        def pool():
            # MaxPool2d(2) needs at least 2x2; on a 1-pixel side keep the slot (and the indices) as Identity.
            if min(size) < 2:
                return nn.Identity()
            size[0], size[1] = size[0] // 2, size[1] // 2
            return nn.MaxPool2d(kernel_size=2)

        layers = OrderedDict(conv1=nn.Conv2d(c, 64, kernel_size=3, stride=2, padding=1), act1=nn.ReLU())
        layers["pool1"] = pool()
        layers.update(conv2=nn.Conv2d(64, 192, kernel_size=3, padding=1), act2=nn.ReLU())
        layers["pool2"] = pool()
        layers.update(
            conv3=nn.Conv2d(192, 384, kernel_size=3, padding=1), act3=nn.ReLU(),
            conv4=nn.Conv2d(384, 256, kernel_size=3, padding=1), act4=nn.ReLU(),
            conv5=nn.Conv2d(256, 256, kernel_size=3, padding=1), act5=nn.ReLU(),
        )
        layers["pool3"] = pool()
        layers.update(avgpool=nn.AdaptiveAvgPool2d((2, 2)), flatten=nn.Flatten())
        self.features = nn.Sequential(layers)
        self.classifier = nn.Sequential(
            OrderedDict(
                drop1=nn.Dropout(0.5),
                fc1=nn.Linear(256 * 2 * 2, 4096),
                act1=nn.ReLU(),
                drop2=nn.Dropout(0.5),
                fc2=nn.Linear(4096, 4096),
                act2=nn.ReLU(),
                out=nn.Linear(4096, num_classes),
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


_CLASSES = {"cnn": CNN, "fcnn": FCNN, "alexnet": AlexNet}
assert tuple(_CLASSES) == WORKSPACE_MODELS


def model_names() -> tuple[str, ...]:
    """Every name build_model accepts: MODELS, and any model class added to the workspace's own (_CLASSES)."""
    return tuple(dict.fromkeys((*_CLASSES, *names.MODELS)))


def is_model_name(name) -> bool:
    """Whether build_model accepts `name` (one of model_names()); the workspace's own models are answered without
    reading torchvision's registry (src.runner.model_names.in_models)."""
    return name in _CLASSES or in_models(name)


def build_model(name, input_shape, num_classes, **kwargs) -> nn.Module:
    """Build model ``name`` (one of ``MODELS``: "cnn" | "fcnn" | "alexnet" | a torchvision classifier such as
    "resnet18") for ``input_shape`` (C, H, W).

    ``kwargs`` go to the model (FCNN: ``activation``, ``dropout``; the others: none).
    Unknown name or keyword, or a torchvision model that cannot take ``input_shape`` -> ValueError naming it.
    """
    key = name.strip().lower() if isinstance(name, str) else None
    if not is_model_name(key):
        known = model_names()
        close = difflib.get_close_matches(str(key), known, n=3)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise ValueError(f"unknown model {name!r}; {hint}choose one of {', '.join(known)}")
    cls = _CLASSES.get(key)
    allowed = [] if cls is None else [
        p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "input_shape", "num_classes")]
    for k in kwargs:
        if k not in allowed:
            raise ValueError(
                f"{k}: not a setting of model {key!r}; allowed: {', '.join(allowed) if allowed else '(none)'}"
            )
    if cls is not None:
        return cls(input_shape, num_classes, **kwargs)
    return torchvision_model(key, _check_shape(input_shape), _check_classes(num_classes))


def feature_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The layers of the model's feature extractor, by module name: its ``features`` block where it has one (the
    workspace's models, torchvision's VGG, MobileNet, EfficientNet, DenseNet, ...; the tutorial's --layer_number
    indexes it), else its top-level modules (ResNet: conv1, bn1, relu, maxpool, layer1, ...)."""
    features = getattr(model, "features", None)
    if isinstance(features, nn.Module):
        return [(f"features.{n}", m) for n, m in features.named_children()]
    return list(model.named_children())
