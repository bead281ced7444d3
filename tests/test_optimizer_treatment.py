"""collaborator.settings.opt_treatment as OpenFL documents it: RESET starts every round's training from a fresh
optimizer state (OpenFL 1.9's PyTorchTaskRunner.reset_opt_vars is empty: the task runner implements it), and keeps
none between rounds; CONTINUE_LOCAL carries the party's own state over."""

from __future__ import annotations

import pytest

import src.taskrunner as taskrunner_module
from report_drawing import without_report_drawing  # noqa: F401  (a fixture)
from workspace.in_process import run_in_process

# The optimizer's state is the subject, not the reports' pages.
pytestmark = [pytest.mark.federation, pytest.mark.usefixtures("without_report_drawing")]


def _state_sizes(tmp_path, monkeypatch, treatment: str, optimizer: str):
    """Per (collaborator, round): optimizer state entries when the round's training starts, and after its task."""
    at_start, after = [], []
    real_train, real_task = taskrunner_module.AuditedTaskRunner.train_, taskrunner_module.AuditedTaskRunner.train_task

    def train_(self, loader):
        at_start.append(len(self.optimizer.state))
        return real_train(self, loader)

    def train_task(self, col_name, round_num, *args, **kwargs):
        out = real_task(self, col_name, round_num, *args, **kwargs)
        after.append(len(self.optimizer.state))
        return out

    monkeypatch.setattr(taskrunner_module.AuditedTaskRunner, "train_", train_)
    monkeypatch.setattr(taskrunner_module.AuditedTaskRunner, "train_task", train_task)
    overrides = {"tasks": {"train": {"kwargs": {"epochs": 1}}},  # one train_ call per round's training
                 "collaborator": {"settings": {"opt_treatment": treatment}},
                 "task_runner": {"settings": {"optimizer": optimizer, "audit": {"enabled": False}}}}
    run_in_process(tmp_path, collaborators=2, rounds=3, overrides=overrides)
    monkeypatch.undo()
    return at_start, after


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_reset_trains_every_round_from_a_fresh_optimizer_state_and_keeps_none(tmp_path, monkeypatch, optimizer):
    at_start, after = _state_sizes(tmp_path / "reset", monkeypatch, "RESET", optimizer)
    assert at_start == [0] * 6 and after == [0] * 6
    at_start, after = _state_sizes(tmp_path / "continue", monkeypatch, "CONTINUE_LOCAL", optimizer)
    # The first training of each party starts empty; from round 1 its own state carries over (every parameter).
    assert at_start[:2] == [0, 0] and min(at_start[2:]) > 0 and min(after) > 0
