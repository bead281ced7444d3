"""End to end: cifar10_PM.py (the tutorial's command line) on digits, its parser (--gate too), the gate's verdicts
in the reports and the summary, and the CIFAR-10-missing error. The plain run is the shared demo run
(tests/shared_runs.py, a new interpreter as a user starts it); the gated and --deanon runs and the CIFAR-10-missing
error call its main() here."""

import csv
import json
from pathlib import Path

import pytest
import yaml

import cifar10_PM
from audit.run_record import RUN_FILE, RunRecord
from audit.run_states import FINISHED
from report_drawing import no_report_drawing
from shared_runs import run_demo_here

COLLABORATORS = ("collaborator1", "collaborator2")
FPRS = ("0.1", "0.5", "0.9")  # the tutorial's default --fpr_tolerance
SUMMARY = ("Average aggregated model validation values = ", "Average training loss = ",
           "Average local model validation values = ")


# Digits with few members per party and one local epoch: the quick end-to-end runs below add to this.
DIGITS_RUN = ["--dataset", "digits", "--train_dataset_ratio", "0.1", "--test_dataset_ratio", "0.45",
              "--audit_dataset_ratio", "0.45", "--local_epochs", "1"]


@pytest.fixture
def digits_run(demo_run):
    """The shared demo run (tests/shared_runs.py): digits, 2 rounds of one local epoch, the default signals, FPR
    tolerances and RMIA, progress bars not turned off."""
    return demo_run.proc, demo_run.log_dir


@pytest.mark.federation
def test_exit_code_and_summary_lines(digits_run):
    proc, log_dir = digits_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in SUMMARY:
        assert line in proc.stdout
    assert "finished 2 rounds" in proc.stdout
    assert f"reports: {log_dir}" in proc.stdout
    # the last round's attacks with their intervals, counts and epsilon bounds: population, update and RMIA
    table = proc.stdout[proc.stdout.index("collaborator1, round 1: membership inference with 95% intervals"):]
    record = json.loads((log_dir / "collaborator1" / "round_0001" / "audit.json").read_text())
    for model, signal in (("local", "loss"), ("update", "loss_reduction"), ("rmia", "independent")):
        result = record["attacks"][model][signal]
        at = result["uncertainty"]["at_fpr"]["0.1"]["tpr"]
        line = next(ln for ln in table.splitlines() if ln.startswith(f"  {model} / {signal} "))
        assert f"{result['exact_auc']:.3g} [" in line and f" {at['k']}/{at['n']}" in line, line
        assert line.endswith(f"{result['uncertainty']['epsilon_lb']['epsilon']:.2f}")
    # stderr is a pipe here: no tqdm bar (each redraw would be a line of the log), one line per round instead
    assert "\r" not in proc.stderr and "it/s" not in proc.stderr and "phase/s" not in proc.stderr
    # rounds numbered from 0, as the reports and the summary number them
    assert [line.split(" in ")[0] for line in proc.stderr.splitlines() if line.startswith("round ")] == [
        "round 0 done (1 of 2)", "round 1 done (2 of 2)"]
    assert "gate_tripped" not in proc.stdout
    assert "summary per round (per collaborator: its leak verdict" in proc.stdout
    # every audited round of every party has its leak verdict line, read off its record
    for r in (0, 1):
        for col in COLLABORATORS:
            leak = json.loads((log_dir / col / f"round_{r:04d}" / "audit.json").read_text())["leak"]
            said = "leak detected (" if leak["detected"] else "no leak detected ("
            assert f"  {col}: {said}{leak['tests']} tests, Holm-corrected, 95%)" in proc.stdout
    assert ("no leak detected in any audited round" in proc.stdout) or ("leak detected: " in proc.stdout)


@pytest.mark.federation
def test_tutorial_named_files(digits_run):
    proc, log_dir = digits_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    for col in COLLABORATORS:
        expected = [f"{col}_roc_at_0.png", f"{col}_roc_at_1.png", f"{col}_auc.png"]
        expected += [f"{col}_tpr_at_{fpr}.png" for fpr in FPRS]
        for name in expected:
            path = log_dir / name
            assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        # copies of the report writer's plots (labelled axes), not new drawings
        assert (log_dir / f"{col}_roc_at_1.png").read_bytes() == (log_dir / col / "round_0001" / "roc.png").read_bytes()
        assert (log_dir / f"{col}_auc.png").read_bytes() == (log_dir / col / "auc.png").read_bytes()
        assert (log_dir / f"{col}_tpr_at_0.1.png").read_bytes() == (log_dir / col / "tpr_at_0.1.png").read_bytes()
    assert not list(log_dir.glob("*.tmp")) and not list(log_dir.glob(".*.tmp"))


@pytest.mark.federation
def test_project_reports(digits_run):
    proc, log_dir = digits_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (log_dir / "index.html").is_file()
    for col in COLLABORATORS:
        party = log_dir / col
        for r in (0, 1):
            record = json.loads((party / f"round_{r:04d}" / "audit.json").read_text())
            assert record["round"] == r and record["party"] == col
            assert (party / f"round_{r:04d}" / "roc.png").is_file()
        rows = list(csv.DictReader((party / "metrics.csv").open()))
        assert len(rows) == 2
        assert "<html" in (party / "index.html").read_text().lower()
    # All parties share this process: each TensorDB keeps one round of tensors (memory), not the plan's 2.
    plan = yaml.safe_load((log_dir / "_run" / "plan" / "plan.yaml").read_text())
    assert plan["aggregator"]["settings"]["db_store_rounds"] == 1
    assert plan["collaborator"]["settings"]["db_store_rounds"] == 1


@pytest.mark.federation
def test_the_run_json_and_the_last_lines_say_what_the_run_cost_each_party(digits_run):
    """The demo's run.json: every party's final model audited, its DP total ("not bounded": every update was sent
    as trained) and the rounds; the demo's last lines, the run index and the verdict command read it."""
    proc, log_dir = digits_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = RunRecord.read(log_dir / RUN_FILE)
    assert run.state == FINISHED and run.rounds == 2 and set(run.parties) == set(COLLABORATORS)
    assert run.versions["openfl"] and run.versions["torch"]
    index = (log_dir / "index.html").read_text()
    lines = proc.stdout[proc.stdout.index("the run's account ("):].splitlines()
    for col in COLLABORATORS:
        party = run.parties[col]
        assert party.final_model.audited and party.final_model.round == 2
        assert {"final / loss", "final / logits", "final / gradient_norm", "rmia / independent"} == set(
            party.final_model.attacks)
        assert not party.dp.bounded and sorted(party.dp.unbounded) == [0, 1]
        assert [(e.round, e.verdict, e.audited) for e in party.rounds] == [(0, "kept", True), (1, "kept", True)]
        assert f"  {party.line()}" in lines and party.line().startswith(f"{col}: the final model: ")
        assert party.final_model.headline() in index
        assert (log_dir / col / "final_model" / "roc.png").is_file()
        assert party.final_model.headline()[1:] in (log_dir / col / "index.html").read_text()
    assert "sent weights computed from the data without DP" in index


def test_parser_booleans():
    parser = cifar10_PM.build_parser()
    assert parser.parse_args(["--is_features", "False"]).is_features is False
    assert parser.parse_args(["--is_feature", "True"]).is_features is True
    assert parser.parse_args(["--is_feature", "false"]).is_features is False
    assert parser.parse_args([]).is_features is True
    with pytest.raises(SystemExit):
        parser.parse_args(["--is_features", "maybe"])


def test_parser_tutorial_command_line():
    args = cifar10_PM.build_parser().parse_args(
        "--audit_dataset_ratio 0.2 --test_dataset_ratio 0.4 --train_dataset_ratio 0.4 --signals loss logits "
        "gradient_norm --fpr_tolerance 0.1 0.2 0.3 --log_dir test_sgd --comm_round 30 --optimizer_type SGD "
        "--is_feature True --layer_number 10 --model alexnet".split())
    assert args.model == "alexnet" and args.layer_number == 10 and args.fpr_tolerance == [0.1, 0.2, 0.3]
    assert args.signals == ["loss", "logits", "gradient_norm"] and args.comm_round == 30


def test_cifar10_missing_fails_with_instructions(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_demo_here(["--dataset", "cifar10", "--data-dir", str(empty), "--comm_round", "1",
                          "--log_dir", str(tmp_path / "logs")], tmp_path)
    assert proc.returncode != 0
    message = proc.stderr
    assert "CIFAR-10" in message and str(empty) in message
    assert "--download" in message or "cifar-10-python.tar.gz" in message  # how to get it
    assert "--dataset digits" in message  # or use digits
    assert "Traceback" not in message


def test_tutorial_outputs_module(tmp_path):
    from workspace.tutorial_outputs import write_tutorial_outputs

    party = tmp_path / "alice"
    (party / "round_0003").mkdir(parents=True)
    (party / "round_0003" / "roc.png").write_bytes(b"roc3")
    (party / "round_0004").mkdir()  # a round without a plot yet: skipped
    (party / "auc.png").write_bytes(b"auc")
    (party / "tpr_at_0.01.png").write_bytes(b"tpr")
    (party / "metrics.csv").write_text("round\n")
    written = write_tutorial_outputs(tmp_path, ["alice", "bob"])  # bob has no reports: nothing
    assert sorted(p.name for p in written) == ["alice_auc.png", "alice_roc_at_3.png", "alice_tpr_at_0.01.png"]
    assert (tmp_path / "alice_roc_at_3.png").read_bytes() == b"roc3"
    assert write_tutorial_outputs(tmp_path, ["alice"]) == []  # unchanged: not rewritten
    (party / "auc.png").write_bytes(b"auc2")
    assert [p.name for p in write_tutorial_outputs(tmp_path, ["alice"])] == ["alice_auc.png"]
    assert (tmp_path / "alice_auc.png").read_bytes() == b"auc2"


# ---------------------------------------------------------------- --gate


def _parse_error(capsys, argv) -> str:
    """The argparse error of a bad command line (exit code 2), as printed."""
    with pytest.raises(SystemExit) as exc:
        cifar10_PM.parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, expected", [
    # f"{0.1000001:g}" == "0.1": the two would overwrite each other's mia_*_tpr_at_fpr_0.1
    (["--fpr_tolerance", "0.05", "0.1", "0.1000001"],
     "error: --fpr_tolerance: 0.1 and 0.1000001 both give the metric name suffix _tpr_at_fpr_0.1"),
    (["--fpr_tolerance", "0.5", "0.5"], "error: --fpr_tolerance: 0.5 is listed twice"),
    (["--fpr_tolerance", "0.1", "2"], "error: --fpr_tolerance: 2.0 is outside (0, 1)"),
    # checked before --gate, whose metric names depend on it
    (["--fpr_tolerance", "0.1", "0.1000001", "--gate", "withhold", "mia_local_loss_auc=0.6"],
     "error: --fpr_tolerance: 0.1 and 0.1000001"),
])
def test_fpr_tolerance_errors_name_the_flag(capsys, argv, expected):
    err = _parse_error(capsys, ["--dataset", "digits", *argv])
    assert expected in err and "Traceback" not in err


@pytest.mark.parametrize("argv, gate", [
    (["--gate", "withhold", "mia_local_loss_exact_auc=0.6"],
     {"action": "withhold", "thresholds": {"mia_local_loss_exact_auc": 0.6}}),
    (["--gate", "dp_retrain", "mia_local_loss_tpr_at_fpr_0.1=0.3", "mia_update_loss_reduction_exact_auc=0.7"],
     {"action": "dp_retrain",
      "thresholds": {"mia_local_loss_tpr_at_fpr_0.1": 0.3, "mia_update_loss_reduction_exact_auc": 0.7}}),
    (["--gate", "withhold", "mia_local_loss_auc=0.6", "--gate_bound", "point", "--epsilon_budget", "2"],
     {"action": "withhold", "thresholds": {"mia_local_loss_auc": 0.6}, "bound": "point", "epsilon_budget": 2.0}),
    (["--epsilon_budget", "1.5"], {"epsilon_budget": 1.5}),  # the plan's action
    (["--gate", "dp_retrain", "--epsilon_budget", "1.5"], {"action": "dp_retrain", "thresholds": {},
                                                          "epsilon_budget": 1.5}),
    # metric names follow --fpr_tolerance and --signals, wherever they stand on the line
    (["--gate", "report_only", "mia_global_gradient_norm_tpr_at_fpr_0.01=0", "--fpr_tolerance", "0.01",
      "--signals", "gradient_norm"],
     {"action": "report_only", "thresholds": {"mia_global_gradient_norm_tpr_at_fpr_0.01": 0.0}}),
])
def test_gate_parsing_and_overrides(argv, gate):
    args = cifar10_PM.parse_args(["--dataset", "digits", *argv])
    assert cifar10_PM.gate_flags(args) == gate
    overrides = cifar10_PM.overrides_from_args(_with_report_dir(args))
    assert overrides["task_runner"]["settings"]["gate"] == gate
    assert "dp" not in overrides["task_runner"]["settings"]["gate"]  # the plan's dp settings are kept


# ---------------------------------------------------------------- RMIA, intervals, the gate's bound


def test_rmia_interval_and_bound_flags_reach_the_plan():
    args = cifar10_PM.parse_args(["--dataset", "digits", "--rmia_references", "independent", "global", "global",
                                  "--reference_models", "4", "--confidence", "0.9", "--epsilon_delta", "1e-6",
                                  "--gate", "withhold", "rmia_independent_tpr_at_fpr_0.1=0.3", "--gate_bound", "lower"])
    audit = cifar10_PM.overrides_from_args(_with_report_dir(args))["task_runner"]["settings"]["audit"]
    assert audit["rmia"] == {"enabled": True, "references": ["independent", "global"], "reference_models": 4}
    assert (audit["confidence"], audit["epsilon_delta"], audit["log_scale"]) == (0.9, 1e-6, True)
    gate = cifar10_PM.overrides_from_args(args)["task_runner"]["settings"]["gate"]
    assert gate == {"action": "withhold", "thresholds": {"rmia_independent_tpr_at_fpr_0.1": 0.3}, "bound": "lower"}
    assert cifar10_PM.parse_args(["--rmia", "False"]).rmia is False and cifar10_PM.parse_args([]).gate_bound is None


def test_the_audit_sample_size_flag_reaches_the_plan():
    def sample_size(*argv):
        args = cifar10_PM.parse_args(["--dataset", "digits", *argv])
        return cifar10_PM.overrides_from_args(_with_report_dir(args))["task_runner"]["settings"]["audit"]["sample_size"]

    assert sample_size() == 1000 and sample_size("--audit_sample_size", "500") == 500
    assert sample_size("--audit_sample_size", "all") is None and sample_size("--audit_sample_size", "ALL") is None


@pytest.mark.parametrize("argv, expected", [
    (["--reference_models", "0"], "error: argument --reference_models: expected a whole number >= 1, got '0'"),
    (["--audit_sample_size", "1"], "error: argument --audit_sample_size: expected a whole number >= 2 or all, got '1'"),
    (["--audit_sample_size", "some"],
     "error: argument --audit_sample_size: expected a whole number >= 2 or all, got 'some'"),
    (["--confidence", "1.5"], "error: --confidence: expected a number in [0.5, 1)"),
    (["--epsilon_delta", "-1"], "error: --epsilon_delta: expected a number in [0, 1)"),
    (["--gate_bound", "upper"], "error: --gate_bound: it says how --gate compares"),
    (["--gate_bound", "mean", "--gate", "withhold", "mia_local_loss_auc=0.6"], "--gate_bound: invalid choice: 'mean'"),
    # RMIA's metrics exist only with RMIA on, and only for the references asked for
    (["--rmia", "False", "--gate", "withhold", "rmia_global_exact_auc=0.6"],
     "--gate: rmia_global_exact_auc: unknown metric"),
    (["--rmia_references", "global", "--gate", "withhold", "rmia_independent_exact_auc=0.6"],
     "--gate: rmia_independent_exact_auc: unknown metric"),
])
def test_rmia_and_interval_flag_errors_name_the_flag(capsys, argv, expected):
    err = _parse_error(capsys, ["--dataset", "digits", *argv])
    assert expected in err and "Traceback" not in err


def test_no_gate_leaves_the_plan_gate():
    args = cifar10_PM.parse_args(["--dataset", "digits"])
    assert args.gate is None
    assert "gate" not in cifar10_PM.overrides_from_args(_with_report_dir(args))["task_runner"]["settings"]


def _with_report_dir(args):
    args.report_dir = Path("unused")  # main() sets it from --log_dir
    return args


@pytest.mark.parametrize("argv, expected", [
    (["--gate", "block", "mia_local_loss_auc=0.6"], ["--gate", "'block'", "withhold, dp_retrain, report_only"]),
    (["--gate", "withhold"], ["--gate withhold", "at least one METRIC=THRESHOLD", "or --epsilon_budget"]),
    (["--epsilon_budget", "-1"], ["--epsilon_budget: expected a finite number >= 0"]),
    (["--gate", "withhold", "mia_local_loss_auc"], ["--gate", "'mia_local_loss_auc' is not METRIC=THRESHOLD"]),
    (["--gate", "withhold", "=0.5"], ["--gate", "'=0.5' is not METRIC=THRESHOLD"]),
    (["--gate", "withhold", "mia_local_loss_auc=high"], ["--gate", "mia_local_loss_auc", "not a number: 'high'"]),
    (["--gate", "withhold", "mia_local_loss_auc=0.5", "mia_local_loss_auc=0.6"], ["'mia_local_loss_auc' is given twice"]),
    (["--gate", "withhold", "mia_local_foo_auc=0.6"], ["--gate: mia_local_foo_auc: unknown metric; did you mean",
                                                      "mia_local_loss_auc"]),
    # a real metric name, but not one this audit produces
    (["--signals", "loss", "--gate", "withhold", "mia_local_logits_auc=0.6"], ["--gate: mia_local_logits_auc: unknown metric"]),
    (["--gate", "withhold", "mia_local_loss_tpr_at_fpr_0.01=0.3"], ["--gate: mia_local_loss_tpr_at_fpr_0.01: unknown"]),
    (["--gate", "withhold", "mia_local_loss_auc=1.5"], ["--gate: mia_local_loss_auc: 1.5 is out of range", "[0, 1]"]),
    (["--gate", "withhold", "mia_local_loss_auc=-0.1"], ["--gate: mia_local_loss_auc: -0.1 is out of range"]),
    (["--gate", "withhold", "mia_local_loss_auc=nan"], ["--gate: mia_local_loss_auc", "nan"]),
])
def test_gate_parse_errors_name_the_offending_value(capsys, argv, expected):
    err = _parse_error(capsys, ["--dataset", "digits", *argv])
    assert "error:" in err and "Traceback" not in err
    for text in expected:
        assert text in err


def test_a_gate_on_a_bound_or_a_metric_without_an_interval_compares_it_as_it_is():
    """docs/gate.md's forms under the default --gate_bound (upper): the grid AUC and the epsilon lower bound have no
    interval, a named bound has none of its own; the exact AUC is compared by its upper bound."""
    args = cifar10_PM.parse_args(["--dataset", "digits", "--gate", "withhold", "mia_local_loss_auc=0.6",
                                  "mia_local_loss_epsilon_lb=1", "mia_local_loss_exact_auc_lower=0.6",
                                  "mia_local_loss_exact_auc=0.7"])
    policy = cifar10_PM.gate_policy(args, args.audit_settings)
    assert policy.bound == "upper"
    assert {name: policy.compared_name(name) for name in policy.thresholds} == {
        "mia_local_loss_auc": "mia_local_loss_auc", "mia_local_loss_epsilon_lb": "mia_local_loss_epsilon_lb",
        "mia_local_loss_exact_auc_lower": "mia_local_loss_exact_auc_lower",
        "mia_local_loss_exact_auc": "mia_local_loss_exact_auc_upper"}


@pytest.fixture(scope="module")
def gated_run(tmp_path_factory):
    """Digits, 2 rounds, a gate that trips on every update: AUC is above 0 unless members all rank last. RMIA off:
    the gate reads the population attack's metric (the shared demo run has RMIA on)."""
    tmp = tmp_path_factory.mktemp("pm_gate")
    log_dir = tmp / "logs"
    with no_report_drawing():  # its tests read the records and the printed lines, not the pages
        proc = run_demo_here([*DIGITS_RUN, "--comm_round", "2", "--signals", "loss", "--rmia", "false",
                              "--no_progress", "--log_dir", str(log_dir), "--gate", "withhold",
                              "mia_local_loss_auc=0.0", "--gate_bound", "point"], tmp)
    return proc, log_dir


@pytest.mark.federation
def test_gate_verdicts_in_collaborator_reports(gated_run):
    proc, log_dir = gated_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    for col in COLLABORATORS:
        records = [json.loads((log_dir / col / f"round_{r:04d}" / "audit.json").read_text()) for r in (0, 1)]
        for record in records:
            gate = record["extra"]["gate"]
            assert gate["verdict"] == "withheld" and gate["action"] == "withhold"
            assert gate["reason"] == "over_threshold" and gate["passed"] is False
            assert gate["thresholds"] == {"mia_local_loss_auc": 0.0}
            tripped = gate["tripped"]["mia_local_loss_auc"]
            assert tripped["threshold"] == 0.0
            assert tripped["value"] == pytest.approx(record["metrics"]["mia_local_loss_auc"]) and tripped["value"] > 0
        # Both updates withheld in round 0: round 1 starts from the same global model, so its audit is unchanged.
        assert records[1]["metrics"]["mia_global_loss_auc"] == pytest.approx(records[0]["metrics"]["mia_global_loss_auc"])


@pytest.mark.federation
def test_gate_verdicts_in_aggregator_report(gated_run):
    proc, log_dir = gated_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in (0, 1):
        record = json.loads((log_dir / "aggregator" / f"round_{r:04d}.json").read_text())
        assert record["withheld"] == list(COLLABORATORS) and record["kept"] == []
        for col in COLLABORATORS:
            entry = record["collaborators"][col]
            assert entry["status"] == "withheld" and entry["gate_kept"] == 0.0 and not entry["averaged"]
            assert "mia_local_loss_auc" in entry["tripped"] and entry["reason"].startswith("update withheld")


@pytest.mark.federation
def test_gate_summary_lines(gated_run):
    proc, log_dir = gated_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "gate: withhold if mia_local_loss_auc > 0" in out
    # the gate's gate_tripped__<metric> scalars are sent every round, but are not AUCs to list
    assert "gate_tripped" not in out
    for r in (0, 1):
        line = next(line for line in out.splitlines() if line.startswith(f"round {r}: "))
        for col in COLLABORATORS:
            assert f"{col} withheld (mia_local_loss_auc " in line
        assert line.endswith("| averaged: none (global model unchanged)")


def test_deanon_gate_metric_needs_deanon(capsys):
    args = cifar10_PM.parse_args(["--deanon", "--gate", "withhold", "deanon_ap_over_chance=2", "--gate_bound", "point"])
    assert args.deanon and args.gate["thresholds"] == {"deanon_ap_over_chance": 2.0}
    with pytest.raises(SystemExit):
        cifar10_PM.parse_args(["--gate", "withhold", "deanon_ap_over_chance=2", "--gate_bound", "point"])
    assert "deanon_ap_over_chance" in capsys.readouterr().err


@pytest.mark.federation
def test_deanon_run_writes_both_sides_reports(tmp_path):
    """--deanon on skewed digits: the collaborators' self-audit metrics and the aggregator's deanon/ report (3 rounds:
    2 of history, then one the server attacks). The parties audit rounds 0 and 2 (--auditing_interval 2), without
    RMIA: neither is what this run checks."""
    log_dir = tmp_path / "logs"
    with no_report_drawing():  # the records and the server's deanon/ files (written as it goes) are read
        proc = run_demo_here([*DIGITS_RUN, "--comm_round", "3", "--collaborators", "3", "--dirichlet_alpha", "0.3",
                              "--signals", "loss", "--rmia", "false", "--auditing_interval", "2", "--no_progress",
                              "--deanon", "--log_dir", str(log_dir)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for col in ("collaborator1", "collaborator2", "collaborator3"):
        record = json.loads((log_dir / col / "round_0002" / "audit.json").read_text())
        assert record["extra"]["deanon"]["crowd_alpha"] == 0.3
        assert record["metrics"]["deanon_ap_over_chance"] > 0
    server = json.loads((log_dir / "aggregator" / "deanon" / "round_0002.json").read_text())
    assert server["status"] == "evaluated"
    assert (log_dir / "aggregator" / "deanon" / "summary.csv").is_file()
