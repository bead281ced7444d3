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
    assert f"tensorboard --logdir {logs}, then open http://localhost:6006/?smoothing=0#timeseries" in proc.stdout
    assert sorted(p.name for p in logs.iterdir() if p.is_dir()) == [f"{p}_tensorboard" for p in PARTIES]


@pytest.mark.federation
@pytest.mark.parametrize("party", PARTIES)
def test_event_files_hold_every_rounds_metrics_under_tags_named_by_metric(demo, party):
    """One run per party (its own folder), and the same tag for a metric in every party's run, so that TensorBoard
    overlays the parties on one chart: privacy/<metric>, train/<metric>, validation/..., gate/...; the values are
    those of the party's metrics file (the writer writes both), each round a step."""
    from src.process.metric_writer import tensorboard_tag

    _proc, log_dir = demo
    logs = log_dir / "_run" / "logs"
    lines = read_metric_lines(logs / f"{party}_metrics.txt")
    # each round a line, then the round after the last: the final model's audit, its own tags
    assert [line["round_number"] for line in lines] == list(range(ROUNDS + 1))
    assert any(key.endswith("final_model_audit/final_model_leak_detected") for key in lines[-1])
    events = read_events(logs / f"{party}_tensorboard")
    assert not any(tag.startswith(party) for tag in events)  # no party in a tag
    expected = {tensorboard_tag(key, party): key for key in lines[0] if key != "round_number"}
    assert {"privacy/mia_local_loss_auc", "privacy/mia_local_logits_tpr_at_fpr_0.1", "gate/gate_kept",
            "privacy/mia_update_loss_reduction_auc", "privacy/leak_epsilon_lb", "train/cross_entropy",
            "validation/global_model_accuracy", "validation/local_model_accuracy",
            "time/elapsed_seconds"} <= set(expected)
    assert set(expected) <= set(events)
    for tag, key in expected.items():
        points = events[tag]
        assert [step for step, _ in points] == [r for r, line in enumerate(lines) if key in line], tag
        for step, value in points:
            assert same_float32(value, lines[step][key]), (tag, step, value, lines[step][key])


@pytest.mark.federation
def test_the_parties_share_their_tags_and_a_collaborator_adds_its_intervals(demo):
    """Every privacy tag of the aggregator's run (the averages) is in each collaborator's, so they overlay; a
    collaborator's run also holds its figures' bounds as their own tags (they never leave the party: the aggregator's
    run has none), with a custom-scalars margin chart for each figure with both."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _proc, log_dir = demo
    logs = log_dir / "_run" / "logs"
    runs = {party: read_events(logs / f"{party}_tensorboard") for party in PARTIES}
    privacy = {party: {t for t in tags if t.startswith("privacy/")} for party, tags in runs.items()}
    assert privacy["aggregator"] and all(privacy["aggregator"] <= privacy[c] for c in PARTIES[1:])
    assert not any(t.endswith(("_lower", "_upper")) for t in privacy["aggregator"])
    for col in PARTIES[1:]:
        record = json.loads((log_dir / col / "round_0001" / "audit.json").read_text())
        lower = record["metrics"]["mia_local_loss_exact_auc_lower"]
        step, stored = runs[col]["privacy/mia_local_loss_exact_auc_lower"][1]
        assert step == 1 and same_float32(stored, lower)
        assert "privacy/mia_local_loss_tpr_at_fpr_0.1_upper" in runs[col]
        accumulator = EventAccumulator(str(logs / f"{col}_tensorboard"), size_guidance={"tensors": 0})
        accumulator.Reload()
        assert "custom_scalars__config__" in accumulator.Tags()["tensors"]


@pytest.mark.federation
@pytest.mark.parametrize("col", PARTIES[1:])
def test_a_collaborators_events_are_its_audit_per_round(demo, col):
    """Each collaborator's audit metrics per round, as its audit.json and metrics.csv hold them."""
    _proc, log_dir = demo
    events = read_events(log_dir / "_run" / "logs" / f"{col}_tensorboard")
    events = {tag.replace("privacy/", f"{col}/train/", 1): points for tag, points in events.items()}
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
    from src.process.metric_writer import tensorboard_tag

    _proc, log_dir = demo
    logs = log_dir / "_run" / "logs"
    events = read_events(logs / "aggregator_tensorboard")
    cols = {c: read_events(logs / f"{c}_tensorboard") for c in PARTIES[1:]}
    for round_num in range(ROUNDS):
        record = json.loads((log_dir / "aggregator" / f"round_{round_num:04d}.json").read_text())
        assert record["aggregator_logs"]
        for key, value in record["aggregator_logs"].items():
            step, stored = events[tensorboard_tag(key, "aggregator")][round_num]
            assert step == round_num and same_float32(stored, value), (key, stored, value)
        # An average lies between the collaborators' values.
        values = [c["privacy/mia_local_loss_auc"][round_num][1] for c in cols.values()]
        assert min(values) - 1e-6 <= events["privacy/mia_local_loss_auc"][round_num][1] <= max(values) + 1e-6


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


def test_a_tag_is_named_by_its_metric_whoever_sent_it():
    """The same tag in every party's run (the aggregator's averages too): audit metrics by the step registry's
    prefixes under privacy/, the rest by what they are; a margin chart for each figure with both bounds."""
    from src.process.metric_writer import interval_layout, tensorboard_tag

    for party in ("collaborator1", "aggregator"):
        assert tensorboard_tag(f"{party}/train/mia_local_loss_exact_auc", party) == "privacy/mia_local_loss_exact_auc"
        assert tensorboard_tag(f"{party}/train/rmia_global_tpr_at_fpr_0.1", party) == "privacy/rmia_global_tpr_at_fpr_0.1"
        assert tensorboard_tag(f"{party}/train/fidel_revealed_fraction", party) == "privacy/fidel_revealed_fraction"
        assert tensorboard_tag(f"{party}/train/leak_epsilon_lb", party) == "privacy/leak_epsilon_lb"
        assert tensorboard_tag(f"{party}/train/gate_kept", party) == "gate/gate_kept"
        assert tensorboard_tag(f"{party}/train/cross_entropy", party) == "train/cross_entropy"
        assert tensorboard_tag(f"{party}/train/population__rmia_global", party) == "population/rmia_global"
        assert (tensorboard_tag(f"{party}/aggregated_model_validation/accuracy", party)
                == "validation/global_model_accuracy")
    assert tensorboard_tag("round_number", "a") is None
    assert tensorboard_tag("elapsed_seconds", "a") == "time/elapsed_seconds"
    tags = {f"privacy/{m}{b}" for m in ("mia_local_loss_exact_auc", "mia_local_loss_tpr_at_fpr_0.1",
                                          "mia_local_loss_advantage") for b in ("", "_lower", "_upper")}
    layout = interval_layout(tags | {"privacy/leak_epsilon_lb", "privacy/mia_local_loss_auc"})
    assert list(layout) == ["privacy with intervals: exact AUC", "privacy with intervals: TPR at FPR 0.1",
                            "privacy with intervals: advantage"]
    assert layout["privacy with intervals: exact AUC"] == {"mia_local_loss_exact_auc": [
        "Margin", ["privacy/mia_local_loss_exact_auc", "privacy/mia_local_loss_exact_auc_lower",
                   "privacy/mia_local_loss_exact_auc_upper"]]}
