"""The task runner's initial model (what RMIA's independent references start from) is not kept in memory: before
round 0 it is the plan's model built again from the seed, after it the received round-0 model read back from a
private file. The audit gets what the runner used to hold, bit for bit, reads it only when the references start,
and nothing reachable from the runner holds a copy of it between audits; the file goes with the runner."""

from __future__ import annotations

import gc
import os
import types

import pytest
import torch

import audit.party_audit as party_audit_module
from audit.spill import load_model
from report_drawing import no_report_drawing
from workspace.in_process import parse_plan, run_in_process
from workspace.plan_file import write_run_plan

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def state(model: torch.nn.Module) -> dict:
    """Every parameter and buffer (non-persistent ones too), cloned."""
    return {name: t.detach().clone() for name, t in (*model.named_parameters(), *model.named_buffers())}


def assert_same_state(model: torch.nn.Module, want: dict, device) -> None:
    got = state(model)
    assert list(got) == list(want)
    for name, value in want.items():
        assert got[name].device == torch.device(device) and got[name].dtype == value.dtype, name
        assert torch.equal(got[name], value), name


@pytest.mark.parametrize("model, dataset, model_settings", [
    ("cnn", "digits", None), ("fcnn", "mnist", {"dropout": 0.3, "activation": "tanh"}), ("alexnet", "cifar10", None)])
@pytest.mark.slow
def test_before_round_0_the_initial_model_is_the_plan_model_built_again_bit_for_bit(tmp_path, model, dataset,
                                                                                    model_settings):
    """What the runner deep-copied at construction, for every model of src/runner/models.py; building it again leaves
    torch's global generator where it was (the draws after it are the ones they would have been)."""
    from openfl.utilities.dataloading import initialize_minimal_dataloader

    overrides = {"data_loader": {"settings": {"dataset": dataset}},
                 "task_runner": {"settings": {"model": model, "model_settings": model_settings, "seed": 11}}}
    plan = parse_plan(write_run_plan(tmp_path, collaborators=1, rounds=1, overrides=overrides))
    runner = plan.get_task_runner(initialize_minimal_dataloader(plan))
    at_construction = state(runner.model)
    torch.rand(3)  # the process goes on drawing
    generator = torch.get_rng_state()
    rebuilt = runner.audit.initial_model()
    assert torch.equal(torch.get_rng_state(), generator)
    assert rebuilt is not runner.model
    assert_same_state(rebuilt, at_construction, runner.device)
    with torch.no_grad():  # a model of its own, not a view of the runner's
        next(rebuilt.parameters()).add_(1.0)
    assert_same_state(runner.model, at_construction, runner.device)


def reachable_tensors(root) -> list[torch.Tensor]:
    """Every tensor reachable from `root` through references (containers, attributes, closures), not through
    modules' globals or classes (what any object can reach)."""
    seen, stack, found = set(), [root], []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (types.ModuleType, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
            continue
        if isinstance(obj, types.FunctionType):  # what a closure or default holds, not its module's globals
            stack.extend(cell.cell_contents for cell in obj.__closure__ or () if cell.cell_contents is not None)
            stack.extend(obj.__defaults__ or ())
            continue
        stack.extend(gc.get_referents(obj))
    return found


OVERRIDES = {
    "tasks": {"train": {"kwargs": {"epochs": 1}}},
    "data_loader": {"settings": {"dataset": "digits", "seed": 3, "train_dataset_ratio": 0.1,
                                 "test_dataset_ratio": 0.45, "audit_dataset_ratio": 0.45}},
    "task_runner": {"settings": {"seed": 3, "audit": {"signals": ["loss"], "fpr_tolerance": [0.1],
                                                      "rmia": {"references": ["global", "independent"],
                                                               "reference_models": 2}}}},
}


@pytest.mark.federation
def test_the_audit_gets_the_initial_model_the_runner_held_and_nothing_keeps_a_copy(tmp_path, monkeypatch):
    """In a federation (2 parties, 3 rounds, RMIA's independent references): each audit is handed what the old runner
    held (its round-0 received model, which is the plan's model), on the runner's device; no audit reads it from disk
    (round 0 hands over the received model itself, later rounds continue the stored references); afterwards the
    runner can still give it, bit for bit, no tensor reachable from the runner holds its values, and its file goes
    with the runner."""
    built, handed, loaded_in_audit = {}, [], []
    inside_audit = []
    real_init = party_audit_module.PartyAudit.use_model
    real_audit_round = party_audit_module.audit_round
    real_initial = party_audit_module.PartyAudit.initial_model

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        built[id(self)] = state(self.model)  # what the old code deep-copied

    def initial_model(self):
        if inside_audit:
            loaded_in_audit.append(id(self))
        return real_initial(self)

    def audit_round(local_model, global_model, *args, initial_model=None, **kwargs):
        inside_audit.append(True)
        try:
            record = real_audit_round(local_model, global_model, *args, initial_model=initial_model, **kwargs)
        finally:
            inside_audit.pop()
        handed.append((kwargs["party"], kwargs["round_num"], state(load_model(initial_model)), state(global_model)))
        return record

    monkeypatch.setattr(party_audit_module.PartyAudit, "use_model", init)
    monkeypatch.setattr(party_audit_module.PartyAudit, "initial_model", initial_model)
    monkeypatch.setattr(party_audit_module, "audit_round", audit_round)
    with no_report_drawing():  # the models handed to the audit are the subject, not the report's pages
        result = run_in_process(tmp_path, collaborators=2, rounds=3, overrides=OVERRIDES)
    monkeypatch.undo()

    parties = sorted(result.collaborators)
    assert sorted((party, round_num) for party, round_num, *_ in handed) == [(p, r) for p in parties for r in range(3)]
    assert loaded_in_audit == []
    start = {party: received for party, round_num, _, received in handed if round_num == 0}
    plan_model = next(iter(built.values()))
    for party, round_num, initial, _ in handed:
        assert list(initial) == list(start[party])
        assert all(torch.equal(initial[n], start[party][n]) for n in initial), (party, round_num)
        assert all(torch.equal(start[party][n], plan_model[n]) for n in plan_model)  # in process: the plan's model

    folders = []
    for party in parties:
        runner = result.runner(party)
        assert_same_state(runner.audit.initial_model(), start[party], runner.device)  # read back from its file
        own = {p.untyped_storage().data_ptr() for p in (*runner.model.parameters(), *runner.model.buffers())}
        tensors = [t for t in reachable_tensors(runner) if t.untyped_storage().data_ptr() not in own]
        for name, value in start[party].items():
            if value.numel() >= 100:
                held = [t for t in tensors if t.shape == value.shape and t.dtype == value.dtype and torch.equal(t, value)]
                assert not held, f"{party}: {name} of the initial model is held {len(held)} time(s)"
        folders.append(runner.audit._initial_on_disk.folder)
        assert os.listdir(folders[-1])
    del runner, result
    gc.collect()
    assert not any(os.path.exists(folder) for folder in folders)
