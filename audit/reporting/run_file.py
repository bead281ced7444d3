"""The run's record, `run.json` in the run's report folder (audit.run_record.RunRecord), gathered from each party's
account (`<party>/account.json`, audit.party_account), and written atomically.

It is rewritten with the run index (audit.reporting.html.write_index), so every round's end updates it; the run's
driver (the demo, an in-process run, `python -m workspace`) writes it at the start, as rounds end and at the end
with the run's state, planned rounds, rounds written, why it stopped, settings and versions
(audit.run_record.RunInfo), which the writes in between keep. Where no driver writes (a plain `fx` deployment: each
participant's report folder), the state is read off the parties' accounts: finished once every party audited the
final model, running before. A rewrite reads an account only once it changed, and run.json itself only when another
process wrote it last.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Callable, Mapping

from audit.reporting.atomic_io import atomic_write_json
from audit.run_record import ACCOUNT_FILE, RUN_FILE, PartyRun, RunInfo, RunRecord
from audit.run_states import FINISHED, RUNNING

__all__ = ["write_run_file", "read_run_file", "party_accounts"]

logger = logging.getLogger(__name__)


# One writer at a time in a process (the run's thread and the report worker both rewrite run.json): an update of the
# rounds written is never lost to a rewrite that read the file before it.
_LOCK = threading.RLock()
# Each account read (path -> (inode, mtime, size), the PartyRun or None if unreadable), kept for the process: a party
# rewrites its account once a round, run.json is rewritten several times a round; an account is read once it changed.
_ACCOUNTS: dict[Path, tuple] = {}
# The run-level fields of each run.json this process wrote (path -> (inode, mtime, size), RunInfo).
_WRITTEN: dict[Path, tuple] = {}


def party_accounts(root: Path, parties: Mapping[str, Path] | None = None) -> dict[str, PartyRun]:
    """Each party's account (name -> PartyRun): `parties` (name -> its report folder), or root's folders holding one.
    An unreadable account, or one of another schema version, is logged and left out."""
    if parties is None:
        try:
            folders = sorted(d for d in Path(root).iterdir() if (d / ACCOUNT_FILE).is_file())
        except FileNotFoundError:
            folders = []
        parties = {d.name: d for d in folders}
    out = {}
    with _LOCK:
        for name, folder in parties.items():
            path = Path(folder) / ACCOUNT_FILE
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            cached = _ACCOUNTS.get(path)
            if cached is None or cached[0] != key:
                try:
                    cached = (key, PartyRun.read(path))
                except (OSError, ValueError) as err:  # RunRecordSchemaError too: named, never read with figures missing
                    logger.warning("%s", err)
                    cached = (key, None)
                _ACCOUNTS[path] = cached
            if cached[1] is not None:
                out[name] = cached[1]
    return out


def read_run_file(root: str | os.PathLike) -> RunRecord | None:
    """root/run.json, or None when there is none (an unreadable one raises ValueError naming the file)."""
    path = Path(root) / RUN_FILE
    if not path.is_file():
        return None
    return RunRecord.read(path)


def write_run_file(root: str | os.PathLike, *, parties: Mapping[str, Path] | None = None,
                   info: RunInfo | None = None, update: Callable[[RunInfo], RunInfo] | None = None) -> RunRecord:
    """Gather the parties' accounts into root/run.json (atomically), with `info` or the run-level fields an earlier
    write gave, changed by `update` if given (e.g. `lambda info: info.round_written(3)`); returns the record
    written."""
    root = Path(root)
    with _LOCK:
        earlier = _earlier_info(root)
        accounts = party_accounts(root, parties)
        if info is None:
            info = earlier if earlier is not None else RunInfo(RUNNING)
            if info.state == RUNNING and accounts and all(p.complete for p in accounts.values()):
                info = info.ended(FINISHED)
        if update is not None:
            info = update(info)
        record = RunRecord(parties=accounts, **{**vars(info.info), "settings": dict(info.settings),
                                                "versions": dict(info.versions)})
        root.mkdir(parents=True, exist_ok=True)
        path = atomic_write_json(root / RUN_FILE, record.to_json())
        try:
            _WRITTEN[path] = (_file_key(path), record.info)
        except OSError:
            _WRITTEN.pop(path, None)
    return record


def _file_key(path: Path) -> tuple:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, st.st_size  # every write is an os.replace: a new inode


def _earlier_info(root: Path) -> RunInfo | None:
    """The run-level fields of root/run.json: those this process wrote last while the file is still that write
    (another process may have rewritten it since: `python -m workspace` and the participants), else read from it."""
    path = root / RUN_FILE
    try:
        key = _file_key(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        logger.warning("%s: %s; written anew", path, err)
        return None
    written = _WRITTEN.get(path)
    if written is not None and written[0] == key:
        return written[1]
    try:
        return RunRecord.read(path).info
    except (OSError, ValueError) as err:  # another schema version (RunRecordSchemaError), or damaged
        logger.warning("%s; written anew", err)
        return None
