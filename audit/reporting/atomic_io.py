"""Crash-safe file writes: write a temp file next to the target, fsync it, then ``os.replace`` it in.

A reader (or a restarted process) therefore sees either the previous complete file or the new complete
file, never a truncated one. On any error the temp file is removed and the error re-raised; the previous
file is left untouched. Parent directories are created as needed. A temp file still being written when the
process ends (a write in another thread, cut short by an interrupt) is removed at exit
(`remove_unfinished_writes`, an atexit hook); one whose process was killed outright is removed by whoever stopped it,
once it is gone (`remove_leftover_temps`).

Permissions: a new file gets what the process's umask allows (0666 & ~umask, as ``open`` would give it), a
replaced file keeps its own; a ``private=True`` file (per-sample data: the audit steps' signals, scores and
reconstructions) is 0600 whatever it replaces, from its first byte, and its folder is made 0700 (``private_folder``).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, Callable

__all__ = ["atomic_write_stream", "atomic_write_text", "atomic_write_bytes", "atomic_write_json", "atomic_savefig",
           "TEMP_SUFFIX", "PRIVATE_FILE_MODE", "PRIVATE_FOLDER_MODE", "private_folder", "current_umask",
           "remove_unfinished_writes", "remove_leftover_temps", "is_temp_name"]

#: Suffix of the temp files; a leftover one (after a hard kill) is named ``.<target name>.<random>.tmp``.
TEMP_SUFFIX = ".tmp"
PRIVATE_FILE_MODE = 0o600
PRIVATE_FOLDER_MODE = 0o700
_umask_lock = threading.Lock()
# The temp files this process is writing now (in any thread).
_in_flight: set[str] = set()
_in_flight_lock = threading.Lock()
# mkstemp's names: "." + the target's name + "." + 8 random characters + TEMP_SUFFIX.
_TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX) + "$")


def current_umask() -> int:
    """The process's umask, read without changing it where /proc says (Linux), else set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _umask_lock:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def private_folder(path: str | os.PathLike) -> Path:
    """Make `path` (and any missing parent, those with the umask's mode) a folder only its owner may open (0700)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(mode=PRIVATE_FOLDER_MODE, exist_ok=True)
    os.chmod(path, PRIVATE_FOLDER_MODE)
    return path


def _fsync_dir(directory: Path) -> None:
    """Persist the rename itself (best effort: not every platform/filesystem allows fsync on a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None], private: bool = False) -> Path:
    path = Path(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    if private:
        mode = PRIVATE_FILE_MODE
    else:
        try:  # keep the permissions of the file being replaced; mkstemp would leave 0600
            mode = os.stat(path).st_mode & 0o7777
        except OSError:
            mode = 0o666 & ~current_umask()
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)  # 0600 while written
    with _in_flight_lock:
        _in_flight.add(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        with _in_flight_lock:
            _in_flight.discard(tmp)
    _fsync_dir(parent)
    return path


def remove_unfinished_writes() -> list[str]:
    """Remove the temp files this process is writing now (a write another thread has not finished: its target keeps
    its previous content); returns them. Called at exit, and by an interrupted run before it says so."""
    with _in_flight_lock:
        pending = sorted(_in_flight)
    removed = []
    for tmp in pending:
        try:
            os.unlink(tmp)
            removed.append(tmp)
        except OSError:
            pass
    return removed


atexit.register(remove_unfinished_writes)


def is_temp_name(name: str) -> bool:
    """Whether a file name is one of these writes' temp files."""
    return bool(_TEMP_NAME.match(name))


def remove_leftover_temps(folder: str | os.PathLike) -> list[Path]:
    """Remove the temp files of unfinished writes under `folder` (recursively): only for a folder no live process
    writes into any more (e.g. the reports of participants that were killed); returns what was removed."""
    removed = []
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            if is_temp_name(name):
                try:
                    os.unlink(os.path.join(dirpath, name))
                    removed.append(Path(dirpath) / name)
                except OSError:
                    pass
    return removed


def atomic_write_stream(path: str | os.PathLike, write: Callable[[IO[bytes]], None], *, private: bool = False) -> Path:
    """Atomically replace ``path`` with what ``write(f)`` writes to the binary file ``f``, piece by piece (a file
    too large to build in memory first); returns the path. ``private``: 0600 (module docstring)."""
    return _atomic_write(path, write, private)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, private: bool = False) -> Path:
    """Atomically replace ``path`` with ``data``; returns the path. ``private``: 0600 (module docstring)."""
    data = bytes(data)
    return _atomic_write(path, lambda f: f.write(data), private)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Atomically replace ``path`` with ``text`` (no newline translation); returns the path."""
    if not isinstance(text, str):
        raise TypeError(f"{path}: text must be str, got {type(text).__name__}")
    return atomic_write_bytes(path, text.encode(encoding))


def _json_default(obj: Any) -> Any:
    # numpy scalars / arrays (without importing numpy): np.float32(1).item() -> 1.0, arrays -> lists.
    if hasattr(obj, "tolist") and callable(obj.tolist):
        return obj.tolist()
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically write ``obj`` as JSON (sorted keys, indent 2, trailing newline).

    NaN/Infinity are rejected (strict JSON) with a ValueError naming ``path``; an unserialisable object
    raises TypeError naming ``path``. Nothing is written in either case.
    """
    try:
        text = json.dumps(obj, sort_keys=True, indent=2, allow_nan=False, default=_json_default)
    except ValueError as e:
        raise ValueError(f"cannot write {path}: {e}") from e
    except TypeError as e:
        raise TypeError(f"cannot write {path}: {e}") from e
    return atomic_write_text(path, text + "\n")


def atomic_savefig(fig: Any, path: str | os.PathLike, *, private: bool = False, **kw: Any) -> Path:
    """Atomically save a matplotlib figure; the format defaults to the extension of ``path``. ``private``: 0600
    (a figure of per-sample data, e.g. reconstructions)."""
    path = Path(path)
    fmt = kw.pop("format", None) or (path.suffix[1:].lower() or None)
    if fmt == "png":  # zlib level 1: the reports redraw every plot each round; PIL's default, level 6, takes ~15%
        kw.setdefault("pil_kwargs", {"compress_level": 1})  # more time per plot for files ~5% smaller
    return _atomic_write(path, lambda f: fig.savefig(f, format=fmt, **kw), private)
