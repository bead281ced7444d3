"""`python -m workspace verdict RUN_DIR`: the run's record (run.json, audit.run_record) as one line per party, and an
exit code a CI step can use.

Exit codes:
  0  the run finished and every party is within the plan's limits: no update it sent is over the gate's limits
     (thresholds, epsilon budget), its final model is not, and its DP total is within gate.run_epsilon_budget (where
     set); with --fail-on-leak also no party's final model has a leak detected
  1  a party is beyond them (each reason is printed), or with --fail-on-leak a final model leaks
  2  no run record: RUN_DIR holds no run.json, or it is unreadable or of another schema version
  3  the verdict is incomplete: the run did not finish (running, interrupted), or a party's final model was not
     audited; nothing is claimed for it
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from audit import FINISHED, RUN_FILE, RunRecord

__all__ = ["OK", "BEYOND", "NO_RECORD", "INCOMPLETE", "verdict"]

OK, BEYOND, NO_RECORD, INCOMPLETE = 0, 1, 2, 3


def verdict(run_dir: Path, *, fail_on_leak: bool = False, say: Callable[[str], None] = print,
            err: Callable[[str], None] = print) -> int:
    """Print the run's verdict per party; returns the exit code of the module docstring."""
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        err(f"error: {path}: no run record (run.json is written in the run's report folder: the demo's --log_dir, "
            "a `python -m workspace` run's folder, an fx participant's reports/)")
        return NO_RECORD
    try:
        record = RunRecord.read(path)
    except (OSError, ValueError) as error:
        err(f"error: {error}")
        return NO_RECORD
    say(f"run {record.state}: {len(record.parties)} part{'ies' if len(record.parties) != 1 else 'y'} ({path})")
    for line in record.lines():
        say(f"  {line}")
    beyond = record.beyond_budget()
    leaking = {name: party.final_model.headline() for name, party in record.parties.items()
               if party.final_model is not None and party.final_model.leak is not None
               and party.final_model.leak.detected}
    for name, why in beyond.items():
        say(f"BEYOND THE PLAN'S LIMITS: {name}: {'; '.join(why)}")
    if fail_on_leak:
        for name, headline in leaking.items():
            say(f"LEAK (--fail-on-leak): {name}: {headline}")
    unaudited = [name for name, party in record.parties.items()
                 if party.final_model is None or not party.final_model.audited]
    if beyond or (fail_on_leak and leaking):
        return BEYOND
    if record.state != FINISHED or unaudited or not record.parties:
        why = [f"the run is {record.state}"] if record.state != FINISHED else []
        why += [f"no final model audit for {', '.join(unaudited)}"] if unaudited else []
        why += ["no party"] if not record.parties else []
        say(f"INCOMPLETE: {'; '.join(why)}: nothing is claimed for what is missing")
        return INCOMPLETE
    said = (f"; final model leak detected for {', '.join(leaking)} (fails only with --fail-on-leak)"
            if leaking and not fail_on_leak else "")
    say(f"within the plan's limits{said}")
    return OK
