"""Per-sample gradient norms of a Linear or Conv2d layer's parameters from one batched forward and backward ("ghost"
norms, as opacus' fast gradient clipping computes them), checked once per forward structure against per-sample
autograd; audit.membership.gradient_norms takes this path where it applies and the general one otherwise.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from audit.membership.autograd_norms import MAX_CHUNK_GRAD_BYTES, loop_squared_norms, squared_rows
from audit.model_io import chunks

__all__ = ["layerwise_targets", "layerwise_norms"]

# ---------------------------------------------------------------- layer-wise per-sample gradient norms
#
# For a Linear or Conv2d layer, sample i's gradient w.r.t. the weight is G_i^T A_i, where A_i holds the layer's
# input (Conv2d: unfolded into patches, one row per output position) and G_i the gradient of the sample's loss w.r.t.
# the layer's output (one row per position); w.r.t. the bias it is the column sums of G_i. One batched forward and a
# backward to the layer's output give every G_i (samples do not interact in eval mode; the loss and logits signals
# batch on the same assumption), so no per-sample weight gradient is ever built when the "ghost" identity
# ||G^T A||_F^2 = <A A^T, G G^T> is cheaper: for the tutorial's conv5 (16 positions) that is 16x16 Gram matrices
# instead of 590k gradient entries per sample. Layers after the audited one are differentiated w.r.t. their inputs
# only, layers before it not at all.

_LAYERWISE_TYPES = (nn.Linear, nn.Conv2d)
_PROBE_SAMPLES = 4  # first samples of a model's first call checked against one-sample-at-a-time autograd
_PROBE_RTOL = 1e-3
# Forwards whose layer-wise norms matched per-sample autograd in this process (see _forward_signature). What the probe
# catches (samples that interact, a weight used outside its layer, a layer run sequence-first) is the forward's
# structure, not its weights: the audit calls this for two models of one structure, three sets each, every round,
# and the probe was a third of a call's time with all parameters (float64 per-sample gradients of the whole net).
_VERIFIED: dict[tuple, None] = {}
_VERIFIED_MAX = 256


def layerwise_targets(model: nn.Module, names: list[str]) -> dict[str, tuple[nn.Module, tuple[str, ...]]] | None:
    """module name -> (module, its wanted parameter attributes) if every wanted parameter is the weight or bias of a
    plain Linear / Conv2d (exact types: a subclass may change the forward) that no other module shares; else None."""
    modules = dict(model.named_modules())
    owners: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        owners[id(p)] = owners.get(id(p), 0) + 1
    targets: dict[str, list[str]] = {}
    for name in names:
        module_name, _, attr = name.rpartition(".")
        module = modules.get(module_name)
        if type(module) not in _LAYERWISE_TYPES or attr not in ("weight", "bias"):
            return None
        if owners.get(id(getattr(module, attr)), 0) != 1:  # tied weights: the layer's output is not all of it
            return None
        if isinstance(module, nn.Conv2d) and (
            module.groups != 1 or module.padding_mode != "zeros" or isinstance(module.padding, str)
        ):
            return None
        targets.setdefault(module_name, []).append(attr)
    return {name: (modules[name], tuple(attrs)) for name, attrs in targets.items()}


def _patches(module: nn.Module, inp: torch.Tensor) -> torch.Tensor | None:
    """The layer's input as (B, positions, in_features): what its weight multiplies at each output position."""
    if isinstance(module, nn.Linear):
        return inp.reshape(inp.shape[0], -1, inp.shape[-1]) if inp.ndim >= 2 else None
    if inp.ndim != 4:
        return None
    return _conv_patches(inp, module.kernel_size, module.stride, module.padding, module.dilation)


def _conv_patches(inp: torch.Tensor, kernel_size, stride, padding, dilation) -> torch.Tensor:
    """F.unfold(inp, ...).transpose(1, 2), (B, positions, C * kh * kw), the same values in the same order.

    Built from strided views (F.pad, Tensor.unfold) and one copy: F.unfold's im2col opens a parallel region per
    sample, whose start-up cost grows with the machine's load, where the views do the same work without one."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, padding, dilation
    x = F.pad(inp, (pw, pw, ph, ph)) if ph or pw else inp
    # A window of the dilated kernel's extent at every output position: (B, C, oh, ow, extent_h, extent_w).
    windows = x.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)
    windows = windows[..., ::dh, ::dw]  # the kernel's taps: (B, C, oh, ow, kh, kw)
    b, c, oh, ow = windows.shape[:4]
    # F.unfold's (B, C * kh * kw, positions) in its memory layout, features in its order (c, i, j), positions
    # row-major; transposed as the caller did, so every later product sums in the same order (bit-identical norms).
    return windows.permute(0, 1, 4, 5, 2, 3).reshape(b, c * kh * kw, oh * ow).transpose(1, 2)


def _squared_layer_norms(module: nn.Module, attrs: tuple[str, ...], inp: torch.Tensor, grad_out: torch.Tensor,
                         batch: int) -> torch.Tensor | None:
    """Per-sample squared norms of the gradient w.r.t. the layer's `attrs`, float64 (batch,); None if the layer
    does not see one row per sample of the `batch` or shapes are odd."""
    # The identities below read row i of the layer's input and output gradient as sample i's. A layer that sees the
    # batch folded into its rows (x.reshape(B * T, D)) or sequence-first ((T, B, D)) breaks that: leave it to the
    # general path. (T == B sequence-first passes this check; the probe against per-sample autograd catches it.)
    if inp.ndim < 2 or inp.shape[0] != batch or grad_out.ndim < 2 or grad_out.shape[0] != batch:
        return None
    b = batch
    if isinstance(module, nn.Conv2d):
        if inp.ndim != 4:
            return None
        g = grad_out.reshape(b, grad_out.shape[1], -1).transpose(1, 2)  # (B, O, P) -> (B, P, O)
        kh, kw = module.kernel_size
        positions, k = g.shape[1], inp.shape[1] * kh * kw

        def patches(dtype):  # built in the dtype they are used in: one copy of the (large) patches, not two
            return _patches(module, inp.to(dtype))
    else:
        a = _patches(module, inp)
        if a is None:
            return None
        g = grad_out.reshape(b, -1, grad_out.shape[-1])
        positions, k = a.shape[1], a.shape[2]

        def patches(dtype):
            return a.to(dtype)
    if g.shape[1] != positions:
        return None
    total = torch.zeros(b, dtype=torch.float64, device=g.device)
    if "bias" in attrs:
        total += torch.linalg.vector_norm(g.sum(dim=1), dim=1).double() ** 2
    if "weight" not in attrs:
        return total
    o = g.shape[2]
    if positions == 1:  # a plain Linear: ||g a^T||^2 = ||g||^2 ||a||^2
        a = patches(inp.dtype)
        total += (torch.linalg.vector_norm(a[:, 0], dim=1).double() ** 2
                  * torch.linalg.vector_norm(g[:, 0], dim=1).double() ** 2)
    elif positions * (k + o) < k * o:  # the Gram matrices are smaller than the gradient
        a64, g64 = patches(torch.float64), g.double()  # float64: the inner product of the two Grams may cancel
        if a64.shape[1:] != (positions, k):
            return None
        total += (torch.bmm(a64, a64.transpose(1, 2)) * torch.bmm(g64, g64.transpose(1, 2))).sum(dim=(1, 2))
    else:  # build the per-sample weight gradients (B, O, K), as few samples at a time as the byte cap needs
        a = patches(inp.dtype)
        if a.shape[1:] != (positions, k):
            return None
        step = max(1, MAX_CHUNK_GRAD_BYTES // max(1, k * o * a.element_size()))
        for part in chunks(b, step):
            total[part] += squared_rows(torch.bmm(g[part].transpose(1, 2), a[part]))
    return total


def layerwise_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor, layers: dict, batch_size: int,
                     *, want_logits: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Squared per-sample gradient norms (float64, (N,)) and the float64 logits if `want_logits`; None if the
    forward does not fit the layer-wise computation (a layer called twice or never, an in-place change of a layer's
    input, a layer that does not see one row per sample, an output that is not (batch, classes) logits) or if it
    disagrees with per-sample autograd on the first samples (e.g. samples that interact in the forward, a weight
    also used outside its layer): the caller then takes the general path."""
    # All parameters and buffers detached: autograd starts at the audited layers' outputs, nothing reaches the model.
    state = {n: p.detach() for n, p in model.named_parameters()}
    state.update({n: b.detach() for n, b in model.named_buffers()})
    signature = _forward_signature(model, x, layers)
    # Before the hooks below change the forward.
    reference = None if signature in _VERIFIED else _probe_reference(model, state, x, y, layers)
    captured: dict[str, list] = {}
    # An in-place op after an audited layer (ReLU(inplace=True)) must not change the tensor whose gradient is read.
    # Later layers get the layer's own output until one such op shows (it raises on the graph's leaf, or bumps the
    # output's version counter); the chunk is then run again with copies, and so are the next ones. The copies were
    # a tenth of the time with all parameters of the tutorial's net, which has no in-place op.
    clone_outputs = [False]

    def hook_for(name):
        def hook(module, inputs, output):
            if not isinstance(output, torch.Tensor) or not inputs or not isinstance(inputs[0], torch.Tensor):
                captured.setdefault(name, []).extend([None, None])  # unusable: marks the call as failed
                return None
            # Downstream of another audited layer the output is already in the graph; else it starts one.
            z = output if output.requires_grad else output.detach().requires_grad_()
            captured.setdefault(name, []).append((inputs[0], inputs[0]._version, z, z._version))
            return z.clone() if clone_outputs[0] else z
        return hook

    def forward(xs):
        """The model's output on xs, the audited layers' captures in `captured`; redone with copies of the layers'
        outputs if an in-place op changed one."""
        for _ in range(2):
            captured.clear()
            try:
                out = functional_call(model, state, (xs,))
            except RuntimeError:
                if clone_outputs[0]:
                    raise
                clone_outputs[0] = True  # e.g. "a leaf Variable that requires grad is being used in an in-place op"
                continue
            if clone_outputs[0] or all(entry is None or entry[2]._version == entry[3]
                                       for entries in captured.values() for entry in entries):
                return out
            clone_outputs[0] = True
        raise AssertionError("unreachable: the second pass copies every output")

    handles = [module.register_forward_hook(hook_for(name)) for name, (module, _) in layers.items()]
    squared = torch.empty(x.shape[0], dtype=torch.float64, device=x.device)
    parts = []
    try:
        for part in chunks(x.shape[0], batch_size):
            with torch.enable_grad():
                out = forward(x[part])
                if (not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != part.stop - part.start
                        or not out.requires_grad):
                    return None
                if any(len(captured.get(name, ())) != 1 for name in layers):
                    return None
                outputs = [captured[name][0][2] for name in layers]
                # The sum of the samples' own losses: its gradient w.r.t. sample i's layer output is sample i's.
                loss = F.cross_entropy(out, y[part], reduction="sum")
                grads = torch.autograd.grad(loss, outputs, allow_unused=True)
            total = torch.zeros(part.stop - part.start, dtype=torch.float64, device=x.device)
            for (name, (module, attrs)), g in zip(layers.items(), grads):
                inp, version, _, _ = captured[name][0]
                if inp._version != version:
                    return None
                if g is None:  # the layer does not reach the loss: zero gradient
                    continue
                layer_sq = _squared_layer_norms(module, attrs, inp.detach(), g, part.stop - part.start)
                if layer_sq is None:
                    return None
                total += layer_sq
            squared[part] = total
            if want_logits:
                parts.append(out.detach().to(torch.float64))
    finally:
        for handle in handles:
            handle.remove()
        captured.clear()
    if reference is not None:
        got = squared[: len(reference)].sqrt()
        if not torch.allclose(got, reference, rtol=_PROBE_RTOL, atol=_PROBE_RTOL * float(reference.max())):
            warnings.warn(
                "gradient_norm_signal: layer-wise per-sample gradient norms disagree with per-sample autograd on the "
                f"first samples ({got.tolist()} vs {reference.tolist()}): does the forward mix samples, use the "
                "layer's weights elsewhere or run the layer sequence-first? Using torch.func instead",
                RuntimeWarning,
                stacklevel=5,
            )
            return None
        if len(_VERIFIED) >= _VERIFIED_MAX:
            _VERIFIED.pop(next(iter(_VERIFIED)))
        _VERIFIED[signature] = None
    return squared, (torch.cat(parts) if want_logits else None)


def _forward_signature(model: nn.Module, x: torch.Tensor, layers: dict) -> tuple:
    """What decides whether the layer-wise norms hold for this forward, weights aside: the model's class, every
    submodule's name, class, hyper-parameters (extra_repr), train/eval flag, own `forward` and hooks, the parameters'
    and buffers' names, shapes, dtypes and trainability, the audited parameters, and the samples' shape, dtype and
    device. Two models that agree on all of it run the same computation on different weights."""
    modules = tuple(
        (name, type(m), m.extra_repr(), m.training, m.__dict__.get("forward"),
         tuple(m._forward_hooks.values()), tuple(m._forward_pre_hooks.values()),
         tuple(m._backward_hooks.values()), tuple(m._backward_pre_hooks.values()))
        for name, m in model.named_modules()
    )
    tensors = tuple((n, tuple(t.shape), t.dtype, t.requires_grad)
                    for n, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers()))
    audited = tuple((name, attrs) for name, (_, attrs) in layers.items())
    return (modules, tensors, audited, tuple(x.shape[1:]), x.dtype, x.device)


def _probe_reference(model: nn.Module, state: dict, x: torch.Tensor, y: torch.Tensor, layers: dict) -> torch.Tensor:
    """Gradient norms of the first few samples by one-sample-at-a-time autograd, to check the layer-wise ones."""
    names = [f"{name}.{attr}" if name else attr for name, (_, attrs) in layers.items() for attr in attrs]
    trainable = {n: state[n] for n in names}
    constants = {n: t for n, t in state.items() if n not in trainable}

    def sample_loss(params, xi, yi):
        out = functional_call(model, (params, constants), (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    k = min(_PROBE_SAMPLES, x.shape[0])
    return loop_squared_norms(sample_loss, trainable, x[:k], y[:k]).sqrt()
