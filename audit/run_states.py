"""How a run stands: the states run.json (audit.run_record.RunRecord.state) records and the run index shows.

running: the run is under way (run.json is rewritten as each round ends); finished: every round and every party's
final-model audit are done; interrupted: the run ended before that (stopped or failed), so its figures cover the rounds
written. The one definition of these names: every writer and reader imports them from here.
"""

from __future__ import annotations

__all__ = ["RUNNING", "FINISHED", "INTERRUPTED", "RUN_STATES"]

RUNNING, FINISHED, INTERRUPTED = "running", "finished", "interrupted"
RUN_STATES = (RUNNING, FINISHED, INTERRUPTED)
