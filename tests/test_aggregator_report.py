"""The aggregator's report: decisions per collaborator from the gate metrics, averages, files, in-process run."""

import csv
import json
import math

import numpy as np
import pytest
from openfl.databases import TensorDB
from openfl.utilities import TensorKey, change_tags

from workspace.run_summary import averaged_summary
from src.aggregation import GatedWeightedAverage, round_decisions
from audit.aggregator_report.writer import AggregatorReportWriter
from audit.aggregator_report.record import metrics_from_tensor_db, round_record
from audit.reporting.metric_labels import averageable
from src.taskrunner import AuditedTaskRunner
from report_drawing import no_report_drawing, pages_drawn_at_the_end
from workspace.in_process import run_in_process
from workspace.plan_file import collaborator_names
from rounding import weighted_average_rounding

AUDIT = {"mia_local_loss_auc": 0.6, "mia_local_loss_tpr_at_fpr_0.1": 0.2}


def test_kept_withheld_ungated_and_straggler_with_reasons():
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
    assert (record["kept"], record["withheld"], record["stragglers"]) == (["a", "c"], ["b", "e"], ["d"])
    assert record["left_out_non_finite"] == []
    assert [n for n, e in entries.items() if e["averaged"]] == ["a", "c"]
    assert entries["a"]["reason"] == "passed the gate" and entries["a"]["tripped"] == {}
    # the party sent its estimate (0.6) and the value its gate compared (0.81, a bound of it): both said
    assert entries["b"]["reason"] == ("update withheld: mia_local_loss_auc: its gate compared 0.81 (a bound of the "
                                      "estimate 0.6) (after 2 retries)")
    assert entries["b"]["gate_epsilon"] == 3.5 and entries["b"]["tripped"] == {"mia_local_loss_auc": 0.81}
    assert entries["c"]["status"] == "kept" and not entries["c"]["gate_reported"]
    assert "no gate_kept metric" in entries["c"]["reason"] and entries["c"]["reason"].endswith("averaged")
    assert any(note.startswith("c: ") for note in record["notes"])
    assert "straggler policy" in entries["d"]["reason"]
    assert entries["e"]["reason"] == "update withheld: non-finite update (NaN/Inf)"
    assert entries["c"]["other_metrics"] == {"cross_entropy": 0.3}
    # each collaborator that reported the metric counts once
    # beside the mean, the worst (largest) value and whose it is: for privacy the maximum counts
    assert record["averaged_audit_metrics"]["mia_local_loss_auc"] == {"mean": pytest.approx((0.6 * 3 + 0.8) / 4), "n": 4,
                                                                      "worst_value": 0.8, "worst": "c",
                                                                      "worse": "higher"}


def test_a_gate_that_only_reports_is_shown_as_tripped_but_kept():
    entry = round_record(0, authorized=["a"], stragglers=[], metrics={
        "a": {"gate_kept": 1.0, "gate_tripped__mia_update_loss_reduction_auc": 0.9}})["collaborators"]["a"]
    assert entry["status"] == "kept"
    assert entry["reason"] == "sent although the gate tripped: mia_update_loss_reduction_auc = 0.9"


def test_a_nan_verdict_is_withheld_and_the_record_stays_strict_json(tmp_path):
    record = round_record(0, authorized=["a"], stragglers=[], metrics={"a": {"gate_kept": float("nan"),
                                                                           "mia_local_loss_auc": float("inf")}},
                          aggregator_logs={"aggregator/train/x": float("nan")})
    entry = record["collaborators"]["a"]
    # The verdict is unreadable: the update may be one its gate withheld, so it is not averaged (fail closed).
    assert (entry["status"], entry["averaged"], record["kept"], record["withheld"]) == ("withheld", False, [], ["a"])
    assert "not a finite number" in entry["reason"] and "treated as withheld" in entry["reason"]
    assert record["notes"] == [f"a: {entry['reason']}"]
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
        ("0", "a", "kept"), ("0", "b", "kept"), ("1", "a", "kept"), ("1", "b", "withheld")]
    metrics = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [(m["round"], m["kept"], m["withheld"]) for m in metrics] == [("0", "2", "0"), ("1", "1", "1")]
    assert float(metrics[1]["mia_local_loss_auc"]) == pytest.approx(0.6)
    page = (tmp_path / "index.html").read_text()
    assert "Round 1" in page and "withheld" in page
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temp files


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    overrides = {"tasks": {"train": {"kwargs": {"epochs": 1}}},
                 "task_runner": {"settings": {"audit": {"signals": ["loss"], "fpr_tolerance": [0.1]}}}}
    with pages_drawn_at_the_end():  # the summaries and pages are read, not a round's images
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
            # no mean of p-values or bounds: a mean of them is no figure
            mean = pytest.approx(sum(own) / 2, rel=1e-6) if averageable(name) else None
            assert value["n"] == 2 and value["mean"] == mean, name
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


# ---------------------------------------------------------------------------------------------------------
# the report says what GatedWeightedAverage averaged: one decision (audit.config.gate_contract) read by both


def _cache_results(db, round_num, col, tensors, gate_kept):
    """`col`'s train results as the aggregator caches them (tags sorted by OpenFL's change_tags)."""
    entries = {TensorKey(n, "agg", round_num, False, change_tags(("trained",), add_field=col)): v
               for n, v in tensors.items()}
    if gate_kept is not None:
        entries[TensorKey("gate_kept", "agg", round_num, True, change_tags(("metric",), add_field=col))] = (
            np.array(gate_kept))
    db.cache_tensor(entries)


def test_the_report_lists_as_kept_exactly_the_updates_the_average_took():
    rng = np.random.default_rng(7)
    shapes = {"emb.weight": (11, 3), "bn.running_var": (5,)}  # an embedding table, BatchNorm statistics
    start = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    db = TensorDB()
    db.cache_tensor({TensorKey(n, "agg", 2, False, ("model",)): v for n, v in start.items()})
    sent = {c: {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
            for c in ("alice", "bob", "carol", "dave", "erin", "frank")}
    sent["bob"]["bn.running_var"][2] = np.inf    # only one of its tensors: left out of every tensor
    sent["carol"]["emb.weight"][0, 0] = np.nan
    verdicts = {"alice": 1.0, "bob": 1.0, "carol": 1.0, "dave": float("nan"), "erin": 0.0, "frank": None}
    for col, tensors in sent.items():
        _cache_results(db, 2, col, tensors, verdicts[col])
    weights = {"alice": 0.1, "bob": 0.3, "carol": 0.2, "dave": 0.15, "erin": 0.15, "frank": 0.1}
    cols = sorted(sent)

    record = round_record(2, authorized=cols, stragglers=[], metrics=metrics_from_tensor_db(db.tensor_db, 2, cols),
                          decisions=round_decisions(db.tensor_db.to_dict("records"), 2, cols))
    assert record["kept"] == ["alice", "frank"]
    assert record["left_out_non_finite"] == ["bob", "carol"] and record["withheld"] == ["dave", "erin"]
    entries = record["collaborators"]
    assert entries["bob"]["reason"] == "left out of the average: a tensor it sent holds NaN/Inf; its gate_kept was 1"
    assert entries["dave"]["reason"].startswith("gate_kept is not a finite number (nan)")
    assert entries["frank"]["cause"] == "no_gate_metric" and entries["frank"]["averaged"]

    function = GatedWeightedAverage()
    for name in shapes:
        got = db.get_aggregated_tensor(TensorKey(name, "agg", 2, False, ("trained",)), weights, function)
        kept = record["kept"]
        want = sum(sent[c][name].astype(np.float64) * weights[c] for c in kept) / sum(weights[c] for c in kept)
        # float32 sums of float32 products: their rounding, derived (tests/rounding.py)
        bound = weighted_average_rounding([sent[c][name] for c in kept], [weights[c] for c in kept])
        assert np.all(np.abs(got - want) <= bound), name


def test_the_average_reads_each_trained_array_once_a_round_and_a_replaced_one_again(monkeypatch):
    """OpenFL calls the aggregation function once per tensor with every row of the round: the finiteness of each
    trained array is read once a round, not once per tensor, and an array that replaced a row's (same name, round and
    tags) is read afresh, so a NaN sent late still leaves its collaborator out."""
    import src.aggregation as aggregation
    from openfl.utilities import LocalTensor

    reads = []
    finite = aggregation._finite
    monkeypatch.setattr(aggregation, "_finite", lambda value: reads.append(id(value)) or finite(value))
    names, cols = [f"t{i}" for i in range(6)], ["c1", "c2"]
    rng = np.random.default_rng(0)
    rows = [{"tensor_name": n, "round": 3, "tags": ("model",), "nparray": rng.normal(size=4)} for n in names]
    rows += [{"tensor_name": n, "round": 3, "tags": (c, "trained"), "nparray": rng.normal(size=4)}
             for n in names for c in cols]
    trained = {(r["tensor_name"], r["tags"][0]): r for r in rows if "trained" in r["tags"]}
    function = GatedWeightedAverage()

    def average(name):
        # copies, as OpenFL hands them: the function's own check of the tensor it averages reads those
        local = [LocalTensor(c, np.array(trained[(name, c)]["nparray"]), 0.5) for c in cols]
        return function.call(local, iter(rows), name, 3, ("trained",))

    for name in names:
        want = (trained[(name, "c1")]["nparray"] + trained[(name, "c2")]["nparray"]) / 2
        np.testing.assert_allclose(average(name), want)
    rows_read = [id(r["nparray"]) for r in trained.values()]
    assert sorted(i for i in reads if i in rows_read) == sorted(rows_read)  # each once, over the six calls
    # c2 sends t0 again, with a NaN: a new array under the same key, read again, and c2 is left out of every tensor
    late = trained[("t0", "c2")]
    late["nparray"] = np.array([np.nan, 0.0, 0.0, 0.0])
    for name in names[1:]:
        np.testing.assert_allclose(average(name), trained[(name, "c1")]["nparray"])


FAULTS = {"collaborator2": "inf", "collaborator3": "nan", "collaborator4": "nan_verdict"}


class FaultyTaskRunner(AuditedTaskRunner):
    """The real task runner, whose results are then broken the way a faulty (or foreign) runner would send
    them: after its gate kept the update, one weight becomes Inf or NaN, or its gate_kept becomes NaN."""

    def train_task(self, col_name, round_num, input_tensor_dict, **kwargs):
        global_out, local_out = super().train_task(col_name, round_num, input_tensor_dict, **kwargs)
        fault = FAULTS.get(col_name)
        if fault == "nan_verdict":
            global_out[TensorKey("gate_kept", col_name, round_num, True, ("metric",))] = np.array(np.nan)
        elif fault is not None:
            key = min((k for k in global_out if "trained" in k.tags), key=lambda k: k.tensor_name)
            broken = np.array(global_out[key], copy=True)  # a copy: the local model itself stays intact
            broken.flat[0] = np.inf if fault == "inf" else np.nan
            global_out[key] = broken
        return global_out, local_out


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    overrides = {"tasks": {"train": {"kwargs": {"epochs": 1}}},
                 "task_runner": {"template": f"{__name__}.FaultyTaskRunner",
                                 "settings": {"audit": {"enabled": False}}}}
    with no_report_drawing():  # the round's record and the average are read, not the pages
        return run_in_process(tmp_path_factory.mktemp("faulty"), collaborators=4, rounds=1, overrides=overrides)


@pytest.mark.slow
def test_inf_nan_and_a_nan_verdict_are_reported_as_left_out_as_they_were(faulty):
    sent = faulty.collaborator_metrics[0]
    for col in ("collaborator1", "collaborator2", "collaborator3"):
        assert sent[f"{col}/train/gate_kept"] == 1.0  # their gates kept them
    assert math.isnan(sent["collaborator4/train/gate_kept"])
    record = json.loads((faulty.aggregator_report_dir / "round_0000.json").read_text())
    assert record["kept"] == ["collaborator1"]
    assert record["left_out_non_finite"] == ["collaborator2", "collaborator3"]
    assert record["withheld"] == ["collaborator4"]
    # ... and that is what the average did: the new global model is collaborator1's update alone.
    db = faulty.aggregator.tensor_db.tensor_db
    rows = db[(db["round"] == 0) & db["tags"].map(lambda t: set(t) == {"collaborator1", "trained"})]
    own = {name: np.asarray(a) for name, a in zip(rows["tensor_name"], rows["nparray"])}
    new = faulty.global_weights(1)
    assert own.keys() == new.keys() and own
    for name in own:
        # its tensor times 1, through OpenFL's float32 tensor pipeline (at most a subtraction and an addition of
        # float32 values: 2 u = 1.2e-7 of the larger); 1e-5 = 170 u
        np.testing.assert_allclose(new[name], own[name], rtol=1e-5, atol=1e-7, err_msg=name)
    # the demo's summary line reads the same record
    assert averaged_summary(record) == ("averaged: collaborator1 (left out: collaborator2 left_out_non_finite, "
                                        "collaborator3 left_out_non_finite, collaborator4 withheld)")


def test_csv_files_escape_names_from_plans_but_not_numbers(tmp_path):
    evil = ["=HYPERLINK(\"http://x\")", "@SUM(A1)", "+1", "-2", "\tx"]
    metrics = {name: {"gate_kept": 1.0, "gate_epsilon": 0.25, "mia_local_margin": -0.5} for name in evil}
    metrics["-2"]["gate_kept"] = 0.0
    metrics["-2"]["gate_tripped__mia_local_margin"] = -0.5
    AggregatorReportWriter(tmp_path).write_round(round_record(0, authorized=evil, stragglers=[], metrics=metrics))
    rows = list(csv.DictReader((tmp_path / "decisions.csv").open(newline="")))
    assert sorted(r["collaborator"] for r in rows) == sorted("'" + name for name in evil)
    withheld = next(r for r in rows if r["collaborator"] == "'-2")
    assert withheld["status"] == "withheld" and withheld["reason"] == "update withheld: mia_local_margin = -0.5"
    assert withheld["gate_epsilon"] == "0.25" and withheld["tripped"] == "mia_local_margin=-0.5"
    averaged = next(csv.DictReader((tmp_path / "metrics.csv").open(newline="")))
    assert averaged["mia_local_margin"] == "-0.5" and averaged["kept"] == "4"  # a number stays a number


def test_worst_in_each_metrics_direction_no_mean_of_p_values_or_bounds_and_no_gate_said():
    """A p-value's worst collaborator is the one with the smallest (the surer leak); p-values and epsilon bounds are
    not averaged; a party without a gate is "no gate", never "passed the gate"; a DP retrain sent is said so."""
    sent = {"a": {"gate_kept": 1.0, "leak_p_value": 0.3, "leak_epsilon_lb": 0.2, "mia_local_loss_exact_auc": 0.55},
            "b": {"gate_kept": 1.0, "leak_p_value": 0.001, "leak_epsilon_lb": 0.0, "mia_local_loss_exact_auc": 0.7}}
    record = round_record(0, authorized=["a", "b"], stragglers=[], metrics=sent)
    averaged = record["averaged_audit_metrics"]
    assert averaged["leak_p_value"] == {"mean": None, "n": 2, "worst_value": 0.001, "worst": "b", "worse": "lower"}
    assert averaged["leak_epsilon_lb"]["mean"] is None and averaged["leak_epsilon_lb"]["worst"] == "a"
    assert averaged["mia_local_loss_exact_auc"]["worst"] == "b"
    assert averaged["mia_local_loss_exact_auc"]["mean"] == pytest.approx(0.625)
    assert {e["reason"] for e in record["collaborators"].values()} == {"no gate: averaged as trained"}
    retrained = round_record(0, authorized=["c"], stragglers=[], metrics={"c": {
        "gate_kept": 1.0, "gate_retries": 2.0, "gate_epsilon": 10.8, "gate_tripped__mia_local_loss_exact_auc": 0.68,
        "gate_threshold__mia_local_loss_exact_auc": 0.6}})["collaborators"]["c"]
    assert retrained["verdict"] == "dp_retrained"
    assert retrained["reason"] == ("sent a DP retrain (try 2 passed); the trained update tripped: "
                                   "mia_local_loss_exact_auc = 0.68")
