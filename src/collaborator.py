"""OpenFL's Collaborator, whose per-round metrics go to TensorBoard under tags named by metric (src.metric_writer):
the plan's collaborator template, so that `fx collaborator start` writes what the one-process demo writes."""

from __future__ import annotations

from openfl.callbacks import MetricWriter
from openfl.component import Collaborator

from src.metric_writer import PartyMetricWriter

__all__ = ["AuditingCollaborator"]


class AuditingCollaborator(Collaborator):
    """With `write_logs`, a PartyMetricWriter in place of OpenFL's MetricWriter (OpenFL adds its own only when the
    callbacks hold none), reading the bounds of the audit's figures from this collaborator's task runner."""

    def __init__(self, *args, callbacks=None, write_logs: bool = False, **kwargs):
        # Always a fresh list: OpenFL's default (`callbacks=[]`) is one list shared by every Collaborator.
        own = list(callbacks or [])
        if write_logs and not any(isinstance(c, MetricWriter) for c in own):
            own.append(PartyMetricWriter())
        super().__init__(*args, callbacks=own, write_logs=write_logs, **kwargs)
        for callback in own:
            if isinstance(callback, PartyMetricWriter) and callback.record_source is None:
                callback.record_source = self.task_runner
