"""Round records of a report folder: their names, their validation, and reading them all back.

Two layouts: a party's report keeps each round in a folder (``round_0003/audit.json``, see
audit.reporting.party), the aggregator's and the deanonymization reports keep ``round_0003.json`` files. Summaries
are always rebuilt from these files, so a crash mid-run leaves every earlier round's record usable.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from audit.config.vocabulary import FIDEL_GRID_FILE, RMIA_SCORES_FILE, SIGNALS_FILE  # noqa: F401 (re-exported)
from audit.round_record import RecordSchemaError, RoundRecord

__all__ = ["round_dir_name", "load_round_records",
           "load_cached_round_records", "round_file_name", "load_round_files", "ROUND_DIR_RE", "SIGNALS_FILE",
           "RMIA_SCORES_FILE", "FIDEL_GRID_FILE", "HISTOGRAMS_FILE"]

logger = logging.getLogger(__name__)

ROUND_DIR_RE = re.compile(r"^round_(\d+)$")
HISTOGRAMS_FILE = "signals.png"       # the members' and non-members' signal histograms (audit.reporting.plots)


def round_dir_name(round_: int) -> str:
    return f"round_{round_:04d}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in JSON")


def load_round_records(party_dir: str | os.PathLike) -> list[RoundRecord]:
    """All readable round records under ``party_dir`` (``round_*/audit.json``), sorted by round.

    A corrupt, unreadable, invalid or misplaced ``audit.json`` is skipped with a logged warning; so is one written
    under another schema version (audit.round_record.RecordSchemaError: one line naming the file, the version found
    and the one expected), rather than read with its figures missing.
    """
    return load_cached_round_records(Path(party_dir), None)


def load_cached_round_records(party_dir: Path, cache: dict | None, refused: list[str] | None = None, *,
                              make=None) -> list:
    """``load_round_records`` with an optional parse cache keyed by path and (inode, mtime, size); `refused`, when
    given, gets the one line of each record skipped for its schema version (for the report to say so). `make(record,
    path)`: what is kept and returned for each record instead of the record itself (e.g. a compact view of it; it has
    a `round`).

    Every write goes through os.replace, so a rewritten file always has a new inode: a cached entry is
    only reused for the very same file.
    """
    try:
        entries = list(party_dir.iterdir())
    except FileNotFoundError:
        return []
    records = []
    seen = set()
    for d in entries:
        if not ROUND_DIR_RE.match(d.name) or not d.is_dir():
            continue
        path = d / "audit.json"
        try:
            st = path.stat()
        except FileNotFoundError:
            logger.debug("round directory without audit.json (write interrupted?): %s", d)
            continue
        except OSError as e:
            logger.warning("skipping unreadable round record %s: %s", path, e)
            continue
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        seen.add(path)
        if cache is not None and path in cache and cache[path][0] == key:
            cached = cache[path][1]
            if isinstance(cached, RecordSchemaError):  # said once per file; the report says it every time
                if refused is not None:
                    refused.append(str(cached))
            else:
                records.append(cached)
            continue
        try:
            record = RoundRecord.from_json(
                json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant), str(path))
        except RecordSchemaError as e:
            logger.warning("skipping round record %s", e)
            if refused is not None:
                refused.append(str(e))
            if cache is not None:
                cache[path] = (key, e)
            continue
        except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError/UnicodeDecodeError are ValueErrors
            logger.warning("skipping unreadable round record %s: %s", path, e)
            continue
        if d.name != round_dir_name(record.round):
            logger.warning(
                "skipping round record %s: it is for round %s (expected in %s)",
                path, record.round, round_dir_name(record.round),
            )
            continue
        kept = record if make is None else make(record, path)
        if cache is not None:
            cache[path] = (key, kept)
        records.append(kept)
    if cache is not None:
        for path in set(cache) - seen:
            del cache[path]
    records.sort(key=lambda r: r.round)
    return records


_ROUND_FILE_RE = re.compile(r"^round_(\d{4,})\.json$")


def round_file_name(round_num: int) -> str:
    return f"round_{int(round_num):04d}.json"


def load_round_files(root: str | Path, what: str, cache: dict | None = None, *, make=None) -> list:
    """The readable round records under `root`, by round; unreadable or misnamed ones are logged and skipped. These
    are the aggregator's and the deanonymization report's records (JSON dicts with a "round"), not a party's
    RoundRecord. `cache` (path -> (inode, mtime, size), what was kept): a file is read only when it is new or changed
    (every write is an os.replace: a new inode), so that a summary rewritten every round reads only the new rounds;
    `make(record)`: what is kept and returned for each record instead of the record itself (it has a "round")."""
    out = []
    seen = set()
    for path in sorted(Path(root).glob("round_*.json")):
        match = _ROUND_FILE_RE.match(path.name)
        if not match:
            continue
        key = None
        if cache is not None:
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            seen.add(path)
            if path in cache and cache[path][0] == key:
                if cache[path][1] is not None:
                    out.append(cache[path][1])
                continue
        kept = None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            logger.warning("skipping unreadable %s record %s: %s", what, path, err)
        else:
            if not isinstance(record, dict) or record.get("round") != int(match.group(1)):
                logger.warning("skipping %s record %s: not the record of its round", what, path)
            else:
                kept = record if make is None else make(record)
                out.append(kept)
        if cache is not None:
            cache[path] = (key, kept)  # a skipped file is said once, not at every rewrite
    if cache is not None:
        for gone in [path for path in cache if path not in seen]:
            del cache[gone]
    return sorted(out, key=lambda r: r["round"])
