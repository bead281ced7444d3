"""The paths a plan names that a collaborator reads or writes stay in its workspace, unless its owner allows more.

A plan travels from the aggregator to every collaborator (`fx workspace export`): a path in it must not let the
plan's author make a collaborator write, read or run files anywhere on its disk. Every collaborator-side path of the
plan (COLLABORATOR_PATHS: the audit's report folder, the dataset's folder, the certificates' folder, a plug-in's
.py file) resolves, relative to the collaborator's workspace (the folder `fx collaborator start` runs in, which
holds plan/plan.yaml), inside that workspace, or inside a folder its owner allows on its own host, outside the
plan: ALLOWED_ENV, a list of folders separated by os.pathsep (`FEDERATION_ALLOWED_PATHS=/data:/srv/audit`).
Anything else is refused when OpenFL builds the collaborator's data loader or task runner, before either reads or
writes a file, in one line naming the key.

Paths are compared as written, `..` folded in (os.path.normpath): a symbolic link inside the workspace is its owner's
own doing and is followed. A run whose owner wrote the plan for parties on its own host (the in-process runner and
the demo; `python -m workspace`, through ALLOWED_ENV in its participants' environment) allows the absolute paths its
plan names (`owner_allowance`): the owner's own choice on its own disk. A relative path stays inside the workspace
everywhere: `../../x` is refused by them all.

Torch-free and OpenFL-free.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from audit import SettingsError

__all__ = ["ALLOWED_ENV", "COLLABORATOR_PATHS", "collaborator_paths", "owner_allowance", "allowed_folders",
           "allowing", "workspace_of", "check_collaborator_paths", "check_writable"]

ALLOWED_ENV = "FEDERATION_ALLOWED_PATHS"
# The plan keys a collaborator reads or writes files at (besides plug-in files, task_runner.settings.audit.plugins[i]),
# and their defaults (None: the key's own default lies inside the workspace).
COLLABORATOR_PATHS = (
    ("task_runner", "settings", "audit", "report_dir"),
    ("data_loader", "settings", "data_dir"),
    ("network", "settings", "cert_folder"),
)
PLUGINS = ("task_runner", "settings", "audit", "plugins")

_allowance = threading.local()


def _get(config: Mapping, path: tuple) -> object:
    node = config
    for part in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _is_plugin_file(entry: str) -> bool:  # audit.config.plugins: a .py file or a path, else a module name
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def collaborator_paths(config: Mapping) -> list[tuple[str, str]]:
    """(dotted key, path as given) of every collaborator-side path the plan names."""
    found = []
    for path in COLLABORATOR_PATHS:
        value = _get(config, path)
        if isinstance(value, (str, os.PathLike)) and str(value).strip():
            found.append((".".join(path), os.fspath(value)))
    plugins = _get(config, PLUGINS)
    if isinstance(plugins, (list, tuple)):
        for i, entry in enumerate(plugins):
            if isinstance(entry, str) and _is_plugin_file(entry):
                found.append((f"{'.'.join(PLUGINS)}[{i}]", entry))
    return found


def _resolved(path: str, workspace: Path) -> Path:
    return Path(os.path.normpath(os.path.join(workspace, os.path.expanduser(path))))


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or path.is_relative_to(folder)


def owner_allowance(config: Mapping) -> list[Path]:
    """The absolute folders the plan's collaborator-side paths name (a plug-in file's folder): what a run whose owner
    wrote the plan for parties on its own host allows them (the in-process runner, `python -m workspace`). A relative
    path is never allowed this way: it stays inside the workspace."""
    out = []
    for key, value in collaborator_paths(config):
        expanded = os.path.expanduser(value)
        if os.path.isabs(expanded):
            path = Path(os.path.normpath(expanded))
            out.append(path.parent if key.startswith(".".join(PLUGINS)) else path)
    return list(dict.fromkeys(out))


def allowed_folders(environ: Mapping | None = None) -> list[Path]:
    """The folders this host's owner allows beyond the workspace: ALLOWED_ENV, and those of `allowing` in this
    thread."""
    text = (os.environ if environ is None else environ).get(ALLOWED_ENV, "")
    folders = [Path(os.path.normpath(os.path.expanduser(p))) for p in text.split(os.pathsep) if p.strip()]
    return [*folders, *getattr(_allowance, "folders", ())]


@contextlib.contextmanager
def allowing(folders: Iterable[str | os.PathLike]) -> Iterator[None]:
    """Allow `folders` (absolute) for collaborators built in this thread meanwhile: for a caller that owns every party
    and wrote the plan itself (the in-process runner)."""
    previous = getattr(_allowance, "folders", ())
    _allowance.folders = (*previous, *(Path(os.path.normpath(os.fspath(f))) for f in folders))
    try:
        yield
    finally:
        _allowance.folders = previous


def workspace_of(plan_files: Iterable[str | os.PathLike]) -> Path:
    """A collaborator's workspace: the folder whose plan/plan.yaml it runs (OpenFL's Plan.files: the plan file
    first), else the current folder (where `fx` runs)."""
    files = list(plan_files)
    if files:
        plan_file = Path(os.path.abspath(os.fspath(files[0])))
        return plan_file.parent.parent if plan_file.parent.name == "plan" else plan_file.parent
    return Path.cwd()


def check_collaborator_paths(config: Mapping, workspace: Path, allowed: Iterable[Path] | None = None) -> None:
    """Every collaborator-side path of the plan inside `workspace` or an allowed folder (default: allowed_folders());
    SettingsError naming the first key that is not."""
    workspace = Path(os.path.normpath(os.path.abspath(workspace)))
    allowed = list(allowed_folders() if allowed is None else allowed)
    for key, value in collaborator_paths(config):
        path = _resolved(value, workspace)
        if _inside(path, workspace) or any(_inside(path, folder) for folder in allowed):
            continue
        raise SettingsError(f"{key}: {value!r} resolves to {path}, outside this collaborator's workspace "
                            f"{workspace}; a plan may name only paths inside it, or in a folder this collaborator's "
                            f"owner allows on its host in {ALLOWED_ENV} (folders separated by {os.pathsep!r})")


def check_writable(key: str, folder: str | os.PathLike) -> None:
    """A folder a run will write into (made if missing) can be written: its nearest existing folder takes a file (one
    made and removed again: what a read-only disk, a read-only mount or missing permissions refuse, for root too).
    SettingsError naming `key` and the folder, before any work."""
    folder = Path(os.path.abspath(os.path.expanduser(os.fspath(folder))))
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise SettingsError(f"{key}: {folder} cannot be made: {existing} is a file")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".write-check.")
    except OSError as err:
        raise SettingsError(f"{key}: {folder} cannot be written: {existing} refuses a new file "
                            f"({err.strerror or err})") from None
    os.close(fd)
    os.unlink(probe)
