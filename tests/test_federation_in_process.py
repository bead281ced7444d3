"""The in-process federation: real OpenFL Aggregator and Collaborators, audits every round, reports."""

import copy
import csv
import json
import math

import numpy as np
import pytest
import torch

from audit.membership.population_attack import population_attack
from audit.membership.signals import loss_signal
from audit.run_record import RUN_FILE, RunRecord
from audit.run_states import FINISHED
from report_drawing import without_report_drawing  # noqa: F401  (a fixture)
from workspace.in_process import initial_tensor_dict, parse_plan, run_in_process
from workspace.plan_file import collaborator_names

ROUNDS = 3
# Few members and several local epochs: the local model overfits, as the audit should then show.
OVERRIDES = {
    "tasks": {"train": {"kwargs": {"epochs": 3}}},
    "data_loader": {"settings": {"dataset": "digits", "seed": 3, "train_dataset_ratio": 0.1,
                                 "test_dataset_ratio": 0.45, "audit_dataset_ratio": 0.45}},
    "task_runner": {"settings": {"seed": 3, "audit": {"fpr_tolerance": [0.05, 0.1]}}},
}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    return run_in_process(tmp_path_factory.mktemp("fed"), collaborators=2, rounds=ROUNDS, overrides=OVERRIDES)


@pytest.mark.federation
def test_every_collaborator_and_round_has_its_reports(federation):
    for name in collaborator_names(2):
        party = federation.report_dir / name
        for round_num in range(ROUNDS):
            round_dir = party / f"round_{round_num:04d}"
            record = json.loads((round_dir / "audit.json").read_text())
            assert record["party"] == name and record["round"] == round_num
            assert set(record["attacks"]) == {"local", "global", "update", "rmia"}
            assert set(record["attacks"]["local"]) == {"loss", "logits", "gradient_norm"}
            assert set(record["attacks"]["rmia"]) == {"global", "independent"}
            # the independent references had as many local trainings as the party's model (one per round)
            assert record["extra"]["rmia"]["independent"]["local_trainings"] == round_num + 1
            assert (round_dir / "roc.png").stat().st_size > 0
            assert (round_dir / "rmia_scores.npz").stat().st_size > 0  # per-sample scores: the party's folder only
        for summary in ("auc.png", "tpr_at_0.05.png", "tpr_at_0.1.png", "metrics.csv", "index.html"):
            assert (party / summary).stat().st_size > 0, summary
        rows = list(csv.DictReader((party / "metrics.csv").open()))
        assert [int(r["round"]) for r in rows] == list(range(ROUNDS))


@pytest.mark.federation
def test_audit_metrics_reach_the_aggregator_as_scalars(federation):
    last = federation.collaborator_metrics[-1]
    for name in collaborator_names(2):
        for key in ("mia_local_loss_auc", "mia_global_logits_auc", "mia_local_gradient_norm_tpr_at_fpr_0.1",
                    "mia_update_loss_reduction_auc"):
            value = last[f"{name}/train/{key}"]
            assert 0.0 <= value <= 1.0 and math.isfinite(value)
    # The aggregator holds only scalars for these metrics, never per-sample values.
    db = federation.aggregator.tensor_db.tensor_db
    audit_rows = db[db["tensor_name"].str.startswith("mia_") | db["tensor_name"].str.startswith("rmia_")]
    assert len(audit_rows) > 0
    assert all(np.asarray(a).size == 1 for a in audit_rows["nparray"])
    # Estimates only: the intervals' bounds stay in the party's report (metrics.csv has them).
    assert "rmia_independent_exact_auc" in set(audit_rows["tensor_name"])
    assert not audit_rows["tensor_name"].str.endswith(("_lower", "_upper")).any()
    header = (federation.report_dir / "collaborator1" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "mia_local_loss_exact_auc_lower" in header and "rmia_independent_tpr_at_fpr_0.1_upper" in header
    # ... and averages them in its own round logs.
    assert any("mia_local_loss_auc" in key for key in federation.round_logs[-1])


@pytest.mark.federation
def test_local_model_leaks_more_than_chance_once_it_overfits(federation):
    last = federation.collaborator_metrics[-1]
    aucs = [last[f"{name}/train/mia_local_loss_auc"] for name in collaborator_names(2)]
    assert np.mean(aucs) > 0.55, aucs


@pytest.mark.federation
def test_round_zero_audits_the_model_the_parties_start_from(federation):
    """The round-0 'global' model is the initial model every party received, not a fresh random init."""
    init = initial_tensor_dict(parse_plan(federation.plan_dir))
    runner = federation.runner("collaborator1")
    model = copy.deepcopy(runner.model)
    model.load_state_dict({k.removeprefix("model."): torch.as_tensor(v) for k, v in init.items()})
    sets = runner.audit.audit_sets()
    losses = [loss_signal(model, torch.as_tensor(x), torch.as_tensor(y))
              for x, y in (sets.members, sets.nonmembers, sets.population)]
    direct = population_attack(*losses, (0.05, 0.1))
    record = json.loads((federation.report_dir / "collaborator1" / "round_0000" / "audit.json").read_text())
    assert record["attacks"]["global"]["loss"]["auc"] == pytest.approx(direct.auc, abs=1e-12)
    assert record["attacks"]["global"]["loss"]["tpr_at_fpr"]["0.1"] == pytest.approx(direct.tpr_at_fpr[0.1], abs=1e-12)


@pytest.mark.federation
def test_every_party_audits_the_final_model_the_aggregator_saves(federation):
    """After the last round each party audits the final global model (the aggregator's last model, which no training
    round receives) against its own members; run.json carries each verdict."""
    run = RunRecord.read(federation.report_dir / RUN_FILE)
    assert run.state == FINISHED and run.rounds == ROUNDS and set(run.parties) == set(collaborator_names(2))
    final_weights = federation.aggregator.last_tensor_dict  # the model file's: the final aggregate
    for name in collaborator_names(2):
        final = run.parties[name].final_model
        assert final.audited and final.round == ROUNDS and final.leak is not None and final.leak.detected is not None
        record = json.loads((federation.report_dir / name / "final_model" / "audit.json").read_text())
        assert record["round"] == ROUNDS and set(record["attacks"]) == {"final", "rmia"}
        assert set(record["attacks"]["final"]) == {"loss", "logits", "gradient_norm"}
        # RMIA: the last round's independent references (as many trainings as the final model had), none trained anew;
        # the received model is no reference for the model it is
        assert set(record["attacks"]["rmia"]) == {"independent"}
        assert record["extra"]["rmia"]["independent"]["local_trainings"] == ROUNDS
        assert record["extra"]["rmia"]["global"] == {"skipped": "the final model is the global model: no received "
                                                                "model to compare it with"}
        sent = federation.final_metrics
        assert sent[f"{name}/final_model_audit/final_model_leak_detected"] == float(final.leak.detected)
        assert sent[f"{name}/final_model_audit/final_model_accuracy"] == pytest.approx(final.accuracy, abs=1e-12)
        # the audit scored the final model: its loss attack from the aggregator's final weights, recomputed
        runner = federation.runner(name)
        model = copy.deepcopy(runner.model)
        model.load_state_dict({k.removeprefix("model."): torch.as_tensor(v) for k, v in final_weights.items()})
        sets = runner.audit.membership_sets(name)
        losses = [loss_signal(model, torch.as_tensor(np.asarray(x)), torch.as_tensor(y))
                  for x, y in (sets.members, sets.nonmembers, sets.population)]
        direct = population_attack(*losses, (0.05, 0.1))
        assert record["attacks"]["final"]["loss"]["auc"] == pytest.approx(direct.auc, abs=1e-12)


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")  # the second run's metrics are compared, not its pages
def test_same_plan_and_seed_give_the_same_metrics(federation, tmp_path):
    again = run_in_process(tmp_path, collaborators=2, rounds=ROUNDS, overrides=OVERRIDES)
    assert again.collaborator_metrics == federation.collaborator_metrics


@pytest.mark.federation
def test_collaborators_keep_no_model_tensors_of_finished_rounds(federation):
    """In one process a collaborator's TensorDB drops its received and trained model tensors once its round is over
    (OpenFL's clean-up would keep two rounds' worth per collaborator), and its metric rows with them (sent with
    their task, read by nothing later): after the run it holds no row of any round."""
    for col in federation.collaborators.values():
        frame = col.tensor_db.tensor_db
        tags = frame["tags"].map(lambda t: bool({"model", "trained"} & set(t)))
        assert not tags.any(), frame[tags][["tensor_name", "round", "tags"]]
        # nor metric rows of any round, the final model's audit (the round after the last) included
        finished = frame["round"].astype(int) <= ROUNDS
        assert not finished.any(), frame[finished][["tensor_name", "round", "tags"]]


@pytest.mark.federation
def test_the_plans_collaborator_drops_a_rounds_models_when_openfl_ends_the_round(federation):
    """What `fx collaborator start` runs, round after round (OpenFL's Collaborator.run: its tasks cache the received
    and the trained model, then its clean-up keeps `db_store_rounds` rounds, then the callbacks' on_round_end): the
    plan's collaborator's own callback drops each round's models and metric rows, so the next round starts holding
    none (OpenFL's clean-up alone keeps two rounds' models and every round's metrics:
    benchmarks/bench_collaborator_models.py). Only that callback is called: the run is over, and the metric writer's
    file is closed."""
    from openfl.utilities import TensorKey

    from src.collaborator import AuditingCollaborator, FinishedModels

    for name, col in federation.collaborators.items():
        assert isinstance(col, AuditingCollaborator)
        (finished,) = [cb for cb in col.callbacks.callbacks if isinstance(cb, FinishedModels)]
        assert finished.collaborator is col
        assert col.db_store_rounds == 2  # the plan's: what OpenFL's clean-up alone would keep
        for later in range(ROUNDS + 5, ROUNDS + 9):  # rounds the run never had
            weights = {tag: np.full((3, 2), later, dtype=np.float32) for tag in ("model", "trained")}
            col.tensor_db.cache_tensor({TensorKey("w", name, later, False, (tag,)): weights[tag] for tag in weights})
            col.tensor_db.cache_tensor({TensorKey("acc", name, later, True, ("metric",)): np.array(0.5)})
            col.tensor_db.clean_up(col.db_store_rounds)
            finished.on_round_end(later, {})
            frame = col.tensor_db.tensor_db
            models = frame[frame["tags"].map(lambda t: bool({"model", "trained"} & set(t)))]
            assert models.empty, models[["tensor_name", "round", "tags"]]
            assert ("acc", later) not in {(r.tensor_name, int(r.round)) for r in frame.itertuples()}


def test_drop_finished_models_keeps_later_rounds_and_delta_bases():
    """drop_finished_models on a real TensorDB: model, trained and metric rows of rounds <= the given one go, later
    rounds stay; with delta updates the models stay (the collaborator applies deltas to the model it holds). Before,
    every round's metric rows stayed for the whole run: the collaborator's memory grew with the rounds."""
    from types import SimpleNamespace

    from openfl.databases import TensorDB
    from openfl.utilities import TensorKey

    from src.collaborator import drop_finished_models

    db = TensorDB()
    weights = np.ones((4, 3), dtype=np.float32)
    for round_num in (0, 1, 2):
        db.cache_tensor({TensorKey("w", "col", round_num, False, ("model",)): weights,
                         TensorKey("w", "col", round_num, False, ("trained",)): weights,
                         TensorKey("acc", "col", round_num, True, ("metric",)): np.array(0.5)})
    assert drop_finished_models(SimpleNamespace(tensor_db=db, use_delta_updates=True), 1) == 2  # the metrics
    assert drop_finished_models(SimpleNamespace(tensor_db=db, use_delta_updates=False), 1) == 4  # the models
    left = {(row.tensor_name, int(row.round), row.tags) for row in db.tensor_db.itertuples()}
    assert left == {("acc", 2, ("metric",)), ("w", 2, ("model",)), ("w", 2, ("trained",))}
    assert db.get_tensor_from_cache(TensorKey("w", "col", 2, False, ("model",))) is not None


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")  # the models held and the metrics are read, not the pages
def test_the_round_ends_at_the_aggregator_without_the_collaborators_models(tmp_path, monkeypatch):
    """The last collaborator's last sending ends the round at the aggregator (its memory peak): by then no
    collaborator holds model tensors of the round any more, and the run's metrics are those of a run that keeps them
    (OpenFL's own clean-up only)."""
    import gc

    import src.collaborator
    from openfl.component import Collaborator
    from openfl.component.aggregator.aggregator import Aggregator

    def model_rows(aggregator):
        cols = [o for o in gc.get_objects() if isinstance(o, Collaborator) and o.client.aggregator is aggregator]
        return {c.collaborator_name: int(c.tensor_db.tensor_db["tags"].map(
            lambda t: bool({"model", "trained"} & set(t))).sum()) for c in cols}

    seen = []
    end_of_round = Aggregator._end_of_round_check

    def spy(self, *args, **kwargs):
        seen.append(model_rows(self))
        return end_of_round(self, *args, **kwargs)

    overrides = {**OVERRIDES, "task_runner": {"settings": {"seed": 3, "audit": {"enabled": False}}}}
    monkeypatch.setattr(Aggregator, "_end_of_round_check", spy)
    dropped = run_in_process(tmp_path / "dropped", collaborators=2, rounds=2, overrides=overrides)
    # one per round, and one for the round after the last (the final model's audit: the audit is off, nothing runs)
    assert len(seen) == 3 and all(s == {"collaborator1": 0, "collaborator2": 0} for s in seen)
    seen.clear()
    monkeypatch.setattr(src.collaborator, "drop_finished_models", lambda col, round_num: 0)
    kept = run_in_process(tmp_path / "kept", collaborators=2, rounds=2, overrides=overrides)
    # OpenFL's clean-up alone: at the round's end the last collaborator still holds the round's received and
    # trained models (and the first one its own, db_store_rounds = 2)
    assert len(seen) == 3 and all(s["collaborator2"] > 0 and s["collaborator1"] > 0 for s in seen[:2])
    assert dropped.round_logs == kept.round_logs and dropped.collaborator_metrics == kept.collaborator_metrics
