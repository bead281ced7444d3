"""The datasets the workspace trains and audits on: float32 images (N, C, H, W) held as uint8 pixels, int64 labels.

Datasets
--------
``digits``
    scikit-learn's bundled 8x8 digits (1,797 images, no download), scaled to [0, 1].
``mnist``, ``fashionmnist``
    MNIST and Fashion-MNIST (1x28x28, 10 classes), train + test concatenated (70,000 images), scaled to [0, 1]
    (``ToTensor()``; the Fidel paper's MNIST setting). Read from ``<data_dir>/MNIST/raw`` and
    ``<data_dir>/FashionMNIST/raw`` (the uncompressed idx files torchvision keeps there).
``cifar10``, ``cifar100``
    CIFAR-10 and CIFAR-100 (3x32x32; 10 classes, and CIFAR-100's 100 fine labels), train + test concatenated
    (60,000 images, as the OpenFL Privacy Meter tutorial does), scaled to [0, 1] then normalised with mean = std =
    0.5 per channel (the tutorial's ``Normalize((0.5,)*3, (0.5,)*3)``). Read from ``<data_dir>/cifar-10-batches-py``
    and ``<data_dir>/cifar-100-python`` (the python pickles of the official archives).

Every such dataset is read from ``data_dir`` in torchvision's on-disk layout (so folders torchvision made keep
working) and never downloaded unless ``download=True`` is asked for explicitly (``--download``,
``data_loader.settings.download: true``); a download fetches the archives torchvision fetches, checked against
the same md5 sums (src/dataset_download.py).

The files are read here by hand, not with torchvision: its compiled operators tie each torchvision wheel to one
torch build, so it would pin the project to torch's CUDA build, which loads the CUDA libraries in every process,
GPU or not (0.27 GB more RSS per process than the CPU build; README, "Memory").
"""

from __future__ import annotations

import codecs
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audit.scaled_pixels import ScaledPixels
from src.dataset_download import Archive, DownloadError, install_archives

__all__ = ["DATASETS", "DatasetUnavailableError", "DatasetInfo", "dataset_info", "dataset_samples", "load_dataset",
           "check_available", "dataset_folder", "dataset_root"]

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
# Samples in each dataset as this module reads it (train + test of the official files): the most a split can deal
# out, known before any file is read (the bounds checked at start, src.plan_bounds).
_SAMPLES = {"digits": 1797, "cifar10": 60000, "cifar100": 60000, "mnist": 70000, "fashionmnist": 70000}
assert tuple(_SAMPLES) == DATASETS


@dataclass(frozen=True)
class _Files:
    """Where torchvision keeps a dataset under its root, the files read there, and the archives a download fetches.

    For CIFAR the archive holds ``folder`` itself (unpacked into data_dir); MNIST's are one .gz per file (unpacked
    into ``folder``)."""

    title: str
    folder: str  # relative to data_dir
    files: tuple[str, ...]  # train files first, then test, in the order they are read
    archives: tuple[Archive, ...]

    @property
    def source(self) -> str:
        """Where to get the files by hand (for the error message)."""
        first = self.archives[0]
        return first.urls()[0] if len(self.archives) == 1 else f"{first.mirrors[0]}*.gz, gunzipped"


# The URLs and md5 sums are torchvision 0.29's (torchvision/datasets/cifar.py, mnist.py): the official archives.
_CIFAR_MIRRORS = ("https://www.cs.toronto.edu/~kriz/",)
_MNIST_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")
_FASHION_MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)
_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                "t10k-labels-idx1-ubyte")


def _gz_archives(md5s: tuple[str, ...], mirrors: tuple[str, ...]) -> tuple[Archive, ...]:
    return tuple(Archive(f"{name}.gz", md5, mirrors) for name, md5 in zip(_MNIST_FILES, md5s, strict=True))


_FILES = {
    "cifar10": _Files("CIFAR-10", "cifar-10-batches-py",
                      ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"),
                      (Archive("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a", _CIFAR_MIRRORS),)),
    "cifar100": _Files("CIFAR-100", "cifar-100-python", ("train", "test"),
                       (Archive("cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85", _CIFAR_MIRRORS),)),
    "mnist": _Files("MNIST", "MNIST/raw", _MNIST_FILES, _gz_archives(
        ("f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432", "9fb629c4189551a2d022fa330f9573f3",
         "ec29112dd5afa0611ce80d1b7f02629c"), _MNIST_MIRRORS)),
    "fashionmnist": _Files("Fashion-MNIST", "FashionMNIST/raw", _MNIST_FILES, _gz_archives(
        ("8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe", "bef4ecab320f06d8554ea6380940ec79",
         "bb300cfdad3c16e7a12a480ee83cd310"), _FASHION_MIRRORS)),
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
    files, root = _FILES[key], _root(data_dir)
    if download and _missing_files(key, root):
        try:
            install_archives(files.archives, root, files.folder, files.files)
        except (DownloadError, OSError) as exc:  # DownloadError names the URLs; OSError: writing in data_dir failed
            what = str(exc) if isinstance(exc, DownloadError) else f"{type(exc).__name__}: {exc}"
            raise _unavailable(key, data_dir, f"download failed ({what})") from exc
    try:
        raw, y = (_read_mnist if key in ("mnist", "fashionmnist") else _read_cifar)(key, root / files.folder)
    except (_CorruptFile, OSError) as exc:  # OSError: a file gone or unreadable since check_available
        what = str(exc) if isinstance(exc, _CorruptFile) else f"{type(exc).__name__}: {exc}"
        raise _unavailable(key, data_dir, f"its files are incomplete or corrupted ({what})") from exc
    _check_arrays(key, data_dir, raw, y)
    # NCHW first (for CIFAR a view of the files' own layout, for MNIST the same bytes), then the samples asked for.
    pixels = raw.transpose(0, 3, 1, 2)
    del raw
    if arrange is not None:
        order = np.asarray(arrange(y))
        pixels, y = pixels[order], y[order]
    pixels = np.ascontiguousarray(pixels)
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
        f"or put the dataset's files ({', '.join(files.files)}; from {files.source}) in that folder; "
        f"offline alternative: --dataset digits (scikit-learn's bundled digits, no download)"
    )


def _missing_files(key: str, root: Path) -> list[str]:
    """The files of dataset ``key`` absent from its folder under root (all of them if the folder is absent)."""
    folder = root / _FILES[key].folder
    return [f for f in _FILES[key].files if not (folder / f).is_file()]


def check_available(name, data_dir=None, *, download=False) -> None:
    """Raise DatasetUnavailableError (one line) if a file the dataset needs is absent and may not be downloaded.

    Loads nothing (certainly no network call), so a run can check this before any work.
    """
    key = _check_name(name)
    if key not in _FILES or download:
        return
    files = _FILES[key]
    folder = _root(data_dir) / files.folder
    if not folder.is_dir():
        raise _unavailable(key, data_dir, "the folder does not exist (download is off)")
    missing = _missing_files(key, _root(data_dir))
    if missing:
        raise _unavailable(key, data_dir, f"the folder is incomplete or corrupted: {', '.join(missing)} missing")


# ----------------------------------------------------------------------------- the files' formats


class _CorruptFile(ValueError):
    """A file of the dataset is not in its format; the message names the file and what is wrong."""


def _read_idx(path: Path, ndim: int) -> np.ndarray:
    """An idx file of unsigned bytes (LeCun's MNIST format): a big-endian header, magic 0x0800 + ndim (2051 for
    images, 2049 for labels) and ndim 32-bit dims, then exactly prod(dims) bytes."""
    with open(path, "rb") as f:
        header = f.read(4 * (1 + ndim))
        if len(header) < 4 * (1 + ndim):
            raise _CorruptFile(f"{path.name}: {len(header)} bytes, shorter than its header")
        magic = int.from_bytes(header[:4], "big")
        if magic != 0x0800 + ndim:
            raise _CorruptFile(f"{path.name}: magic number {magic}, expected {0x0800 + ndim} (unsigned bytes, "
                               f"{ndim} dimension{'s' if ndim > 1 else ''})")
        dims = tuple(int.from_bytes(header[4 * k:4 * k + 4], "big") for k in range(1, ndim + 1))
        data = np.fromfile(f, dtype=np.uint8)
    if data.size != int(np.prod(dims)):
        raise _CorruptFile(f"{path.name}: {data.size} bytes of data, its header says {'x'.join(map(str, dims))} "
                           f"= {int(np.prod(dims))}")
    return data.reshape(dims)


def _read_mnist(key: str, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """MNIST / Fashion-MNIST's train + test as uint8 (N, 28, 28, 1) and int64 labels."""
    _c, h, w = _INFOS[key].input_shape
    images, labels = [], []
    for prefix in ("train", "t10k"):
        x = _read_idx(folder / f"{prefix}-images-idx3-ubyte", 3)
        y = _read_idx(folder / f"{prefix}-labels-idx1-ubyte", 1)
        if x.shape[1:] != (h, w):
            raise _CorruptFile(f"{prefix}-images-idx3-ubyte: images of {x.shape[1]}x{x.shape[2]} pixels, expected "
                               f"{h}x{w}")
        if len(x) != len(y):
            raise _CorruptFile(f"{prefix}-images-idx3-ubyte holds {len(x)} images, {prefix}-labels-idx1-ubyte "
                               f"{len(y)} labels")
        images.append(x)
        labels.append(y)
    return np.concatenate(images)[..., None], np.concatenate(labels).astype(np.int64)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only. A pickle can run any code it names when it is loaded;
    CIFAR's batches need nothing but numpy's array reconstruction, so any other global is refused."""

    # What numpy's own reduction names (public API only): the official files are numpy 1 pickles of protocol 2;
    # numpy 2 names numpy._core, and protocol 5 rebuilds from a buffer; protocol 2 written by Python 3 encodes
    # bytes with _codecs.encode.
    _ALLOWED = {
        **{(f"numpy.{core}.multiarray", "_reconstruct"): np.empty(0).__reduce__()[0] for core in ("core", "_core")},
        **{(f"numpy.{core}.numeric", "_frombuffer"): np.empty(0).__reduce_ex__(5)[0] for core in ("core", "_core")},
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,
    }

    def find_class(self, module, name):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused to load {module}.{name} (only numpy arrays are expected)") from None


def _read_cifar_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR python batch: {"data": uint8 (n, 3072), label_key: n labels}, as pickled by Python 2 (latin1)."""
    try:
        with open(path, "rb") as f:
            entry = _ArrayUnpickler(f, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            ImportError, UnicodeDecodeError) as exc:  # what unpickling a corrupt or foreign file raises
        raise _CorruptFile(f"{path.name}: not a CIFAR batch pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(entry, dict) or "data" not in entry or label_key not in entry:
        keys = sorted(map(str, entry)) if isinstance(entry, dict) else type(entry).__name__
        raise _CorruptFile(f"{path.name}: expected a dict with 'data' and {label_key!r}, got {keys}")
    data, labels = entry["data"], np.asarray(entry[label_key])
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        what = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise _CorruptFile(f"{path.name}: 'data' is {what}, expected uint8 (n, 3072)")
    if labels.ndim != 1 or len(labels) != len(data) or (labels.size and labels.dtype.kind not in "iu"):
        raise _CorruptFile(f"{path.name}: {label_key!r} holds {labels.shape} {labels.dtype} values for "
                           f"{len(data)} images, expected {len(data)} whole numbers")
    return data, labels.astype(np.int64)


def _read_cifar(key: str, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 / CIFAR-100's train + test as uint8 (N, 32, 32, 3) and int64 (fine) labels.

    Each row of a batch is the image's 1024 red, then green, then blue values, row-major: (N, 3, 32, 32) as stored;
    the NHWC result is a view of it."""
    label_key = "labels" if key == "cifar10" else "fine_labels"
    batches = [_read_cifar_batch(folder / name, label_key) for name in _FILES[key].files]
    data = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    del batches
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels
