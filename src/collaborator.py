"""OpenFL's Collaborator, whose per-round metrics go to TensorBoard under tags named by metric
(src.process.metric_writer): the plan's collaborator template, so that `fx collaborator start` writes what the
one-process demo writes. It also writes its phases between tasks as status events (src.process.party_events) for the
tooling's status line."""

from __future__ import annotations

from openfl.callbacks import Callback, MetricWriter
from openfl.component import Collaborator

from src.process.metric_writer import PartyMetricWriter
from src.process.party_events import emit

__all__ = ["AuditingCollaborator", "StatusEvents"]


class StatusEvents(Callback):
    """The collaborator's phases between its tasks, as status events (src.process.party_events): waiting for tasks, a
    round's tasks received (its first task validates the received model), the round done, the run done."""

    def __init__(self, party: str = ""):
        super().__init__()
        self.party = party

    def on_experiment_begin(self, logs=None):
        emit(self.party, "waiting")

    def on_round_begin(self, round_num: int, logs=None):
        emit(self.party, "validating", round_num)

    def on_round_end(self, round_num: int, logs=None):
        emit(self.party, "waiting", round_num)

    def on_experiment_end(self, logs=None):
        emit(self.party, "done")


class AuditingCollaborator(Collaborator):
    """With `write_logs`, a PartyMetricWriter in place of OpenFL's MetricWriter (OpenFL adds its own only when the
    callbacks hold none), reading the bounds of the audit's figures from this collaborator's task runner."""

    def __init__(self, *args, callbacks=None, write_logs: bool = False, **kwargs):
        # Always a fresh list: OpenFL's default (`callbacks=[]`) is one list shared by every Collaborator.
        own = [*(callbacks or []), StatusEvents()]
        if write_logs and not any(isinstance(c, MetricWriter) for c in own):
            own.append(PartyMetricWriter())
        super().__init__(*args, callbacks=own, write_logs=write_logs, **kwargs)
        for callback in own:
            if isinstance(callback, StatusEvents):
                callback.party = self.collaborator_name
            if isinstance(callback, PartyMetricWriter) and callback.record_source is None:
                callback.record_source = self.task_runner
