"""Per-sample squared gradient norms by plain autograd, one sample at a time (works for any forward), and the rows'
squared norms, which both of audit.membership.gradient_norms' paths (torch.func, layer-wise) share.
"""

from __future__ import annotations

import torch

__all__ = ["MAX_CHUNK_GRAD_BYTES", "loop_squared_norms", "squared_rows"]

# vmap(grad) materialises one full gradient per sample of the chunk; cap a chunk's per-sample gradients at this many
# bytes so a large model (e.g. the ~23M-parameter tutorial net, ~93 MB per sample) cannot exhaust RAM whatever
# batch_size the caller picked.
MAX_CHUNK_GRAD_BYTES = 512 * 2**20
_SQUARES_TEMP_BYTES = 64 * 2**20  # squared_rows' temporary products, at most this or one row


def loop_squared_norms(sample_loss, trainable: dict, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Squared gradient norms one sample at a time with plain autograd (works for any forward)."""
    out = torch.empty(len(xs), dtype=torch.float64, device=xs.device)
    for i in range(len(xs)):
        params = {n: t.detach().requires_grad_() for n, t in trainable.items()}
        with torch.enable_grad():
            grads = torch.autograd.grad(sample_loss(params, xs[i], ys[i]), list(params.values()), allow_unused=True)
        out[i] = sum(float(squared_rows(g[None])) for g in grads if g is not None)
    return out


def squared_rows(t: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of each row t[i] (any shape after the first axis), float64 of shape (len(t),).

    In the tensor's dtype, without a float64 copy of it: a float32 dot product sums its products pairwise, so its
    error grows with the logarithm of a row's length, where torch.linalg.vector_norm's float32 accumulators lose the
    small terms of a long row (the tutorial net's fc2 has 16.8M-element rows); .double().pow(2).sum() is exact but
    copies the tensor in float64."""
    rows = t.reshape(len(t), -1)
    if rows.numel() * rows.element_size() <= _SQUARES_TEMP_BYTES:
        return torch.linalg.vecdot(rows, rows, dim=1).double()
    # The products are a temporary of the rows' size: one row at a time beyond the cap.
    return torch.stack([torch.linalg.vecdot(row, row, dim=0) for row in rows]).double()
