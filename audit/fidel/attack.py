"""First Dense Layer Attack (Fidel): how many of a round's training samples one model update gives away.

For a dense layer y = W a + b, the gradient of neuron i is g_i * a (weights) and g_i (bias), so a neuron that
only one sample moved reveals that sample's input exactly: a = dW_i / db_i, whatever the learning rate (Phong et
al.; Enthoven & Al-Ars, "Fidel").  With several samples, dW_i / db_i is the g-weighted average of the inputs of the
samples that moved neuron i; it is one sample outright when one gradient dominates (ReLU and Dropout make that
likely).  For an FCNN the first dense layer's input is the image; for a CNN it is the activation map feeding that
layer (a "partial reconstruction").

This module is the data owner's audit (it knows the round's training samples, an attacker does not):

* audit.fidel.layers: ``dense_update`` - dW (out x in) and db (out) of the first dense layer, local minus received
  global weights; ``reconstruct`` - dW_i / db_i for every neuron with a non-negligible |db_i|;
* audit.fidel.scoring: ``pearson_matrix`` - Pearson r of every reconstruction with every sample, in one matrix
  product; ``count_revealed`` - one-to-one matching of reconstructions to samples, pairs with r >= threshold;
  ``ica_components`` - blind source separation (FastICA) of the reconstructions, to un-mix samples that share neurons
  (the Cocktail Party Attack's idea, which the Fidel paper names as future work);
* here: :func:`fidel_audit` - all of it for one update, as a :class:`FidelResult`;
* audit.fidel.grid: ``save_reveal_grid`` - a PNG of the revealed samples beside their reconstructions.

A CNN's activation-map reconstructions can be mapped back to pixels with a decoder trained on population data
(:mod:`audit.fidel.decoder`); pass it as ``decoder=`` to also get pixel-level counts.

Exactness: dW_i / db_i is exact for one plain-SGD step (momentum keeps it, being linear in the gradients); over
several steps a reconstruction mixes the inputs as each step saw them (for a CNN the activations drift as the conv
weights move), and weight decay adds a lambda * W term that is no sample at all.

Cost per update: one forward pass of the round's samples up to the layer, one (k x d) by (d x n) product, a linear
assignment of at most k x n, and FastICA (more for the CNN, whose activation maps hold 512 values); a decoder fit
adds one ridge regression per round (benchmarks/bench_fidel.py times them).

Knows nothing about OpenFL: weights come in as ``nn.Module`` or state dicts (tensors or numpy arrays).
"""

from __future__ import annotations

import copy
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from audit.config.fidel_settings import DEFAULT_THRESHOLD
from audit.fidel.layers import (DEFAULT_MIN_REL_BIAS, as_samples, _state, dense_update, find_first_dense_layer,
                                layer_inputs, reconstruct)
from audit.fidel.scoring import (affine_fit, check_fraction, count_revealed, fit_psnr, numerical_rank, pearson_matrix,
                                 spatial_differences)
from audit.fidel.scoring import ica_components as ica_components_fn  # fidel_audit has a keyword of that name

__all__ = [
    "FidelResult",
    "fidel_audit",
]

#: Scalar metric names reported to the federation (see :meth:`FidelResult.metrics`).
# ----------------------------------------------------------------------------- the audit


def _stat(values: np.ndarray, fn: Callable) -> float | None:
    values = values[np.isfinite(values)]
    return float(fn(values)) if values.size else None


@dataclass(frozen=True, eq=False)  # eq=False: numpy array fields
class FidelResult:
    """One update's Fidel audit.

    Counts are distinct samples (one-to-one matching).  ``space`` is "input" when the first dense layer sees the
    samples themselves (FCNN) and "activation" when it sees an activation map (CNN); the ``*_decoded`` fields are
    pixel-level scores of a decoder's output (None without a decoder).  Per-sample arrays are in sample order;
    ``match_*`` describe each sample's best reconstruction (plain neuron, or ICA component if that is better),
    fitted to the sample's scale, for display.
    """

    layer: str
    space: str
    n_samples: int
    n_neurons: int
    n_neurons_used: int
    threshold: float
    revealed: int
    revealed_ica: int | None
    revealed_union: int
    revealed_decoded: int | None
    mean_best_r: float
    mean_best_r_ica: float | None
    mean_best_r_decoded: float | None
    ica_components: int
    reconstruction_shape: tuple
    # arrays
    neuron_index: np.ndarray = field(repr=False)  # (k,) neurons used
    best_r: np.ndarray = field(repr=False)  # (n,) max r over neuron reconstructions
    best_r_ica: np.ndarray | None = field(repr=False)  # (n,) max |r| over ICA components
    best_r_decoded: np.ndarray | None = field(repr=False)  # (n,) max pixel r over decoded reconstructions
    revealed_mask: np.ndarray = field(repr=False)  # (n,) bool, plain
    revealed_ica_mask: np.ndarray | None = field(repr=False)
    revealed_decoded_mask: np.ndarray | None = field(repr=False)
    match_r: np.ndarray = field(repr=False)  # (n,) r of the match shown (|r| for ICA)
    match_source: np.ndarray = field(repr=False)  # (n,) "neuron" | "ica"
    match_reconstruction: np.ndarray = field(repr=False)  # (n, *reconstruction_shape), fitted a*rec+b
    match_decoded: np.ndarray | None = field(repr=False)  # (n, *sample shape) decoder output of the neuron match
    match_decoded_r: np.ndarray | None = field(repr=False)  # (n,) pixel r of match_decoded
    psnr: np.ndarray = field(repr=False)  # (n,) dB of each sample's match, in `space`
    psnr_decoded: np.ndarray | None = field(repr=False)  # (n,) dB of match_decoded, in pixels

    @property
    def revealed_fraction(self) -> float:
        return self.revealed / self.n_samples

    @property
    def revealed_union_mask(self) -> np.ndarray:
        mask = self.revealed_mask.copy()
        if self.revealed_ica_mask is not None:
            mask |= self.revealed_ica_mask
        return mask

    def metrics(self) -> dict[str, float]:
        """The federation's scalars (:data:`FIDEL_METRICS`).

        ``fidel_revealed_fraction_ica`` is the fraction an attacker who also un-mixes gets: samples revealed by a
        neuron *or* an ICA component (revealed_union / n_samples).
        """
        return {
            "fidel_revealed_fraction": self.revealed / self.n_samples,
            "fidel_revealed_fraction_ica": self.revealed_union / self.n_samples,
            "fidel_mean_best_r": self.mean_best_r,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able scalars (no NaN: missing values are None)."""
        n = self.n_samples
        rev = self.revealed_union_mask
        d = {
            "layer": self.layer,
            "space": self.space,
            "n_samples": n,
            "n_neurons": self.n_neurons,
            "n_neurons_used": self.n_neurons_used,
            "threshold": self.threshold,
            "revealed": self.revealed,
            "revealed_fraction": self.revealed / n,
            "revealed_ica": self.revealed_ica,
            "revealed_fraction_ica": None if self.revealed_ica is None else self.revealed_ica / n,
            "revealed_union": self.revealed_union,
            "revealed_fraction_union": self.revealed_union / n,
            "revealed_decoded": self.revealed_decoded,
            "revealed_fraction_decoded": None if self.revealed_decoded is None else self.revealed_decoded / n,
            "ica_components": self.ica_components,
            "mean_best_r": self.mean_best_r,
            "mean_best_r_ica": self.mean_best_r_ica,
            "mean_best_r_decoded": self.mean_best_r_decoded,
            "psnr_mean": _stat(self.psnr, np.mean),
            "psnr_median": _stat(self.psnr, np.median),
            "psnr_min": _stat(self.psnr, np.min),
            "psnr_max": _stat(self.psnr, np.max),
            "psnr_revealed_mean": _stat(self.psnr[rev], np.mean),
            "psnr_decoded_mean": None if self.psnr_decoded is None else _stat(self.psnr_decoded, np.mean),
        }
        d.update(self.metrics())
        return d


def _global_net(global_weights, model: nn.Module | None) -> nn.Module:
    if isinstance(global_weights, nn.Module):
        return global_weights
    if model is None or not isinstance(model, nn.Module):
        raise ValueError("model: needed (an nn.Module of the architecture) when global_weights is a state dict")
    state = _state(global_weights, "global_weights")
    net = copy.deepcopy(model)
    tensors = {k: torch.as_tensor(np.asarray(v) if not isinstance(v, torch.Tensor) else v) for k, v in state.items()}
    try:
        missing, unexpected = net.load_state_dict(tensors, strict=False)
    except RuntimeError as e:  # a shape mismatch
        raise ValueError(f"global_weights do not fit the model: {e}") from e
    params = {n for n, _ in net.named_parameters()}
    missing = [k for k in missing if k in params]
    if missing or unexpected:
        raise ValueError(
            f"global_weights do not fit the model: missing {missing or 'none'}, unexpected {unexpected or 'none'}"
        )
    return net


def fidel_audit(
    global_weights,
    local_weights,
    samples,
    *,
    model: nn.Module | None = None,
    layer: str | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    min_rel_bias: float = DEFAULT_MIN_REL_BIAS,
    ica: bool = True,
    ica_components: int | None = None,
    ica_rank_rtol: float = 1e-3,
    ica_max_iter: int = 400,
    seed: int = 0,
    decoder: Callable[[np.ndarray], np.ndarray] | None = None,
    batch_size: int = 256,
) -> FidelResult:
    """Audit one update: how many of ``samples`` (the round's training inputs, (N, C, H, W)) it reveals.

    * ``global_weights``: the received global model (nn.Module) or its state dict (then ``model`` gives the
      architecture); ``local_weights``: the locally trained model or state dict.
    * ``layer``: the dense layer to attack; default the first nn.Linear in forward order.
    * Reconstructions are scored against the samples' inputs of that layer under the global model (the image for
      an FCNN, the activation map for a CNN).  ``threshold``: Pearson r of a full reveal (paper: 0.98).
    * ``min_rel_bias``: neurons with |db_i| <= min_rel_bias * max |db| are skipped.
    * ``ica``: also un-mix with FastICA (seeded by ``seed``) into ``ica_components`` sources (default: the numerical
      rank of the reconstructions at relative tolerance ``ica_rank_rtol``, at most N and values - 1); sources have
      no sign, so they are scored by |r|.  ``ica_max_iter`` bounds FastICA's iterations (and the cost).
    * ``decoder``: callable mapping layer inputs (k, in) to samples (k, C, H, W) (e.g. :mod:`audit.fidel.decoder`);
      adds pixel-level scores of the decoded neuron reconstructions.
    """
    threshold = check_fraction("threshold", threshold, low=0, high=1, low_open=True, high_open=False)
    check_fraction("min_rel_bias", min_rel_bias, low=0, high=1, low_open=False, high_open=True)
    check_fraction("ica_rank_rtol", ica_rank_rtol, low=0, high=1, low_open=True, high_open=True)
    for name, value in (("ica_max_iter", ica_max_iter), ("ica_components", ica_components)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    x = as_samples(samples)
    n = x.shape[0]
    net = _global_net(global_weights, model)
    layer = find_first_dense_layer(net, x[:1], layer)
    dw, db = dense_update(global_weights, local_weights, layer)
    feats, rec_shape = layer_inputs(net, layer, x, batch_size=batch_size)
    if feats.shape[1] != dw.shape[1]:
        raise ValueError(f"layer {layer!r}: update has {dw.shape[1]} inputs but the model feeds it {feats.shape[1]}")
    x_flat = x.detach().to(torch.float64).reshape(n, -1).cpu().numpy()
    space = "input" if feats.shape == x_flat.shape and np.allclose(feats, x_flat) else "activation"

    recs, used = reconstruct(dw, db, min_rel_bias)
    corr = pearson_matrix(recs, feats)  # (k, n)
    best_r = corr.max(axis=0) if len(recs) else np.zeros(n)
    best_idx = corr.argmax(axis=0) if len(recs) else np.zeros(n, dtype=int)
    rows, cols = count_revealed(corr, threshold)
    revealed_mask = np.zeros(n, dtype=bool)
    revealed_mask[cols] = True
    # The reconstruction shown for a sample: its one-to-one match if revealed, else its best neuron.
    match_idx = best_idx.copy()
    match_idx[cols] = rows
    match_r = corr[match_idx, np.arange(n)] if len(recs) else np.zeros(n)
    match_rec = recs[match_idx] if len(recs) else np.zeros_like(feats)
    match_source = np.full(n, "neuron", dtype=object)

    best_r_ica = ica_mask = None
    n_comp = 0
    if ica and len(recs) >= 1:
        cap = min(n, len(recs), spatial_differences(recs[:1], rec_shape).shape[1] - 1)
        n_comp = min(cap, numerical_rank(recs, ica_rank_rtol)) if ica_components is None else ica_components
        if n_comp >= 1:
            sources = ica_components_fn(recs, n_comp, shape=rec_shape, seed=seed, max_iter=ica_max_iter)
            corr_ica = np.abs(pearson_matrix(sources, feats))
            best_r_ica = corr_ica.max(axis=0)
            _, icols = count_revealed(corr_ica, threshold)
            ica_mask = np.zeros(n, dtype=bool)
            ica_mask[icols] = True
            # Show the ICA source where it beats the sample's neuron match (sign is fitted by affine_fit).
            better = (best_r_ica > match_r) & ~revealed_mask
            if better.any():
                src = sources[corr_ica.argmax(axis=0)]
                match_rec = np.where(better[:, None], src, match_rec)
                match_r = np.where(better, best_r_ica, match_r)
                match_source[better] = "ica"
    if ica and best_r_ica is None:  # nothing to un-mix (no neuron moved): ICA reveals nothing either
        best_r_ica, ica_mask = np.zeros(n), np.zeros(n, dtype=bool)

    best_r_dec = dec_mask = match_dec = match_dec_r = None
    if decoder is not None:
        if getattr(decoder, "layer", layer) != layer:
            raise ValueError(f"decoder: was trained for layer {decoder.layer!r}, the audit attacks {layer!r}")
        sample_shape = tuple(x.shape[1:])
        if len(recs):
            decoded = np.asarray(decoder(recs), dtype=np.float64).reshape(len(recs), -1)
            if decoded.shape[1] != x_flat.shape[1]:
                raise ValueError(
                    f"decoder: returns {decoded.shape[1]} values per reconstruction, samples have {x_flat.shape[1]}"
                )
            corr_dec = pearson_matrix(decoded, x_flat)
            best_r_dec = corr_dec.max(axis=0)
            drows, dcols = count_revealed(corr_dec, threshold)
            dec_idx = corr_dec.argmax(axis=0)
            dec_idx[dcols] = drows
            match_dec_r = corr_dec[dec_idx, np.arange(n)]
            match_dec = decoded[dec_idx].reshape((n,) + sample_shape)
        else:
            dcols = np.zeros(0, dtype=int)
            best_r_dec = match_dec_r = np.zeros(n)
            match_dec = np.zeros((n,) + sample_shape)
        dec_mask = np.zeros(n, dtype=bool)
        dec_mask[dcols] = True

    union = revealed_mask | ica_mask if ica_mask is not None else revealed_mask
    return FidelResult(
        layer=layer,
        space=space,
        n_samples=n,
        n_neurons=int(dw.shape[0]),
        n_neurons_used=int(len(used)),
        threshold=threshold,
        revealed=int(revealed_mask.sum()),
        revealed_ica=None if ica_mask is None else int(ica_mask.sum()),
        revealed_union=int(union.sum()),
        revealed_decoded=None if dec_mask is None else int(dec_mask.sum()),
        mean_best_r=float(best_r.mean()),
        mean_best_r_ica=None if best_r_ica is None else float(best_r_ica.mean()),
        mean_best_r_decoded=None if best_r_dec is None else float(best_r_dec.mean()),
        ica_components=int(n_comp),
        reconstruction_shape=tuple(rec_shape),
        neuron_index=used,
        best_r=best_r,
        best_r_ica=best_r_ica,
        best_r_decoded=best_r_dec,
        revealed_mask=revealed_mask,
        revealed_ica_mask=ica_mask,
        revealed_decoded_mask=dec_mask,
        match_r=match_r,
        match_source=match_source,
        match_reconstruction=affine_fit(match_rec, feats).reshape((n,) + tuple(rec_shape)),
        match_decoded=match_dec,
        match_decoded_r=match_dec_r,
        psnr=fit_psnr(match_r, feats),
        psnr_decoded=None if match_dec_r is None else fit_psnr(match_dec_r, x_flat),
    )
