"""Fetch a dataset's archives, check each against its published md5, unpack them and put the files in place.

Written with the standard library (urllib, hashlib, tarfile, gzip) because the datasets are no longer read through
torchvision (see src/datasets.py). An interrupted or failed download leaves no folder the reader would take for a
complete dataset: everything is fetched and unpacked in a staging folder next to the destination, which is removed
at the end, and the files are moved in one by one (``os.replace``), those the destination lacked last, so the
dataset's folder holds every file it needs only once the last one is in.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Archive", "DownloadError", "fetch_verified", "install_archives"]

_CHUNK = 1 << 20
_TIMEOUT_S = 60  # per blocking read, not for the whole file


class DownloadError(RuntimeError):
    """No mirror gave an archive with the expected md5, or the archive lacks a file (one line, naming the URLs)."""


@dataclass(frozen=True)
class Archive:
    """One file a dataset's download fetches: its name, its published md5 and the base URLs to try, in order."""

    name: str  # e.g. "cifar-10-python.tar.gz", "train-images-idx3-ubyte.gz"
    md5: str
    mirrors: tuple[str, ...]  # base URLs ending in "/": the URL is mirror + name

    def urls(self) -> list[str]:
        return [mirror + self.name for mirror in self.mirrors]


def _fetch_one(url: str, dest: Path) -> str:
    """Stream url into dest; the md5 hex digest of what was written."""
    digest = hashlib.md5(usedforsecurity=False)  # a checksum against the published one, not a security measure
    with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response, open(dest, "wb") as out:
        while chunk := response.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def fetch_verified(archive: Archive, dest: Path) -> str:
    """Download ``archive`` into the file ``dest`` from the first mirror that serves it with its md5; returns that
    URL. Raises DownloadError naming every URL tried and what went wrong there (one line); dest is then absent."""
    failures = []
    for url in archive.urls():
        print(f"Downloading {url}", file=sys.stderr, flush=True)
        try:
            md5 = _fetch_one(url, dest)
        except (OSError, ValueError) as exc:  # URLError, HTTPError and timeouts are OSErrors; ValueError: bad URL
            failures.append(f"{url}: {type(exc).__name__}: {' '.join(str(exc).split())}")
            dest.unlink(missing_ok=True)
            continue
        if md5 == archive.md5:
            return url
        failures.append(f"{url}: md5 {md5}, expected {archive.md5}")
        dest.unlink(missing_ok=True)
    raise DownloadError("; ".join(failures))


def _unpack(path: Path, out_dir: Path) -> None:
    """A .tar.gz into out_dir (the data filter: no absolute paths, links out, devices), a .gz into out_dir/<stem>."""
    if path.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(path, "r:gz") as tar:
            tar.extractall(out_dir, filter="data")
    elif path.suffix == ".gz":
        with gzip.open(path, "rb") as src, open(out_dir / path.stem, "wb") as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
    else:  # pragma: no cover - the tables in src/datasets.py name only these kinds
        raise ValueError(f"cannot unpack {path.name}: neither .tar.gz nor .gz")


def install_archives(archives: tuple[Archive, ...], root: Path, folder: str, needed: tuple[str, ...]) -> None:
    """Fetch and check every archive, unpack them, and move the files they put in ``folder`` (relative to the
    unpacked tree, e.g. "cifar-10-batches-py" or "." for bare .gz files) into ``root / folder`` (for a bare .gz:
    ``root / folder`` directly). ``needed`` are the files the reader needs there: a missing one fails the download.

    Raises DownloadError (one line, naming the URLs); nothing is left in ``root`` but what was there and, only if
    every archive was good, the complete folder. A hard kill leaves at most a hidden ``.download-*`` folder in root.
    """
    root.mkdir(parents=True, exist_ok=True)
    target = root / folder
    staging = Path(tempfile.mkdtemp(dir=root, prefix=f".download-{folder.replace('/', '-')}-"))
    try:
        fetched, unpacked = staging / "fetched", staging / "unpacked"
        fetched.mkdir()
        unpacked.mkdir()
        sources = []
        for archive in archives:
            url = fetch_verified(archive, fetched / archive.name)
            try:
                _unpack(fetched / archive.name, unpacked)
            except (OSError, EOFError, tarfile.TarError) as exc:  # md5 right but not an archive: a wrong table
                raise DownloadError(f"{url}: cannot unpack it ({type(exc).__name__}: {exc})") from exc
            (fetched / archive.name).unlink()  # keep at most one archive's bytes on disk besides the files
            sources.append(url)
        # .gz archives unpack to bare files at the top; a tar.gz holds its own folder
        files_dir = unpacked if all(not a.name.endswith((".tar.gz", ".tgz")) for a in archives) else unpacked / folder
        files = sorted(p for p in files_dir.iterdir() if p.is_file()) if files_dir.is_dir() else []
        lacking = [name for name in needed if not (files_dir / name).is_file()]
        if lacking:
            raise DownloadError(f"{', '.join(sources)}: the archive holds no {', '.join(lacking)} under {folder}")
        target.mkdir(parents=True, exist_ok=True)
        # Files the folder already has first, those it lacks last: it is complete only once the last one is in.
        files.sort(key=lambda p: not (target / p.name).is_file())
        for path in files:
            os.replace(path, target / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
