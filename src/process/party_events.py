"""The status events a party writes for the tooling that runs it (`python -m workspace run`, workspace.party_status):
one JSON object a line, appended to the file the environment variable PARTY_STATUS_FILE names (relative paths from the
party's working folder, as OpenFL's LOG_FILE); nothing is written without it (`fx` run by hand, the one-process demo).

An event: {"party": name, "phase": what it now does, "round": round or null}, plus for the aggregator "reported" (the
collaborators done with the round), or {"party": name, "note": text} for a line to tell the user once. The phases are
the words the status line shows (validating, training, auditing, DP retraining, waiting, done; serving, waiting for
collaborators). Each event is one write(2) of one line to a file opened with O_APPEND, so the lines of the parties'
threads never interleave and a reader sees whole lines, or a last line still being written.
OpenFL-free: written from the task runner, the collaborator's callbacks (src.collaborator) and the aggregator.
"""

from __future__ import annotations

import json
import os
import time

__all__ = ["ENV", "emit", "PHASES"]

ENV = "PARTY_STATUS_FILE"
PHASES = ("starting", "validating", "training", "auditing", "DP retraining", "waiting", "done", "serving",
          "waiting for collaborators")


def emit(party: str, phase: str | None = None, round_num: int | None = None, **fields) -> None:
    """Append one event, if this process was given a status file."""
    path = os.environ.get(ENV)
    if not path:
        return
    if phase is not None and phase not in PHASES:
        raise ValueError(f"status event: unknown phase {phase!r}; known: {', '.join(PHASES)}")
    event = {"t": round(time.time(), 3), "party": party, **({} if phase is None else {"phase": phase}),
             **({} if phase is None else {"round": None if round_num is None else int(round_num)}), **fields}
    line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
