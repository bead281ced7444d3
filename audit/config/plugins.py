"""Audit plug-ins named by the plan (`task_runner.settings.audit.plugins`): modules that register their audit steps
(audit.config.steps) when imported. They are imported before the audit section is read, by whatever reads it: the
task runner (`fx plan initialize`, `fx collaborator start`, the demo), the aggregator and the local federation tool
(src.plan.checks.check_plan), so that the plan's section of a plug-in step, its gate metrics and its metrics in the
aggregator's report are known everywhere.

An entry is a module name importable where the plan is read (e.g. one under the workspace's `src/`, which OpenFL's
`fx workspace export` ships to the collaborators), or the path of a .py file (absolute, or relative to the directory
the plan is read from). Each is imported once per process.

    task_runner:
      settings:
        audit:
          plugins: [src.my_audit, /opt/audits/loss_trajectory.py]
          loss_trajectory: {enabled: true}
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from audit.config.fields import SettingsError

__all__ = ["load_plugins", "check_plugins"]

# entry (module name, or resolved file path) -> the imported module's name
_LOADED: dict[str, str] = {}


def check_plugins(key: str, value) -> tuple[str, ...]:
    """The entries as given (a list of non-empty strings; None -> none), each imported (load_plugins)."""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise SettingsError(f"{key}: expected a list of module names or .py paths, got {value!r}")
    for i, entry in enumerate(value):
        if not isinstance(entry, str) or not entry.strip():
            raise SettingsError(f"{key}[{i}]: expected a module name or a .py path, got {entry!r}")
    load_plugins(key, value)
    return tuple(value)


def load_plugins(key: str, entries) -> None:
    """Import every entry not imported yet; an entry that cannot be imported is a SettingsError naming it."""
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if entry.endswith(".py") or "/" in entry or "\\" in entry:
            path = Path(entry).expanduser().resolve()
            if str(path) in _LOADED:
                continue
            if not path.is_file():
                raise SettingsError(f"{where}: no such plug-in file: {path}")
            _LOADED[str(path)] = _import_file(where, path)
        elif entry not in _LOADED:
            try:
                importlib.import_module(entry)
            except ImportError as err:
                raise SettingsError(f"{where}: cannot import plug-in module {entry!r}: {err}") from None
            except Exception as err:  # noqa: BLE001 - whatever the plug-in raises (e.g. a refused registration)
                sys.modules.pop(entry, None)
                raise SettingsError(f"{where}: importing plug-in module {entry!r} failed: {type(err).__name__}: "
                                    f"{err}") from None
            _LOADED[entry] = entry


def _import_file(where: str, path: Path) -> str:
    # A name of its own per file (two plug-ins may share a file name), kept in sys.modules like any module.
    name = f"audit_plugin_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SettingsError(f"{where}: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - whatever the plug-in raises, the plan names it
        del sys.modules[name]
        raise SettingsError(f"{where}: importing {path} failed: {type(err).__name__}: {err}") from None
    return name
