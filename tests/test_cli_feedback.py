"""What the command lines say before and during a run: the nearest names for an unknown value of any flag, checks
the flags allow made before anything is written and worded with those flags, one line for a flag that is overridden
or not used, the audit-cost note's advice, and a warning when the global model stays near chance."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

import cifar10_PM
from audit import chance_accuracy
from audit.audit_cost import audit_cost_note
from audit.chance_accuracy import near_chance_note
from audit.round_record import RoundRecord
from report_drawing import without_report_drawing  # noqa: F401  (a fixture)


@pytest.mark.parametrize("argv, hint", [
    (["--model", "fcn"], "; did you mean fcnn or cnn?"),
    (["--dataset", "CIFAR10"], "; did you mean cifar10 or cifar100?"),
    (["--optimizer_type", "adam"], "; did you mean Adam?"),
    (["--rmia_references", "global", "independant"], "; did you mean independent?"),
    (["--gate_bound", "uper", "--gate", "withhold", "mia_local_loss_exact_auc=0.6"], "; did you mean upper?"),
    (["--gate", "withold", "mia_local_loss_exact_auc=0.6"], "; did you mean withhold?"),
    (["--gate", "withhold", "mia_local_los_exact_auc=0.6"], "did you mean mia_local_loss_exact_auc or "),
    (["--signals", "los"], "did you mean loss?"),
    (["--is_features", "Ture"], "; did you mean True?"),
    (["--audit_sample_size", "alll"], "; did you mean all?"),
])
def test_an_unknown_value_of_a_flag_is_answered_with_the_nearest_names_in_one_line(argv, hint, capsys):
    with pytest.raises(SystemExit) as stop:
        cifar10_PM.parse_args(["--dataset", "digits", *argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and hint in err, err
    assert err.count("\n") == 1 and len(err) < 400


def test_an_unknown_subcommand_of_the_tool_is_answered_with_the_nearest(capsys):
    from workspace.__main__ import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["strat", "--dir", "x"])
    err = capsys.readouterr().err
    assert "invalid choice: 'strat'" in err and err.rstrip().endswith("did you mean start?  (see python -m workspace "
                                                                       "--help)")


def _deanon_config(tmp_path, argv, collaborators=2):
    from workspace.plan_file import run_plan_config

    args = cifar10_PM.parse_args(["--dataset", "digits", "--deanon", "--collaborators", str(collaborators), *argv])
    args.report_dir = tmp_path / "demo"
    config = run_plan_config(tmp_path / "demo" / "_run", collaborators=collaborators, rounds=2,
                             overrides=cifar10_PM.overrides_from_args(args), plan_path=cifar10_PM.PLAN)
    return args, config


def test_deanonymization_on_the_tutorials_ratios_is_sized_to_the_shard_with_a_note(tmp_path):
    """--deanon with the tutorial's ratios (0.4 / 0.4 / 0.2: a population shard of half the member count) runs the
    self-audit sized to the shard, and says so once per sizing, naming the collaborators; the demo's ratios keep
    the plan's sizes but a crowd smaller than asked, which is noted too."""
    args, config = _deanon_config(tmp_path, [], collaborators=3)
    notes = cifar10_PM.check_deanon_sizes(args, config)  # digits' 1797 samples: shards of 599 and 600, one per size
    assert notes[0] == ("--deanon (collaborator1): the deanonymization self-audit is sized to the population shard: 2 "
                        "crowd users (not 10) of 30 private + 30 prior samples each, shadow updates on 30 samples: its "
                        "120 samples cannot give 2 users the member count (240) and a prior of 240; the collaborator's "
                        "update stays its own, on its 240 members (prior: 30 of its 240 non-members)")
    named = [name for note in notes for name in note[len("--deanon ("):note.index(")")].split(", ")]
    assert sorted(named) == ["collaborator1", "collaborator2", "collaborator3"]
    assert all("self-audit is sized to the population shard: 2 crowd users (not 10) of " in n for n in notes)
    args, config = _deanon_config(tmp_path, ["--train_dataset_ratio", "0.1", "--test_dataset_ratio", "0.45",
                                             "--audit_dataset_ratio", "0.45"])
    notes = cifar10_PM.check_deanon_sizes(args, config)
    assert notes and all(n.startswith("--deanon (collaborator") and ": a crowd of 2 users, not " in n for n in notes)
    assert not any("sized to the population shard" in n for n in notes)


def test_a_population_too_small_for_any_crowd_is_refused_at_start_in_the_words_of_the_flags(tmp_path, capsys):
    log_dir = tmp_path / "run"
    openfl_level = logging.getLogger("openfl").level  # main() quietens OpenFL's logger: not for the other tests
    try:
        code = cifar10_PM.main(["--dataset", "digits", "--comm_round", "2", "--deanon", "--dirichlet_alpha", "0.3",
                                "--audit_dataset_ratio", "0.002", "--no_progress", "--log_dir", str(log_dir)])
    finally:
        logging.getLogger("openfl").setLevel(openfl_level)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not log_dir.exists()
    (line,) = [e for e in err if e.startswith("error:")]
    assert line.startswith("error: --deanon: collaborator")
    assert "--audit_dataset_ratio 0.002 of --dataset digits, split by --dirichlet_alpha 0.3" in line
    assert "cannot give 2 crowd users one private and one prior sample each; raise --audit_dataset_ratio" in line
    assert "task_runner.settings" not in line and "data_loader.settings" not in line


@pytest.mark.parametrize("argv, note", [
    (["--model", "fcnn"], "--is_features True: model fcnn's `features` block has no layer with parameters, so the "
                          "gradient norm is taken over all parameters (as with --is_features False)"),
    (["--is_features", "False", "--layer_number", "0"], "--layer_number 0: not used: --is_features False"),
    (["--signals", "loss", "--is_features", "True"], "--is_features True: not used: --signals has no gradient_norm"),
    (["--rmia", "False", "--reference_models", "2"], "--reference_models: not used: --rmia False"),
    (["--download", "--data-dir", "x"], "--data-dir and --download: not used: --dataset digits is bundled"),
    (["--comm_round", "3", "--auditing_interval", "5"], "--auditing_interval 5 with --comm_round 3: only round 0 is "
                                                        "audited"),
])
def test_a_flag_that_is_overridden_or_not_used_gets_one_line(argv, note):
    argv = ["--dataset", "digits", *argv]
    notes = cifar10_PM.flag_notes(cifar10_PM.parse_args(argv), cifar10_PM.typed_flags(argv))
    assert len(notes) == 1 and notes[0].startswith(note), notes


def test_the_tutorials_flags_as_given_get_no_note():
    argv = ["--dataset", "digits", "--model", "cnn", "--layer_number", "0", "--rmia", "True"]
    assert cifar10_PM.flag_notes(cifar10_PM.parse_args(argv), cifar10_PM.typed_flags(argv)) == []
    assert cifar10_PM.typed_flags(["--comm", "3", "--model", "cnn"]) == {"comm_round", "model"}  # abbreviations too


def test_the_audit_cost_note_suggests_a_gradient_layer_only_when_none_is_set():
    record = RoundRecord("p", 0, settings={"audit_global": True},
                         timings={"audit_s": 5.0, "train_s": 1.0, "membership_s": 4.0,
                                  "signals_s": {"local": {"gradient_norm": 3.0, "loss": 0.2}}})
    unset = audit_cost_note(record)
    assert "audit.gradient_layer (the norm over one layer; --is_features True)" in unset
    layered = audit_cost_note(dataclasses.replace(record, settings={**record.settings, "gradient_layer": "features.conv1"}))
    assert "over audit.gradient_layer features.conv1): a layer with fewer parameters" in layered
    assert "audit.gradient_layer (the norm over one layer" not in layered


def test_the_near_chance_note_holds_the_accuracy_against_the_most_frequent_class(monkeypatch):
    monkeypatch.setattr(chance_accuracy, "_SAID", set())
    balanced = np.repeat(np.arange(10), 40)
    assert near_chance_note("a", 2, 0.5, balanced, once=False) is None
    note = near_chance_note("a", 2, 0.118, balanced, once=False)
    assert note.startswith("a round 2: the global model's validation accuracy is 0.118 (47/400) after 2 rounds, "
                           "near chance (0.100: always its most frequent class of 10)")
    assert "--learning_rate, --optimizer_type Adam, --local_epochs" in note
    skewed = np.array([0] * 300 + [1] * 100)  # always class 0 scores 0.75: 0.77 is near chance here
    assert near_chance_note("a", 2, 0.77, skewed, once=False) is not None
    assert near_chance_note("a", 2, 0.9, skewed, once=False) is None
    assert near_chance_note("a", 2, 0.1, balanced) is not None and near_chance_note("b", 2, 0.1, balanced) is None


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")  # the log lines are read, not the reports
def test_the_tutorials_untrained_model_is_flagged_during_the_run(tmp_path, caplog, monkeypatch):
    """Digits with the tutorial's SGD at 0.005 for one epoch stays near chance: the run says so once, at round 2;
    the demo's Adam at 0.003 for five epochs does not."""
    from workspace.in_process import run_in_process

    monkeypatch.setattr(chance_accuracy, "_SAID", set())

    def run(name, optimizer, lr, epochs):
        overrides = {"tasks": {"train": {"kwargs": {"epochs": epochs}}},
                     "data_loader": {"settings": {"dataset": "digits"}},
                     "task_runner": {"settings": {"optimizer": optimizer, "learning_rate": lr,
                                                  "audit": {"enabled": False}}}}
        with caplog.at_level(logging.WARNING, logger="audit.party_audit"):
            run_in_process(tmp_path / name, collaborators=2, rounds=3, overrides=overrides)
        return [r.getMessage() for r in caplog.records if "near chance" in r.getMessage()]

    (said,) = run("sgd", "SGD", 0.005, 1)
    assert said.startswith("collaborator1 round 2: the global model's validation accuracy is 0.1")
    caplog.clear()
    monkeypatch.setattr(chance_accuracy, "_SAID", set())
    assert run("adam", "Adam", 0.003, 5) == []
