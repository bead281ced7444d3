"""Per-sample gradient norms of a classifier's loss, w.r.t. all its trainable parameters or one layer's.

For a Linear or Conv2d layer that sees one row per sample, sample i's gradient w.r.t. the weight is G_i^T A_i (A_i the
layer's input, unfolded into patches for a convolution; G_i the gradient of the sample's loss w.r.t. the layer's
output), so one batched forward and backward give every sample's norm without building per-sample gradients when the
Gram matrices are smaller ("ghost" norms, as opacus' fast gradient clipping does). Any other parameter, or a layer that
sees the batch folded into its rows or sequence-first, goes through torch.func (vmap of grad), or a per-sample autograd
loop when vmap cannot batch the forward. The first samples of the first call on a forward of a given structure are
checked against per-sample autograd.

Here: the parameters' names and the choice of path, and the torch.func path; the layer-wise path is
audit.membership.layerwise_norms, the per-sample autograd loop audit.membership.autograd_norms.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from audit.membership.autograd_norms import MAX_CHUNK_GRAD_BYTES, loop_squared_norms, squared_rows
from audit.membership.layerwise_norms import layerwise_norms, layerwise_targets
from audit.model_io import chunks, eval_mode

__all__ = ["gradient_parameter_names", "gradient_norms"]


def gradient_parameter_names(model: nn.Module, layer: str | None) -> list[str]:
    """Full names (as in model.named_parameters()) of the parameters to differentiate."""
    if layer is None:
        names = [name for name, p in model.named_parameters() if p.requires_grad]
        if not names:
            raise ValueError("the model has no trainable parameters")
        return names
    modules = dict(model.named_modules())
    owners = [name for name, m in modules.items() if name and any(p.requires_grad for p in m.parameters())]
    if layer not in modules:
        raise ValueError(f"unknown layer {layer!r}; modules with trainable parameters: {', '.join(owners)}")
    prefix = f"{layer}." if layer else ""
    # Take names from the root so they are exactly the keys functional_call expects (tied weights are listed once).
    names = [name for name, p in model.named_parameters() if p.requires_grad and name.startswith(prefix)]
    if not names:
        raise ValueError(
            f"layer {layer!r} ({type(modules[layer]).__name__}) has no trainable parameters; "
            f"modules with trainable parameters: {', '.join(owners)}"
        )
    return names


def gradient_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor, names: list[str], batch_size: int,
                    *, want_logits: bool = False) -> tuple[np.ndarray, torch.Tensor | None]:
    """Per-sample gradient norms w.r.t. the parameters `names`, and (if the layer-wise path ran and `want_logits`)
    the float64 logits of the same forward pass, else None."""
    with eval_mode(model), torch.no_grad():  # torch.func.grad and enable_grad() below still see gradients
        layers = layerwise_targets(model, names)
        if layers is not None:
            found = layerwise_norms(model, x, y, layers, batch_size, want_logits=want_logits)
            if found is not None:
                squared, logits = found
                return squared.sqrt().cpu().numpy(), logits
        return _functorch_squared_norms(model, x, y, names, batch_size).sqrt().cpu().numpy(), None


def _functorch_squared_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor, names: list[str],
                             batch_size: int) -> torch.Tensor:
    """Squared per-sample gradient norms by torch.func (vmap of grad), any model; float64 of shape (N,).

    Materialises every sample's full gradient: the general path, used when the layer-wise one does not apply.
    """
    wanted = set(names)
    # Detached copies share storage with the model but are outside autograd, so neither the parameters nor their
    # .grad fields can be touched; torch.func tracks the trainable ones itself.
    trainable = {n: p.detach() for n, p in model.named_parameters() if n in wanted}
    constants = {n: p.detach() for n, p in model.named_parameters() if n not in wanted}
    constants.update({n: b.detach() for n, b in model.named_buffers()})

    per_sample_elems = sum(p.numel() for p in trainable.values())
    elem_bytes = next(iter(trainable.values())).element_size()
    chunk = max(1, min(batch_size, MAX_CHUNK_GRAD_BYTES // max(1, per_sample_elems * elem_bytes)))

    def sample_loss(params, xi, yi):
        out = functional_call(model, (params, constants), (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    per_sample_grads = vmap(grad(sample_loss), in_dims=(None, 0, 0))

    def squared_norms_vmap(xs, ys):
        grads = per_sample_grads(trainable, xs, ys)
        return sum(squared_rows(g) for g in grads.values())

    def squared_norms_loop(xs, ys):
        return loop_squared_norms(sample_loss, trainable, xs, ys)

    result = torch.empty(x.shape[0], dtype=torch.float64, device=x.device)
    use_vmap = True
    for part in chunks(x.shape[0], chunk):
        vmap_error = None
        if use_vmap:
            try:
                result[part] = squared_norms_vmap(x[part], y[part])
                continue
            except (RuntimeError, NotImplementedError) as err:
                vmap_error = err
        # The loop is for forwards that only vmap cannot batch: in-place writes of batched values into fresh or
        # captured tensors, .item() / float() / data-dependent control flow, dynamic shapes (boolean masks,
        # nonzero), .tolist() (no storage), old-style autograd.Functions. torch raises these as RuntimeError with
        # no single type or prefix, so the test is the loop itself, outside the except block: an error that is not
        # vmap's (a wrong input shape or dtype) fails there too, on the first sample, and propagates with its own
        # message and no fallback warning.
        result[part] = squared_norms_loop(x[part], y[part])
        if vmap_error is not None:
            warnings.warn(
                f"gradient_norm_signal: torch.func.vmap failed ({vmap_error}); falling back to a per-sample "
                "autograd loop, which is slower",
                RuntimeWarning,
                stacklevel=4,
            )
            use_vmap = False
    return result
