"""Where a run stands: running, finished, interrupted or failed, and how many rounds it wrote. One small typed record,
`run_state.json` in the run's report root (beside its index.html), written atomically by whoever runs the rounds
(the demo, `python -m workspace start`) when the run starts, as rounds end and when it stops; read by the run index
(audit.reporting.html), so that a run that stopped early never reads like a finished short one.

`rounds_done` counts the rounds whose reports were written (the rounds 0 .. rounds_done - 1); a round being
audited when the run stopped is not counted, whatever files of it exist.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Mapping

from audit.reporting.atomic_io import atomic_write_json

__all__ = ["STATE_FILE", "SCHEMA_VERSION", "RUNNING", "FINISHED", "INTERRUPTED", "FAILED", "STATUSES", "RunState"]

STATE_FILE = "run_state.json"
SCHEMA_VERSION = 1
RUNNING, FINISHED, INTERRUPTED, FAILED = "running", "finished", "interrupted", "failed"
STATUSES = (RUNNING, FINISHED, INTERRUPTED, FAILED)


@dataclass(frozen=True)
class RunState:
    """A run's status, its planned rounds, the rounds whose reports were written, and why it stopped (the signal
    or the failure's line), if it did."""

    status: str
    rounds: int
    rounds_done: int = 0
    reason: str | None = None
    # The statuses, for those who have the class alone (audit's public API)
    RUNNING: ClassVar[str] = RUNNING
    FINISHED: ClassVar[str] = FINISHED
    INTERRUPTED: ClassVar[str] = INTERRUPTED
    FAILED: ClassVar[str] = FAILED

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"run state: status {self.status!r}; one of {', '.join(STATUSES)}")
        if not (isinstance(self.rounds, int) and isinstance(self.rounds_done, int) and self.rounds >= 1
                and 0 <= self.rounds_done <= self.rounds):
            raise ValueError(f"run state: rounds {self.rounds!r}, rounds_done {self.rounds_done!r}: whole numbers, "
                             "0 <= rounds_done <= rounds >= 1")

    # ---------------------------------------------------------------- transitions
    def round_written(self, rounds_done: int) -> "RunState":
        return replace(self, rounds_done=max(self.rounds_done, min(int(rounds_done), self.rounds)))

    def ended(self, status: str, reason: str | None = None, rounds_done: int | None = None) -> "RunState":
        done = self.rounds_done if rounds_done is None else min(int(rounds_done), self.rounds)
        return replace(self, status=status, reason=reason, rounds_done=done)

    # ---------------------------------------------------------------- what it says
    @property
    def last_round(self) -> int | None:
        """The last round whose reports were written (0-based, as the reports number them); None: none was."""
        return self.rounds_done - 1 if self.rounds_done else None

    def describe(self) -> str:
        """One sentence: 'finished 8 rounds', 'interrupted (SIGINT) after 2 of 8 rounds (the last written: round 1)',
        ..."""
        written = ("no round was written" if self.last_round is None else
                   f"the last written: round {self.last_round}")
        why = f" ({self.reason})" if self.reason else ""
        if self.status == FINISHED:
            return f"finished {self.rounds} round{'s' if self.rounds != 1 else ''}"
        if self.status == RUNNING:
            return f"running: {self.rounds_done} of {self.rounds} rounds written so far"
        return f"{self.status}{why} after {self.rounds_done} of {self.rounds} rounds ({written})"

    # ---------------------------------------------------------------- storage
    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = STATE_FILE) -> "RunState":
        if not isinstance(data, Mapping) or data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"{source}: not a run state of schema version {SCHEMA_VERSION}")
        fields = {k: data[k] for k in ("status", "rounds", "rounds_done", "reason") if k in data}
        try:
            return cls(**fields)
        except TypeError as err:
            raise ValueError(f"{source}: {err}") from None

    def write(self, root: str | Path) -> Path:
        return atomic_write_json(Path(root) / STATE_FILE, self.to_json())

    @classmethod
    def read(cls, root: str | Path) -> "RunState | None":
        """The state in `root`, or None where there is none (a report folder written by other means) or it cannot
        be read."""
        path = Path(root) / STATE_FILE
        try:
            return cls.from_json(json.loads(path.read_text(encoding="utf-8")), str(path))
        except (OSError, ValueError):
            return None
