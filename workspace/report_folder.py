"""The demo's report folder (`cifar10_PM.py --log_dir`): where it is, one run at a time in it, new or empty.

- Where: a relative --log_dir is a folder under the project's `reports/` and must stay there (`../../x` is refused);
  an absolute one is the user's own choice on their own machine and is taken as given.
- One run per folder: the folder's lock (workspace.run_lock, the kernel's flock on `<folder>/.cifar10_PM.lock`) is
  taken before anything else is checked, made or deleted there, and held to the end of the run; a second demo on the
  same folder is refused in one line naming the folder and the holder. `--replace_log_dir` therefore never deletes
  another running demo's reports.
- New or empty (the lock file aside), or, with --replace_log_dir, a folder this script wrote (it has `_run/`).
- A refused start leaves nothing: the lock file, and the folders the claim made, go again.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from workspace.run_lock import FolderBusyError, FolderLock

__all__ = ["RUN_FOLDER", "LOCK_FILE", "resolve_log_dir", "check_log_dir", "LogDirClaim"]

RUN_FOLDER = "_run"  # inside --log_dir: the run's plan and the aggregator's report; marks a report folder of ours
LOCK_FILE = ".cifar10_PM.lock"
HOLDER = "cifar10_PM.py"


def resolve_log_dir(log_dir: str, reports: Path) -> Path:
    """The report folder --log_dir names: an absolute path as given, a relative one under `reports` (which it may not
    leave, through `..` or a symlink). ValueError naming --log_dir."""
    given = Path(log_dir).expanduser()
    if given.is_absolute():
        return given.resolve()
    root = reports.resolve()
    folder = (root / given).resolve()
    if folder == root or not folder.is_relative_to(root):
        where = "is reports/ itself" if folder == root else f"resolves to {folder}, outside {root}"
        raise ValueError(f"--log_dir {log_dir}: a relative --log_dir is a folder under reports/, and this one {where}; "
                         "give a name such as demo (reports/demo), or an absolute path")
    return folder


def _in_use(report_dir: Path) -> list[Path]:
    """What the folder holds besides its lock file."""
    return [p for p in report_dir.iterdir() if p.name != LOCK_FILE]


def check_log_dir(report_dir: Path, replace: bool) -> None:
    """--log_dir must be a folder that can be made, new or empty: a run never mixes its rounds with an earlier run's.
    With --replace_log_dir, a folder holding an earlier run's reports (its _run/ folder) may be replaced. Nothing is
    made or deleted here; ValueError naming --log_dir."""
    if report_dir.exists() and not report_dir.is_dir():
        raise ValueError(f"--log_dir {report_dir}: exists and is not a folder; give a new or empty folder")
    if report_dir.is_dir():
        if not os.access(report_dir, os.W_OK | os.X_OK):
            raise ValueError(f"--log_dir {report_dir}: no permission to write in it")
        if not _in_use(report_dir):
            return
        if not replace:
            raise ValueError(f"--log_dir {report_dir}: not empty (an earlier run's reports would mix with this "
                             "run's); give a new or empty folder, or add --replace_log_dir to replace them")
        if not (report_dir / RUN_FOLDER).is_dir():
            raise ValueError(f"--log_dir {report_dir}: not empty and not a report folder of this script (it has no "
                             f"{RUN_FOLDER}/); --replace_log_dir replaces only those: give a new or empty folder")
        return
    parent = report_dir.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"--log_dir {report_dir}: cannot be made: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--log_dir {report_dir}: cannot be made: no permission to write in {parent}")


class LogDirClaim:
    """The demo's hold on its report folder: made if missing and locked (`acquire`), emptied of an earlier run's
    reports (`replace_contents`), given back at the end (`release`) or, for a refused start, undone (`undo`: the lock
    file and every folder the claim made go)."""

    def __init__(self, report_dir: Path):
        self.root = Path(report_dir)
        self.lock = FolderLock(self.root, file_name=LOCK_FILE, holder=HOLDER, flag="--log_dir")
        self._made: Path | None = None  # the topmost folder the claim made

    def acquire(self) -> "LogDirClaim":
        """Make the folder (and its missing parents) if needed and take its lock; FolderBusyError when another demo
        holds it, ValueError when it cannot be made. check_log_dir's checks come after, under the lock."""
        if not self.root.is_dir():
            check_log_dir(self.root, replace=False)  # a file in the way, or no permission: named before anything
            missing = self.root  # the topmost folder mkdir makes
            while not missing.parent.exists():
                missing = missing.parent
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise ValueError(f"--log_dir {self.root}: cannot be made ({err.strerror or err})") from None
            self._made = missing
        try:
            self.lock.acquire()
        except FolderBusyError:
            self._remove_made()
            raise
        return self

    def replace_contents(self) -> None:
        """Delete an earlier run's reports (check_log_dir allowed it), keeping the lock file."""
        try:
            for path in _in_use(self.root):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        except OSError as err:
            raise ValueError(f"--log_dir {self.root}: cannot be emptied ({err.strerror or err})") from None

    def release(self) -> None:
        self.lock.release(remove=True)

    def undo(self) -> None:
        """A refused start: the lock file goes, and the folders the claim made if nothing else was put there."""
        self.lock.release(remove=True)
        self._remove_made()

    def _remove_made(self) -> None:
        if self._made is None:
            return
        folder = self.root
        while True:
            try:
                folder.rmdir()  # only an empty folder: nothing anyone else put there is deleted
            except OSError:
                return
            if folder == self._made:
                return
            folder = folder.parent
