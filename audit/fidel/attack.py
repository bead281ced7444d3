"""First Dense Layer Attack (Fidel): how many of a round's training samples one model update gives away.

For a dense layer y = W a + b, the gradient of neuron i is g_i * a (weights) and g_i (bias), so a neuron that
only one sample moved reveals that sample's input exactly: a = dW_i / db_i, whatever the learning rate (Phong et
al.; Enthoven & Al-Ars, "Fidel").  With several samples, dW_i / db_i is the g-weighted average of the inputs of the
samples that moved neuron i; it is one sample outright when one gradient dominates (ReLU and Dropout make that
likely).  For an FCNN the first dense layer's input is the image; for a CNN it is the activation map feeding that
layer (a "partial reconstruction").

This module is the data owner's audit (it knows the round's training samples, an attacker does not):

* :func:`dense_update` - dW (out x in) and db (out) of the first dense layer, local minus received global weights;
* :func:`reconstruct` - dW_i / db_i for every neuron with a non-negligible |db_i|;
* :func:`pearson_matrix` - Pearson r of every reconstruction with every sample, in one matrix product;
* :func:`count_revealed` - one-to-one matching of reconstructions to samples, pairs with r >= threshold;
* :func:`ica_components` - blind source separation (FastICA) of the reconstructions, to un-mix samples that share
  neurons (the Cocktail Party Attack's idea, which the Fidel paper names as future work);
* :func:`fidel_audit` - all of it for one update, as a :class:`FidelResult`;
* :func:`save_reveal_grid` - a PNG of the revealed samples beside their reconstructions.

A CNN's activation-map reconstructions can be mapped back to pixels with a decoder trained on population data
(:mod:`audit.fidel.decoder`); pass it as ``decoder=`` to also get pixel-level counts.

Exactness: dW_i / db_i is exact for one plain-SGD step (momentum keeps it, being linear in the gradients); over
several steps a reconstruction mixes the inputs as each step saw them (for a CNN the activations drift as the conv
weights move), and weight decay adds a lambda * W term that is no sample at all.

Cost per update (2 CPU threads, digits): one forward pass of the round's samples up to the layer, one (k x d) by
(d x n) product, a linear assignment of at most k x n, and FastICA - about 30 ms for the FCNN and 0.1-0.5 s for
the CNN (its 512-value activation maps); a decoder fit adds ~0.2 s per round.

Knows nothing about OpenFL: weights come in as ``nn.Module`` or state dicts (tensors or numpy arrays).
"""

from __future__ import annotations

import copy
import math
import numbers
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from audit.config.fidel_settings import DEFAULT_THRESHOLD, FIDEL_METRICS
from audit.membership.signals import eval_mode, model_input

__all__ = [
    "FIDEL_METRICS",
    "DEFAULT_THRESHOLD",
    "DEFAULT_MIN_REL_BIAS",
    "FidelResult",
    "find_first_dense_layer",
    "layer_inputs",
    "dense_update",
    "reconstruct",
    "pearson_matrix",
    "count_revealed",
    "ica_components",
    "fit_psnr",
    "fidel_audit",
    "save_reveal_grid",
]

#: Scalar metric names reported to the federation (see :meth:`FidelResult.metrics`).
#: A neuron is used when |db_i| > DEFAULT_MIN_REL_BIAS * max_j |db_j|; below that, dW_i / db_i is dominated by the
#: float32 rounding of the weights (error ~ eps * |w| / |db_i|), not by the samples.
DEFAULT_MIN_REL_BIAS = 1e-3


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the wanted layer input is captured."""


# ----------------------------------------------------------------------------- validation helpers


def _check_fraction(name: str, value, *, low: float, high: float, low_open: bool, high_open: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    value = float(value)
    bad_low = value <= low if low_open else value < low
    bad_high = value >= high if high_open else value > high
    if bad_low or bad_high:
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise ValueError(f"{name}: must be in {lo}{low:g}, {high:g}{hi}, got {value!r}")
    return value


def _as_samples(samples) -> torch.Tensor:
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
    x = model_input(model, _as_samples(sample_input)[:1])
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
    x = model_input(model, _as_samples(samples))
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
    min_rel_bias = _check_fraction("min_rel_bias", min_rel_bias, low=0, high=1, low_open=False, high_open=True)
    dw, db = np.asarray(dw, dtype=np.float64), np.asarray(db, dtype=np.float64)
    if dw.ndim != 2 or db.shape != (dw.shape[0],):
        raise ValueError(f"dW must be (out, in) and db (out,); got {dw.shape} and {db.shape}")
    mag = np.abs(db)
    peak = mag.max(initial=0.0)
    used = np.flatnonzero((mag > min_rel_bias * peak) & (mag > 0))
    return dw[used] / db[used, None], used


# ----------------------------------------------------------------------------- scoring


def _standardise_rows(a: np.ndarray) -> np.ndarray:
    a = a - a.mean(axis=1, keepdims=True)
    norm = np.linalg.norm(a, axis=1, keepdims=True)
    # A constant row has no defined correlation; zeros make its r 0 instead of NaN.
    return np.divide(a, norm, out=np.zeros_like(a), where=norm > 0)


def _rows(values) -> np.ndarray:
    """float64 (count, values per row); numpy cannot infer a -1 axis from an empty array (no neuron moved)."""
    arr = np.asarray(values, dtype=np.float64)
    return arr.reshape(len(arr), math.prod(arr.shape[1:]))


def pearson_matrix(a, b) -> np.ndarray:
    """Pearson r of every row of ``a`` (k, d) with every row of ``b`` (n, d): (k, n), one matrix product."""
    a, b = _rows(a), _rows(b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"reconstructions have {a.shape[1]} values each but samples have {b.shape[1]}")
    return np.clip(_standardise_rows(a) @ _standardise_rows(b).T, -1.0, 1.0)


def count_revealed(corr, threshold: float = DEFAULT_THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """Distinct samples revealed by a one-to-one matching of reconstructions (rows) to samples (columns).

    Returns the matched ``(rows, cols)`` with ``corr >= threshold``; its length is the revealed count, and each
    sample and each reconstruction appears at most once (a sample two neurons reveal counts once).
    """
    threshold = _check_fraction("threshold", threshold, low=0, high=1, low_open=True, high_open=False)
    corr = np.asarray(corr, dtype=np.float64)
    if corr.ndim != 2:
        raise ValueError(f"corr must be (reconstructions, samples), got shape {corr.shape}")
    hit = corr >= threshold
    rows, cols = np.flatnonzero(hit.any(axis=1)), np.flatnonzero(hit.any(axis=0))
    if rows.size == 0:
        return rows, cols
    sub_hit, sub_corr = hit[np.ix_(rows, cols)], corr[np.ix_(rows, cols)]
    # Maximising the plain sum of r can trade one revealed pair for two near misses (0.97 + 0.97 > 0.99 + 0.5).
    # So maximise the number of pairs >= threshold first and the sum of r only second: the r term sums to less
    # than 1/2 in magnitude over any matching, so it can never outweigh one more revealed pair.
    weight = sub_hit + sub_corr / (2 * min(sub_hit.shape) + 1)
    r, c = linear_sum_assignment(weight, maximize=True)
    keep = sub_hit[r, c]
    return rows[r[keep]], cols[c[keep]]


def _spatial_differences(recs: np.ndarray, shape: tuple | None) -> np.ndarray:
    """Horizontal and vertical neighbour differences of each (C, H, W) row; the rows unchanged otherwise."""
    if shape is None or len(shape) != 3 or shape[1] < 2 or shape[2] < 2 or math.prod(shape) != recs.shape[1]:
        return recs
    img = recs.reshape((len(recs),) + tuple(shape))
    dx = np.diff(img, axis=-1).reshape(len(recs), -1)
    dy = np.diff(img, axis=-2).reshape(len(recs), -1)
    return np.concatenate([dx, dy], axis=1)


def ica_components(recs, n_components: int, *, shape: tuple | None = None, seed: int = 0, max_iter: int = 400):
    """FastICA un-mixing of the reconstructions ``recs`` (k, d) into ``n_components`` sources (n_components, d).

    Each reconstruction is a mixture of the samples' inputs (dW = G^T X for one step), so the reconstructions are
    the observed channels and the input positions the observations; the sources are the samples up to scale and
    sign.  FastICA whitens, so its sources come out uncorrelated, while images are not (digits: mean pairwise
    r ~ 0.5), which caps how close a source can get to a sample.  With ``shape`` = (C, H, W) the un-mixing matrix is
    therefore learned on neighbour differences (edges of different images correlate less) and then applied to the
    reconstructions themselves - a linear filter along the positions keeps the mixing matrix unchanged.  Rows are
    standardised first so every neuron weighs the same (dW_i / db_i magnifies small-db neurons).
    """
    from sklearn.decomposition import FastICA
    from sklearn.exceptions import ConvergenceWarning

    recs = _standardise_rows(np.asarray(recs, dtype=np.float64))
    train = _spatial_differences(recs, shape)
    if isinstance(n_components, bool) or not isinstance(n_components, numbers.Integral) or n_components < 1:
        raise ValueError(f"ica_components: must be a positive integer, got {n_components!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, numbers.Integral) or max_iter < 1:
        raise ValueError(f"ica_max_iter: must be a positive integer, got {max_iter!r}")
    if n_components > min(recs.shape[0], train.shape[1] - 1):
        raise ValueError(
            f"ica_components: {n_components} is more than the {recs.shape[0]} reconstructions or "
            f"{train.shape[1] - 1} (observations per reconstruction - 1) allow"
        )
    ica = FastICA(n_components=int(n_components), whiten="unit-variance", random_state=seed, max_iter=max_iter)
    with warnings.catch_warnings():
        # A component that does not converge is still scored: a bad one simply does not correlate.
        warnings.simplefilter("ignore", ConvergenceWarning)
        ica.fit(train.T)
    return np.nan_to_num(ica.components_ @ recs)


ica_components_fn = ica_components  # fidel_audit's keyword of the same name shadows the function


def _numerical_rank(recs: np.ndarray, rtol: float) -> int:
    if recs.shape[0] == 0:
        return 0
    s = np.linalg.svd(_standardise_rows(recs), compute_uv=False)
    return int(np.sum(s > rtol * s[0])) if s[0] > 0 else 0


def fit_psnr(r, samples) -> np.ndarray:
    """PSNR (dB) of the least-squares fit a * rec + b to each sample, from the Pearson r of the pair.

    The residual of the best affine fit of rec to x is var(x) * (1 - r^2) per value (closed form of the least
    squares), so no refit is needed; the peak is the sample's own data range.  r = +-1 is capped at 1e-12 * var.
    """
    x = np.asarray(samples, dtype=np.float64).reshape(len(samples), -1)
    r = np.asarray(r, dtype=np.float64)
    var = x.var(axis=1)
    rng = x.max(axis=1) - x.min(axis=1)
    mse = var * np.maximum(1.0 - r**2, 1e-12)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 10.0 * np.log10(rng**2 / mse)
    return np.where(var > 0, out, np.nan)


def _affine_fit(rec: np.ndarray, x: np.ndarray) -> np.ndarray:
    """a * rec + b closest to x (row-wise least squares), for display in the sample's own scale."""
    rc = rec - rec.mean(axis=1, keepdims=True)
    xc = x - x.mean(axis=1, keepdims=True)
    den = (rc * rc).sum(axis=1, keepdims=True)
    a = np.divide((rc * xc).sum(axis=1, keepdims=True), den, out=np.zeros_like(den), where=den > 0)
    return a * rc + x.mean(axis=1, keepdims=True)


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
    threshold = _check_fraction("threshold", threshold, low=0, high=1, low_open=True, high_open=False)
    _check_fraction("min_rel_bias", min_rel_bias, low=0, high=1, low_open=False, high_open=True)
    _check_fraction("ica_rank_rtol", ica_rank_rtol, low=0, high=1, low_open=True, high_open=True)
    for name, value in (("ica_max_iter", ica_max_iter), ("ica_components", ica_components)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    x = _as_samples(samples)
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
        cap = min(n, len(recs), _spatial_differences(recs[:1], rec_shape).shape[1] - 1)
        n_comp = min(cap, _numerical_rank(recs, ica_rank_rtol)) if ica_components is None else ica_components
        if n_comp >= 1:
            sources = ica_components_fn(recs, n_comp, shape=rec_shape, seed=seed, max_iter=ica_max_iter)
            corr_ica = np.abs(pearson_matrix(sources, feats))
            best_r_ica = corr_ica.max(axis=0)
            _, icols = count_revealed(corr_ica, threshold)
            ica_mask = np.zeros(n, dtype=bool)
            ica_mask[icols] = True
            # Show the ICA source where it beats the sample's neuron match (sign is fitted by _affine_fit).
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
        match_reconstruction=_affine_fit(match_rec, feats).reshape((n,) + tuple(rec_shape)),
        match_decoded=match_dec,
        match_decoded_r=match_dec_r,
        psnr=fit_psnr(match_r, feats),
        psnr_decoded=None if match_dec_r is None else fit_psnr(match_dec_r, x_flat),
    )


# ----------------------------------------------------------------------------- grid image


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

    x = _as_samples(samples).detach().cpu().numpy()
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
    return atomic_savefig(fig, path, dpi=100)
