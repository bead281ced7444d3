"""One base for every report folder: a record per round, written atomically, and summaries rebuilt from the records.

The party's report (audit.reporting.party), the aggregator's (audit.aggregator_report.writer) and the aggregator-side
deanonymization report (audit.deanon.server) differ only in where a round's record goes, what else a round writes and
what the summaries are. The record is written last: it is what makes a round part of the report, so a crash leaves the
earlier rounds intact and the next write repairs the summaries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from audit.reporting.atomic_io import atomic_write_json
from audit.reporting.records import load_round_files, round_file_name

__all__ = ["RoundReportWriter"]


class RoundReportWriter:
    """Writes round records under `root` (`round_NNNN.json` unless `record_path` says otherwise) and rebuilds the
    summaries (`rebuild_summary`) from every record on disk after each round."""

    what = "round"  # in log messages about unreadable records

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def record_path(self, round_num: int) -> Path:
        return self.root / round_file_name(round_num)

    def prepare(self, record: Mapping) -> Mapping:
        """The record as stored: validated or cleaned by subclasses (raise ValueError to write nothing)."""
        return record

    def write_round_files(self, record: Mapping) -> None:
        """Files of the round besides its record (e.g. its ROC image), written before the record."""

    def write_round(self, record: Mapping) -> Path:
        """Store one round and rebuild the summaries; returns the record's path."""
        record = self.prepare(record)
        self.write_round_files(record)
        path = atomic_write_json(self.record_path(record["round"]), record)
        self.rebuild_summary()
        return path

    def load_rounds(self) -> list[dict]:
        """Every round's record, read from disk (kept by no one: a long run's records would grow with it)."""
        return load_round_files(self.root, self.what)

    def rebuild_summary(self) -> None:
        raise NotImplementedError
