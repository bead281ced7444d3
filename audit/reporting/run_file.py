"""The run's record, `run.json` in the run's report folder (audit.run_record.RunRecord), gathered from each party's
account (`<party>/account.json`, audit.party_account), and written atomically.

It is rewritten with the run index (audit.reporting.html.write_index), so every round's end updates it; the run's
driver (the demo, an in-process run, `python -m workspace`) writes it at the start and at the end with the run's
state, planned rounds, settings and versions (`RunInfo`), which the writes in between keep. Where no driver writes
(a plain `fx` deployment: each participant's report folder), the state is read off the parties' accounts: finished
once every party audited the final model, running before.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from audit.reporting.atomic_io import atomic_write_json
from audit.run_record import ACCOUNT_FILE, RUN_FILE, PartyRun, RunRecord
from audit.run_states import FINISHED, RUNNING

__all__ = ["RunInfo", "write_run_file", "read_run_file", "party_accounts"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunInfo:
    """What the run's driver knows of the run: its state, planned rounds, settings and versions."""

    state: str
    rounds: int | None = None
    settings: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)


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
    for name, folder in parties.items():
        path = Path(folder) / ACCOUNT_FILE
        if not path.is_file():
            continue
        try:
            out[name] = PartyRun.read(path)
        except (OSError, ValueError) as err:  # RunRecordSchemaError too: named, never read with figures missing
            logger.warning("%s", err)
    return out


def read_run_file(root: str | os.PathLike) -> RunRecord | None:
    """root/run.json, or None when there is none (an unreadable one raises ValueError naming the file)."""
    path = Path(root) / RUN_FILE
    if not path.is_file():
        return None
    return RunRecord.read(path)


def write_run_file(root: str | os.PathLike, *, parties: Mapping[str, Path] | None = None,
                   info: RunInfo | None = None) -> RunRecord:
    """Gather the parties' accounts into root/run.json (atomically), with `info` or the run-level fields an earlier
    write gave; returns the record written."""
    root = Path(root)
    earlier = None
    try:
        earlier = read_run_file(root)
    except (OSError, ValueError) as err:  # another schema version (RunRecordSchemaError), or damaged
        logger.warning("%s; written anew", err)
    accounts = party_accounts(root, parties)
    if info is None:
        state = earlier.state if earlier is not None else RUNNING
        if state == RUNNING and accounts and all(p.complete for p in accounts.values()):
            state = FINISHED
        info = RunInfo(state, earlier.rounds if earlier else None, earlier.settings if earlier else {},
                       earlier.versions if earlier else {})
    record = RunRecord(state=info.state, parties=accounts, rounds=info.rounds, settings=dict(info.settings),
                       versions=dict(info.versions))
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(root / RUN_FILE, record.to_json())
    return record
