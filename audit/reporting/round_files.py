"""Per-round JSON records in a report folder (`round_NNNN.json`): their names, and reading them all back.

Summaries are rebuilt from these files, so a crash mid-run leaves every earlier round's record usable.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

__all__ = ["round_file_name", "load_round_records"]

logger = logging.getLogger(__name__)

_ROUND_FILE_RE = re.compile(r"^round_(\d{4,})\.json$")


def round_file_name(round_num: int) -> str:
    return f"round_{int(round_num):04d}.json"


def load_round_records(root: str | Path, what: str) -> list[dict]:
    """The readable round records under `root`, by round; unreadable or misnamed ones are logged and skipped."""
    records = []
    for path in sorted(Path(root).glob("round_*.json")):
        match = _ROUND_FILE_RE.match(path.name)
        if not match:
            continue
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            logger.warning("skipping unreadable %s record %s: %s", what, path, err)
            continue
        if not isinstance(record, dict) or record.get("round") != int(match.group(1)):
            logger.warning("skipping %s record %s: not the record of its round", what, path)
            continue
        records.append(record)
    return sorted(records, key=lambda r: r["round"])
