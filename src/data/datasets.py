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
from its URLs, checked against its md5 sums. What is added around them:

- Before anything reads a CIFAR file, every file torchvision would read is compared with torchvision's md5 table
  (the official archive's files; a changed file fails naming it) and then passed through ``_ArrayUnpickler``, which
  refuses any pickle naming an object other than numpy's arrays: torchvision's CIFAR classes ``pickle.load`` them,
  and a pickle can run any code it names.
- A missing or corrupted dataset fails in one line (``DatasetUnavailableError``) naming the file, the folder, the
  flag and the plan key, and how to get it; torchvision's own messages name neither the file nor the folder.
- Parties that share ``data_dir`` download one at a time (a lock on the folder): torchvision writes the archive
  under its final name, so two at once would write one file.
- The arrays are checked (shape, label range) and kept as uint8 pixels (``ScaledPixels``), a quarter of the float32
  values' memory; only the samples ``arrange`` picks are kept.

torchvision is imported on first use: ``DATASETS`` and ``dataset_info`` (the demo's ``--help``) need no torch.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import os
import pickle
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audit.scaled_pixels import ScaledPixels

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

# The dataset's name in messages, and torchvision's class for it (torchvision.datasets.<class>).
_TITLES = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "mnist": "MNIST", "fashionmnist": "Fashion-MNIST"}
_CLASSES = {"cifar10": "CIFAR10", "cifar100": "CIFAR100", "mnist": "MNIST", "fashionmnist": "FashionMNIST"}
_CIFAR_LABELS = {"cifar10": "labels", "cifar100": "fine_labels"}  # the key torchvision reads the labels from


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


def _torchvision_class(key: str):
    import torchvision.datasets

    return getattr(torchvision.datasets, _CLASSES[key])


def _folder(key: str, root: Path) -> Path:
    """Where torchvision keeps dataset ``key`` under ``root``: CIFAR's unpacked archive, MNIST's raw folder."""
    cls = _torchvision_class(key)
    return root / cls.base_folder if key in _CIFAR_LABELS else root / cls.__name__ / "raw"


def _files(key: str) -> list[tuple[str, str | None]]:
    """The files torchvision reads for dataset ``key``, with the md5 it checks them against (None: it checks none;
    MNIST's md5s are its archives', checked when downloaded)."""
    cls = _torchvision_class(key)
    if key in _CIFAR_LABELS:
        return [(name, md5) for name, md5 in cls.train_list + cls.test_list] + [(cls.meta["filename"], cls.meta["md5"])]
    return [(os.path.splitext(archive)[0], None) for archive, _md5 in cls.resources]


def _source(key: str) -> str:
    """Where to get the files by hand (for the error message)."""
    cls = _torchvision_class(key)
    if key in _CIFAR_LABELS:
        return cls.url
    return f"{cls.mirrors[0]}*.gz, gunzipped"


def dataset_root(data_dir=None) -> Path:
    """The absolute root of torchvision's layout that ``data_dir`` names (what ``data_dir`` should be set to; the
    dataset's own folder, dataset_folder, lies below it)."""
    return _root(data_dir)


def dataset_folder(name, data_dir=None) -> Path | None:
    """The folder dataset ``name`` is read from under ``data_dir`` (None: digits has no files)."""
    key = _check_name(name)
    return None if key == "digits" else _folder(key, _root(data_dir))


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
        _download(key, root, data_dir)
    try:
        raw, y = (_read_cifar if key in _CIFAR_LABELS else _read_mnist)(key, root)
    except (_CorruptFile, OSError) as exc:  # OSError: a file gone or unreadable since check_available
        what = str(exc) if isinstance(exc, _CorruptFile) else f"{type(exc).__name__}: {exc}"
        raise _unavailable(key, data_dir, f"its files are incomplete or corrupted ({what})", corrupt=True) from exc
    _check_arrays(key, data_dir, raw, y)
    # NCHW first (for CIFAR a view of the files' own layout, for MNIST the same bytes), then the samples asked for.
    pixels = raw.transpose(0, 3, 1, 2)
    del raw
    if arrange is not None:
        order = np.asarray(arrange(y))
        pixels, y = pixels[order], y[order]
    pixels = np.ascontiguousarray(pixels)
    if key in _CIFAR_LABELS:
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
    names = ", ".join(name for name, _md5 in _files(key))
    again = "delete the dataset's files there and run once with --download" if corrupt else "run once with --download"
    return DatasetUnavailableError(
        f"{_TITLES[key]} is not available: {reason}; looked in {_folder(key, _root(data_dir))} (--data-dir, "
        f"data_loader.settings.data_dir); to get it {again} (data_loader.settings.download: true), "
        f"or put the dataset's files ({names}; from {_source(key)}) in that folder; "
        f"offline alternative: --dataset digits (scikit-learn's bundled digits, no download)"
    )


def _missing_files(key: str, root: Path) -> list[str]:
    """The files of dataset ``key`` absent from its folder under root (all of them if the folder is absent)."""
    folder = _folder(key, root)
    return [name for name, _md5 in _files(key) if not (folder / name).is_file()]


def check_available(name, data_dir=None, *, download=False) -> None:
    """Raise DatasetUnavailableError (one line) if a file the dataset needs is absent and may not be downloaded.

    Reads no file (certainly no network call), so a run can check this before any work; the files' contents are
    checked when they are loaded.
    """
    key = _check_name(name)
    if key == "digits" or download:
        return
    if not _folder(key, _root(data_dir)).is_dir():
        raise _unavailable(key, data_dir, "the folder does not exist (download is off)")
    missing = _missing_files(key, _root(data_dir))
    if missing:
        raise _unavailable(key, data_dir, f"the folder is incomplete or corrupted: {', '.join(missing)} missing")


# ----------------------------------------------------------------------------- downloading


@contextlib.contextmanager
def _locked(folder: Path):
    """An exclusive lock on ``folder`` (flock on the directory itself: no lock file is left behind)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def _tar_data_filter():
    """torchvision unpacks archives with tarfile's default filter (none before Python 3.14): the md5-checked archive
    is the official one, but unpack it as the "data" filter allows all the same (no absolute paths, no links out of
    the folder, no devices)."""
    before = tarfile.TarFile.extraction_filter
    tarfile.TarFile.extraction_filter = staticmethod(tarfile.data_filter)
    try:
        yield
    finally:
        tarfile.TarFile.extraction_filter = before


def _download(key: str, root: Path, data_dir) -> None:
    """torchvision's download of dataset ``key`` into ``root`` (nothing fetched if its check passes already), one
    party at a time. A failure raises DatasetUnavailableError in one line naming the URLs tried, and removes the
    archive it left."""
    cls = _torchvision_class(key)
    folder = _folder(key, root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root), _tar_data_filter():
            _download_only(cls, root)
    except Exception as exc:  # torchvision: URLError/HTTPError, RuntimeError (md5), tarfile/OS errors
        for archive in _archives(key, root):
            archive.unlink(missing_ok=True)
        made = folder.relative_to(root)
        for empty in (made, *made.parents[:-1]):  # the folders it made under root, if they hold nothing
            with contextlib.suppress(OSError):
                (root / empty).rmdir()
        raise _unavailable(key, data_dir, f"download failed ({_download_failure(key, exc)})") from exc
    missing = _missing_files(key, root)
    if missing:  # torchvision does not check what its archive held
        raise _unavailable(key, data_dir, f"download failed ({_download_failure(key, None)}: the archive holds no "
                                          f"{', '.join(missing)})")


def _download_only(cls, root: Path) -> None:
    """torchvision's ``download()`` of ``cls`` alone: its constructor with download=True would go on to read the
    files (for CIFAR, pickle.load them) before they are checked here."""
    from torchvision.datasets import VisionDataset

    dataset = cls.__new__(cls)
    VisionDataset.__init__(dataset, str(root))  # what the class's download() reads of its instance: the root
    dataset.download()


def _archives(key: str, root: Path) -> list[Path]:
    """The archives torchvision's download leaves (kept when it succeeds, as torchvision does)."""
    cls = _torchvision_class(key)
    if key in _CIFAR_LABELS:
        return [root / cls.filename]
    return [_folder(key, root) / archive for archive, _md5 in cls.resources]


def _download_failure(key: str, exc: Exception | None) -> str:
    """torchvision's reason on one line (none: only where), with the URLs it tried."""
    cls = _torchvision_class(key)
    where = cls.url if key in _CIFAR_LABELS else f"mirrors {', '.join(cls.mirrors)}"
    if exc is None:
        return where
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())
    if key in _CIFAR_LABELS and str(exc) == "File not found or corrupted.":  # torchvision's md5 check of the archive
        reason = f"its md5 is not {cls.tgz_md5}"
    return f"{where}: {reason}"


# ----------------------------------------------------------------------------- reading through torchvision


class _CorruptFile(ValueError):
    """A file of the dataset is not what torchvision reads; the message names the file and what is wrong."""


def _read_mnist(key: str, root: Path) -> tuple[np.ndarray, np.ndarray]:
    """MNIST / Fashion-MNIST's train + test as uint8 (N, 28, 28, 1) and int64 labels (torchvision's class)."""
    cls = _torchvision_class(key)
    parts = []
    for train in (True, False):
        prefix = "train" if train else "t10k"
        try:
            part = cls(root=str(root), train=train)
        except Exception as exc:  # torchvision's reader raises AssertionError, TypeError, ValueError, RuntimeError
            raise _CorruptFile(_which_idx_file(root / cls.__name__ / "raw", prefix, exc)) from None
        _c, h, w = _INFOS[key].input_shape
        if tuple(part.data.shape[1:]) != (h, w):
            raise _CorruptFile(f"{prefix}-images-idx3-ubyte: images of {'x'.join(map(str, part.data.shape[1:]))} "
                               f"pixels, expected {h}x{w}")
        if len(part.data) != len(part.targets):
            raise _CorruptFile(f"{prefix}-images-idx3-ubyte holds {len(part.data)} images, "
                               f"{prefix}-labels-idx1-ubyte {len(part.targets)} labels")
        parts.append(part)
    raw = np.concatenate([p.data.numpy() for p in parts])[..., None]
    return raw, np.concatenate([p.targets.numpy() for p in parts]).astype(np.int64)


def _which_idx_file(folder: Path, prefix: str, exc: Exception) -> str:
    """Which of the two idx files torchvision could not read, and why (its readers, one file each)."""
    from torchvision.datasets.mnist import read_image_file, read_label_file

    for name, read in ((f"{prefix}-images-idx3-ubyte", read_image_file), (f"{prefix}-labels-idx1-ubyte",
                                                                         read_label_file)):
        try:
            read(str(folder / name))
        except Exception as file_exc:
            return f"{name}: not an idx file torchvision reads ({type(file_exc).__name__}: {file_exc})"
    return f"{prefix}-images-idx3-ubyte / {prefix}-labels-idx1-ubyte: {type(exc).__name__}: {exc}"


def _read_cifar(key: str, root: Path) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 / CIFAR-100's train + test as uint8 (N, 32, 32, 3) and int64 (fine) labels (torchvision's class),
    once every file has passed torchvision's md5 table and the numpy-only unpickler."""
    from torchvision.datasets.utils import check_integrity

    cls = _torchvision_class(key)
    folder = root / cls.base_folder
    for name, md5 in _files(key):
        if not check_integrity(folder / name, md5):
            raise _CorruptFile(f"{name}: its md5 is not torchvision's {md5} (not the official file)")
    for name, _md5 in _files(key):
        meta = name == cls.meta["filename"]
        _check_cifar_pickle(folder / name, cls.meta["key"] if meta else _CIFAR_LABELS[key], meta=meta)
    try:
        parts = [cls(root=str(root), train=train) for train in (True, False)]
    except Exception as exc:  # a file changed since it was checked
        raise _CorruptFile(f"torchvision's {cls.__name__} could not read it ({type(exc).__name__}: {exc})") from None
    # torchvision's arrays (uint8 N, H, W, C: a view of the batches stacked), not per-image PIL access.
    raw = np.concatenate([p.data for p in parts], axis=0)
    labels = np.concatenate([np.asarray(p.targets, dtype=np.int64) for p in parts])
    return raw, labels


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only. A pickle can run any code it names when it is loaded;
    CIFAR's batches need nothing but numpy's array reconstruction, so any other global is refused. It is pickle's
    own machine (not a scan of the opcodes), so it resolves exactly the globals pickle.load would."""

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


def _check_cifar_pickle(path: Path, label_key: str, *, meta: bool = False) -> None:
    """One CIFAR pickle, loaded by _ArrayUnpickler (as torchvision loads it: latin1 for Python 2's str) and
    checked for what torchvision reads from it: a batch {"data": uint8 (n, 3072), label_key: n labels}, or the meta
    file (a dict with label_key, the class names)."""
    try:
        with open(path, "rb") as f:
            entry = _ArrayUnpickler(f, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            ImportError, UnicodeDecodeError) as exc:  # what unpickling a corrupt or foreign file raises
        raise _CorruptFile(f"{path.name}: not a CIFAR batch pickle ({type(exc).__name__}: {exc})") from None
    if meta:
        if not isinstance(entry, dict) or label_key not in entry:
            got = sorted(map(str, entry)) if isinstance(entry, dict) else type(entry).__name__
            raise _CorruptFile(f"{path.name}: expected a dict with {label_key!r}, got {got}")
        return
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
