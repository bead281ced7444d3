"""Decoder from a CNN's first-dense-layer input (an activation map) back to the image, for the Fidel audit.

The Fidel paper trains a small generative network on auxiliary data (activation map under the attacked model ->
image) and runs it on the partial reconstructions dW_i / db_i.  Here the decoder is a ridge regression
(sklearn ``RidgeCV``, penalty chosen by efficient leave-one-out): a linear map from the CNN's ReLU/max-pooled
activations back to the pixels, fitted in closed form on the party's population where a generative network trains
for hundreds of epochs (benchmarks/bench_fidel.py reports what it reveals).  Being linear, it also maps a mixture of
activation maps to the same mixture of decoded images, so it adds no artefacts of its own to a partial
reconstruction.

Train it on population data under the round's *received global* model (the activations the reconstructions are
made of), then pass it to :func:`audit.fidel.attack.fidel_audit` as ``decoder=``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
from torch import nn

from audit.fidel.layers import find_first_dense_layer, layer_inputs

__all__ = ["DEFAULT_ALPHAS", "FidelDecoder", "train_decoder"]

#: Ridge penalties tried by leave-one-out cross-validation.
DEFAULT_ALPHAS = tuple(float(a) for a in np.logspace(-4, 2, 13))


@dataclass(frozen=True, eq=False)
class FidelDecoder:
    """A fitted decoder: ``decoder(layer_inputs (k, in)) -> images (k, *output_shape)``."""

    layer: str
    input_size: int
    output_shape: tuple
    alpha: float
    ridge: object

    def __call__(self, feats) -> np.ndarray:
        feats = np.asarray(feats, dtype=np.float64)
        feats = feats.reshape(len(feats), -1)
        if feats.shape[1] != self.input_size:
            raise ValueError(
                f"decoder: expects {self.input_size} values per input of {self.layer!r}, got {feats.shape[1]}"
            )
        return self.ridge.predict(feats).reshape((len(feats),) + self.output_shape)


def train_decoder(
    model: nn.Module,
    population_x,
    *,
    layer: str | None = None,
    alphas=DEFAULT_ALPHAS,
    batch_size: int = 256,
) -> FidelDecoder:
    """Fit a decoder from ``layer``'s input under ``model`` (the received global model) to the images.

    ``population_x``: (N, C, H, W) samples the auditor may use (not the round's training samples), N >= 2.
    ``layer``: default the first nn.Linear in forward order.  ``alphas``: ridge penalties to choose from.
    """
    from sklearn.linear_model import RidgeCV

    x = np.asarray(population_x)
    if x.ndim < 2 or x.shape[0] < 2:
        raise ValueError(f"population_x: need at least 2 samples of shape (N, ...), got shape {x.shape}")
    try:
        alphas = np.asarray(alphas, dtype=np.float64).ravel()
    except (TypeError, ValueError) as e:
        raise ValueError(f"alphas: must be positive numbers, got {alphas!r}") from e
    if alphas.size == 0 or not np.all(np.isfinite(alphas)) or np.any(alphas <= 0):
        raise ValueError(f"alphas: must be positive numbers, got {alphas!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size: must be a positive integer, got {batch_size!r}")
    layer = find_first_dense_layer(model, x[:1], layer)
    feats, _ = layer_inputs(model, layer, x, batch_size=int(batch_size))
    target = x.reshape(len(x), -1).astype(np.float64)
    ridge = RidgeCV(alphas=alphas).fit(feats, target)
    return FidelDecoder(
        layer=layer,
        input_size=int(feats.shape[1]),
        output_shape=tuple(x.shape[1:]),
        alpha=float(ridge.alpha_),
        ridge=ridge,
    )
