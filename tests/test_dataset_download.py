"""`download=True` (`--download`): torchvision's download (its URLs, its md5 check of the archives, its layout), with
what src.data.datasets adds: one line naming the dataset and the URLs on a failure, nothing left behind by a failed
download, an interrupted one never read as complete, parties sharing a folder one at a time. No network: synthetic
archives are served from a local http.server thread (torchvision's download reads no file:// URL), torchvision's
tables of URLs and md5 sums patched for the test (the class attributes its download reads)."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torchvision.datasets as tvd
import torchvision.datasets.utils as tv_utils

import src.data.datasets as datasets
from src.data.datasets import DatasetUnavailableError, check_available, dataset_folder, load_dataset
from torchvision_files import md5_tables, write_dataset

TITLES = {"mnist": "MNIST", "fashionmnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}
CLASS = {"mnist": tvd.MNIST, "fashionmnist": tvd.FashionMNIST, "cifar10": tvd.CIFAR10, "cifar100": tvd.CIFAR100}


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def make_archives(src: Path, out: Path, name: str, n_train=40, n_test=15, seed=0, leave_out=None):
    """The archives torchvision downloads for `name`, made from freshly written files, in `out`; returns (images,
    labels, {archive name: md5}). `leave_out`: a file not packed (a broken archive)."""
    images, labels = write_dataset(src, name, n_train, n_test, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    cls = CLASS[name]
    if name.startswith("cifar"):
        tgz = out / cls.filename
        with tarfile.open(tgz, "w:gz") as tar:  # the official archive holds the folder itself
            for path in sorted((src / cls.base_folder).iterdir()):
                if path.name != leave_out:
                    tar.add(path, arcname=f"{cls.base_folder}/{path.name}")
        names = [cls.filename]
    else:
        names = [archive for archive, _md5 in cls.resources]
        for archive in names:
            with open(src / cls.__name__ / "raw" / archive[:-3], "rb") as f, gzip.open(out / archive, "wb") as g:
                g.write(f.read())
    return images, labels, {a: _md5(out / a) for a in names}


def use_sources(monkeypatch, name, mirrors, md5s, src=None):
    """Point torchvision's download of `name` at `mirrors` (base URLs) with the given archive md5s; for CIFAR also
    trust the files written under `src` (their md5s in torchvision's table, which the read checks)."""
    cls = CLASS[name]
    if name.startswith("cifar"):
        monkeypatch.setattr(cls, "url", mirrors[0] + cls.filename)
        monkeypatch.setattr(cls, "tgz_md5", md5s[cls.filename])
        if src is not None:
            for attr, value in md5_tables(src, name).items():
                monkeypatch.setattr(cls, attr, value)
    else:
        monkeypatch.setattr(cls, "mirrors", list(mirrors))
        monkeypatch.setattr(cls, "resources", [(a, md5s[a]) for a, _md5 in cls.resources])


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
    use_sources(monkeypatch, name, [base], md5s, src=tmp_path / "src")
    root = tmp_path / "data"
    x, y = load_dataset(name, root, download=True)
    _assert_read_back(x, y, images, labels, name)
    folder = dataset_folder(name, root)
    # torchvision's layout: the files as written (CIFAR: with its meta file), and the archives it keeps
    written = tmp_path / "src" / folder.relative_to(root)
    kept = {p.name for p in folder.iterdir()} - {p.name for p in written.iterdir()}
    assert kept == (set() if name.startswith("cifar") else set(md5s))
    assert sorted(p.name for p in root.iterdir()) == sorted({folder.relative_to(root).parts[0]} |
                                                            (set(md5s) if name.startswith("cifar") else set()))
    assert {path.lstrip("/") for path in requested} == set(md5s)
    check_available(name, root)
    before = len(requested)
    load_dataset(name, root, download=True)  # there already: nothing fetched again
    assert len(requested) == before


@pytest.mark.parametrize("name", ["mnist", "fashionmnist"])
def test_a_mirror_that_fails_is_followed_by_the_next(tmp_path, server, name, monkeypatch):
    base, requested = server
    images, labels, md5s = make_archives(tmp_path / "src", tmp_path / "www" / "good", name, seed=4)
    (tmp_path / "www" / "stale").mkdir()
    for archive in md5s:  # the first mirror serves other bytes (a wrong md5), the second is missing, the third good
        (tmp_path / "www" / "stale" / archive).write_bytes(b"stale")
    use_sources(monkeypatch, name, [f"{base}stale/", f"{base}missing/", f"{base}good/"], md5s)
    x, y = load_dataset(name, tmp_path / "data", download=True)
    _assert_read_back(x, y, images, labels, name)
    for archive in md5s:  # in the mirrors' order, each archive
        tried = [p.split("/")[1] for p in requested if p.endswith("/" + archive)]
        assert tried[0] == "stale" and tried[-1] == "good" and "missing" in tried


@pytest.mark.parametrize("name", ["cifar10", "mnist"])
def test_a_wrong_md5_fails_in_one_line_naming_dataset_and_url_and_leaves_nothing(tmp_path, name, server, monkeypatch):
    base, _requested = server
    make_archives(tmp_path / "src", tmp_path / "www", name)
    root = tmp_path / "data"
    root.mkdir()
    (root / "unrelated.txt").write_text("kept")
    md5s = {a: "0" * 32 for a in (p.name for p in (tmp_path / "www").iterdir())}
    mirror = base
    use_sources(monkeypatch, name, [mirror], md5s)
    with pytest.raises(DatasetUnavailableError) as err:
        load_dataset(name, root, download=True)
    message = str(err.value)
    assert "\n" not in message
    if name == "cifar10":
        assert message.startswith(f"CIFAR-10 is not available: download failed ({mirror}cifar-10-python.tar.gz: its "
                                  f"md5 is not {'0' * 32})")
    else:
        assert message.startswith(f"MNIST is not available: download failed (mirrors {mirror}: RuntimeError: Error "
                                  f"downloading train-images-idx3-ubyte.gz: Tried {mirror}, got: File not found or "
                                  f"corrupted.")
    assert sorted(p.name for p in root.iterdir()) == ["unrelated.txt"]  # no folder, no archive
    with pytest.raises(DatasetUnavailableError, match="does not exist"):
        check_available(name, root)


def test_an_unreachable_url_fails_in_one_line_naming_it(tmp_path, server, monkeypatch):
    gone = server[0] + "nowhere/"
    use_sources(monkeypatch, "cifar100", [gone], {"cifar-100-python.tar.gz": "0" * 32})
    with pytest.raises(DatasetUnavailableError) as err:
        load_dataset("cifar100", tmp_path / "data", download=True)
    message = str(err.value)
    assert "\n" not in message
    assert f"CIFAR-100 is not available: download failed ({gone}cifar-100-python.tar.gz: HTTPError: HTTP Error 404" \
        in message
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == []


def test_an_archive_lacking_a_file_fails_naming_it(tmp_path, server, monkeypatch):
    _images, _labels, md5s = make_archives(tmp_path / "src", tmp_path / "www", "cifar10", leave_out="test_batch")
    use_sources(monkeypatch, "cifar10", [server[0]], md5s, src=tmp_path / "src")
    with pytest.raises(DatasetUnavailableError, match=r"download failed \(http://.*cifar-10-python\.tar\.gz: the "
                                                      r"archive holds no test_batch\)"):
        load_dataset("cifar10", tmp_path / "data", download=True)
    with pytest.raises(DatasetUnavailableError, match="test_batch missing"):
        check_available("cifar10", tmp_path / "data")


def test_an_archive_reaching_outside_its_folder_is_not_unpacked(tmp_path, server, monkeypatch):
    """An md5-checked archive is trusted only so far: it is unpacked with tarfile's "data" filter, which refuses
    members outside the folder (torchvision itself unpacks with none)."""
    www = tmp_path / "www"
    with tarfile.open(www / "cifar-10-python.tar.gz", "w:gz") as tar:
        payload = b"escaped"
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    use_sources(monkeypatch, "cifar10", [server[0]], {"cifar-10-python.tar.gz": _md5(www / "cifar-10-python.tar.gz")})
    with pytest.raises(DatasetUnavailableError, match=r"cifar-10-python\.tar\.gz: OutsideDestinationError"):
        load_dataset("cifar10", tmp_path / "data" / "deep", download=True)
    assert not list(tmp_path.rglob("escaped.txt"))
    assert sorted(p.name for p in (tmp_path / "data" / "deep").iterdir()) == []
    assert tarfile.TarFile.extraction_filter is None  # the filter was set for the download only


class _Interrupted(BaseException):
    """Stands for Ctrl-C or a kill arriving in the middle of unpacking."""


@pytest.mark.parametrize("name", ["cifar10", "mnist"])
def test_a_download_interrupted_while_unpacking_is_not_read_and_the_next_completes_it(tmp_path, name, server,
                                                                                        monkeypatch):
    """Interrupted after each file it unpacks in turn: a run without --download stops in one line (a file missing,
    or for CIFAR a file whose md5 is not the archive's), and the next download completes the folder from the
    archive torchvision kept (nothing fetched twice) and reads exactly the data."""
    images, labels, md5s = make_archives(tmp_path / "src", tmp_path / "www", name, seed=6)
    base, requested = server
    use_sources(monkeypatch, name, [base], md5s, src=tmp_path / "src")
    n_files = len(list((tmp_path / "src" / dataset_folder(name, tmp_path / "src").relative_to(tmp_path / "src"))
                       .iterdir()))
    if name == "cifar10":  # a tar member at a time
        real, owner, attr = tarfile.TarFile._extract_one, tarfile.TarFile, "_extract_one"
    else:  # a .gz at a time
        real, owner, attr = tv_utils.extract_archive, tv_utils, "extract_archive"
    for stop_at in range(n_files):
        root = tmp_path / f"data{stop_at}"
        done = []

        def interrupted(*args, **kwargs):
            if len(done) == stop_at:
                raise _Interrupted()
            done.append(1)
            return real(*args, **kwargs)

        with monkeypatch.context() as mp:
            mp.setattr(owner, attr, interrupted)
            with pytest.raises(_Interrupted):
                load_dataset(name, root, download=True)
        with pytest.raises(DatasetUnavailableError) as err:
            load_dataset(name, root)
        assert "\n" not in str(err.value)
        assert any(why in str(err.value) for why in ("does not exist", "missing", "md5")), str(err.value)
        requested.clear()
        x, y = load_dataset(name, root, download=True)
        _assert_read_back(x, y, images, labels, name)
        # what was fetched before the interruption is unpacked again from the archive torchvision kept
        assert len(requested) == 2 * (len(md5s) - (stop_at + 1 if name == "mnist" else 1))


def test_two_parties_downloading_into_one_folder_at_once(tmp_path, server, monkeypatch):
    """Collaborators of a federation on one host may share data_dir and download at the same time: one at a time,
    the archive fetched once."""
    base, requested = server
    images, labels, md5s = make_archives(tmp_path / "src", tmp_path / "www", "cifar10", n_train=300, n_test=60)
    use_sources(monkeypatch, "cifar10", [base], md5s, src=tmp_path / "src")
    results, errors = [], []

    def party():
        try:
            results.append(load_dataset("cifar10", tmp_path / "data", download=True))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=party) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 3
    for x, y in results:
        _assert_read_back(x, y, images, labels, "cifar10")
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["cifar-10-batches-py", "cifar-10-python.tar.gz"]
    assert sum(p.endswith("cifar-10-python.tar.gz") for p in requested) <= 2  # torchvision: a redirect check + the file
