"""The aggregator's report: decisions per collaborator from the gate metrics, averages, files, in-process run."""

import csv
import json
import math

import numpy as np
import pytest
from openfl.databases import TensorDB
from openfl.utilities import TensorKey

from src.aggregator_report import AggregatorReportWriter, metrics_from_tensor_db, round_record
from workspace.in_process import collaborator_names, run_in_process

AUDIT = {"mia_local_loss_auc": 0.6, "mia_local_loss_tpr_at_fpr_0.1": 0.2}


def test_kept_gated_ungated_and_straggler_with_reasons():
    record = round_record(3, authorized=["a", "b", "c", "d", "e"], stragglers=["d"], metrics={
        "a": {"gate_kept": 1.0, "gate_retries": 0.0, "gate_epsilon": 0.0, "gate_tripped__non_finite_update": 0.0,
              "gate_tripped__mia_local_loss_auc": 0.0, **AUDIT},
        "b": {"gate_kept": 0.0, "gate_retries": 2.0, "gate_epsilon": 3.5, "gate_tripped__non_finite_update": 0.0,
              "gate_tripped__mia_local_loss_auc": 0.81, **AUDIT},
        "c": {"mia_local_loss_auc": 0.8, "cross_entropy": 0.3},  # gating off: no gate_kept
        "d": {"gate_kept": 1.0, **AUDIT},                          # reported train, then missed the cutoff
        "e": {"gate_kept": 0.0, "gate_tripped__non_finite_update": 1.0},
    })
    entries = record["collaborators"]
    assert record["round"] == 3
    assert (record["kept"], record["gated"], record["stragglers"]) == (["a", "c"], ["b", "e"], ["d"])
    assert entries["a"]["reason"] == "passed the gate" and entries["a"]["tripped"] == {}
    assert entries["b"]["reason"] == "update withheld: mia_local_loss_auc = 0.81 (after 2 retries)"
    assert entries["b"]["gate_epsilon"] == 3.5 and entries["b"]["tripped"] == {"mia_local_loss_auc": 0.81}
    assert entries["c"]["status"] == "kept" and not entries["c"]["gate_reported"]
    assert "no gate_kept metric" in entries["c"]["reason"] and "counted as kept" in entries["c"]["reason"]
    assert any(note.startswith("c: ") for note in record["notes"])
    assert "straggler policy" in entries["d"]["reason"]
    assert entries["e"]["reason"] == "update withheld: non-finite update (NaN/Inf)"
    assert entries["c"]["other_metrics"] == {"cross_entropy": 0.3}
    # each collaborator that reported the metric counts once
    assert record["averaged_audit_metrics"]["mia_local_loss_auc"] == {"mean": pytest.approx((0.6 * 3 + 0.8) / 4), "n": 4}


def test_a_gate_that_only_reports_is_shown_as_tripped_but_kept():
    entry = round_record(0, authorized=["a"], stragglers=[], metrics={
        "a": {"gate_kept": 1.0, "gate_tripped__mia_update_loss_reduction_auc": 0.9}})["collaborators"]["a"]
    assert entry["status"] == "kept"
    assert entry["reason"] == "sent although the gate tripped: mia_update_loss_reduction_auc = 0.9"


def test_non_finite_numbers_become_null_so_the_record_stays_strict_json(tmp_path):
    record = round_record(0, authorized=["a"], stragglers=[], metrics={"a": {"gate_kept": float("nan"),
                                                                           "mia_local_loss_auc": float("inf")}},
                          aggregator_logs={"aggregator/train/x": float("nan")})
    assert record["collaborators"]["a"]["status"] == "kept" and "not a finite number" in record["collaborators"]["a"]["reason"]
    AggregatorReportWriter(tmp_path).write_round(record)  # would raise on NaN
    loaded = json.loads((tmp_path / "round_0000.json").read_text())
    assert loaded["collaborators"]["a"]["audit_metrics"]["mia_local_loss_auc"] is None
    assert loaded["averaged_audit_metrics"] == {}


def test_metrics_are_read_per_collaborator_and_round_from_the_tensor_db():
    db = TensorDB()
    db.cache_tensor({
        TensorKey("gate_kept", "agg", 1, True, ("metric", "col1")): np.array(0.0),
        TensorKey("gate_kept", "agg", 0, True, ("col1", "metric")): np.array(1.0),          # another round
        TensorKey("mia_local_loss_auc", "agg", 1, True, ("col2", "metric")): np.array(0.7),
        TensorKey("accuracy", "agg", 1, True, ("metric", "validate_agg", "col2")): np.array(0.9),
        TensorKey("mia_local_loss_auc", "agg", 1, True, ("metric",)): np.array(0.65),       # the aggregator's average
        TensorKey("conv.weight", "agg", 1, False, ("trained", "col1")): np.zeros(4),        # an update, not a metric
        TensorKey("gate_kept", "agg", 1, True, ("metric", "stranger")): np.array(1.0),      # not authorized
    })
    assert metrics_from_tensor_db(db.tensor_db, 1, ["col1", "col2"]) == {
        "col1": {"gate_kept": 0.0},
        "col2": {"mia_local_loss_auc": pytest.approx(0.7), "accuracy[validate_agg]": pytest.approx(0.9)},
    }


def test_summaries_are_rebuilt_from_the_round_files(tmp_path):
    writer = AggregatorReportWriter(tmp_path)
    for round_num in range(2):
        writer.write_round(round_record(round_num, authorized=["a", "b"], stragglers=[], metrics={
            "a": {"gate_kept": 1.0, **AUDIT}, "b": {"gate_kept": float(round_num == 0), **AUDIT}}))
    (tmp_path / "round_0005.json").write_text('{"round": 5, "collaborators"')  # a torn file from a crash
    writer.rebuild_summary()  # the corrupt file is skipped, the good rounds stay
    decisions = list(csv.DictReader((tmp_path / "decisions.csv").open()))
    assert [(d["round"], d["collaborator"], d["status"]) for d in decisions] == [
        ("0", "a", "kept"), ("0", "b", "kept"), ("1", "a", "kept"), ("1", "b", "gated")]
    metrics = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [(m["round"], m["kept"], m["gated"]) for m in metrics] == [("0", "2", "0"), ("1", "1", "1")]
    assert float(metrics[1]["mia_local_loss_auc"]) == pytest.approx(0.6)
    page = (tmp_path / "index.html").read_text()
    assert "Round 1" in page and "gated" in page
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temp files


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    overrides = {"tasks": {"train": {"kwargs": {"epochs": 1}}},
                 "task_runner": {"settings": {"audit": {"signals": ["loss"], "fpr_tolerance": [0.1]}}}}
    return run_in_process(tmp_path_factory.mktemp("agg_report"), collaborators=2, rounds=2, overrides=overrides)


@pytest.mark.federation
def test_in_process_run_writes_the_aggregator_report(in_process):
    report = in_process.aggregator_report_dir
    assert report == in_process.plan_dir.parent / "aggregator_report"
    assert not in_process.aggregator.report.errors
    for round_num in range(2):
        record = json.loads((report / f"round_{round_num:04d}.json").read_text())
        assert record["authorized_collaborators"] == collaborator_names(2)
        assert sorted(record["collaborators"]) == collaborator_names(2) and record["stragglers"] == []
        # the averages are those of what each collaborator reported this round
        sent = in_process.collaborator_metrics[round_num]
        for name, value in record["averaged_audit_metrics"].items():
            own = [sent[f"{col}/train/{name}"] for col in collaborator_names(2)]
            assert value["n"] == 2 and value["mean"] == pytest.approx(sum(own) / 2, rel=1e-6)
        assert "mia_local_loss_auc" in record["averaged_audit_metrics"]
        for col in collaborator_names(2):
            assert record["collaborators"][col]["audit_metrics"]["mia_local_loss_auc"] == pytest.approx(
                sent[f"{col}/train/mia_local_loss_auc"], rel=1e-6)
    for name in ("decisions.csv", "metrics.csv", "index.html"):
        assert (report / name).stat().st_size > 0
    # the collaborators' report index does not list the aggregator as an audited party
    assert "aggregator" not in (in_process.report_dir / "index.html").read_text()


@pytest.mark.federation
def test_a_report_that_cannot_be_written_does_not_stop_the_federation(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the report folder should be")
    result = run_in_process(tmp_path / "run", collaborators=1, rounds=2, overrides={
        "aggregator": {"settings": {"report_dir": str(blocker / "aggregator")}},
        "tasks": {"train": {"kwargs": {"epochs": 1}}},
        "task_runner": {"settings": {"audit": {"enabled": False}}}})
    assert len(result.round_logs) == 2  # both rounds ended
    assert len(result.aggregator.report.errors) == 2 and all("round" in e for e in result.aggregator.report.errors)
    assert all(math.isfinite(v) for v in result.round_logs[-1].values())
