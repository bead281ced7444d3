"""The train task's results: through the audit they are the model's own tensors (no copy of a model's size held while
the audit runs), and what the task returns, which OpenFL caches and sends, is a copy with the values the audit left
in the model, which the next round's training cannot change. The received model the audit reads is OpenFL's arrays of
the received weights, and a write into it fails the round."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import src.runner.models
import src.taskrunner as taskrunner_module
from audit.party_audit import PartyAudit
from report_drawing import without_report_drawing  # noqa: F401  (a fixture)
from tests.test_received_model_federation import BatchNormNet
from tests.test_settings_at_start import FAST, merged
from workspace.in_process import run_in_process

pytestmark = [pytest.mark.federation, pytest.mark.usefixtures("without_report_drawing")]


def _model_tensors(runner) -> dict:
    return {name: tensor.numpy() for name, tensor in runner.state_dict().items()}


# collaborator2 sends a noised update: the model is written during the audit's step (weights changed), its results
# are then copies of what it sends.
NOISE = {"task_runner": {"settings": {"per_collaborator": {"collaborator2": {
    "mitigation": {"method": "noise", "sigma": 0.01}}}}}}


@pytest.mark.parametrize("model", ["cnn", "batchnorm_cnn"])  # BatchNorm: running statistics and an int64 buffer
def test_results_are_the_model_through_the_audit_and_a_copy_of_it_after(tmp_path, monkeypatch, model):
    monkeypatch.setitem(src.runner.models._CLASSES, "batchnorm_cnn", BatchNormNet)
    during, returned, retyped = [], [], set()
    real_after, real_task = PartyAudit.after_training, taskrunner_module.AuditedTaskRunner.train_task

    def after_training(self, trained, received, *args, **kwargs):
        model = {name: tensor.numpy() for name, tensor in self.model.state_dict().items()}
        during.append({name: np.shares_memory(array, model[name]) for name, array in trained.items()})
        # the received model the audit reads is OpenFL's arrays of the received weights, not a copy (but where OpenFL
        # sent another dtype: BatchNorm's int64 counter arrives as a float)
        global_model = {name: tensor.numpy() for name, tensor in self._round.received_model.state_dict().items()}
        assert set(global_model) == set(received)
        during.append({name: np.shares_memory(array, global_model[name]) for name, array in received.items()
                       if array.dtype == global_model[name].dtype})
        assert all(np.array_equal(array, global_model[name]) for name, array in received.items())
        retyped.update(name for name, array in received.items() if array.dtype != global_model[name].dtype)
        return real_after(self, trained, received, *args, **kwargs)

    def train_task(self, col_name, round_num, *args, **kwargs):
        global_out, local_out = real_task(self, col_name, round_num, *args, **kwargs)
        model = _model_tensors(self)
        for out in (global_out, local_out):
            for key, array in out.items():
                if "metric" in key.tags:
                    continue
                returned.append((np.shares_memory(array, model[key.tensor_name]),
                                 np.array_equal(array, model[key.tensor_name]), key.tensor_name))
        # The copies outlive a change of the model (the next round's training writes into the same tensors); the
        # model then gets its own values back, bit for bit.
        kept = {key: np.array(array) for key, array in global_out.items() if "metric" not in key.tags}
        state = {name: tensor.clone() for name, tensor in self.state_dict().items()}
        for tensor in self.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(1.0)
        assert all(np.array_equal(global_out[key], value) for key, value in kept.items())
        for name, tensor in self.state_dict().items():
            tensor.copy_(state[name])
        return global_out, local_out

    monkeypatch.setattr(PartyAudit, "after_training", after_training)
    monkeypatch.setattr(taskrunner_module.AuditedTaskRunner, "train_task", train_task)
    overrides = merged(FAST, merged(NOISE, {"task_runner": {"settings": {"model": model}}}))
    result = run_in_process(tmp_path, collaborators=2, rounds=2, overrides=overrides)

    assert len(during) == 8 and all(during) and all(all(shared.values()) for shared in during), during
    assert retyped == ({"features.bn1.num_batches_tracked", "classifier.bn2.num_batches_tracked"}
                       if model == "batchnorm_cnn" else set()), retyped
    assert returned and not any(shared for shared, _equal, _name in returned), returned
    assert all(equal for _shared, equal, _name in returned), [name for _s, equal, name in returned if not equal]
    noised = [json.loads((result.report_dir / "collaborator2" / f"round_{r:04d}" / "audit.json").read_text())
              ["extra"]["mitigation"] for r in (0, 1)]
    assert all(m["method"] == "noise" and m["sent_update_norm"] != m["update_norm"] for m in noised), noised


def test_a_write_into_the_received_model_fails_the_round(tmp_path, monkeypatch):
    """What a withheld round sends is the received arrays the audit's received model is built on: an audit step that
    writes into that model fails the round, naming the tensor, and nothing is sent."""
    real_after = PartyAudit.after_training

    def after_training(self, trained, received, *args, **kwargs):
        outcome = real_after(self, trained, received, *args, **kwargs)
        if self._round is None and writes:  # the round is done: write as a misbehaving step would have
            with torch.no_grad():
                writes.pop().add_(1.0)
        return outcome

    writes = []
    real_before = PartyAudit.before_training

    def before_training(self, *args, **kwargs):
        plan = real_before(self, *args, **kwargs)
        if self._round.received_model is not None and not writes:
            writes.append(next(self._round.received_model.parameters()))
        return plan

    monkeypatch.setattr(PartyAudit, "after_training", after_training)
    monkeypatch.setattr(PartyAudit, "before_training", before_training)
    with pytest.raises(Exception, match=r"wrote into the received model \("):
        run_in_process(tmp_path, collaborators=2, rounds=1, overrides=FAST)
