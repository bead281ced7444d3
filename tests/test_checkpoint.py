"""aggregator.settings.save_every_round: OpenFL's model files each round only where the plan asks for them; the
files at the end are the same either way."""

import gc
import weakref

import numpy as np
import pytest
from openfl.component import Aggregator
from openfl.protocols import utils
from openfl.utilities import TensorKey

from report_drawing import without_report_drawing  # noqa: F401  (a fixture)
from src.server import model_file
from src.aggregator import AuditingAggregator
from workspace.in_process import parse_plan, run_in_process
from workspace.plan_file import write_run_plan

DIGITS = {
    "tasks": {"train": {"kwargs": {"epochs": 1}}},
    "data_loader": {"settings": {"dataset": "digits", "seed": 4}},
    "task_runner": {"settings": {"seed": 4, "audit": {"enabled": False}}},
}
ROUNDS = 3


def _run(tmp_path, monkeypatch, every_round: bool):
    writes = []
    real = model_file.write_model_file
    monkeypatch.setattr(model_file, "write_model_file",
                        lambda path, *args: writes.append(str(path)) or real(path, *args))
    overrides = {**DIGITS, "aggregator": {"settings": {"save_every_round": every_round}}}
    result = run_in_process(tmp_path, collaborators=2, rounds=ROUNDS, overrides=overrides)
    monkeypatch.undo()
    return result, writes


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")  # the model files and tensors are read, not the reports
def test_the_last_model_s_file_at_the_end_unless_asked_and_the_same_files(tmp_path, monkeypatch):
    asked, asked_writes = _run(tmp_path / "every", monkeypatch, True)
    plain, plain_writes = _run(tmp_path / "end", monkeypatch, False)
    save = {name: tmp_path / name / "save" for name in ("every", "end")}
    # OpenFL's way: last_state_path every round, the final model's audit's round too (and best_state_path whenever
    # the validation improved).
    assert sum(p.endswith("last.pbuf") for p in asked_writes) == ROUNDS + 1
    # Here: the last model's file once, at the last round; the best model's whenever it improved, as OpenFL's.
    assert [p.rsplit("/", 1)[1] for p in plain_writes].count("last.pbuf") == 1
    assert [p for p in plain_writes if p.endswith("best.pbuf")] != []
    assert len([p for p in plain_writes if p.endswith("best.pbuf")]) == len(
        [p for p in asked_writes if p.endswith("best.pbuf")])
    for name in ("last.pbuf", "best.pbuf"):
        assert (save["end"] / name).read_bytes() == (save["every"] / name).read_bytes(), name
    # The aggregator keeps the same tensors in memory as OpenFL does.
    for attr in ("last_tensor_dict", "best_tensor_dict"):
        a, b = getattr(asked.aggregator, attr), getattr(plain.aggregator, attr)
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    # Of the final model, only the copy the collaborators read is held (they ask for no delta updates).
    assert _model_rows(plain.aggregator) == {("model",)}


def _model_rows(aggregator) -> set:
    """The tags of the aggregator's rows of the final model's round: the one the final model's audit read, after
    which the round number moved on."""
    frame = aggregator.tensor_db.tensor_db
    return {tuple(t) for t, r, report in zip(frame["tags"], frame["round"], frame["report"])
            if int(r) == aggregator.round_number - 1 and not report}


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")  # the model files and tensors are read, not the reports
def test_collaborators_with_delta_updates_get_every_copy_they_read(tmp_path):
    """With collaborator.settings.use_delta_updates the collaborators ask for the aggregate and its delta: the
    aggregator keeps them, and the run ends with the same kind of files."""
    overrides = {**DIGITS, "collaborator": {"settings": {"use_delta_updates": True}}}
    result = run_in_process(tmp_path, collaborators=2, rounds=2, overrides=overrides)
    assert _model_rows(result.aggregator) == {("model",), ("aggregated",), ("aggregated", "delta")}
    assert (tmp_path / "save" / "last.pbuf").exists()


def test_a_best_model_of_an_earlier_round_waits_on_disk(tmp_path):
    """best_state_path improves in round 0 only: its file is written then, from round 0's tensors, and holds them at
    the end; last_state_path's only at the last round: the round after the last training round (the final model's
    audit), whose model is the final one."""
    plan = parse_plan(write_run_plan(tmp_path, collaborators=1, rounds=1))
    initial = {"w": np.arange(3, dtype=np.float32)}
    agg = plan.get_aggregator(tensor_dict=initial)
    assert isinstance(agg, AuditingAggregator) and not agg.save_every_round
    assert (agg.final_round, agg.rounds_to_train) == (1, 2)
    assert agg.model is None  # the initial model's protobuf is not kept: its tensors are in the store
    agg._save_model(0, agg.best_state_path)
    agg._save_model(0, agg.last_state_path)
    assert (tmp_path / "save" / "best.pbuf").exists() and not (tmp_path / "save" / "last.pbuf").exists()
    agg.tensor_db.cache_tensor({TensorKey("w", agg.uuid, 1, False, ("model",)): np.full(3, 7, dtype=np.float32)})
    agg._save_model(1, agg.last_state_path)
    best, _ = utils.deconstruct_model_proto(utils.load_proto(str(tmp_path / "save" / "best.pbuf")),
                                            agg.compression_pipeline)
    last, _ = utils.deconstruct_model_proto(utils.load_proto(str(tmp_path / "save" / "last.pbuf")),
                                            agg.compression_pipeline)
    assert best["w"].tolist() == [0, 1, 2] and last["w"].tolist() == [7, 7, 7]
    # The bytes OpenFL's own save writes for the same round (it reads the names off the initial model's protobuf).
    agg.model = utils.construct_model_proto(initial, 0, agg.compression_pipeline)
    Aggregator._save_model(agg, 1, str(tmp_path / "openfl_last.pbuf"))
    assert (tmp_path / "openfl_last.pbuf").read_bytes() == (tmp_path / "save" / "last.pbuf").read_bytes()


def test_no_round_s_model_outlives_its_rows_in_the_store(tmp_path):
    """Once the tensor store's clean-up drops a round, nothing of the aggregator holds its model: OpenFL's
    last_tensor_dict and best_tensor_dict kept it (a whole model each through every later round). The best one is
    read back from its file, the same values."""
    plan = parse_plan(write_run_plan(tmp_path, collaborators=1, rounds=2))  # round 2: the final model's audit
    agg = plan.get_aggregator(tensor_dict={"w": np.arange(3, dtype=np.float32)})
    model = np.full(3, 7, dtype=np.float32)
    agg.tensor_db.cache_tensor({TensorKey("w", agg.uuid, 1, False, ("model",)): model})
    agg._save_model(1, agg.best_state_path)
    agg._save_model(1, agg.last_state_path)
    held = weakref.ref(model)
    del model
    agg.tensor_db.cache_tensor({TensorKey("w", agg.uuid, 2, False, ("model",)): np.zeros(3, dtype=np.float32)})
    agg.tensor_db.clean_up(1)  # round 2's rows stay, rounds 0 and 1 go
    gc.collect()
    assert held() is None
    assert agg.best_tensor_dict["w"].tolist() == [7, 7, 7]
    agg._save_model(2, agg.last_state_path)  # the last round, not the best: last_tensor_dict is its model
    assert agg.last_tensor_dict["w"].tolist() == [0, 0, 0] and agg.best_tensor_dict["w"].tolist() == [7, 7, 7]


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")
def test_an_in_process_run_lets_the_initial_model_go(tmp_path, monkeypatch):
    """OpenFL's Plan.get_aggregator leaves the initial model in the plan's settings; once the store drops round 0,
    nothing of an in-process run holds it."""
    import workspace.in_process as in_process

    initial, alive = in_process.initial_tensor_dict, []

    def watched(plan):
        tensors = initial(plan)
        alive.extend(weakref.ref(a) for a in tensors.values() if isinstance(a, np.ndarray))
        return tensors

    def check(collaborator, task, round_num):
        if round_num == 2 and not seen:
            gc.collect()
            seen.append(sum(r() is not None for r in alive))

    seen: list = []
    monkeypatch.setattr(in_process, "initial_tensor_dict", watched)
    run_in_process(tmp_path, collaborators=1, rounds=3, overrides=DIGITS, on_task=check)
    assert alive and seen == [0]


def test_a_bad_value_fails_naming_the_key(tmp_path):
    plan = parse_plan(write_run_plan(tmp_path, collaborators=1, rounds=1,
                                     overrides={"aggregator": {"settings": {"save_every_round": "yes"}}}))
    with pytest.raises(ValueError, match=r"aggregator\.settings\.save_every_round: expected true or false"):
        plan.get_aggregator(tensor_dict={})
