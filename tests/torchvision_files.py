"""Small datasets written in torchvision's on-disk layout (the files torchvision reads, in their own formats), for
tests that must never download: MNIST / Fashion-MNIST's uncompressed idx files and CIFAR's python pickles."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np

MNIST_FOLDERS = {"mnist": "MNIST", "fashionmnist": "FashionMNIST"}
CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
CLASSES = {"mnist": 10, "fashionmnist": 10, "cifar10": 10, "cifar100": 100}
SHAPES = {"mnist": (28, 28), "fashionmnist": (28, 28), "cifar10": (32, 32, 3), "cifar100": (32, 32, 3)}


def _write_idx(path: Path, array: np.ndarray) -> None:
    """The idx format (LeCun's): magic 0x0000 08 <ndim> (unsigned byte data), big-endian dims, then the bytes."""
    assert array.dtype == np.uint8
    header = struct.pack(">I", 0x0800 | array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.tobytes())


def _write_pickle(path: Path, obj) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def write_dataset(root: Path, name: str, n_train: int, n_test: int, seed: int = 0):
    """Random images and labels written under `root` as torchvision keeps dataset `name`.

    Returns (images uint8 (N, H, W[, C]) in torchvision's order: train then test, labels int64 (N,)). Labels cycle
    through every class first (each class appears when N >= classes), then are random."""
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    images = rng.integers(0, 256, size=(n, *SHAPES[name]), dtype=np.uint8)
    k = CLASSES[name]
    labels = np.concatenate([rng.permutation(k), rng.integers(0, k, size=max(0, n - k))])[:n].astype(np.int64)
    root = Path(root)
    if name in MNIST_FOLDERS:
        raw = root / MNIST_FOLDERS[name] / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        for prefix, sl in (("train", slice(0, n_train)), ("t10k", slice(n_train, n))):
            _write_idx(raw / f"{prefix}-images-idx3-ubyte", images[sl])
            _write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels[sl].astype(np.uint8))
        return images, labels
    folder = root / CIFAR_FOLDERS[name]
    folder.mkdir(parents=True, exist_ok=True)
    rows = images.transpose(0, 3, 1, 2).reshape(n, -1)  # CIFAR rows: 1024 red, 1024 green, 1024 blue
    if name == "cifar100":
        for file, sl in (("train", slice(0, n_train)), ("test", slice(n_train, n))):
            _write_pickle(folder / file, {"filenames": [f"{i}.png" for i in range(n)[sl]], "batch_label": file,
                                          "fine_labels": labels[sl].tolist(),
                                          "coarse_labels": (labels[sl] // 5).tolist(), "data": rows[sl]})
        _write_pickle(folder / "meta", {"fine_label_names": [f"class{i}" for i in range(100)],
                                        "coarse_label_names": [f"super{i}" for i in range(20)]})
        return images, labels
    # CIFAR-10: the train part dealt over data_batch_1..5 in order
    bounds = np.linspace(0, n_train, 6).astype(int)
    for b in range(5):
        sl = slice(bounds[b], bounds[b + 1])
        _write_pickle(folder / f"data_batch_{b + 1}", {"batch_label": f"training batch {b + 1}",
                                                       "labels": labels[sl].tolist(), "data": rows[sl]})
    _write_pickle(folder / "test_batch", {"batch_label": "testing batch 1", "labels": labels[n_train:].tolist(),
                                          "data": rows[n_train:]})
    _write_pickle(folder / "batches.meta", {"label_names": [f"class{i}" for i in range(10)]})
    return images, labels


def python2_batch_pickle(data: np.ndarray, labels, label_key: str) -> bytes:
    """A CIFAR batch {"data": uint8 (n, 3072), label_key: [ints]} pickled as the official files are: Python 2's
    protocol 2, byte strings as str (SHORT_BINSTRING/BINSTRING), numpy 1's ``numpy.core.multiarray._reconstruct``.
    Written opcode by opcode (pickletools' names) since no Python 2 is at hand; numpy 2 pickles name ``numpy._core``
    and Python 3 encodes bytes through ``_codecs.encode``, so a numpy 2 pickle would not test this path."""
    assert data.dtype == np.uint8 and data.ndim == 2

    def short_str(s: str) -> bytes:  # SHORT_BINSTRING: a Python 2 str
        return b"U" + bytes([len(s)]) + s.encode("latin1")

    def int_op(v: int) -> bytes:  # BININT1 / BININT2 / BININT
        return b"K" + bytes([v]) if 0 <= v < 256 else b"M" + struct.pack("<H", v) if 0 <= v < 65536 else \
            b"J" + struct.pack("<i", v)

    dtype = (b"cnumpy\ndtype\n" + short_str("u1") + int_op(0) + int_op(1) + b"\x87R"  # numpy.dtype("u1", 0, 1)
             + b"(" + int_op(3) + short_str("|") + b"NNN" + int_op(-1) + int_op(-1) + int_op(0) + b"tb")
    raw = data.tobytes()
    array = (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + int_op(0) + b"\x85" + short_str("b")
             + b"\x87R"  # _reconstruct(ndarray, (0,), "b"), then its state:
             + b"(" + int_op(1) + int_op(data.shape[0]) + int_op(data.shape[1]) + b"\x86" + dtype + b"\x89"
             + b"T" + struct.pack("<I", len(raw)) + raw + b"tb")
    label_list = b"](" + b"".join(int_op(int(v)) for v in labels) + b"e"
    return (b"\x80\x02}(" + short_str("batch_label") + short_str("training batch 1 of 5") + short_str("data") + array
            + short_str(label_key) + label_list + b"u.")


def md5_tables(root: Path, name: str) -> dict:
    """torchvision's md5 table of CIFAR class `name` (train_list, test_list, meta) with the md5s of the files under
    `root` in their place: what trust_files sets so that torchvision takes these files for the official ones. MNIST's raw files have no md5 in torchvision: nothing to set."""
    import hashlib

    import torchvision.datasets as tvd

    cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
    folder = Path(root) / cls.base_folder

    def md5(file: str) -> str:
        return hashlib.md5((folder / file).read_bytes()).hexdigest()

    return {"train_list": [[f, md5(f)] for f, _ in cls.train_list],
            "test_list": [[f, md5(f)] for f, _ in cls.test_list], "meta": {**cls.meta, "md5": md5(cls.meta["filename"])}}


def trust_files(monkeypatch, root: Path, name: str) -> None:
    """Make torchvision take the CIFAR files written under `root` (write_dataset) for the official ones (their md5s
    in its table), for this test; a no-op for MNIST / Fashion-MNIST."""
    if name not in CIFAR_FOLDERS:
        return
    import torchvision.datasets as tvd

    cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
    for attr, value in md5_tables(root, name).items():
        monkeypatch.setattr(cls, attr, value)
