"""The datasets the workspace trains and audits on: float32 images (N, C, H, W) held as uint8 pixels, int64 labels.

Datasets
--------
``digits``
    scikit-learn's bundled 8x8 digits (1,797 images, no download), scaled to [0, 1].
``mnist``, ``fashionmnist``
    torchvision's MNIST and Fashion-MNIST (1x28x28, 10 classes), train + test concatenated (70,000 images),
    scaled to [0, 1] (``ToTensor()``; the Fidel paper's MNIST setting). Read from ``<data_dir>/MNIST/raw`` and
    ``<data_dir>/FashionMNIST/raw`` (the uncompressed idx files torchvision keeps there).
``cifar10``, ``cifar100``
    torchvision's CIFAR-10 and CIFAR-100 (3x32x32; 10 classes, and CIFAR-100's 100 fine labels), train + test
    concatenated (60,000 images, as the OpenFL Privacy Meter tutorial does), scaled to [0, 1] then normalised
    with mean = std = 0.5 per channel (the tutorial's ``Normalize((0.5,)*3, (0.5,)*3)``). Read from
    ``<data_dir>/cifar-10-batches-py`` and ``<data_dir>/cifar-100-python``.

Every torchvision dataset is read from ``data_dir`` in torchvision's on-disk layout and never downloaded unless
``download=True`` is asked for explicitly (``--download``, ``data_loader.settings.download: true``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audit.scaled_pixels import ScaledPixels

__all__ = ["DATASETS", "DatasetUnavailableError", "DatasetInfo", "dataset_info", "load_dataset", "check_available",
           "dataset_folder"]

DATASETS = ("digits", "cifar10", "cifar100", "mnist", "fashionmnist")

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
    "cifar100": DatasetInfo("cifar100", (3, 32, 32), 100),
    "mnist": DatasetInfo("mnist", (1, 28, 28), 10),
    "fashionmnist": DatasetInfo("fashionmnist", (1, 28, 28), 10),
}
assert tuple(_INFOS) == DATASETS


@dataclass(frozen=True)
class _Files:
    """Where torchvision keeps a dataset under its root, and the files it reads there."""

    title: str
    folder: str  # relative to data_dir
    files: tuple[str, ...]
    archive: str  # what --download fetches (to get it by hand)


_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                "t10k-labels-idx1-ubyte")
_FILES = {
    "cifar10": _Files("CIFAR-10", "cifar-10-batches-py",
                      ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"),
                      "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
    "cifar100": _Files("CIFAR-100", "cifar-100-python", ("train", "test"),
                       "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
    "mnist": _Files("MNIST", "MNIST/raw", _MNIST_FILES, "https://ossci-datasets.s3.amazonaws.com/mnist/, gunzipped"),
    "fashionmnist": _Files("Fashion-MNIST", "FashionMNIST/raw", _MNIST_FILES,
                           "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/, gunzipped"),
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


def _root(data_dir) -> Path:
    return Path(_DEFAULT_DATA_DIR if data_dir is None else os.fspath(data_dir)).expanduser().resolve()


def dataset_folder(name, data_dir=None) -> Path | None:
    """The folder torchvision reads dataset ``name`` from under ``data_dir`` (None: digits has no files)."""
    files = _FILES.get(_check_name(name))
    return None if files is None else _root(data_dir) / files.folder


# ----------------------------------------------------------------------------- loading


def load_dataset(name, data_dir=None, *, download=False, arrange=None) -> tuple[np.ndarray, np.ndarray]:
    """Load a whole dataset as ``(x, y)``: x float32 values (N, C, H, W) held as uint8 pixels (ScaledPixels: read
    as float32), y int64 (N,).

    ``data_dir`` is the root of torchvision's layout (default ``"data"``, relative to the working directory, i.e.
    the OpenFL workspace); digits ignores it. With ``download=False`` nothing touches the network; missing files
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
    try:
        import torchvision.datasets  # noqa: F401
    except Exception as exc:  # pragma: no cover - torchvision is a project requirement
        raise DatasetUnavailableError(f"cannot import torchvision to read {_FILES[key].title}: {exc}") from exc
    try:
        raw, y = (_read_mnist if key in ("mnist", "fashionmnist") else _read_cifar)(key, _root(data_dir), download)
    except DatasetUnavailableError:
        raise
    except Exception as exc:  # torchvision: RuntimeError/AssertionError (missing/corrupt), URLError/OSError (network)
        reason = f"download failed ({type(exc).__name__}: {exc})" if download else \
            f"its files are incomplete or corrupted ({type(exc).__name__}: {exc})"
        raise _unavailable(key, data_dir, reason) from exc
    _check_arrays(key, data_dir, raw, y)
    if arrange is not None:
        order = np.asarray(arrange(y))
        raw, y = raw[order], y[order]
    pixels = np.ascontiguousarray(raw.transpose(0, 3, 1, 2))
    del raw
    if key in ("cifar10", "cifar100"):
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
    if raw.shape[1:] != (h, w, c) or len(y) != len(raw):
        raise _unavailable(key, data_dir, f"its files are corrupted: images of shape {raw.shape} and {len(y)} "
                                          f"labels, expected (N, {h}, {w}, {c}) and N labels")
    if len(y) and not 0 <= y.min() <= y.max() < classes:
        raise _unavailable(key, data_dir, f"its files are corrupted: labels in [{y.min()}, {y.max()}], expected "
                                          f"[0, {classes - 1}]")


def _unavailable(key: str, data_dir, reason: str) -> DatasetUnavailableError:
    """One line: which dataset, where it was looked for (the flag and the plan key), and how to get it."""
    files = _FILES[key]
    return DatasetUnavailableError(
        f"{files.title} is not available: {reason}; looked in {_root(data_dir) / files.folder} (--data-dir, "
        f"data_loader.settings.data_dir); to get it run once with --download (data_loader.settings.download: true), "
        f"or put torchvision's files ({', '.join(files.files)}; from {files.archive}) in that folder; "
        f"offline alternative: --dataset digits (scikit-learn's bundled digits, no download)"
    )


def check_available(name, data_dir=None, *, download=False) -> None:
    """Raise DatasetUnavailableError (one line) if a file the dataset needs is absent and may not be downloaded.

    Loads nothing and imports no torchvision (certainly no network call), so a run can check this before any work.
    """
    key = _check_name(name)
    if key not in _FILES or download:
        return
    files = _FILES[key]
    folder = _root(data_dir) / files.folder
    if not folder.is_dir():
        raise _unavailable(key, data_dir, "the folder does not exist (download is off)")
    missing = [f for f in files.files if not (folder / f).is_file()]
    if missing:
        raise _unavailable(key, data_dir, f"the folder is incomplete or corrupted: {', '.join(missing)} missing")


def _read_mnist(key: str, root: Path, download: bool) -> tuple[np.ndarray, np.ndarray]:
    """MNIST / Fashion-MNIST's train + test as uint8 (N, 28, 28, 1) and int64 labels (torchvision's reader)."""
    from torchvision.datasets import MNIST, FashionMNIST

    cls = MNIST if key == "mnist" else FashionMNIST
    parts = [cls(root=str(root), train=train, download=download) for train in (True, False)]
    raw = np.concatenate([p.data.numpy() for p in parts])[..., None]
    return raw, np.concatenate([p.targets.numpy() for p in parts]).astype(np.int64)


def _read_cifar(key: str, root: Path, download: bool) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 / CIFAR-100's train + test as uint8 (N, 32, 32, 3) and int64 (fine) labels (torchvision's reader)."""
    from torchvision.datasets import CIFAR10, CIFAR100

    class Cifar(CIFAR10 if key == "cifar10" else CIFAR100):
        # torchvision compares every file's md5 with the official archive's, so it refuses any other file in the
        # same format (a subset, a relabelled copy, a test's small files). Here the files must exist; load_dataset
        # then checks the arrays' shapes and labels. A download is still checked against the archive's md5.
        def _check_integrity(self) -> bool:
            names = [n for n, _md5 in self.train_list + self.test_list]
            return all(os.path.isfile(os.path.join(self.root, self.base_folder, n)) for n in names)

        def _load_meta(self) -> None:  # the class names are not used (and batches.meta/meta is md5-checked)
            pass

    parts = [Cifar(root=str(root), train=train, download=download) for train in (True, False)]
    # The datasets' raw arrays (uint8 N,H,W,C), not per-image PIL access.
    raw = np.concatenate([p.data for p in parts], axis=0)
    return raw, np.concatenate([np.asarray(p.targets, dtype=np.int64) for p in parts])
