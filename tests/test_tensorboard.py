"""TENSORBOARD=1: the one-process demo writes OpenFL's TensorBoard event files (MetricWriter), as `fx` runs do; they
are read back with TensorBoard's own reader and checked against the run's metrics files and audit reports."""

import csv
import json

import pytest

from event_files import read_events, read_metric_lines, same_float32
from shared_runs import DEMO_ROUNDS

PARTIES = ("aggregator", "collaborator1", "collaborator2")
ROUNDS = DEMO_ROUNDS


@pytest.fixture
def demo(demo_run):
    """The shared demo run (tests/shared_runs.py): digits, 2 rounds, TENSORBOARD=1."""
    assert demo_run.proc.returncode == 0, demo_run.proc.stderr[-3000:]
    return demo_run.proc, demo_run.log_dir


@pytest.mark.federation
def test_the_demo_says_where_the_event_files_are(demo):
    proc, log_dir = demo
    logs = log_dir / "_run" / "logs"
    assert f"tensorboard --logdir {logs}" in proc.stdout
    assert sorted(p.name for p in logs.iterdir() if p.is_dir()) == [f"{p}_tensorboard" for p in PARTIES]


@pytest.mark.federation
@pytest.mark.parametrize("party", PARTIES)
def test_event_files_hold_every_rounds_metrics(demo, party):
    """Tags, steps and values are those of the party's metrics file (OpenFL's MetricWriter writes both)."""
    _proc, log_dir = demo
    logs = log_dir / "_run" / "logs"
    lines = read_metric_lines(logs / f"{party}_metrics.txt")
    assert [line["round_number"] for line in lines] == list(range(ROUNDS))
    events = read_events(logs / f"{party}_tensorboard")
    assert set(events) == set(lines[0]) == set(lines[-1])
    prefix = f"{party}/train/" if party != "aggregator" else "aggregator/train/"
    assert {f"{prefix}mia_local_loss_auc", f"{prefix}mia_local_logits_tpr_at_fpr_0.1", f"{prefix}gate_kept",
            f"{prefix}mia_update_loss_reduction_auc", "round_number", "elapsed_seconds"} <= set(events)
    for tag, points in events.items():
        assert [step for step, _ in points] == list(range(ROUNDS)), tag
        for (step, value), line in zip(points, lines):
            assert same_float32(value, line[tag]), (tag, step, value, line[tag])


@pytest.mark.federation
@pytest.mark.parametrize("col", PARTIES[1:])
def test_a_collaborators_events_are_its_audit_per_round(demo, col):
    """Each collaborator's audit metrics per round, as its audit.json and metrics.csv hold them."""
    _proc, log_dir = demo
    events = read_events(log_dir / "_run" / "logs" / f"{col}_tensorboard")
    with open(log_dir / col / "metrics.csv", newline="") as f:
        rows = {int(row["round"]): row for row in csv.DictReader(f)}
    checked = 0
    for round_num in range(ROUNDS):
        record = json.loads((log_dir / col / f"round_{round_num:04d}" / "audit.json").read_text())
        for metric, value in record["metrics"].items():
            if not isinstance(value, (int, float)) or f"{col}/train/{metric}" not in events:
                continue
            step, stored = events[f"{col}/train/{metric}"][round_num]
            assert step == round_num and same_float32(stored, value), (metric, round_num, stored, value)
            assert same_float32(stored, float(rows[round_num][metric]))
            checked += 1
    assert checked >= ROUNDS * 10  # each signal's AUCs and TPRs of the local, global and update attacks


@pytest.mark.federation
def test_the_aggregators_events_are_its_weighted_averages(demo):
    """The aggregator's tags are OpenFL's data-size-weighted averages, as its report's round files keep them."""
    _proc, log_dir = demo
    logs = log_dir / "_run" / "logs"
    events = read_events(logs / "aggregator_tensorboard")
    cols = {c: read_events(logs / f"{c}_tensorboard") for c in PARTIES[1:]}
    for round_num in range(ROUNDS):
        record = json.loads((log_dir / "aggregator" / f"round_{round_num:04d}.json").read_text())
        assert record["aggregator_logs"]
        for tag, value in record["aggregator_logs"].items():
            step, stored = events[tag][round_num]
            assert step == round_num and same_float32(stored, value), (tag, stored, value)
        # An average lies between the collaborators' values.
        values = [c[f"{col}/train/mia_local_loss_auc"][round_num][1] for col, c in cols.items()]
        assert min(values) - 1e-6 <= events["aggregator/train/mia_local_loss_auc"][round_num][1] <= max(values) + 1e-6


def test_a_tensorboard_value_openfl_cannot_read_fails_before_any_work(tmp_path, monkeypatch, capsys):
    import logging

    import cifar10_PM

    monkeypatch.setenv("TENSORBOARD", "yes")
    openfl_level = logging.getLogger("openfl").level  # main() quietens OpenFL's logger: not for the other tests
    try:
        code = cifar10_PM.main(["--dataset", "digits", "--comm_round", "1", "--log_dir", str(tmp_path / "run")])
    finally:
        logging.getLogger("openfl").setLevel(openfl_level)
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == ("error: TENSORBOARD='yes': OpenFL reads it as a whole number; set "
                                         "TENSORBOARD=1 to write TensorBoard event files, 0 or unset for none")
    assert not (tmp_path / "run").exists()
