"""`download=True` (`--download`): the archives torchvision fetches, checked against their md5, unpacked into the same
layout, never leaving a folder that passes check_available unless it is complete. No network: synthetic archives are
served from a local http.server thread or file:// URLs, with the tables of URLs and md5 sums patched for the test."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import http.server
import io
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

import src.dataset_download as dataset_download
import src.datasets as datasets
from src.datasets import DatasetUnavailableError, check_available, dataset_folder, load_dataset
from torchvision_files import write_dataset

TITLES = {"mnist": "MNIST", "fashionmnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def make_archives(src: Path, out: Path, name: str, n_train=40, n_test=15, seed=0, leave_out=None):
    """The archives torchvision downloads for `name`, made from freshly written files, in `out`; returns (images,
    labels, {archive name: md5}). `leave_out`: a file not packed (a broken archive)."""
    images, labels = write_dataset(src, name, n_train, n_test, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    files = datasets._FILES[name]
    if name.startswith("cifar"):
        tgz = out / files.archives[0].name
        with tarfile.open(tgz, "w:gz") as tar:  # the official archive holds the folder itself
            for path in sorted((src / files.folder).iterdir()):
                if path.name != leave_out:
                    tar.add(path, arcname=f"{files.folder}/{path.name}")
    else:
        for archive in files.archives:
            with open(src / files.folder / archive.name[:-3], "rb") as f, gzip.open(out / archive.name, "wb") as g:
                g.write(f.read())
    return images, labels, {a.name: _md5(out / a.name) for a in files.archives}


def use_sources(monkeypatch, name, mirrors, md5s):
    """Point dataset `name`'s download at `mirrors` with the given md5 sums (the table patched, nothing else)."""
    files = datasets._FILES[name]
    archives = tuple(dataclasses.replace(a, mirrors=tuple(mirrors), md5=md5s[a.name]) for a in files.archives)
    monkeypatch.setitem(datasets._FILES, name, dataclasses.replace(files, archives=archives))


@pytest.fixture
def server(tmp_path):
    """A local HTTP server over tmp_path/"www"; yields (base URL, list of the paths requested)."""
    www = tmp_path / "www"
    www.mkdir()
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(www), **kwargs)

        def log_message(self, *args):
            pass

        def do_GET(self):
            requested.append(self.path)
            super().do_GET()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/", requested
    finally:
        httpd.shutdown()
        httpd.server_close()


def _pixels(x, name):
    x = np.asarray(x)
    return np.rint((x + 1.0) * 127.5 if name.startswith("cifar") else x * 255.0).astype(np.uint8)


def _assert_read_back(x, y, images, labels, name):
    c, h, w = datasets.dataset_info(name).input_shape
    np.testing.assert_array_equal(y, labels)
    np.testing.assert_array_equal(_pixels(x, name), images.reshape(len(images), h, w, c).transpose(0, 3, 1, 2))


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "mnist", "fashionmnist"])
def test_download_over_http_gives_the_layout_and_the_arrays(tmp_path, server, name, monkeypatch):
    base, requested = server
    images, labels, md5s = make_archives(tmp_path / "src", tmp_path / "www", name, seed=3)
    use_sources(monkeypatch, name, [base], md5s)
    root = tmp_path / "data"
    x, y = load_dataset(name, root, download=True)
    _assert_read_back(x, y, images, labels, name)
    folder = dataset_folder(name, root)
    # torchvision's layout: the files as written by hand (CIFAR: with its meta file); nothing else in root
    written = tmp_path / "src" / folder.relative_to(root)
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in written.iterdir())
    assert sorted(p.name for p in root.iterdir()) == [folder.relative_to(root).parts[0]]
    assert sorted(requested) == sorted(f"/{a}" for a in md5s)
    check_available(name, root)
    load_dataset(name, root, download=True)  # there already: nothing fetched again
    assert len(requested) == len(md5s)


@pytest.mark.parametrize("name", ["mnist", "fashionmnist"])
def test_a_mirror_that_fails_is_followed_by_the_next(tmp_path, server, name):
    base, requested = server
    images, labels, md5s = make_archives(tmp_path / "src", tmp_path / "www" / "good", name, seed=4)
    (tmp_path / "www" / "stale").mkdir()
    for archive in md5s:  # the first mirror serves other bytes (a wrong md5), the second is missing, the third good
        (tmp_path / "www" / "stale" / archive).write_bytes(b"stale")
    with pytest.MonkeyPatch.context() as mp:
        use_sources(mp, name, [f"{base}stale/", f"{base}missing/", f"{base}good/"], md5s)
        x, y = load_dataset(name, tmp_path / "data", download=True)
    _assert_read_back(x, y, images, labels, name)
    assert requested == [f"/{mirror}/{a}" for a in md5s for mirror in ("stale", "missing", "good")]


@pytest.mark.parametrize("name", ["cifar10", "mnist"])
def test_a_wrong_md5_fails_in_one_line_naming_dataset_and_url_and_leaves_nothing(tmp_path, name, no_network):
    make_archives(tmp_path / "src", tmp_path / "www", name)
    root = tmp_path / "data"
    root.mkdir()
    (root / "unrelated.txt").write_text("kept")
    first = datasets._FILES[name].archives[0].name
    md5s = {a.name: _md5(tmp_path / "www" / a.name) for a in datasets._FILES[name].archives}
    md5s[first] = "0" * 32
    with pytest.MonkeyPatch.context() as mp:
        use_sources(mp, name, [(tmp_path / "www").as_uri() + "/"], md5s)
        with pytest.raises(DatasetUnavailableError) as err:
            load_dataset(name, root, download=True)
    message = str(err.value)
    url = (tmp_path / "www" / first).as_uri()
    assert "\n" not in message
    assert message.startswith(f"{TITLES[name]} is not available: download failed ({url}: md5 "
                              f"{_md5(tmp_path / 'www' / first)}, expected {'0' * 32})")
    assert sorted(p.name for p in root.iterdir()) == ["unrelated.txt"]  # no folder, no staging, no archive
    with pytest.raises(DatasetUnavailableError, match="does not exist"):
        check_available(name, root)


def test_an_unreachable_url_fails_in_one_line_naming_it(tmp_path, no_network):
    with pytest.MonkeyPatch.context() as mp:
        gone = (tmp_path / "nowhere").as_uri() + "/"
        use_sources(mp, "cifar100", [gone], {"cifar-100-python.tar.gz": "0" * 32})
        with pytest.raises(DatasetUnavailableError) as err:
            load_dataset("cifar100", tmp_path / "data", download=True)
    message = str(err.value)
    assert "\n" not in message
    assert f"CIFAR-100 is not available: download failed ({gone}cifar-100-python.tar.gz: URLError: " in message
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == []


def test_an_archive_lacking_a_file_fails_naming_it_and_leaves_nothing(tmp_path, no_network):
    _images, _labels, md5s = make_archives(tmp_path / "src", tmp_path / "www", "cifar10", leave_out="test_batch")
    with pytest.MonkeyPatch.context() as mp:
        use_sources(mp, "cifar10", [(tmp_path / "www").as_uri() + "/"], md5s)
        with pytest.raises(DatasetUnavailableError, match=r"download failed \(file://.*cifar-10-python\.tar\.gz: the "
                                                          r"archive holds no test_batch under cifar-10-batches-py\)"):
            load_dataset("cifar10", tmp_path / "data", download=True)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == []


def test_an_archive_reaching_outside_its_folder_is_not_unpacked(tmp_path, no_network):
    """md5-checked archives are trusted only so far: tarfile's "data" filter refuses members outside the folder."""
    www = tmp_path / "www"
    www.mkdir()
    with tarfile.open(www / "cifar-10-python.tar.gz", "w:gz") as tar:
        payload = b"escaped"
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    with pytest.MonkeyPatch.context() as mp:
        use_sources(mp, "cifar10", [www.as_uri() + "/"], {"cifar-10-python.tar.gz": _md5(www / "cifar-10-python.tar.gz")})
        with pytest.raises(DatasetUnavailableError, match=r"cifar-10-python\.tar\.gz: cannot unpack it \("):
            load_dataset("cifar10", tmp_path / "data" / "deep", download=True)
    assert not list(tmp_path.rglob("escaped.txt"))
    assert sorted(p.name for p in (tmp_path / "data" / "deep").iterdir()) == []


class _Interrupted(BaseException):
    """Stands for Ctrl-C or a kill arriving between two moves into the dataset's folder."""


@pytest.mark.parametrize("name,already", [("cifar10", ()), ("cifar10", ("data_batch_1", "data_batch_2", "test_batch")),
                                          ("mnist", ()), ("mnist", ("train-images-idx3-ubyte",))])
def test_a_download_interrupted_at_any_move_leaves_no_folder_that_passes(tmp_path, name, already, no_network):
    """Interrupted before each move of a file into place in turn (the folder empty, or holding some files): the
    folder never passes check_available before the last move, and no staging folder is left behind."""
    images, labels, md5s = make_archives(tmp_path / "src", tmp_path / "www", name, seed=6)
    n_files = len(list((tmp_path / "src" / datasets._FILES[name].folder).iterdir()))
    real_replace = dataset_download.os.replace
    for stop_at in range(n_files + 1):
        root = tmp_path / f"data{stop_at}"
        folder = dataset_folder(name, root)
        if already:
            folder.mkdir(parents=True)
            for file in already:
                (folder / file).write_bytes((tmp_path / "src" / datasets._FILES[name].folder / file).read_bytes())
        moves = []

        def replace(src, dst):
            if len(moves) == stop_at:
                raise _Interrupted()
            moves.append(dst)
            real_replace(src, dst)

        with pytest.MonkeyPatch.context() as mp:
            use_sources(mp, name, [(tmp_path / "www").as_uri() + "/"], md5s)
            mp.setattr(dataset_download.os, "replace", replace)
            if stop_at < n_files:
                with pytest.raises(_Interrupted):
                    load_dataset(name, root, download=True)
                with pytest.raises(DatasetUnavailableError, match="missing|does not exist"):
                    check_available(name, root)
            else:
                x, y = load_dataset(name, root, download=True)
                _assert_read_back(x, y, images, labels, name)
        assert not [p for p in root.iterdir() if p.name.startswith(".download")]


def test_two_parties_downloading_into_one_folder_at_once(tmp_path, server):
    """Collaborators of a federation on one host may share data_dir and download at the same time."""
    base, _requested = server
    images, labels, md5s = make_archives(tmp_path / "src", tmp_path / "www", "cifar10", n_train=300, n_test=60)
    results, errors = [], []

    def party():
        try:
            results.append(load_dataset("cifar10", tmp_path / "data", download=True))
        except BaseException as exc:  # reported below
            errors.append(exc)

    with pytest.MonkeyPatch.context() as mp:
        use_sources(mp, "cifar10", [base], md5s)
        threads = [threading.Thread(target=party) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [] and len(results) == 3
    for x, y in results:
        _assert_read_back(x, y, images, labels, "cifar10")
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["cifar-10-batches-py"]

