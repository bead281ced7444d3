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
        tar.extractall(dest, filter=_data_or_skip)
    archive.unlink()
    return dest


def _data_or_skip(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """tarfile's "data" filter, but a member it refuses (a tracked symlink to an absolute path, such as a clone's
    `.venv`) is left out instead of failing the export: it is no code of the revision."""
    try:
        return tarfile.data_filter(member, path)
    except tarfile.FilterError:
        return None
