"""MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100 read by torchvision's dataset classes from small files this test writes
in torchvision's on-disk layout (never a download): images and labels read back exactly, class counts, the one-line
error of a missing dataset or of each kind of corrupted file, a pickle that would run code refused before anything
unpickles it, the models on their shapes, and a short audited round on each. torchvision checks CIFAR's files against
the official files' md5s: `trust_files` puts the test files' md5s in its table."""


import pickle
import re
import struct

import numpy as np
import pytest

from src.data.datasets import (DATASETS, DatasetUnavailableError, check_available, dataset_folder, dataset_info,
                          load_dataset)
from torchvision_files import CLASSES, python2_batch_pickle, trust_files, write_dataset

ON_DISK = ("mnist", "fashionmnist", "cifar10", "cifar100")


def test_the_datasets_and_their_shapes():
    assert set(ON_DISK) < set(DATASETS)
    assert dataset_info("mnist").input_shape == dataset_info("fashionmnist").input_shape == (1, 28, 28)
    assert dataset_info("cifar100").input_shape == (3, 32, 32)
    assert [dataset_info(n).num_classes for n in ON_DISK] == [10, 10, 10, 100]


@pytest.mark.parametrize("name", ON_DISK)
def test_read_back_exactly_what_was_written(tmp_path, name, no_network, monkeypatch):
    images, labels = write_dataset(tmp_path, name, n_train=130, n_test=37, seed=ON_DISK.index(name))
    trust_files(monkeypatch, tmp_path, name)
    x, y = load_dataset(name, tmp_path)
    c, h, w = dataset_info(name).input_shape
    assert x.shape == (167, c, h, w) and x.dtype == np.float32 and y.dtype == np.int64
    x = np.asarray(x)  # the float32 values the pixels are read as
    np.testing.assert_array_equal(y, labels)  # train then test, in file order
    assert np.bincount(y, minlength=CLASSES[name]).tolist() == np.bincount(labels, minlength=CLASSES[name]).tolist()
    assert np.bincount(y).size == CLASSES[name]  # every class present (the writer cycles through them first)
    nchw = images.reshape(167, h, w, c).transpose(0, 3, 1, 2)
    if name.startswith("cifar"):  # ToTensor then Normalize(0.5, 0.5), as the tutorial
        # float32 pixel / 255, - 0.5, / 0.5: three roundings of values at most 1, at most 3 u = 1.8e-7
        np.testing.assert_allclose(x, (nchw / 255.0 - 0.5) / 0.5, rtol=0, atol=1e-6)
        back = np.rint((x + 1.0) * 127.5)
    else:  # ToTensor only: [0, 1]
        np.testing.assert_allclose(x, nchw / 255.0, rtol=0, atol=1e-7)  # one rounding of a value <= 1: u = 6e-8
        back = np.rint(x * 255.0)
    np.testing.assert_array_equal(back.astype(np.uint8), nchw)  # the pixels themselves, not only close


@pytest.mark.parametrize("name", ON_DISK)
def test_missing_dataset_one_line_naming_folder_flags_and_download(tmp_path, name, no_network):
    folder = dataset_folder(name, tmp_path)
    for loader in (lambda: check_available(name, tmp_path), lambda: load_dataset(name, tmp_path)):
        with pytest.raises(DatasetUnavailableError) as err:
            loader()
        message = str(err.value)
        assert "\n" not in message
        for part in (str(folder), "--data-dir", "data_loader.settings.data_dir", "--download",
                     "data_loader.settings.download: true", "does not exist"):
            assert part in message, (part, message)
    # One file short: named.
    write_dataset(tmp_path, name, 20, 10)
    gone = sorted(p for p in folder.iterdir() if p.name not in ("meta", "batches.meta"))[-1]
    gone.unlink()
    with pytest.raises(DatasetUnavailableError, match=f"incomplete.*{gone.name} missing"):
        load_dataset(name, tmp_path)
    check_available(name, tmp_path / "elsewhere", download=True)  # would download: nothing to say before it


def test_digits_needs_no_folder(tmp_path):
    assert dataset_folder("digits", tmp_path) is None
    check_available("digits", tmp_path / "none")


@pytest.mark.parametrize("name", ["mnist", "cifar100"])
def test_corrupt_files_fail_naming_the_dataset(tmp_path, name, no_network, monkeypatch):
    write_dataset(tmp_path, name, 20, 10)
    folder = dataset_folder(name, tmp_path)
    if name == "mnist":  # a label file cut short
        path = folder / "t10k-labels-idx1-ubyte"
        path.write_bytes(path.read_bytes()[:-3])
        match = "MNIST is not available: its files are incomplete or corrupted"
    else:  # a fine label of 100 among 100 classes
        import pickle

        with open(folder / "test", "rb") as f:
            entry = pickle.load(f)
        entry["fine_labels"][0] = 100
        with open(folder / "test", "wb") as f:
            pickle.dump(entry, f)
        match = r"CIFAR-100 is not available: its files are corrupted: labels in \[\d+, 100\], expected \[0, 99\]"
        trust_files(monkeypatch, tmp_path, name)
    with pytest.raises(DatasetUnavailableError, match=match):
        load_dataset(name, tmp_path)


def _idx(magic: int, dims, payload: bytes) -> bytes:
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload


def _rewrite_pickle(path, change):
    with open(path, "rb") as f:
        entry = pickle.load(f)
    change(entry)
    with open(path, "wb") as f:
        pickle.dump(entry, f)


# Each: (dataset, file to spoil, how, what the message must say about it). A spoiled CIFAR file is trusted (its md5 in
# torchvision's table) so that what is tested is the check of its contents; the md5 check has its own test.
CORRUPTIONS = [
    ("mnist", "train-images-idx3-ubyte", lambda b: _idx(2049, [20 * 28 * 28], b[16:]),
     r"train-images-idx3-ubyte: not an idx file torchvision reads \(ValueError: x should have 3 dimension"),
    ("mnist", "t10k-labels-idx1-ubyte", lambda b: _idx(2051, [10, 1, 1], b[8:]),
     r"t10k-labels-idx1-ubyte: not an idx file torchvision reads \(ValueError: x should have 1 dimension"),
    ("mnist", "train-images-idx3-ubyte", lambda b: _idx(2051, [20, 28, 28], b[16:] + b"\0"),
     r"train-images-idx3-ubyte: not an idx file torchvision reads \(RuntimeError: shape '\[20, 28, 28\]' is "
     r"invalid for input of size 15681"),
    ("mnist", "train-images-idx3-ubyte", lambda b: b[:6],
     r"train-images-idx3-ubyte: not an idx file torchvision reads"),
    ("fashionmnist", "t10k-images-idx3-ubyte", lambda b: _idx(2051, [10, 20, 20], bytes(4000)),
     r"t10k-images-idx3-ubyte: images of 20x20 pixels, expected 28x28"),
    ("fashionmnist", "train-labels-idx1-ubyte", lambda b: _idx(2049, [19], b[8:27]),
     r"train-images-idx3-ubyte holds 20 images, train-labels-idx1-ubyte 19 labels"),
    ("fashionmnist", "train-labels-idx1-ubyte", lambda b: _idx(2049, [20], b[8:27] + bytes([10])),
     r"its files are corrupted: labels in \[\d+, 10\], expected \[0, 9\]"),
    ("cifar10", "data_batch_3", lambda b: b"not a pickle at all",
     r"data_batch_3: not a CIFAR batch pickle \(UnpicklingError"),
    ("cifar10", "test_batch", lambda b: b[: len(b) // 2], r"test_batch: not a CIFAR batch pickle"),
    ("cifar10", "data_batch_1", lambda b: pickle.dumps([1, 2, 3]),
     r"data_batch_1: expected a dict with 'data' and 'labels', got list"),
    ("cifar10", "data_batch_2", lambda b: pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "fine_labels": [0, 1]}),
     r"data_batch_2: expected a dict with 'data' and 'labels', got \['data', 'fine_labels'\]"),
    ("cifar10", "data_batch_2", lambda b: pickle.dumps({"data": np.zeros((2, 3000), np.uint8), "labels": [0, 1]}),
     r"data_batch_2: 'data' is uint8 \(2, 3000\), expected uint8 \(n, 3072\)"),
    ("cifar10", "batches.meta", lambda b: pickle.dumps({"names": []}),
     r"batches.meta: expected a dict with 'label_names', got \['names'\]"),
    ("cifar100", "train", lambda b: pickle.dumps({"data": np.zeros((2, 3072), np.float32), "fine_labels": [0, 1]}),
     r"train: 'data' is float32 \(2, 3072\), expected uint8"),
    ("cifar100", "test", lambda b: pickle.dumps({"data": np.zeros((3, 3072), np.uint8), "fine_labels": [0, 1]}),
     r"test: 'fine_labels' holds \(2,\) int64 values for 3 images, expected 3 whole numbers"),
    ("cifar100", "test", lambda b: pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "fine_labels": [0.5, 1]}),
     r"test: 'fine_labels' holds \(2,\) float64 values"),
]


@pytest.mark.parametrize("name,file,spoil,says", CORRUPTIONS,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CORRUPTIONS)])
def test_each_corruption_is_one_line_naming_the_dataset_and_file(tmp_path, name, file, spoil, says, no_network,
                                                                  monkeypatch):
    write_dataset(tmp_path, name, 20, 10)
    path = dataset_folder(name, tmp_path) / file
    path.write_bytes(spoil(path.read_bytes()))
    trust_files(monkeypatch, tmp_path, name)
    with pytest.raises(DatasetUnavailableError) as err:
        load_dataset(name, tmp_path)
    message = str(err.value)
    assert "\n" not in message
    title = {"mnist": "MNIST", "fashionmnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}[name]
    assert message.startswith(f"{title} is not available: its files are")
    assert str(dataset_folder(name, tmp_path)) in message
    assert re.search(says, message), (says, message)


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_a_cifar_file_other_than_the_official_one_fails_its_md5_naming_it(tmp_path, name, no_network, monkeypatch):
    """torchvision's md5 table: a CIFAR file changed by one byte (still a valid pickle of the right shape) is refused,
    naming the file and the md5 it should have, before anything unpickles it."""
    write_dataset(tmp_path, name, 20, 10)
    trust_files(monkeypatch, tmp_path, name)
    load_dataset(name, tmp_path)  # trusted as written
    file = "data_batch_2" if name == "cifar10" else "test"
    path = dataset_folder(name, tmp_path) / file
    entry = pickle.loads(path.read_bytes())
    entry["data"][0, 0] ^= 1
    path.write_bytes(pickle.dumps(entry))
    import torchvision.datasets as tvd

    expected = dict((tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100).train_list
                    + (tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100).test_list)[file]
    with pytest.raises(DatasetUnavailableError) as err:
        load_dataset(name, tmp_path)
    assert "\n" not in str(err.value)
    assert f"its files are incomplete or corrupted ({file}: its md5 is not torchvision's {expected}" in str(err.value)
    monkeypatch.undo()  # torchvision's own table: the test's files are not the official ones
    with pytest.raises(DatasetUnavailableError, match=r"data_batch_1|train: its md5 is not torchvision's"):
        load_dataset(name, tmp_path)


@pytest.mark.parametrize("name,label_key", [("cifar10", "labels"), ("cifar100", "fine_labels")])
def test_official_python2_pickles_read_as_pickle_reads_them(tmp_path, name, label_key, no_network, monkeypatch):
    """The official batches are Python 2 pickles (numpy 1, byte strings as str): read as pickle.load(encoding=
    "latin1") reads them, which is what torchvision does; the test's own files are numpy 2 pickles."""
    images, labels = write_dataset(tmp_path, name, 30, 12, seed=5)
    folder = dataset_folder(name, tmp_path)
    rows = images.transpose(0, 3, 1, 2).reshape(len(images), -1)
    files = sorted(p.name for p in folder.iterdir() if p.name not in ("meta", "batches.meta"))
    files = [f for f in files if f != "test_batch" and f != "test"] + ["test_batch" if name == "cifar10" else "test"]
    bounds = np.concatenate([np.linspace(0, 30, len(files)).astype(int), [42]])
    for file, start, stop in zip(files, bounds[:-1], bounds[1:]):
        blob = python2_batch_pickle(rows[start:stop], labels[start:stop].tolist(), label_key)
        with pytest.raises(UnicodeDecodeError):
            pickle.loads(blob)  # Python 2 str holding raw bytes: only latin1 decodes them, as for the real files
        reference = pickle.loads(blob, encoding="latin1")
        np.testing.assert_array_equal(reference["data"], rows[start:stop])
        (folder / file).write_bytes(blob)
    trust_files(monkeypatch, tmp_path, name)
    x, y = load_dataset(name, tmp_path)
    np.testing.assert_array_equal(y, labels)
    np.testing.assert_array_equal(np.rint((np.asarray(x) + 1.0) * 127.5).astype(np.uint8),
                                  images.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar_pickles_of_any_protocol(tmp_path, protocol, no_network, monkeypatch):
    images, labels = write_dataset(tmp_path, "cifar100", 17, 9, seed=protocol)
    folder = dataset_folder("cifar100", tmp_path)
    for file in ("train", "test"):
        entry = pickle.loads((folder / file).read_bytes())
        (folder / file).write_bytes(pickle.dumps(entry, protocol=protocol))
    trust_files(monkeypatch, tmp_path, "cifar100")
    x, y = load_dataset("cifar100", tmp_path)
    np.testing.assert_array_equal(y, labels)
    np.testing.assert_array_equal(np.rint((np.asarray(x) + 1.0) * 127.5).astype(np.uint8),
                                  images.transpose(0, 3, 1, 2))


class _RunsCode:
    """Pickles as a call of open(marker, "w"): loading it with pickle.load would create the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_pickle_that_would_run_code_is_refused_unrun(tmp_path, no_network, monkeypatch):
    """Even with its md5 in torchvision's table (which torchvision alone would then pickle.load), a pickle naming
    anything but numpy's arrays is refused, and nothing in it runs."""
    write_dataset(tmp_path, "cifar10", 20, 10)
    marker = tmp_path / "ran"
    blob = pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1], "x": _RunsCode(marker)})
    pickle.loads(blob).clear()  # what plain unpickling does
    assert marker.exists()
    marker.unlink()
    (dataset_folder("cifar10", tmp_path) / "data_batch_4").write_bytes(blob)
    trust_files(monkeypatch, tmp_path, "cifar10")
    with pytest.raises(DatasetUnavailableError, match=r"data_batch_4: not a CIFAR batch pickle \(UnpicklingError: "
                                                      r"refused to load (builtins|io)\.open"):
        load_dataset("cifar10", tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("name", ON_DISK)
@pytest.mark.parametrize("model", ["cnn", "fcnn", "alexnet", "resnet18"])
def test_models_take_each_datasets_shape(name, model):
    import torch

    from src.runner.models import build_model

    info = dataset_info(name)
    net = build_model(model, info.input_shape, info.num_classes)
    out = net.eval()(torch.zeros(3, *info.input_shape))
    assert out.shape == (3, info.num_classes)


def test_loader_reads_a_shard_from_the_files(tmp_path, no_network, monkeypatch):
    from src.dataloader import AuditDataLoader, clear_dataset_cache
    from src.data.split import split_indices

    _images, labels = write_dataset(tmp_path, "cifar100", 200, 100)
    trust_files(monkeypatch, tmp_path, "cifar100")
    clear_dataset_cache()
    try:
        dl = AuditDataLoader(data_path="2", dataset="cifar100", data_dir=str(tmp_path), collaborator_count=2,
                             train_dataset_ratio=0.4, test_dataset_ratio=0.4, audit_dataset_ratio=0.2, seed=1)
    finally:
        clear_dataset_cache()
    assert dl.get_feature_shape() == [3, 32, 32] and dl.get_num_classes() == 100
    part = split_indices(labels, 2, seed=1)[1]
    np.testing.assert_array_equal(dl.y_train, labels[part["train"]])
    np.testing.assert_array_equal(dl.y_population, labels[part["population"]])


def test_loader_and_demo_name_the_datasets(tmp_path):
    import cifar10_PM
    from src.dataloader import AuditDataLoader

    with pytest.raises(ValueError, match=r"data_loader\.settings\.dataset: unknown dataset 'emnist'.*fashionmnist"):
        AuditDataLoader(data_path=None, dataset="emnist")
    assert AuditDataLoader(data_path=None, dataset="fashionmnist", data_dir=tmp_path).get_feature_shape() == [1, 28, 28]
    action = next(a for a in cifar10_PM.build_parser()._actions if a.dest == "dataset")
    assert tuple(action.choices) == DATASETS


@pytest.mark.federation
@pytest.mark.parametrize("name,model", [("mnist", "fcnn"), ("fashionmnist", "cnn"), ("cifar10", "cnn"),
                                        ("cifar100", "fcnn")])
def test_a_short_audited_round_on_each(tmp_path, name, model, no_network, monkeypatch):
    """One round, two collaborators, the audit on: the tiny files are what the collaborators train and audit on."""
    import json

    from report_drawing import no_report_drawing
    from src.dataloader import clear_dataset_cache
    from workspace.in_process import run_in_process

    _images, labels = write_dataset(tmp_path / "data", name, 160, 80)
    trust_files(monkeypatch, tmp_path / "data", name)
    clear_dataset_cache()
    try:
        with no_report_drawing():  # the records are read, not the pages
            result = run_in_process(tmp_path / "run", collaborators=2, rounds=1, overrides={
                "data_loader": {"settings": {"dataset": name, "data_dir": str(tmp_path / "data"), "batch_size": 16,
                                             "train_dataset_ratio": 0.4, "test_dataset_ratio": 0.4,
                                             "audit_dataset_ratio": 0.2}},
                "tasks": {"train": {"kwargs": {"epochs": 1}}},
                "task_runner": {"settings": {"model": model, "audit": {"signals": ["loss"], "fpr_tolerance": [0.5]}}},
            })
    finally:
        clear_dataset_cache()
    for col in ("collaborator1", "collaborator2"):
        loader = result.runner(col).data_loader
        assert loader.get_num_classes() == CLASSES[name] and len(loader.y_train) == 48  # 0.4 * 240 / 2
        assert set(loader.y_train) <= set(labels.tolist())
        record = json.loads((result.report_dir / col / "round_0000" / "audit.json").read_text())
        auc = record["metrics"]["mia_local_loss_auc"]
        assert 0.0 <= auc <= 1.0
    assert 0.0 <= result.round_logs[0]["aggregator/aggregated_model_validation/accuracy"] <= 1.0


def test_the_multi_process_tool_checks_the_dataset_before_any_folder(tmp_path, no_network):
    """`python -m workspace run`: collaborators run in their own folders, so a relative data_dir is refused, and a
    missing dataset fails in one line naming the plan key and the folder, before any folder is made."""
    from pathlib import Path

    from workspace.run_plan import PlanOverrideError, build_run_plan

    plan = Path(__file__).resolve().parents[1] / "plan" / "plan.yaml"

    def build(**settings):
        return build_run_plan(plan, collaborators=2, rounds=1, port=50000, use_tls=True,
                              overrides={"data_loader": {"settings": {"dataset": "mnist", **settings}}})

    with pytest.raises(PlanOverrideError, match=r"data_loader\.settings\.data_dir: 'data' is relative.*absolute path"):
        build(data_dir="data")
    with pytest.raises(PlanOverrideError) as err:
        build(data_dir=str(tmp_path))
    assert "\n" not in str(err.value) and str(tmp_path / "MNIST" / "raw") in str(err.value)
    assert "data_loader.settings.download: true" in str(err.value)
    write_dataset(tmp_path, "mnist", 20, 10)
    assert build(data_dir=str(tmp_path))["data_loader"]["settings"]["data_dir"] == str(tmp_path)
    build(data_dir="data", download=True)  # each collaborator may download into its own folder
