"""What a run holds does not grow with its rounds: the aggregator's TensorDB keeps the last rounds' metric rows only,
its metric queue (read by nothing) keeps nothing, a collaborator's TensorDB keeps no finished round's rows, and the
party's report keeps a small view of each round rather than its record (audit.reporting.round_views). The memory and
time per round of a long run are benchmarks/bench_rounds_flat.py's."""

from __future__ import annotations

import pytest

from workspace.in_process import run_in_process

FAST = {"tasks": {"train": {"kwargs": {"epochs": 1}}},
        "data_loader": {"settings": {"train_dataset_ratio": 0.05, "test_dataset_ratio": 0.05,
                                     "audit_dataset_ratio": 0.2}},
        "task_runner": {"settings": {"audit": {"signals": ["loss"], "fpr_tolerance": [0.1],
                                               "rmia": {"enabled": False}}}}}


@pytest.mark.federation
def test_the_rows_kept_per_round_stay_the_same_over_rounds(tmp_path, monkeypatch):
    rows = []
    result = {}

    def on_round_end(round_num, _logs):
        aggregator = result["aggregator"]
        db = aggregator.tensor_db
        stored = db._store[0]
        rows.append({"aggregator_reports": sum(1 for row in stored if row[3]),
                     "aggregator_rows": len(stored),
                     "metric_queue": aggregator.metric_queue.qsize(),
                     "rounds_with_reports": len({int(row[2]) for row in stored if row[3]})})

    from openfl.federated import Plan

    real = Plan.get_aggregator

    def keep(self, *args, **kwargs):
        result["aggregator"] = real(self, *args, **kwargs)
        return result["aggregator"]

    monkeypatch.setattr(Plan, "get_aggregator", keep)
    run = run_in_process(tmp_path / "run", collaborators=2, rounds=5, on_round_end=on_round_end, overrides={
        **FAST, "aggregator": {"settings": {"report_dir": str(tmp_path / "reports" / "aggregator")}},
        "task_runner": {"settings": {**FAST["task_runner"]["settings"],
                                     "audit": {**FAST["task_runner"]["settings"]["audit"],
                                               "report_dir": str(tmp_path / "reports")}}}})
    db_store_rounds = run.aggregator.db_store_rounds
    assert all(r["metric_queue"] == 0 for r in rows), rows
    # each round adds its metric rows; those of rounds before the last db_store_rounds go at its end (the callbacks
    # run before that: they see one round more)
    assert [r["rounds_with_reports"] for r in rows][db_store_rounds:] == [db_store_rounds + 1] * (5 - db_store_rounds)
    steady = [r["aggregator_rows"] for r in rows][db_store_rounds:]
    assert len(set(steady)) == 1, rows
    for name, col in run.collaborators.items():
        frame = col.tensor_db.tensor_db
        assert set(frame["round"].astype(int)) <= {4}, (name, sorted(set(frame["round"].astype(int))))
