"""Per-sample membership signals of a PyTorch classifier: loss, logit margin, gradient norm.

The "logits" signal is the margin of the true-class logit over the best other logit, z_y - max_{j!=y} z_j (the
"hinge" score of Carlini et al.'s LiRA). The scaled logit log(p_y / (1 - p_y)) is not used: it is a monotone function
of the loss, so a threshold attack on it has exactly the loss attack's ROC - the OpenFL tutorial's defect of a
"logits" signal that is the loss again. With three or more classes the margin ignores how the remaining probability
mass is spread over the other classes, so it ranks samples differently from the loss. With two classes it does not:
there the loss is softplus(-margin), a decreasing function of the margin, and both signals give the same ROC.

All signals are taken with the model in eval mode (no Dropout noise, BatchNorm running statistics), so two calls on
the same model and samples give the same values; the model's train/eval flags, parameters and ``.grad`` fields are
left as they were. Values are float64 numpy arrays of shape (N,), one per sample, in the order of the samples.

Per-sample gradient norms are computed in audit.membership.gradient_norms (layer-wise for Linear and Conv2d, torch.func
for the rest).

Inputs keep their kind: floating inputs are cast to the model's dtype, integer inputs (token ids for an Embedding)
stay integer (`model_input`).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from audit.config.vocabulary import MEMBER_IF_LOWER, SIGNALS
from audit.membership.gradient_norms import gradient_norms, gradient_parameter_names
from audit.model_io import check_batch_size, chunks, eval_mode, prepare
from audit.scaled_pixels import read_in_chunks





def _check_signal_name(signal: str) -> None:
    if signal not in SIGNALS:
        raise ValueError(f"unknown signal {signal!r}; valid signals: {', '.join(SIGNALS)}")


def member_if_lower(signal: str) -> bool:
    """True if members are expected to have lower values of `signal` than non-members."""
    _check_signal_name(signal)
    return MEMBER_IF_LOWER[signal]


def _logits(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Model outputs for all samples in float64, shape (N, C); eval mode, no autograd graph."""
    outs = []
    with eval_mode(model), torch.no_grad():
        for part in chunks(x.shape[0], batch_size):
            out = model(x[part])
            if not isinstance(out, torch.Tensor) or out.ndim != 2:
                raise ValueError("the model must return a logits tensor of shape (batch, classes)")
            outs.append(out.to(torch.float64))
    return torch.cat(outs)


def _loss_from_logits(logits: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    return F.cross_entropy(logits, y, reduction="none").cpu().numpy()


def _logit_margin_from_logits(logits: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    if logits.shape[1] < 2:
        raise ValueError("the logits (margin) signal needs a model with at least 2 classes")
    # Read off the raw logits, never the softmax: finite even when probabilities saturate to exactly 0 or 1.
    true_logit = logits.gather(1, y[:, None]).squeeze(1)
    others = logits.scatter(1, y[:, None], float("-inf"))
    return (true_logit - others.max(dim=1).values).cpu().numpy()


def loss_signal(model: nn.Module, x, y, *, batch_size: int = 256) -> np.ndarray:
    """Per-sample cross-entropy loss, float64 of shape (N,)."""
    x, y = prepare(model, x, y, batch_size)
    return _loss_from_logits(_logits(model, x, batch_size), y)


def logit_signal(model: nn.Module, x, y, *, batch_size: int = 256) -> np.ndarray:
    """Per-sample logit margin of the true class, z_y - max_{j != y} z_j, float64 of shape (N,)."""
    x, y = prepare(model, x, y, batch_size)
    return _logit_margin_from_logits(_logits(model, x, batch_size), y)


def gradient_norm_signal(model: nn.Module, x, y, *, layer: str | None = None, batch_size: int = 256) -> np.ndarray:
    """L2 norm of each sample's gradient of its own cross-entropy loss, float64 of shape (N,).

    With `layer=None` the gradient is taken w.r.t. all trainable parameters, otherwise only w.r.t. the parameters of
    the submodule named `layer` in model.named_modules() (e.g. "fc1", "features.10"); the other parameters are held
    constant, which skips their gradients.
    """
    x, y = prepare(model, x, y, batch_size)
    return gradient_norms(model, x, y, gradient_parameter_names(model, layer), batch_size)[0]


#: Rows of samples whose values are computed on read (ScaledPixels) converted at a time: 50 MB of CIFAR images.
CHUNK_ROWS = 4096


def _signals_in_chunks(model, x, y, names, *, layer, batch_size, timings, outputs) -> dict[str, np.ndarray]:
    """compute_signals over consecutive chunks of whole batches (the same batches, so the same values), each chunk's
    float32 values converted only for it: no float32 copy of a large set."""
    check_batch_size(batch_size)
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != len(x):
        raise ValueError(f"x must have shape (N, ...) and y shape (N,); got {tuple(x.shape)} and {tuple(y.shape)}")
    rows = max(1, CHUNK_ROWS // batch_size) * batch_size
    parts, seconds, logits = [], {}, []
    for start in range(0, len(x), rows):
        chunk_timings, chunk_outputs = {}, {}
        parts.append(compute_signals(model, x[start:start + rows], y[start:start + rows], names, layer=layer,
                                     batch_size=batch_size, timings=chunk_timings, outputs=chunk_outputs))
        for name, value in chunk_timings.items():
            seconds[name] = seconds.get(name, 0.0) + value
        if "logits" in chunk_outputs:
            logits.append(chunk_outputs["logits"])
    if timings is not None:
        timings.update(seconds)
    if outputs is not None and logits:
        outputs["logits"] = torch.cat(logits)
    return {name: np.concatenate([part[name] for part in parts]) for name in names}


def compute_signals(
    model: nn.Module, x, y, names: Sequence[str], *, layer: str | None = None, batch_size: int = 256,
    timings: dict | None = None, outputs: dict | None = None,
) -> dict[str, np.ndarray]:
    """Signals named in `names` (from SIGNALS), in that order; `layer` applies to gradient_norm only.

    Ask for several signals in one call: loss and logits share one forward pass, and when the gradient norm is
    taken layer-wise (Linear / Conv2d parameters) its forward pass gives them too. A `timings` dict gets the
    seconds spent per signal: a forward pass shared with the gradient norm counts as gradient_norm's, one shared by
    loss and logits only as the first of them's. An `outputs` dict gets the model's outputs (float64, (N, C)) under
    "logits" when a forward pass gave them (loss or logits asked for), e.g. for the accuracy on the same samples.
    """
    if isinstance(names, str):
        names = [names]
    for name in names:
        _check_signal_name(name)
    if read_in_chunks(x) and len(x) > CHUNK_ROWS:
        return _signals_in_chunks(model, x, y, names, layer=layer, batch_size=batch_size, timings=timings,
                                  outputs=outputs)
    x, y = prepare(model, x, y, batch_size)
    want_logits = bool({"loss", "logits"} & set(names))
    seconds = {name: 0.0 for name in names}
    norms = logits = None
    if "gradient_norm" in names:
        start = time.perf_counter()
        # The layer-wise gradient path runs the forward pass anyway: loss and logits come from it when it applies.
        norms, logits = gradient_norms(model, x, y, gradient_parameter_names(model, layer), batch_size,
                                        want_logits=want_logits)
        seconds["gradient_norm"] += time.perf_counter() - start
    out: dict[str, np.ndarray] = {}
    for name in names:
        start = time.perf_counter()
        if name in ("loss", "logits") and logits is None:
            logits = _logits(model, x, batch_size)  # one forward for both
        if name == "loss":
            out[name] = _loss_from_logits(logits, y)
        elif name == "logits":
            out[name] = _logit_margin_from_logits(logits, y)
        else:
            out[name] = norms
        seconds[name] += time.perf_counter() - start
    if timings is not None:
        timings.update(seconds)
    if outputs is not None and logits is not None:
        outputs["logits"] = logits
    return out
