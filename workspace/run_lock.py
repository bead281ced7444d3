"""One folder, one run: an exclusive lock on a file in the folder, taken before anything is made or started there,
held until the command exits. A federation folder's is <folder>/federation.lock (`prepare`, `start`, `run`); the
demo's report folder has its own (workspace.report_folder).

The lock is the kernel's (flock(2) on the open file), taken in one system call: of two commands on the same folder at
the same instant exactly one gets it, and the other is refused in one line naming the holder's PID (written into the
file). A command killed outright releases it with its last open file; a stale lock cannot exist. The file descriptor
is not inherited by the processes the command starts (Python opens files non-inheritable), so a participant left
running never holds a folder. A holder may remove the file as it releases the lock: a command that opened the file
just before and then locks it finds the path no longer names its file and locks the path's new file instead.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

LOCK_FILE = "federation.lock"


class FolderBusyError(RuntimeError):
    """Another tooling holds the folder's lock; the message names the folder and the holder."""


class FolderLock:
    """The exclusive lock of one folder (see the module docstring): a federation folder's by default; `file_name`,
    `holder` (what the refusal calls the other process) and `flag` (what names the folder) for another tool's."""

    def __init__(self, folder: Path, *, file_name: str = LOCK_FILE, holder: str = "`python -m workspace`",
                 flag: str = "--dir"):
        self.folder = Path(folder)
        self.path = self.folder / file_name
        self.holder, self.flag = holder, flag
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, flag: str | None = None) -> "FolderLock":
        """Take the lock now or raise FolderBusyError (never waits). The folder must exist."""
        flag = flag or self.flag
        if self._fd is not None:
            return self
        for _ in range(100):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as err:
                raise FolderBusyError(f"{flag} {self.folder}: cannot open its lock file {self.path.name} "
                                      f"({err.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                holder = None
                for _ in range(10):  # the holder writes its PID right after it locks
                    holder = _read_pid(fd)
                    if holder:
                        break
                    time.sleep(0.02)
                os.close(fd)
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise FolderBusyError(f"{flag} {self.folder}: cannot lock it ({err.strerror})") from None
                who = f"pid {holder}" if holder else "another process"
                raise FolderBusyError(f"{flag} {self.folder}: in use by another {self.holder} ({who}); one run per "
                                      "folder: wait for it to end, or stop it") from None
            if _same_file(fd, self.path):
                break
            # The holder removed the file (release(remove=True)) between our open and our lock: the lock we hold is
            # on a file nobody else will open. Lock the path's file as it is now.
            os.close(fd)
        else:
            raise FolderBusyError(f"{flag} {self.folder}: its lock file {self.path.name} keeps being replaced")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self, remove: bool = False) -> None:
        """Release the lock; with remove=True also delete the lock file first (while still held: nobody can have
        locked the file being removed)."""
        if self._fd is None:
            return
        if remove:
            try:
                self.path.unlink()
            except OSError:
                pass
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
