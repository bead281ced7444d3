"""torchvision's files of a dataset on disk (src.data.datasets names the datasets and loads them through here): where
torchvision keeps them, downloading them one party at a time, and reading them through torchvision once checked.

- Before anything reads a CIFAR file, every file torchvision would read is compared with torchvision's md5 table
  (the official archive's files; a changed file fails naming it) and then passed through ``_ArrayUnpickler``, which
  refuses any pickle naming an object other than numpy's arrays: torchvision's CIFAR classes ``pickle.load`` them,
  and a pickle can run any code it names.
- Parties that share ``data_dir`` download one at a time (a lock on the folder): torchvision writes the archive
  under its final name, so two at once would write one file.
- A download that fails removes the archive and the empty folders it left, and says why in one line
  (``DownloadFailed``); a file that is not what torchvision reads raises ``CorruptFile`` naming it.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np

# torchvision's class for each dataset with files (torchvision.datasets.<class>).
_CLASSES = {"cifar10": "CIFAR10", "cifar100": "CIFAR100", "mnist": "MNIST", "fashionmnist": "FashionMNIST"}
CIFAR_LABELS = {"cifar10": "labels", "cifar100": "fine_labels"}  # the key torchvision reads the labels from


class DownloadFailed(RuntimeError):
    """torchvision's download failed or its archive lacked a file; the message: the URLs tried and why."""


# ----------------------------------------------------------------------------- where torchvision keeps the files


def torchvision_class(key: str):
    import torchvision.datasets

    return getattr(torchvision.datasets, _CLASSES[key])


def files_folder(key: str, root: Path) -> Path:
    """Where torchvision keeps dataset ``key`` under ``root``: CIFAR's unpacked archive, MNIST's raw folder."""
    cls = torchvision_class(key)
    return root / cls.base_folder if key in CIFAR_LABELS else root / cls.__name__ / "raw"


def expected_files(key: str) -> list[tuple[str, str | None]]:
    """The files torchvision reads for dataset ``key``, with the md5 it checks them against (None: it checks none;
    MNIST's md5s are its archives', checked when downloaded)."""
    cls = torchvision_class(key)
    if key in CIFAR_LABELS:
        return [(name, md5) for name, md5 in cls.train_list + cls.test_list] + [(cls.meta["filename"], cls.meta["md5"])]
    return [(os.path.splitext(archive)[0], None) for archive, _md5 in cls.resources]


def files_source(key: str) -> str:
    """Where to get the files by hand (for the error message)."""
    cls = torchvision_class(key)
    if key in CIFAR_LABELS:
        return cls.url
    return f"{cls.mirrors[0]}*.gz, gunzipped"


def missing_files(key: str, root: Path) -> list[str]:
    """The files of dataset ``key`` absent from its folder under root (all of them if the folder is absent)."""
    folder = files_folder(key, root)
    return [name for name, _md5 in expected_files(key) if not (folder / name).is_file()]


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


def download(key: str, root: Path) -> None:
    """torchvision's download of dataset ``key`` into ``root`` (nothing fetched if its check passes already), one
    party at a time. A failure raises DownloadFailed in one line naming the URLs tried, and removes the archive it
    left."""
    cls = torchvision_class(key)
    folder = files_folder(key, root)
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
        raise DownloadFailed(_download_failure(key, exc)) from exc
    missing = missing_files(key, root)
    if missing:  # torchvision does not check what its archive held
        raise DownloadFailed(f"{_download_failure(key, None)}: the archive holds no {', '.join(missing)}")


def _download_only(cls, root: Path) -> None:
    """torchvision's ``download()`` of ``cls`` alone: its constructor with download=True would go on to read the
    files (for CIFAR, pickle.load them) before they are checked here."""
    from torchvision.datasets import VisionDataset

    dataset = cls.__new__(cls)
    VisionDataset.__init__(dataset, str(root))  # what the class's download() reads of its instance: the root
    dataset.download()


def _archives(key: str, root: Path) -> list[Path]:
    """The archives torchvision's download leaves (kept when it succeeds, as torchvision does)."""
    cls = torchvision_class(key)
    if key in CIFAR_LABELS:
        return [root / cls.filename]
    return [files_folder(key, root) / archive for archive, _md5 in cls.resources]


def _download_failure(key: str, exc: Exception | None) -> str:
    """torchvision's reason on one line (none: only where), with the URLs it tried."""
    cls = torchvision_class(key)
    where = cls.url if key in CIFAR_LABELS else f"mirrors {', '.join(cls.mirrors)}"
    if exc is None:
        return where
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())
    if key in CIFAR_LABELS and str(exc) == "File not found or corrupted.":  # torchvision's md5 check of the archive
        reason = f"its md5 is not {cls.tgz_md5}"
    return f"{where}: {reason}"


# ----------------------------------------------------------------------------- reading through torchvision


class CorruptFile(ValueError):
    """A file of the dataset is not what torchvision reads; the message names the file and what is wrong."""


def read_mnist(key: str, root: Path, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """MNIST / Fashion-MNIST's train + test as uint8 (N, 28, 28, 1) and int64 labels (torchvision's class); `size`:
    the images' (H, W)."""
    cls = torchvision_class(key)
    parts = []
    for train in (True, False):
        prefix = "train" if train else "t10k"
        try:
            part = cls(root=str(root), train=train)
        except Exception as exc:  # torchvision's reader raises AssertionError, TypeError, ValueError, RuntimeError
            raise CorruptFile(_which_idx_file(root / cls.__name__ / "raw", prefix, exc)) from None
        h, w = size
        if tuple(part.data.shape[1:]) != (h, w):
            raise CorruptFile(f"{prefix}-images-idx3-ubyte: images of {'x'.join(map(str, part.data.shape[1:]))} "
                               f"pixels, expected {h}x{w}")
        if len(part.data) != len(part.targets):
            raise CorruptFile(f"{prefix}-images-idx3-ubyte holds {len(part.data)} images, "
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


def read_cifar(key: str, root: Path) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 / CIFAR-100's train + test as uint8 (N, 32, 32, 3) and int64 (fine) labels (torchvision's class),
    once every file has passed torchvision's md5 table and the numpy-only unpickler."""
    from torchvision.datasets.utils import check_integrity

    cls = torchvision_class(key)
    folder = root / cls.base_folder
    for name, md5 in expected_files(key):
        if not check_integrity(folder / name, md5):
            raise CorruptFile(f"{name}: its md5 is not torchvision's {md5} (not the official file)")
    for name, _md5 in expected_files(key):
        meta = name == cls.meta["filename"]
        _check_cifar_pickle(folder / name, cls.meta["key"] if meta else CIFAR_LABELS[key], meta=meta)
    try:
        parts = [cls(root=str(root), train=train) for train in (True, False)]
    except Exception as exc:  # a file changed since it was checked
        raise CorruptFile(f"torchvision's {cls.__name__} could not read it ({type(exc).__name__}: {exc})") from None
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
        raise CorruptFile(f"{path.name}: not a CIFAR batch pickle ({type(exc).__name__}: {exc})") from None
    if meta:
        if not isinstance(entry, dict) or label_key not in entry:
            got = sorted(map(str, entry)) if isinstance(entry, dict) else type(entry).__name__
            raise CorruptFile(f"{path.name}: expected a dict with {label_key!r}, got {got}")
        return
    if not isinstance(entry, dict) or "data" not in entry or label_key not in entry:
        keys = sorted(map(str, entry)) if isinstance(entry, dict) else type(entry).__name__
        raise CorruptFile(f"{path.name}: expected a dict with 'data' and {label_key!r}, got {keys}")
    data, labels = entry["data"], np.asarray(entry[label_key])
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        what = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise CorruptFile(f"{path.name}: 'data' is {what}, expected uint8 (n, 3072)")
    if labels.ndim != 1 or len(labels) != len(data) or (labels.size and labels.dtype.kind not in "iu"):
        raise CorruptFile(f"{path.name}: {label_key!r} holds {labels.shape} {labels.dtype} values for "
                           f"{len(data)} images, expected {len(data)} whole numbers")
