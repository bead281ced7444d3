"""The datasets the workspace trains and audits on, loaded as float32 images in [0, 1] (normalised as noted).

Datasets
--------
``digits``
    scikit-learn's bundled 8x8 digits (1,797 images, no download), scaled to [0, 1].
``cifar10``
    torchvision's CIFAR-10, train + test concatenated (60,000 images, as the OpenFL
    Privacy Meter tutorial does), scaled to [0, 1] then normalised with mean = std = 0.5
    per channel (as the tutorial's ``Normalize((0.5,)*3, (0.5,)*3)``).  Never downloaded
    unless ``download=True`` is asked for explicitly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["DATASETS", "DatasetUnavailableError", "DatasetInfo", "dataset_info", "load_dataset", "check_available"]

DATASETS = ("digits", "cifar10")

_CIFAR10_FOLDER = "cifar-10-batches-py"
_DEFAULT_DATA_DIR = "data"


class DatasetUnavailableError(RuntimeError):
    """The dataset's files are absent (and not downloaded) or could not be fetched."""


@dataclass(frozen=True)
class DatasetInfo:
    """Static description of a dataset (known without loading it)."""

    name: str
    input_shape: tuple[int, int, int]  # (C, H, W)
    num_classes: int


_INFOS = {
    "digits": DatasetInfo("digits", (1, 8, 8), 10),
    "cifar10": DatasetInfo("cifar10", (3, 32, 32), 10),
}


def _check_name(name) -> str:
    key = name.strip().lower() if isinstance(name, str) else None
    if key not in _INFOS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    return key


def dataset_info(name) -> DatasetInfo:
    """Shape and class count of dataset ``name`` without loading any data.

    Raises ValueError naming ``name`` and the choices for an unknown dataset.
    """
    return _INFOS[_check_name(name)]


# ----------------------------------------------------------------------------- loading


def load_dataset(name, data_dir=None, *, download=False) -> tuple[np.ndarray, np.ndarray]:
    """Load a whole dataset as ``(x, y)``: x float32 (N, C, H, W), y int64 (N,).

    ``data_dir`` is only used by cifar10 (default ``"data"``, relative to the working
    directory, i.e. the OpenFL workspace).  With ``download=False`` nothing touches the
    network; missing files raise :class:`DatasetUnavailableError`.
    """
    key = _check_name(name)
    if key == "digits":
        return _load_digits()
    return _load_cifar10(data_dir, download=download)


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    return np.ascontiguousarray(x), y


def _cifar_unavailable(folder: Path, reason: str) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"CIFAR-10 is not available: {reason}\n"
        f"  looked in: {folder}\n"
        f"  to get it: on a machine with network access run once with --download "
        f"(data_loader.settings.download: true), or fetch and extract "
        f"https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz; then copy the resulting "
        f"'{_CIFAR10_FOLDER}' folder (data_batch_1..5, test_batch, batches.meta) into "
        f"{folder.parent} (data_dir)\n"
        f"  offline alternative: --dataset digits (scikit-learn's bundled digits, no download)."
    )


def check_available(name, data_dir=None, *, download=False) -> None:
    """Raise DatasetUnavailableError if the dataset's folder is absent and may not be downloaded; loads nothing, so
    a run can check this before any work."""
    if _check_name(name) != "cifar10" or download:
        return
    folder = Path(_DEFAULT_DATA_DIR if data_dir is None else os.fspath(data_dir)).expanduser().resolve() / _CIFAR10_FOLDER
    if not folder.is_dir():
        # Decided before importing torchvision: fast, and certainly no network call.
        raise _cifar_unavailable(folder, "the folder does not exist (download=False)")


def _load_cifar10(data_dir, *, download: bool) -> tuple[np.ndarray, np.ndarray]:
    root = Path(_DEFAULT_DATA_DIR if data_dir is None else os.fspath(data_dir)).expanduser()
    root = root.resolve()
    folder = root / _CIFAR10_FOLDER
    check_available("cifar10", data_dir, download=download)

    try:
        from torchvision.datasets import CIFAR10
    except Exception as exc:  # pragma: no cover - torchvision is a project requirement
        raise DatasetUnavailableError(f"cannot import torchvision to read CIFAR-10: {exc}") from exc

    try:
        parts = [CIFAR10(root=str(root), train=train, download=download) for train in (True, False)]
    except Exception as exc:  # torchvision: RuntimeError (missing/corrupt), URLError/OSError (network)
        reason = (
            f"download failed ({type(exc).__name__}: {exc})"
            if download
            else f"the files are incomplete or corrupted ({exc})"
        )
        raise _cifar_unavailable(folder, reason) from exc

    # Use the datasets' raw arrays (uint8 N,H,W,C), not per-image PIL access.
    raw = np.concatenate([p.data for p in parts], axis=0)
    y = np.concatenate([np.asarray(p.targets, dtype=np.int64) for p in parts])
    x = np.ascontiguousarray(raw.transpose(0, 3, 1, 2), dtype=np.float32)
    # ToTensor() then Normalize(0.5, 0.5): (v / 255 - 0.5) / 0.5 == v * 2/255 - 1; in place.
    x *= np.float32(2.0 / 255.0)
    x -= np.float32(1.0)
    return x, y
