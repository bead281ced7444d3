"""OpenFL's Collaborator, whose per-round metrics go to TensorBoard under tags named by metric
(src.process.metric_writer): the plan's collaborator template, so that `fx collaborator start` writes what the
one-process demo writes. It also writes its phases between tasks as status events (src.process.party_events) for the
tooling's status line, lets go of each finished round's models (drop_finished_models), and makes the NamedTensors it
sends as they are read (src.process.named_tensors)."""

from __future__ import annotations

from openfl.callbacks import Callback, MetricWriter
from openfl.component import Collaborator

from src.process.metric_writer import PartyMetricWriter
from src.process.named_tensors import NamedTensorsOnRead
from src.process.party_events import emit

__all__ = ["AuditingCollaborator", "StatusEvents", "FinishedModels", "drop_finished_models"]

# TensorDB tags of a collaborator's model tensors (received, trained): what drop_finished_models frees.
_MODEL_TAGS = ("model", "trained")


def drop_finished_models(col, round_num: int) -> int:
    """Free the model tensors (received and trained, each a model's size) and the metric rows of `col`'s rounds up to
    `round_num`, once its round is over; returns how many rows went. OpenFL's own clean-up (`db_store_rounds`, 2 in
    our plan) keeps the last rounds' models, a received and a trained array a round, and every round's metrics (each
    sent with its task, read by nothing later): neither is read by a later task, the next round's model comes from
    the aggregator. The models stay with delta updates (`use_delta_updates`): the collaborator then applies the
    aggregator's deltas to the model it holds."""
    db = col.tensor_db
    keep_models = getattr(col, "use_delta_updates", False)
    with db.mutex:
        frame = db.tensor_db
        finished = frame["round"].astype(int) <= round_num
        report = frame["report"].astype(bool)
        model_rows = frame["tags"].map(lambda tags: any(tag in _MODEL_TAGS for tag in tags)) & ~report
        drop = finished & (report | (model_rows & (not keep_models)))
        if drop.any():
            db.tensor_db = frame[~drop].reset_index(drop=True)
    return int(drop.sum())


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


class FinishedModels(Callback):
    """At each round's end (after OpenFL's clean-up), drop_finished_models for the collaborator it belongs to."""

    def __init__(self, collaborator=None):
        super().__init__()
        self.collaborator = collaborator

    def on_round_end(self, round_num: int, logs=None):
        if self.collaborator is not None:
            drop_finished_models(self.collaborator, round_num)


class AuditingCollaborator(Collaborator):
    """With `write_logs`, a PartyMetricWriter in place of OpenFL's MetricWriter (OpenFL adds its own only when the
    callbacks hold none), reading the bounds of the audit's figures from this collaborator's task runner. A process
    of its own holds each round's models only until the round ends (FinishedModels): what OpenFL's `db_store_rounds`
    would keep is two earlier rounds' received and trained models, each a model's size, through the next round's
    training and audit."""

    def __init__(self, *args, callbacks=None, write_logs: bool = False, **kwargs):
        # Always a fresh list: OpenFL's default (`callbacks=[]`) is one list shared by every Collaborator.
        own = [*(callbacks or []), StatusEvents(), FinishedModels()]
        if write_logs and not any(isinstance(c, MetricWriter) for c in own):
            own.append(PartyMetricWriter())
        super().__init__(*args, callbacks=own, write_logs=write_logs, **kwargs)
        for callback in own:
            if isinstance(callback, StatusEvents):
                callback.party = self.collaborator_name
            if isinstance(callback, FinishedModels):
                callback.collaborator = self
            if isinstance(callback, PartyMetricWriter) and callback.record_source is None:
                callback.record_source = self.task_runner

    def send_task_results(self, tensor_dict, round_number, task_name) -> dict:
        """OpenFL 1.9's `Collaborator.send_task_results`, the same results sent and the same metrics returned, but
        the NamedTensors are made as the client reads them (NamedTensorsOnRead), not all kept in a list through the
        send: a model's size less at the aggregator's end of round in one process, and in a gRPC request."""
        data_size = -1  # as OpenFL: a task that is neither training nor validation has no data size
        if "train" in task_name:
            data_size = self.task_runner.get_train_data_size()
        if "valid" in task_name:
            data_size = self.task_runner.get_valid_data_size()
        metrics = {}
        for (tensor_name, _origin, _round, report, _tags), value in tensor_dict.items():
            if report:  # a scalar metric
                metrics[f"{self.collaborator_name}/{task_name}/{tensor_name}"] = float(value)
        self.client.send_local_task_results(round_number, task_name, data_size,
                                            NamedTensorsOnRead(self.nparray_to_named_tensor, tensor_dict))
        return metrics
