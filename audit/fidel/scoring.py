"""Scoring Fidel's reconstructions against the round's samples: Pearson r of every pair, a one-to-one matching of
reconstructions to samples, FastICA un-mixing of reconstructions that mix several samples, and PSNR after an affine
fit (the reconstructions' scale is arbitrary)."""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np
from scipy.optimize import linear_sum_assignment

from audit.config.fidel_settings import DEFAULT_THRESHOLD

__all__ = ["pearson_matrix", "count_revealed", "ica_components", "numerical_rank", "spatial_differences",
           "affine_fit", "fit_psnr", "check_fraction"]


def check_fraction(name: str, value, *, low: float, high: float, low_open: bool, high_open: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    value = float(value)
    bad_low = value <= low if low_open else value < low
    bad_high = value >= high if high_open else value > high
    if bad_low or bad_high:
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise ValueError(f"{name}: must be in {lo}{low:g}, {high:g}{hi}, got {value!r}")
    return value





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
    threshold = check_fraction("threshold", threshold, low=0, high=1, low_open=True, high_open=False)
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


def spatial_differences(recs: np.ndarray, shape: tuple | None) -> np.ndarray:
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
    train = spatial_differences(recs, shape)
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




def numerical_rank(recs: np.ndarray, rtol: float) -> int:
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


def affine_fit(rec: np.ndarray, x: np.ndarray) -> np.ndarray:
    """a * rec + b closest to x (row-wise least squares), for display in the sample's own scale."""
    rc = rec - rec.mean(axis=1, keepdims=True)
    xc = x - x.mean(axis=1, keepdims=True)
    den = (rc * rc).sum(axis=1, keepdims=True)
    a = np.divide((rc * xc).sum(axis=1, keepdims=True), den, out=np.zeros_like(den), where=den > 0)
    return a * rc + x.mean(axis=1, keepdims=True)
