"""The image a party keeps of a Fidel audit: revealed samples beside their reconstructions (private: it stays in the
party's own report folder)."""

from __future__ import annotations

import math

import numpy as np

from audit.fidel.attack import FidelResult
from audit.fidel.layers import as_samples

__all__ = ["save_reveal_grid"]



def _display(img: np.ndarray) -> tuple[np.ndarray, str | None]:
    """A 2-D image (and colormap) from (C, H, W) / (H, W) / (d,) values."""
    img = np.asarray(img, dtype=np.float64)
    if img.ndim == 3 and img.shape[0] == 3:
        lo, hi = img.min(), img.max()
        return (img.transpose(1, 2, 0) - lo) / (hi - lo if hi > lo else 1.0), None
    if img.ndim == 3:  # one channel, or an activation map: the channel mean
        return img.mean(axis=0), "gray"
    if img.ndim == 1:
        side = math.isqrt(img.size)
        return (img.reshape(side, side) if side * side == img.size else img[None, :]), "gray"
    return img, "gray"


def save_reveal_grid(result: FidelResult, samples, path, *, max_samples: int = 24, include_unrevealed: bool = False):
    """Write a PNG of revealed samples (top) beside their reconstructions (below), each labelled with r.

    For a CNN the reconstruction row shows the decoder output when the audit had a decoder, else the channel
    mean of the activation-map reconstruction.  With no revealed sample the best matches are shown instead
    (titled so).  Atomic write (:func:`audit.reporting.atomic_io.atomic_savefig`); returns the path.
    """
    from matplotlib.figure import Figure

    from audit.reporting.atomic_io import atomic_savefig

    x = as_samples(samples).detach().cpu().numpy()
    if x.shape[0] != result.n_samples:
        raise ValueError(f"samples: {x.shape[0]} given but the result is for {result.n_samples}")
    if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 1:
        raise ValueError(f"max_samples: must be a positive integer, got {max_samples!r}")
    use_decoded = result.space == "activation" and result.match_decoded is not None
    mask = result.revealed_decoded_mask if use_decoded else result.revealed_union_mask
    scores = result.match_decoded_r if use_decoded else result.match_r
    idx = np.flatnonzero(mask)
    title = f"{result.layer}: {int(mask.sum())} of {result.n_samples} samples revealed (r >= {result.threshold:g})"
    if idx.size == 0 or include_unrevealed:
        idx = np.argsort(-scores, kind="stable")
        if not mask.any():
            title += "; best matches shown"
    idx = idx[:max_samples]
    cols = max(1, len(idx))
    fig = Figure(figsize=(1.2 * cols + 0.6, 3.0), layout="constrained")
    axes = fig.subplots(2, cols, squeeze=False)
    label = "decoded" if use_decoded else ("reconstruction" if result.space == "input" else "activation (mean)")
    for j, s in enumerate(idx):
        img, cmap = _display(x[s])
        axes[0, j].imshow(img, cmap=cmap)
        axes[0, j].set_title(f"sample {s}", fontsize=7)
        rec = result.match_decoded[s] if use_decoded else result.match_reconstruction[s]
        rimg, rcmap = _display(rec)
        # Same grey scale as the sample where both are images in the same space, so contrast differences show.
        same_space = use_decoded or result.space == "input"
        lim = dict(vmin=img.min(), vmax=img.max()) if same_space and cmap and rimg.shape == img.shape else {}
        axes[1, j].imshow(rimg, cmap=rcmap, **lim)
        src = "" if use_decoded or result.match_source[s] == "neuron" else " ica"
        axes[1, j].set_title(f"r={scores[s]:.3f}{src}", fontsize=7, color="black" if mask[s] else "gray")
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0, 0].set_ylabel("sample", fontsize=8)
    axes[1, 0].set_ylabel(label, fontsize=8)
    fig.suptitle(title, fontsize=8)
    return atomic_savefig(fig, path, dpi=100, private=True)  # the members it reveals: only their owner reads it
