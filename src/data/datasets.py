"""The datasets the workspace trains and audits on: float32 images (N, C, H, W) held as uint8 pixels, int64 labels.

Datasets
--------
``digits``
    scikit-learn's bundled 8x8 digits (1,797 images, no download), scaled to [0, 1].
``mnist``, ``fashionmnist``
    torchvision's MNIST and FashionMNIST (1x28x28, 10 classes), train + test concatenated (70,000 images), scaled
    to [0, 1] (``ToTensor()``; the Fidel paper's MNIST setting).
``cifar10``, ``cifar100``
    torchvision's CIFAR10 and CIFAR100 (3x32x32; 10 classes, and CIFAR-100's 100 fine labels), train + test
    concatenated (60,000 images, as the OpenFL Privacy Meter tutorial does), scaled to [0, 1] then normalised with
    mean = std = 0.5 per channel (the tutorial's ``Normalize((0.5,)*3, (0.5,)*3)``).

torchvision's dataset classes read the files (from ``data_dir``, torchvision's ``root``, in its on-disk layout) and
download them, only when ``download=True`` is asked for (``--download``, ``data_loader.settings.download: true``),
from its URLs, checked against its md5 sums; src.data.torchvision_files checks the files before torchvision reads
them (md5, a numpy-only unpickler) and downloads one party at a time. What is added here:

- A missing or corrupted dataset fails in one line (``DatasetUnavailableError``) naming the file, the folder, the
  flag and the plan key, and how to get it; torchvision's own messages name neither the file nor the folder.
- The arrays are checked (shape, label range) and kept as uint8 pixels (``ScaledPixels``), a quarter of the float32
  values' memory; only the samples ``arrange`` picks are kept.

torchvision is imported on first use: ``DATASETS`` and ``dataset_info`` (the demo's ``--help``) need no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audit import ScaledPixels
from src.data.torchvision_files import (CIFAR_LABELS, CorruptFile, DownloadFailed, download as download_files,
                                        expected_files, files_folder, files_source, missing_files, read_cifar,
                                        read_mnist)

__all__ = ["DATASETS", "DatasetUnavailableError", "DatasetInfo", "dataset_info", "dataset_samples", "load_dataset",
           "check_available", "dataset_folder", "dataset_root"]

DATASETS = ("digits", "cifar10", "cifar100", "mnist", "fashionmnist")

_DEFAULT_DATA_DIR = "data"


class DatasetUnavailableError(RuntimeError):
    """The dataset's files are absent (and not downloaded), corrupted, or could not be fetched."""


@dataclass(frozen=True)
class DatasetInfo:
    """Static description of a dataset (known without loading it)."""

    name: str
    input_shape: tuple[int, int, int]  # (C, H, W)
    num_classes: int


_INFOS = {
    "digits": DatasetInfo("digits", (1, 8, 8), 10),
    "cifar10": DatasetInfo("cifar10", (3, 32, 32), 10),
    "cifar100": DatasetInfo("cifar100", (3, 32, 32), 100),
    "mnist": DatasetInfo("mnist", (1, 28, 28), 10),
    "fashionmnist": DatasetInfo("fashionmnist", (1, 28, 28), 10),
}
assert tuple(_INFOS) == DATASETS
# Samples in each dataset as this module reads it (train + test of the official files): the most a split can deal
# out, known before any file is read (the bounds checked at start, src.plan.bounds).
_SAMPLES = {"digits": 1797, "cifar10": 60000, "cifar100": 60000, "mnist": 70000, "fashionmnist": 70000}
assert tuple(_SAMPLES) == DATASETS

# The dataset's name in messages.
_TITLES = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "mnist": "MNIST", "fashionmnist": "Fashion-MNIST"}


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


def dataset_samples(name) -> int:
    """How many samples dataset ``name`` holds (its official files; digits is bundled), without reading any file."""
    return _SAMPLES[_check_name(name)]


def _root(data_dir) -> Path:
    return Path(_DEFAULT_DATA_DIR if data_dir is None else os.fspath(data_dir)).expanduser().resolve()


def dataset_root(data_dir=None) -> Path:
    """The absolute root of torchvision's layout that ``data_dir`` names (what ``data_dir`` should be set to; the
    dataset's own folder, dataset_folder, lies below it)."""
    return _root(data_dir)


def dataset_folder(name, data_dir=None) -> Path | None:
    """The folder dataset ``name`` is read from under ``data_dir`` (None: digits has no files)."""
    key = _check_name(name)
    return None if key == "digits" else files_folder(key, _root(data_dir))


# ----------------------------------------------------------------------------- loading


def load_dataset(name, data_dir=None, *, download=False, arrange=None) -> tuple[np.ndarray, np.ndarray]:
    """Load a whole dataset as ``(x, y)``: x float32 values (N, C, H, W) held as uint8 pixels (ScaledPixels: read
    as float32), y int64 (N,).

    ``data_dir`` is torchvision's root (default ``"data"``, relative to the working directory, i.e. the OpenFL
    workspace); digits ignores it. With ``download=False`` nothing touches the network; missing or corrupted files
    raise :class:`DatasetUnavailableError`. ``arrange(y) -> indices``: only those samples, in that order, are
    returned, picked from the files' uint8 pixels (the loader keeps every party's sets in one array this way: one copy
    of the samples used, and no copy of the whole dataset besides).
    """
    key = _check_name(name)
    if key == "digits":
        pixels, y = _load_digits()
        if arrange is not None:
            order = np.asarray(arrange(y))
            pixels, y = pixels[order], y[order]
        return ScaledPixels(pixels, divide=16.0), y  # sklearn's images hold whole values 0..16
    check_available(key, data_dir, download=download)
    root = _root(data_dir)
    if download:
        try:
            download_files(key, root)
        except DownloadFailed as exc:
            raise _unavailable(key, data_dir, f"download failed ({exc})") from exc.__cause__
    try:
        if key in CIFAR_LABELS:
            raw, y = read_cifar(key, root)
        else:
            raw, y = read_mnist(key, root, _INFOS[key].input_shape[1:])
    except (CorruptFile, OSError) as exc:  # OSError: a file gone or unreadable since check_available
        what = str(exc) if isinstance(exc, CorruptFile) else f"{type(exc).__name__}: {exc}"
        raise _unavailable(key, data_dir, f"its files are incomplete or corrupted ({what})", corrupt=True) from exc
    _check_arrays(key, data_dir, raw, y)
    # NCHW first (for CIFAR a view of the files' own layout, for MNIST the same bytes), then the samples asked for.
    pixels = raw.transpose(0, 3, 1, 2)
    del raw
    if arrange is not None:
        order = np.asarray(arrange(y))
        pixels, y = pixels[order], y[order]
    pixels = np.ascontiguousarray(pixels)
    if key in CIFAR_LABELS:
        # ToTensor() then Normalize(0.5, 0.5): (v / 255 - 0.5) / 0.5 == v * 2/255 - 1.
        return ScaledPixels(pixels, multiply=2.0 / 255.0, subtract=1.0), y
    return ScaledPixels(pixels, divide=255.0), y  # ToTensor() only, as the Fidel paper's MNIST setting


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as uint8 pixels (N, 1, 8, 8) and int64 labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.ascontiguousarray(bunch.images.reshape(-1, 1, 8, 8).astype(np.uint8)), bunch.target.astype(np.int64)


def _check_arrays(key: str, data_dir, raw: np.ndarray, y: np.ndarray) -> None:
    """Files in the right format but of another shape or label range fail here, naming the dataset's folder."""
    c, h, w = _INFOS[key].input_shape
    classes = _INFOS[key].num_classes
    if raw.dtype != np.uint8 or raw.shape[1:] != (h, w, c) or len(y) != len(raw):
        raise _unavailable(key, data_dir, f"its files are corrupted: images of shape {raw.shape} ({raw.dtype}) and "
                                          f"{len(y)} labels, expected uint8 (N, {h}, {w}, {c}) and N labels")
    if len(y) and not 0 <= y.min() <= y.max() < classes:
        raise _unavailable(key, data_dir, f"its files are corrupted: labels in [{y.min()}, {y.max()}], expected "
                                          f"[0, {classes - 1}]")


def _unavailable(key: str, data_dir, reason: str, *, corrupt: bool = False) -> DatasetUnavailableError:
    """One line: which dataset, where it was looked for (the flag and the plan key), and how to get it (a corrupted
    file first deleted: torchvision's MNIST download skips files that exist)."""
    names = ", ".join(name for name, _md5 in expected_files(key))
    again = "delete the dataset's files there and run once with --download" if corrupt else "run once with --download"
    return DatasetUnavailableError(
        f"{_TITLES[key]} is not available: {reason}; looked in {files_folder(key, _root(data_dir))} (--data-dir, "
        f"data_loader.settings.data_dir); to get it {again} (data_loader.settings.download: true), "
        f"or put the dataset's files ({names}; from {files_source(key)}) in that folder; "
        f"offline alternative: --dataset digits (scikit-learn's bundled digits, no download)"
    )


def check_available(name, data_dir=None, *, download=False) -> None:
    """Raise DatasetUnavailableError (one line) if a file the dataset needs is absent and may not be downloaded.

    Reads no file (certainly no network call), so a run can check this before any work; the files' contents are
    checked when they are loaded.
    """
    key = _check_name(name)
    if key == "digits" or download:
        return
    if not files_folder(key, _root(data_dir)).is_dir():
        raise _unavailable(key, data_dir, "the folder does not exist (download is off)")
    missing = missing_files(key, _root(data_dir))
    if missing:
        raise _unavailable(key, data_dir, f"the folder is incomplete or corrupted: {', '.join(missing)} missing")


