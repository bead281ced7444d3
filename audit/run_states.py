"""How a run stands: the states run.json (audit.run_record.RunInfo.state) records and the run index shows, and the
one sentence that says them.

running: the run is under way (run.json is rewritten as each round ends); finished: every round and every party's
final-model audit are done; interrupted: stopped by a signal (Ctrl-C, SIGTERM) before that; failed: ended before that
on an error (a full disk, a step that broke its contract, ...). An interrupted or failed run's figures cover the
rounds written, never read as a finished short run. The one definition of these names: every writer and reader
imports them from here.
"""

from __future__ import annotations

__all__ = ["RUNNING", "FINISHED", "INTERRUPTED", "FAILED", "RUN_STATES", "ENDED_EARLY", "describe_run"]

RUNNING, FINISHED, INTERRUPTED, FAILED = "running", "finished", "interrupted", "failed"
RUN_STATES = (RUNNING, FINISHED, INTERRUPTED, FAILED)
ENDED_EARLY = (INTERRUPTED, FAILED)


def describe_run(state: str, rounds: int | None, rounds_done: int, reason: str | None = None) -> str:
    """One sentence: 'finished 8 rounds', 'interrupted (SIGINT) after 2 of 8 rounds (the last written: round 1)',
    'running: 3 of 8 rounds written so far', ... `rounds_done` counts the rounds whose reports were written (rounds
    0 .. rounds_done - 1); `rounds`: the planned ones (None: not known)."""
    of = f" of {rounds}" if rounds is not None else ""
    if state == FINISHED:
        count = rounds if rounds is not None else rounds_done
        return f"finished {count} round{'s' if count != 1 else ''}"
    if state == RUNNING:
        return f"running: {rounds_done}{of} rounds written so far"
    written = f"the last written: round {rounds_done - 1}" if rounds_done else "no round was written"
    why = f" ({reason})" if reason else ""
    return f"{state}{why} after {rounds_done}{of} rounds ({written})"
