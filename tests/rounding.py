"""What rounding alone can do to a computation: the tests' tolerances derived from it (tests/README.md, "Numerical
tolerances"), not tuned to one machine's kernels."""

import numpy as np

U32 = 2.0**-24  # float32's unit roundoff: one rounding moves a value by at most this fraction of it

# Two float64 computations of the same values by two code paths (stacked torch.func copies and separate modules,
# per-sample and batched gradients) differ by rounding alone, 2^-53 per operation. A forward and backward pass moves a
# result by at most about 1e-15 of its scale, a few training steps by about 1e-14, on every kernel set tried (ATen
# default/AVX2/AVX-512, oneDNN SSE4.1 to AVX-512: benchmarks/README.md), where float32 drifts by up to 1e-2 (BatchNorm
# over a few values and ReLUs near 0 amplify one rounding up to 1e6 times). 1e-10 leaves 1e4 over float64's figure
# and is 1e2 below what a training step 1e-6 off moves.
FLOAT64_PATHS = 1e-10


def assert_same_float64(got, want, err_msg: str = "") -> None:
    """Two float64 computations of the same values (parameters, updates, buffers, logits, norms) equal to
    FLOAT64_PATHS of the largest value, or of 1 where that is smaller: an update inherits the rounding of the
    parameters, of order 1, it is the change of."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (err_msg, got.shape, want.shape)
    scale = max(float(np.abs(want).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(got, want, rtol=0, atol=FLOAT64_PATHS * scale, err_msg=err_msg)


def gamma(n: int, u: float = U32) -> float:
    """Higham's gamma_n = n u / (1 - n u): n roundings in a sum or a chain of products move the result by at most
    gamma_n times the sum of its terms' magnitudes."""
    return n * u / (1 - n * u)


def weighted_average_rounding(arrays, weights) -> np.ndarray:
    """Elementwise bound on how far a float32 weighted average sum_i a_i w_i / sum_j w_j, accumulated term by term
    (each weight rounded to float32, each product and each sum rounded), can be from the exact one: 2n + 1 roundings
    of at most U32 each, relative to the terms' magnitudes, for n terms."""
    weights = np.asarray(weights, np.float64) / np.sum(weights)
    magnitude = sum(np.abs(np.asarray(a, np.float64)) * w for a, w in zip(arrays, weights))
    return gamma(2 * len(weights) + 1) * magnitude
