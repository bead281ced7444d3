"""Another git revision's code beside the working tree's, for benchmarks that compare the two in one run."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

__all__ = ["export_revision"]


def export_revision(root: Path, rev: str, dest: Path) -> Path:
    """The tracked files of git revision `rev` of the repository at `root`, in dest (git archive: read-only for the
    repository)."""
    dest.mkdir(parents=True)
    archive = dest.with_suffix(".tar")
    with open(archive, "wb") as f:
        subprocess.run(["git", "-C", str(root), "archive", "--format=tar", rev], stdout=f, check=True,
                       stderr=subprocess.DEVNULL)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()
    return dest
