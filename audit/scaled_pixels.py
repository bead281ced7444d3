"""Images held as their uint8 pixels and read as float32 values: a quarter of the float32 array's memory.

A dataset's float32 samples are an affine function of its uint8 pixels (CIFAR's Normalize(0.5, 0.5) is
``v * 2/255 - 1``, MNIST's ToTensor ``v / 255``). Holding the pixels and computing the float32 values of the rows
that are read (a batch, a sample of the audit sets) costs 1 byte per value instead of 4 (CIFAR-10's 60,000 images:
0.18 GB instead of 0.74 GB), with the same float32 operations, in the same order, as a conversion done once: every
read gives bit for bit the values the float32 array held.

Any code that takes an array of samples can take one: indexing (``x[rows]``, ``x[a:b]``) and ``np.asarray(x)`` give
float32 ndarrays; ``shape``, ``dtype`` (float32), ``len`` are the float32 array's. ``rows(slice)`` is the one view
(no copy), ``take(index)`` the rows a sample picks (a copy of their pixels only). Code that reads a large set whole
should read it in chunks (``read_in_chunks``) so that no float32 copy of the whole set is made.
"""

from __future__ import annotations

import numpy as np


class ScaledPixels:
    """uint8 pixels (N, ...) read as float32 ``((pixels * multiply) - subtract) / divide`` (each step optional)."""

    dtype = np.dtype(np.float32)

    def __init__(self, pixels: np.ndarray, *, multiply: float | None = None, subtract: float | None = None,
                 divide: float | None = None):
        pixels = np.asarray(pixels)
        if pixels.dtype != np.uint8 or pixels.ndim < 1:
            raise ValueError(f"ScaledPixels: pixels must be a uint8 array (N, ...), got {pixels.dtype} "
                             f"{tuple(pixels.shape)}")
        self.pixels = pixels
        # float32 constants: the operations the loaders applied in place on a float32 array.
        self._steps = tuple((op, np.float32(value)) for op, value in
                            (("multiply", multiply), ("subtract", subtract), ("divide", divide)) if value is not None)

    @property
    def shape(self) -> tuple:
        return self.pixels.shape

    @property
    def ndim(self) -> int:
        return self.pixels.ndim

    @property
    def size(self) -> int:
        return self.pixels.size

    def __len__(self) -> int:
        return len(self.pixels)

    def __repr__(self) -> str:
        steps = ", ".join(f"{op}={float(value):g}" for op, value in self._steps)
        return f"ScaledPixels(shape={self.shape}, {steps or 'as is'})"

    def _values(self, pixels: np.ndarray) -> np.ndarray:
        out = pixels.astype(np.float32)  # a new array: the steps then run in place, as the one-off conversion did
        for op, value in self._steps:
            if op == "multiply":
                out *= value
            elif op == "subtract":
                out -= value
            else:
                out /= value
        return out

    def __getitem__(self, key) -> np.ndarray:
        """The float32 values of the rows (or elements) `key` selects, in a new array."""
        return self._values(np.asarray(self.pixels[key]))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        if copy is False:
            raise ValueError("ScaledPixels: the float32 values are computed on read; a copy cannot be avoided")
        out = self._values(self.pixels)
        return out if dtype is None else out.astype(dtype, copy=False)

    def rows(self, key: slice) -> "ScaledPixels":
        """Rows `key` (a slice) as ScaledPixels sharing these pixels: no copy."""
        if not isinstance(key, slice):
            raise TypeError(f"ScaledPixels.rows takes a slice, got {type(key).__name__}")
        return self._holding(self.pixels[key])

    def take(self, index) -> "ScaledPixels":
        """Rows `index` (integer indices) as ScaledPixels holding a copy of only those rows' pixels."""
        return self._holding(self.pixels[np.asarray(index, dtype=np.intp)])

    def _holding(self, pixels: np.ndarray) -> "ScaledPixels":
        """These steps on other pixels (already checked: rows of these)."""
        other = object.__new__(ScaledPixels)
        other.pixels, other._steps = pixels, self._steps
        return other


def take_rows(x, index) -> np.ndarray:
    """Rows `index` of an array of samples (ndarray, tensor, list or ScaledPixels) as an ndarray, without converting
    the rows that are not taken."""
    return x[index] if isinstance(x, ScaledPixels) else np.asarray(x)[index]


def select_rows(x, index):
    """Rows `index` of an array of samples, held as `x` holds them: ScaledPixels keep their pixels (a quarter of the
    float32 rows' memory), anything else gives an ndarray."""
    return x.take(index) if isinstance(x, ScaledPixels) else np.asarray(x)[index]


def read_in_chunks(x) -> bool:
    """Whether `x` should be read a chunk at a time (its values are computed on read) rather than whole."""
    return isinstance(x, ScaledPixels)
