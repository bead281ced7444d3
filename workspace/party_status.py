"""Each party's phase (validating, training, auditing, waiting, ...) read from the status events it writes, for the
status line of `python -m workspace run`.

Every participant is started with PARTY_STATUS_FILE naming a file in its workspace's logs folder, to which it appends
one JSON event a line (src.process.party_events): its collaborator's callbacks when a round's tasks arrive (validating),
when the round is done (waiting) and at the end (done); its task runner when it validates and trains; its audit when
it audits and retrains with DP; the aggregator when it serves, sends a round's tasks and hears that a collaborator
is done (with who is done with the round), and when the experiment is complete. A note for the user (the audit cost
note) comes as an event too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from src.process.party_events import PHASES

__all__ = ["PartyStatus", "StatusFollower", "apply_event", "status_file"]


def status_file(workspace: Path, name: str) -> Path:
    """Where a participant started in `workspace` writes its status events."""
    return workspace / "logs" / f"{name}.status.jsonl"


@dataclass
class PartyStatus:
    """What a party is doing, as far as its events say."""

    phase: str = "starting"
    round: int | None = None
    notes: list[str] = field(default_factory=list)  # lines to tell the user once (e.g. the audit cost note)
    reported: tuple[str, ...] = ()  # aggregator: collaborators done with the current round

    def text(self, collaborators: int | None = None) -> str:
        if self.round is None or self.phase == "done":
            return self.phase
        if collaborators and self.phase == "waiting for collaborators":
            return f"r{self.round} {len(self.reported)}/{collaborators} in"
        return f"{self.phase} r{self.round}"


def apply_event(status: PartyStatus, event: dict) -> bool:
    """Update `status` from one event; True if what it shows changed. An event without a round keeps the round; one
    whose phase the status line does not know changes nothing."""
    if isinstance(event.get("note"), str):
        status.notes.append(event["note"])
    phase = event.get("phase")
    if phase not in PHASES:
        return False
    before = (status.phase, status.round, status.reported)
    status.phase = phase
    if isinstance(event.get("round"), int):
        status.round = event["round"]
    if isinstance(event.get("reported"), list):
        status.reported = tuple(str(name) for name in event["reported"])
    return (status.phase, status.round, status.reported) != before


@dataclass
class StatusFollower:
    """Reads the events a party appended to its status file since the last call (a partial last line waits for its
    end; a line that is not a JSON object is passed over). `party`: only that party's events (in one process several
    parties may share a file)."""

    path: Path
    party: str | None = None
    status: PartyStatus = field(default_factory=PartyStatus)
    offset: int = 0
    pending: bytes = b""

    def poll(self) -> bool:
        """Read what is new; True if the party's status changed."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return False
        self.offset += len(chunk)
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        changed = False
        for raw in lines:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if isinstance(event, dict) and (self.party is None or event.get("party") == self.party):
                changed |= apply_event(self.status, event)
        return changed

    def take_notes(self) -> list[str]:
        notes, self.status.notes = self.status.notes, []
        return notes
