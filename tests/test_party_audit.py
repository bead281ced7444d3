"""audit.party_audit.PartyAudit: the collaborator's audit the task runner calls, usable without OpenFL.

It imports nothing of OpenFL, and one round driven by hand (no OpenFL, a tabular model and data the federation tests
do not use) goes through the received-model check, the training plan, the validation accuracy read off the signal
cache, the audit, the gate and the report: the gate's withhold puts the received weights back into the model."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from report_drawing import without_report_drawing  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_facade_and_what_it_uses_import_no_openfl():
    code = ("import sys, audit.party_audit, audit.party_mitigation, audit.membership.signal_cache, "
            "audit.dp_training, audit.config.per_collaborator, audit.chance_accuracy, audit.audit_cost\n"
            "print(sorted(m for m in sys.modules if m == 'openfl' or m.startswith('openfl.')))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def _party_data(seed=0, n=60, features=5, classes=3):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=2.0, size=(classes, features))

    def draw(count):
        y = rng.integers(0, classes, count)
        return (centres[y] + rng.normal(size=(count, features))).astype(np.float32), y

    (x_train, y_train), (x_valid, y_valid), (x_pop, y_pop) = draw(n), draw(n), draw(n)
    data = SimpleNamespace(X_train=x_train, y_train=y_train, X_valid=x_valid, y_valid=y_valid, X_population=x_pop,
                           y_population=y_pop, batch_size=16, dirichlet_alpha=None, shard=0)
    data.get_audit_sets = lambda: {"members": (data.X_train, data.y_train), "nonmembers": (data.X_valid, data.y_valid),
                                   "population": (data.X_population, data.y_population)}
    return data


def _plan_model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))


def _state(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.slow
def test_one_round_by_hand_withholds_an_update_over_the_gates_limit(tmp_path, without_report_drawing):
    # The round's record is read, not its images: the drawing is only asked for (tests/report_drawing.py).
    from audit.party_audit import PartyAudit

    data = _party_data()
    party = PartyAudit(
        audit={"signals": ["loss"], "fpr_tolerance": [0.1], "rmia": {"enabled": False}, "report_dir": str(tmp_path)},
        gate={"action": "withhold", "bound": "point", "thresholds": {"mia_local_loss_auc": 0.0}},
        per_collaborator=None, mitigation=None, prefix="task_runner.settings", seed=1, data=data,
        optimizer=("Adam", 0.01, 0.0), party="alice")
    model = _plan_model()
    party.use_model(model, _plan_model, (5,), "cpu")
    received = _state(model)

    verdict = party.check_received("alice", 0, received)
    assert not verdict.rejected
    accuracy = party.validation_accuracy("alice", 0, "global", model)
    with torch.no_grad():
        want = float((model(torch.as_tensor(data.X_valid)).argmax(1).numpy() == data.y_valid).mean())
    assert accuracy == want
    assert len(party.signal_cache) == 3  # the received model's signals on the three sets, for the audit to reuse

    plan = party.before_training("alice", 0, 2, verdict, received_model=lambda: copy.deepcopy(model))
    assert (plan.epochs, plan.learning_rate) == (2, 0.01)
    optimizer = party.make_optimizer(model, plan.learning_rate)
    torch.manual_seed(plan.seed)
    for _ in range(plan.epochs * 10):  # the local training, as the task runner's would
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(torch.as_tensor(data.X_train)), torch.as_tensor(data.y_train)).backward()
        optimizer.step()
    trained = _state(model)

    outcome = party.after_training(dict(trained), received, train_loss=0.5, train_seconds=0.1)
    assert outcome.weights_changed and outcome.train_loss is None
    assert all(np.array_equal(v.numpy(), received[k]) for k, v in model.state_dict().items())
    assert outcome.scalars["gate_kept"] == 0.0 and outcome.scalars["gate_tripped__mia_local_loss_auc"] > 0
    assert 0.0 <= outcome.scalars["mia_local_loss_auc"] <= 1.0
    assert outcome.record.extra["gate"]["verdict"] == "withheld"
    assert outcome.record.timings["audit_in_validation_s"] > 0  # the received model's signals came from validation
    assert party.last_record is outcome.record
    assert without_report_drawing == [(str((tmp_path / "alice").resolve()), 0)]  # its report's drawing asked for
    written = json.loads((tmp_path / "alice" / "round_0000" / "audit.json").read_text())
    assert written["metrics"]["mia_local_loss_auc"] == outcome.scalars["mia_local_loss_auc"]


@pytest.mark.usefixtures("one_torch_thread")
def test_the_received_models_verdict_is_found_again_by_its_weights_not_its_arrays(tmp_path):
    """check_received runs the checks once per round and weights: copies of the same weights (other array objects)
    get the same verdict object; other weights, or another round, are checked again."""
    from audit.party_audit import PartyAudit

    party = PartyAudit(
        audit={"signals": ["loss"], "fpr_tolerance": [0.1], "rmia": {"enabled": False}, "report_dir": str(tmp_path)},
        gate=None, per_collaborator=None, mitigation=None, prefix="task_runner.settings", seed=1, data=_party_data(),
        optimizer=("Adam", 0.01, 0.0), party="alice")
    model = _plan_model()
    party.use_model(model, _plan_model, (5,), "cpu")
    received = _state(model)
    first = party.check_received("alice", 0, received)
    assert party.check_received("alice", 0, {k: v.copy() for k, v in received.items()}) is first
    changed = {k: v.copy() for k, v in received.items()}
    changed["0.bias"][0] = np.nextafter(changed["0.bias"][0], np.float32(np.inf))  # one bit of one weight
    assert party.check_received("alice", 0, changed) is not first
    assert party.check_received("alice", 1, received) is not first
