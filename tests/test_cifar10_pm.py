"""End to end: cifar10_PM.py (the tutorial's command line) on digits, its parser, and the CIFAR-10-missing error."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

import cifar10_PM

COLLABORATORS = ("collaborator1", "collaborator2")
FPRS = ("0.1", "0.5", "0.9")  # the tutorial's default --fpr_tolerance
SUMMARY = ("Average aggregated model validation values = ", "Average training loss = ",
           "Average local model validation values = ")


def _run(args, tmp_path, timeout=600):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, str(ROOT / "cifar10_PM.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pm")
    log_dir = tmp / "logs"
    proc = _run(["--dataset", "digits", "--comm_round", "2", "--train_dataset_ratio", "0.1",
                 "--test_dataset_ratio", "0.45", "--audit_dataset_ratio", "0.45", "--local_epochs", "1",
                 "--log_dir", str(log_dir)], tmp)
    return proc, log_dir


def test_exit_code_and_summary_lines(digits_run):
    proc, log_dir = digits_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in SUMMARY:
        assert line in proc.stdout
    assert "finished 2 rounds" in proc.stdout
    assert f"reports: {log_dir}" in proc.stdout
    assert "last round collaborator1/train/mia_local_loss_auc = " in proc.stdout
    assert "rounds" in proc.stderr and "phase" in proc.stderr  # tqdm bars: rounds and phases
    assert "audit" in proc.stderr


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
    proc = _run(["--dataset", "cifar10", "--data-dir", str(empty), "--comm_round", "1",
                 "--log_dir", str(tmp_path / "logs")], tmp_path, timeout=300)
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
