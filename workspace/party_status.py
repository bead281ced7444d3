"""Each party's phase (validating, training, auditing, waiting, ...) read from its own OpenFL log, for the status line
of `python -m workspace run`.

The participants write OpenFL's plain log (`LOG_FILE`, one `[hh:mm:ss] [file.py:line] LEVEL message` line per
record; a record's continuation lines start otherwise and are skipped). A collaborator's round goes:
OpenFL's "Round: N Received Tasks" (then it validates the received model), its PyTorch runner's "Run E epoch of N
round" (training), the task runner's "... round N: auditing ..." and "... round N audit: ..." (src/taskrunner.py;
then it validates its own model), OpenFL's metric writer's "Round N: Metrics" and "Requesting tasks..." (waiting),
and "Received shutdown signal" at the end. The aggregator says when it sends a round's tasks, which collaborators
have completed all tasks, and when the experiment is complete.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from src.audit_cost import COST_NOTE_MARK

__all__ = ["RECORD", "PartyStatus", "LogFollower"]

RECORD = re.compile(r"^\[\d\d:\d\d:\d\d\] \[[^\]]+:\d+\] (?P<level>[A-Z]+) (?P<message>.*)$")

# (pattern, phase) for a collaborator's messages; the first match wins. `round` is the round the phase belongs to.
COLLABORATOR_PHASES = (
    (re.compile(r"^Round: (?P<round>\d+) Received Tasks"), "validating"),
    (re.compile(r"^Run \d+ epoch of (?P<round>\d+) round"), "training"),
    (re.compile(r"^\S+ round (?P<round>\d+): auditing "), "auditing"),
    (re.compile(r"^\S+ round (?P<round>\d+): DP retrain "), "DP retraining"),
    (re.compile(r"^\S+ round (?P<round>\d+) audit: "), "validating"),  # the audit is done; the local model next
    (re.compile(r"^Round (?P<round>\d+): Metrics: "), "waiting"),
    (re.compile(r"^Requesting tasks"), "waiting"),
    (re.compile(r"^Received shutdown signal"), "done"),
)
AGG_SENDING = re.compile(r"^Sending tasks to collaborator (?P<name>\S+) for round (?P<round>\d+)")
AGG_COMPLETED = re.compile(r"^Round (?P<round>\d+): Collaborators that have completed all tasks: \[(?P<names>.*)\]")
AGG_SERVING = re.compile(r"^Starting Aggregator gRPC Server")
AGG_DONE = re.compile(r"^Experiment Completed")


@dataclass
class PartyStatus:
    """What a party is doing, as far as its log says."""

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


def apply_collaborator_line(status: PartyStatus, line: str) -> bool:
    """Update `status` from one line of a collaborator's log; True if its phase or round changed."""
    match = RECORD.match(line)
    if match is None:
        return False
    message = match["message"]
    if match["level"] == "WARNING" and COST_NOTE_MARK in message:
        status.notes.append(message)
    for pattern, phase in COLLABORATOR_PHASES:
        found = pattern.match(message)
        if found is None:
            continue
        before = (status.phase, status.round)
        status.phase = phase
        if "round" in found.groupdict():
            status.round = int(found["round"])
        return (status.phase, status.round) != before
    return False


def apply_aggregator_line(status: PartyStatus, line: str) -> bool:
    """Update `status` from one line of the aggregator's log; True if what it shows changed."""
    match = RECORD.match(line)
    if match is None:
        return False
    message = match["message"]
    before = (status.phase, status.round, status.reported)
    if AGG_SERVING.match(message):
        status.phase = "serving"
    elif found := AGG_SENDING.match(message):
        if status.round != int(found["round"]):
            status.round, status.reported = int(found["round"]), ()
        status.phase = "waiting for collaborators"
    elif found := AGG_COMPLETED.match(message):
        status.round = int(found["round"])
        status.reported = tuple(re.findall(r"'([^']+)'", found["names"]))
        status.phase = "waiting for collaborators"
    elif AGG_DONE.match(message):
        status.phase = "done"
    return (status.phase, status.round, status.reported) != before


@dataclass
class LogFollower:
    """Reads the lines a party appended to its log since the last call (a partial last line waits for its end)."""

    path: Path
    aggregator: bool = False
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
        data = self.pending + chunk
        *lines, self.pending = data.split(b"\n")
        apply = apply_aggregator_line if self.aggregator else apply_collaborator_line
        changed = False
        for raw in lines:
            changed |= apply(self.status, raw.decode("utf-8", errors="replace"))
        return changed

    def take_notes(self) -> list[str]:
        notes, self.status.notes = self.status.notes, []
        return notes
