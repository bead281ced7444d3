"""Issue 15, "every setting checked at start, by its dotted key": each bad setting of the probe fails before any work,
folder or certificate, in one line that names the key or flag, the value and what is allowed.

Families: the task runner's settings, the tasks' keyword arguments, the device, the aggregator's settings (each through
the in-process runner the demo and the tests use, which checks the plan before writing anything), the demo's flags
(cifar10_PM.main in this process), the federation tool's flags (workspace.__main__.main in this process); then the
real entry points in child processes (federation tests): `python -m workspace prepare` with a setting only
`fx plan initialize` can check makes no certificate, and the demo's --log_dir is never mixed.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import cifar10_PM
from audit.config.fields import SettingsError
from report_drawing import no_report_drawing
from src.server.settings import OPENFL_FILLED, OPENFL_KEYS, OWN_KEYS
from shared_runs import workspace_here
from src.plan.checks import TASK_FUNCTIONS
from workspace.in_process import parse_plan, run_in_process
from workspace.plan_file import check_settings, run_plan_config, write_run_plan

ROOT = Path(__file__).resolve().parent.parent

# A quick audit, so that a plan the checks wrongly let through runs (and the test fails) in seconds.
FAST = {"task_runner": {"settings": {"audit": {"signals": ["loss"], "audit_global": False, "update_attack": False}}},
        "tasks": {"train": {"kwargs": {"epochs": 1}}}}


def merged(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def fails_before_anything(tmp_path, overrides) -> str:
    """The message the in-process runner stops with; asserts it is one line and that no folder was made."""
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError) as err:
        run_in_process(run_dir, collaborators=2, rounds=1, overrides=merged(FAST, overrides))
    message = str(err.value)
    assert "\n" not in message, message
    assert not run_dir.exists()  # no plan, no report, no saved model
    return message


def runner(settings: dict) -> dict:
    return {"task_runner": {"settings": settings}}


# ------------------------------------------------------------------------------------------------- task runner

@pytest.mark.parametrize("overrides, start, words", [
    # accepted before and without effect: passed through **kwargs
    (runner({"learnig_rate": 0.1}), "task_runner.settings.learnig_rate: unknown setting; known: ",
     ["learning_rate", "momentum", "per_collaborator"]),
    # a name no collaborator has (the federation's are collaborator1, collaborator2)
    (runner({"per_collaborator": {"collaborator9": {"epochs": 3}}}),
     "task_runner.settings.per_collaborator.collaborator9: no collaborator of this federation has that name",
     ["collaborator1, collaborator2"]),
    # a mitigation whose strength is left at 0 changed nothing and was not recorded
    (runner({"mitigation": {"method": "noise"}}), "task_runner.settings.mitigation.sigma: method noise needs",
     ["sigma > 0", "got 0 (not set)"]),
    (runner({"per_collaborator": {"collaborator2": {"mitigation": {"method": "noise", "sigma": 0}}}}),
     "task_runner.settings.per_collaborator.collaborator2.mitigation.sigma: method noise needs", ["got 0"]),
    (runner({"mitigation": {"method": "mm_aug"}}), "task_runner.settings.mitigation.alpha: method mm_aug needs",
     ["alpha > 0", "(not set)"]),
    # failed in round 0 with no key named (gradient_layer was checked; these were not)
    (runner({"audit": {"fidel": {"enabled": True, "layer": "classifier.fc9"}}}),
     "task_runner.settings.audit.fidel.layer: layer 'classifier.fc9': no such module",
     ["classifier.fc1, classifier.fc2, classifier.out"]),
    (runner({"audit": {"fidel": {"enabled": True, "layer": "features.conv1"}}}),
     "task_runner.settings.audit.fidel.layer: layer 'features.conv1' is Conv2d, not nn.Linear", []),
    (runner({"audit": {"deanon": {"enabled": True, "layer": "classifier.fc9"}}}),
     "task_runner.settings.audit.deanon.layer: no tensor of layer 'classifier.fc9'", ["classifier.out"]),
    # failed in the first DP training with no key named
    (runner({"audit": {"canary": {"gradient_count": 100000}}, "gate": {"action": "dp_retrain"}}),
     "task_runner.settings.audit.canary.gradient_count: 100000 canaries need as many of the model's trainable "
     "values, it has 74890", []),
], ids=["misspelt-key", "per-collaborator-name", "noise-without-sigma", "per-collaborator-noise-sigma-0",
        "mm_aug-without-alpha", "fidel-layer-missing", "fidel-layer-not-dense", "deanon-layer-missing",
        "canary-gradient-count"])
def test_task_runner_settings_fail_before_anything(tmp_path, overrides, start, words):
    message = fails_before_anything(tmp_path, overrides)
    assert message.startswith(start), message
    for word in words:
        assert word in message, message


def test_a_strong_enough_mitigation_and_a_real_layer_still_run_and_dp_fedavg_may_only_clip(tmp_path):
    """The checks refuse no-ops, not the settings they guard: these build (dp_fedavg with sigma 0 clips, and is
    recorded as such)."""
    from workspace.plan_file import check_run_plan

    for settings in ({"mitigation": {"method": "noise", "sigma": 0.01}},
                     {"mitigation": {"method": "dp_fedavg"}},
                     {"mitigation": {"method": "bkg_repl", "alpha": 0.5}},
                     {"per_collaborator": {"collaborator2": {"epochs": 2}}},
                     {"audit": {"fidel": {"enabled": True, "layer": "classifier.fc1"},
                                "deanon": {"layer": "classifier.out"}}}):
        check_run_plan(run_plan_config(tmp_path, collaborators=2, rounds=1, overrides=merged(FAST, runner(settings))),
                       ["collaborator1", "collaborator2"])


# ------------------------------------------------------------------------------------------------- task kwargs

def train_kwargs(**kwargs) -> dict:
    return {"tasks": {"train": {"kwargs": kwargs}}}


@pytest.mark.parametrize("overrides, message", [
    # misspelt: trained the plan's 5 epochs
    (train_kwargs(epoch=1), "tasks.train.kwargs.epoch: not an argument of train_task (it would be ignored); "
                            "allowed: epochs, use_tqdm, metrics; did you mean epochs?"),
    (train_kwargs(lr=0.1), "tasks.train.kwargs.lr: not an argument of train_task (it would be ignored); "
                           "allowed: epochs, use_tqdm, metrics"),
    # failed in round 0 (ValueError from the training recipe, TypeError from range())
    (train_kwargs(epochs=0), "tasks.train.kwargs.epochs: expected an integer >= 1, got 0"),
    (train_kwargs(epochs="1"), "tasks.train.kwargs.epochs: expected an integer >= 1, got '1'"),
    (train_kwargs(epochs=1.5), "tasks.train.kwargs.epochs: expected an integer >= 1, got 1.5"),
    (train_kwargs(use_tqdm="yes"), "tasks.train.kwargs.use_tqdm: expected true or false, got 'yes'"),
    ({"tasks": {"aggregated_model_validation": {"kwargs": {"apply": "both"}}}},
     "tasks.aggregated_model_validation.kwargs.apply: expected local (the locally trained model) or global "
     "(the received one), got 'both'"),
    ({"tasks": {"train": {"function": "train_tsk"}}},
     "tasks.train.function: 'train_tsk' is not a task function of src.taskrunner.AuditedTaskRunner; "
     "allowed: train_task, validate_task, final_model_audit_task; did you mean train_task?"),
    ({"tasks": {"train": {"kwarg": {"epochs": 1}}}},
     "tasks.train.kwarg: unknown key of a task; allowed: function, kwargs, aggregation_type; did you mean kwargs?"),
], ids=["epoch", "lr", "epochs-0", "epochs-str", "epochs-float", "use_tqdm", "apply", "function", "kwarg-section"])
def test_task_kwargs_fail_before_anything(tmp_path, overrides, message):
    assert fails_before_anything(tmp_path, overrides) == message


def test_the_task_kwargs_table_is_the_task_functions_signatures():
    """src.plan.checks spells the task functions' keyword arguments out (torch-free); they must be what the task
    runner's functions take: its own train_task's and OpenFL's PyTorchTaskRunner's (which reads kwargs["apply"])."""
    from openfl.federated import PyTorchTaskRunner

    from src.taskrunner import AuditedTaskRunner

    fixed = {"self", "col_name", "round_num", "input_tensor_dict", "kwargs"}
    for function, allowed in TASK_FUNCTIONS.items():
        named = set()
        for cls in (AuditedTaskRunner, PyTorchTaskRunner):
            if hasattr(cls, function):  # the final model's audit is the workspace's own
                named |= set(inspect.signature(getattr(cls, function)).parameters) - fixed
        extra = {"validate_task": {"apply"}}.get(function, set())  # read from **kwargs
        assert set(allowed) == named | extra | {"metrics"}, function  # metrics: OpenFL's templates carry it
    assert set(TASK_FUNCTIONS) == {"train_task", "validate_task", "final_model_audit_task"}


def test_the_plans_own_tasks_pass_and_its_runner_is_checked():
    config = run_plan_config(ROOT, collaborators=2, rounds=1)
    check_settings(config, ["collaborator1", "collaborator2"])
    other = merged(config, {"task_runner": {"template": "somewhere.Else"}, "tasks": {"train": {"kwargs": {"x": 1}}}})
    check_settings(other, ["collaborator1"])  # another runner's tasks are its own business


# ------------------------------------------------------------------------------------------------- device

UNAVAILABLE = ["cuda:63"] + ([] if torch.cuda.is_available() else ["cuda"]) + \
              ([] if torch.backends.mps.is_available() else ["mps"])


@pytest.mark.parametrize("device, says", [
    *[(name, f"task_runner.settings.device: {name!r} is not available on this machine; available here: cpu")
      for name in UNAVAILABLE],
    ("gpu", "task_runner.settings.device: 'gpu' is not a torch device name; available here: cpu"),
    ("", "task_runner.settings.device: expected a device name (available here: cpu"),
    (0, "task_runner.settings.device: expected a device name (available here: cpu"),
])
def test_a_device_that_does_not_exist_fails_before_anything(tmp_path, device, says):
    message = fails_before_anything(tmp_path, runner({"device": device}))
    assert message.startswith(says), message


def test_the_devices_this_machine_has_are_accepted():
    from src.runner.devices import available_devices, check_device

    for name in available_devices():
        assert check_device("device", name) == torch.device(name)
    assert check_device("device", None) is None  # OpenFL's choice: CUDA if there is one


# ------------------------------------------------------------------------------------------------- aggregator

@pytest.mark.parametrize("settings, key, known", [
    ({"pol_interval_s": 2}, "pol_interval_s",
     "poll_interval_s, report_dir, deanon, callbacks, save_every_round, canary_clients, final_model_audit, "
     "init_state_path"),
    ({"rounds_to_trian": 5}, "rounds_to_trian", "rounds_to_train"),
    ({"deanon": {"enabled": False, "layr": "x"}}, "deanon.layr", "enabled, layer, attacks, min_history_rounds, seed"),
    ({"canary_clients": {"enabled": True, "cont": 3}}, "canary_clients.cont", "enabled, count, scale, seed"),
])
def test_unknown_aggregator_settings_fail_before_anything_and_at_fx_aggregator_start(tmp_path, settings, key, known):
    overrides = {"aggregator": {"settings": settings}}
    message = fails_before_anything(tmp_path, overrides)
    assert message.startswith(f"aggregator.settings.{key}: unknown setting; known: "), message
    assert known in message
    # `fx aggregator start` builds the aggregator from the plan as Plan.get_aggregator does: the same line, not a
    # TypeError from Aggregator.__init__
    plan = parse_plan(write_run_plan(tmp_path / "fx", collaborators=2, rounds=1, overrides=overrides))
    with pytest.raises(ValueError) as err:
        plan.get_aggregator(tensor_dict={})
    assert str(err.value) == message


def test_fx_aggregator_start_checks_the_tasks(tmp_path):
    """In a deployment the tasks reach a collaborator's task function only in round 0; the aggregator, which gets
    them with its assigner, refuses the plan at start."""
    plan = parse_plan(write_run_plan(tmp_path, collaborators=2, rounds=1, overrides=train_kwargs(epoch=1)))
    with pytest.raises(SettingsError, match=r"^tasks\.train\.kwargs\.epoch: not an argument of train_task"):
        plan.get_aggregator(tensor_dict={})


def test_the_aggregator_keys_are_openfls_signature():
    from openfl.component import Aggregator

    parameters = set(inspect.signature(Aggregator.__init__).parameters) - {"self", "callbacks"}
    assert set(OPENFL_KEYS) | set(OPENFL_FILLED) == parameters
    assert not set(OPENFL_KEYS) & set(OPENFL_FILLED) and not set(OWN_KEYS) & parameters


# ------------------------------------------------------------------------------------------------- OpenFL's sections

NETWORK_KNOWN = ("known: agg_addr, agg_port, hash_salt, use_tls, require_client_auth, client_reconnect_interval, "
                 "cert_folder, enable_atomic_connections, resend_data_on_reconnection, single_col_cert_common_name, "
                 "transport_protocol")


@pytest.mark.parametrize("overrides, line", [
    # swallowed by the gRPC client's and server's **kwargs: the interval stayed 1 s
    ({"network": {"settings": {"client_reconect_interval": 5}}},
     "network.settings.client_reconect_interval: unknown setting (it would be ignored or fail later); "
     + NETWORK_KNOWN + "; did you mean client_reconnect_interval?"),
    ({"network": {"settings": {"client_reconnect_interval": -1}}},
     "network.settings.client_reconnect_interval: expected a number of seconds > 0, got -1"),
    ({"network": {"settings": {"transport_protocol": "http"}}},
     "network.settings.transport_protocol: expected one of grpc, rest, got 'http'"),
    ({"network": {"settings": {"agg_port": 70000}}},
     "network.settings.agg_port: expected a TCP port in [1, 65535] or 'auto', got 70000"),
    # a TypeError from Collaborator.__init__ at `fx collaborator start`; an AttributeError for the treatment
    ({"collaborator": {"settings": {"db_store_round": 2}}},
     "collaborator.settings.db_store_round: unknown setting (it would be ignored or fail later); known: "
     "opt_treatment, device_assignment_policy, use_delta_updates, db_store_rounds, log_memory_usage, write_logs, "
     "callbacks, interop_mode; did you mean db_store_rounds?"),
    ({"collaborator": {"settings": {"opt_treatment": "FOO"}}},
     "collaborator.settings.opt_treatment: expected one of RESET, CONTINUE_LOCAL, CONTINUE_GLOBAL, got 'FOO'"),
    # swallowed by CutoffTimePolicy's **kwargs: the cutoff stayed 3600 s
    ({"straggler_handling_policy": {"settings": {"straggler_cutof_time": 60}}},
     "straggler_handling_policy.settings.straggler_cutof_time: unknown setting (it would be ignored or fail later); "
     "known: straggler_cutoff_time, minimum_reporting; did you mean straggler_cutoff_time?"),
    # a TypeError in the policy's timer thread in round 0; a ValueError naming no key in round 0
    ({"straggler_handling_policy": {"settings": {"straggler_cutoff_time": "60"}}},
     "straggler_handling_policy.settings.straggler_cutoff_time: expected a number of seconds > 0 (.inf: no cutoff), "
     "got '60'"),
    ({"straggler_handling_policy": {"settings": {"minimum_reporting": 0}}},
     "straggler_handling_policy.settings.minimum_reporting: expected an integer >= 1, got 0"),
    ({"straggler_handling_policy": {"template": "openfl.component.aggregator.straggler_handling.Cutoff"}},
     "straggler_handling_policy.template: 'openfl.component.aggregator.straggler_handling.Cutoff' is not a policy of "
     "openfl.component.aggregator.straggler_handling; allowed: CutoffTimePolicy, PercentagePolicy, WaitForAllPolicy"),
    # a key of a section besides its settings: taken by Plan.build for a setting named `setings`, or ignored
    ({"aggregator": {"setings": {"poll_interval_s": 5}}},
     "aggregator.setings: unknown key of a plan section (it would be ignored or taken for a setting); allowed: "
     "defaults, template, settings; did you mean settings?"),
    ({"network": {"setings": {"client_reconnect_interval": 5}}},
     "network.setings: unknown key of a plan section (it would be ignored or taken for a setting); allowed: "
     "defaults, template, settings; did you mean settings?"),
    # a section OpenFL does not read: the run went on with WaitForAllPolicy, OpenFL's default
    ({"straggler_handling_polcy": {"settings": {"straggler_cutoff_time": 60}}},
     "straggler_handling_polcy: not a section OpenFL reads (it would be ignored); sections: aggregator, collaborator, "
     "data_loader, task_runner, network, assigner, straggler_handling_policy, compression_pipeline, connector, tasks; "
     "did you mean straggler_handling_policy?"),
], ids=["network-key", "reconnect-interval", "transport", "agg_port", "collaborator-key", "opt_treatment",
        "straggler-key", "cutoff-str", "minimum_reporting", "straggler-template", "aggregator-section-key",
        "network-section-key", "unknown-section"])
def test_openfls_own_sections_fail_before_anything(tmp_path, overrides, line):
    assert fails_before_anything(tmp_path, overrides) == line


def test_openfls_sections_keys_are_its_signatures_and_defaults():
    """src.plan.openfl_sections spells OpenFL's keys out (torch- and OpenFL-free); they must be what OpenFL takes."""
    import yaml
    from openfl.component import Collaborator
    from openfl.component.aggregator import straggler_handling
    from openfl.component.collaborator.collaborator import OptTreatment
    from openfl.transport.grpc.aggregator_client import AggregatorGRPCClient
    from openfl.transport.grpc.aggregator_server import AggregatorGRPCServer

    from src.plan import openfl_sections as sections

    def params(function, *left_out):
        return set(inspect.signature(function).parameters) - {"self", "args", "kwargs", *left_out}

    network = params(AggregatorGRPCClient.__init__) | params(AggregatorGRPCServer.__init__, "aggregator")
    defaults = Path(inspect.getfile(yaml)).parents[1] / "openfl-workspace" / "workspace" / "plan" / "defaults"
    network |= set(yaml.safe_load((defaults / "network.yaml").read_text())["settings"])
    assert set(sections.NETWORK_KEYS) | set(sections.NETWORK_FILLED) == network
    assert not set(sections.NETWORK_KEYS) & set(sections.NETWORK_FILLED)
    assert set(sections.COLLABORATOR_KEYS) | set(sections.COLLABORATOR_FILLED) == params(Collaborator.__init__)
    assert not set(sections.COLLABORATOR_KEYS) & set(sections.COLLABORATOR_FILLED)
    for treatment in OptTreatment.__members__:
        sections.COLLABORATOR_KEYS["opt_treatment"]("k", treatment)
    policies = {name for name in dir(straggler_handling) if name.endswith("Policy") and name != "StragglerPolicy"}
    assert set(sections.STRAGGLER_POLICIES) == policies
    for name, keys in sections.STRAGGLER_POLICIES.items():
        assert set(keys) == params(getattr(straggler_handling, name).__init__, "round_start_time"), name
    sections.check_openfl_sections(run_plan_config(ROOT, collaborators=2, rounds=1))  # the workspace's own plan
    # the sections OpenFL's Plan reads
    from openfl.federated.plan import plan as plan_module

    read = set(re.findall(r'\b(?:self|plan)\.config(?:\.get\(\s*|\[)"([a-z_]+)"', inspect.getsource(plan_module)))
    assert read == set(sections.SECTIONS)


def test_fx_plan_initialize_and_fx_aggregator_start_check_the_whole_plan(tmp_path):
    """A deployment by hand: `fx plan initialize` builds the task runner through OpenFL's Plan before any certificate,
    and it checks the plan's other sections; `fx aggregator start` knows every collaborator (plan/cols.yaml) and
    refuses a `per_collaborator` name that is none of them (before, it applied to nobody, silently)."""
    from openfl.utilities.dataloading import initialize_minimal_dataloader

    bad_network = {**FAST, "network": {"settings": {"client_reconect_interval": 5}}}
    plan = parse_plan(write_run_plan(tmp_path / "a", collaborators=2, rounds=1, overrides=bad_network))
    with pytest.raises(SettingsError, match=r"^network\.settings\.client_reconect_interval: unknown setting"):
        plan.get_task_runner(initialize_minimal_dataloader(plan))  # what fx plan initialize does

    misspelt = merged(FAST, runner({"per_collaborator": {"colaborator2": {"epochs": 2}}}))
    plan = parse_plan(write_run_plan(tmp_path / "b", collaborators=2, rounds=1, overrides=misspelt))
    plan.get_task_runner(initialize_minimal_dataloader(plan))  # names are not known at fx plan initialize
    with pytest.raises(SettingsError) as err:
        plan.get_aggregator(tensor_dict={})
    assert str(err.value) == ("task_runner.settings.per_collaborator.colaborator2: no collaborator of this federation "
                              "has that name; its collaborators: collaborator1, collaborator2; did you mean "
                              "collaborator2?")


# ------------------------------------------------------------------------------------------------- the demo

DEMO = ["--dataset", "digits", "--comm_round", "1", "--signals", "loss", "--no_progress"]


def demo(argv, capsys) -> tuple[int, str]:
    """cifar10_PM's exit code and stderr, in this process (argparse's exit counts as the code it gives)."""
    import logging

    openfl_level = logging.getLogger("openfl").level  # main() quietens OpenFL's logger: not for the other tests
    try:
        code = cifar10_PM.main(argv)
    except SystemExit as stop:
        code = stop.code
    finally:
        logging.getLogger("openfl").setLevel(openfl_level)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("flags, says", [
    (["--signals", "entropy"], "--signals: unknown signal 'entropy'; known: loss, logits, gradient_norm"),
    (["--fpr_tolerance", "0.1", "2"], "--fpr_tolerance: 2.0 is outside (0, 1)"),
    (["--train_dataset_ratio", "0.9"], "--train_dataset_ratio + --test_dataset_ratio + --audit_dataset_ratio must "
                                       "be <= 1, got 0.9 + 0.4 + 0.2 = 1.5"),
    (["--audit_dataset_ratio", "0"], "--audit_dataset_ratio: expected a finite number > 0, got 0.0"),
    (["--dirichlet_alpha", "-1"], "--dirichlet_alpha: expected a finite number > 0 or null (IID), got -1.0"),
    (["--device", "cuda:63"], "--device: 'cuda:63' is not available on this machine; available here: cpu"),
    (["--local_epochs", "0"], "argument --local_epochs: expected a whole number >= 1, got '0'"),
    (["--comm_round", "0"], "argument --comm_round: expected a whole number >= 1, got '0'"),
    (["--collaborators", "1.5"], "argument --collaborators: expected a whole number >= 1, got '1.5'"),
    (["--learning_rate", "0"], "argument --learning_rate: expected a number > 0, got '0'"),
    (["--auditing_interval", "-2"], "argument --auditing_interval: expected a whole number >= 1, got '-2'"),
    (["--layer_number", "99", "--model", "cnn"], "--layer_number: features[99] of model 'cnn' is not a layer"),
], ids=lambda v: v[0] if isinstance(v, list) else None)
def test_demo_flags_fail_in_one_line_before_anything(tmp_path, capsys, flags, says):
    log_dir = tmp_path / "logs"
    code, err = demo([*DEMO, *flags, "--log_dir", str(log_dir)], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and says in err, err
    assert not log_dir.exists()  # no report written


def test_demo_log_dir_and_plan_file_fail_in_one_line_before_anything(tmp_path, capsys, monkeypatch):
    (tmp_path / "a_file").write_text("")
    used = tmp_path / "used"
    (used / "collaborator1").mkdir(parents=True)
    (used / "collaborator1" / "old.txt").write_text("an earlier run")
    cases = [
        (tmp_path / "a_file", [], f"error: --log_dir {tmp_path / 'a_file'}: exists and is not a folder"),
        (tmp_path / "a_file" / "sub", [], f"error: --log_dir {tmp_path / 'a_file' / 'sub'}: cannot be made: "
                                          f"{tmp_path / 'a_file'} is a file"),
        (used, [], f"error: --log_dir {used}: not empty (an earlier run's reports would mix with this run's); give "
                   "a new or empty folder, or add --replace_log_dir to replace them"),
        # --replace_log_dir replaces only a folder this script wrote (it has _run/): never a user's other folder
        (used, ["--replace_log_dir"], f"error: --log_dir {used}: not empty and not a report folder of this script"),
    ]
    for log_dir, extra, line in cases:
        code, err = demo([*DEMO, *extra, "--log_dir", str(log_dir)], capsys)
        assert code == 2 and err.strip() == err.strip().splitlines()[0] and err.startswith(line), err
    assert sorted(p.name for p in used.rglob("*")) == ["collaborator1", "old.txt"]  # untouched
    assert (tmp_path / "a_file").is_file()

    plan = tmp_path / "plan.yaml"
    plan.write_text("task_runner:\n  settings: {device: cpu\n  x: [\n")
    monkeypatch.setattr(cifar10_PM, "PLAN", plan)
    for extra in ([], ["--gate", "withhold", "mia_local_loss_auc=0.6"]):  # --gate reads the plan at parse time
        code, err = demo([*DEMO, *extra, "--log_dir", str(tmp_path / "new")], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"{plan}: not valid YAML at line 3, column 4: expected ',' or '}}', but got ':'" in err
    assert not (tmp_path / "new").exists()


def test_demo_help_shows_defaults_and_the_download_flag(capsys):
    with pytest.raises(SystemExit):
        cifar10_PM.build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for shown in ("--comm_round COMM_ROUND federated rounds (default: 30)", "(default: cifar10)",
                  "--download [DOWNLOAD]", "(default: ['loss', 'gradient_norm', 'logits'])"):
        assert shown in text


def test_demo_download_flag_reaches_the_plan_and_the_cifar_hint_names_it(tmp_path):
    args = cifar10_PM.parse_args(["--download", "--dataset", "digits"])
    args.report_dir = tmp_path
    assert cifar10_PM.overrides_from_args(args)["data_loader"]["settings"]["download"] is True
    from src.data.datasets import DatasetUnavailableError, check_available

    with pytest.raises(DatasetUnavailableError, match="--download"):
        check_available("cifar10", tmp_path / "none")
    check_available("cifar10", tmp_path / "none", download=True)  # would download: nothing to say now


# ------------------------------------------------------------------------------------------------- the tool

def tool(argv, capsys) -> tuple[int, str]:
    from workspace.__main__ import main

    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("flags, line", [
    (["--set", "tasks.train.kwargs.epoch=1"],
     "error: tasks.train.kwargs.epoch: not an argument of train_task (it would be ignored); allowed: epochs, "
     "use_tqdm, metrics"),
    (["--set", "tasks.train.kwargs.epochs=1.5"], "error: tasks.train.kwargs.epochs: expected an integer >= 1, got 1.5"),
    (["--set", "aggregator.settings.pol_interval_s=2"], "error: aggregator.settings.pol_interval_s: unknown setting"),
    (["--set", "task_runner.settings.per_collaborator.collaborator3.epochs=2"],
     "error: task_runner.settings.per_collaborator.collaborator3: no collaborator of this federation has that name; "
     "its collaborators: collaborator1, collaborator2"),
    (["--rounds", "1", "--set", "aggregator.settings.rounds_to_train=5"],
     "error: --set aggregator.settings.rounds_to_train=5: the tool sets this key; use --rounds (this run's value: 1)"),
    (["--set", "network.settings.client_reconect_interval=5"],
     "error: network.settings.client_reconect_interval: unknown setting (it would be ignored or fail later)"),
    (["--set", "collaborator.settings.db_store_round=2"],
     "error: collaborator.settings.db_store_round: unknown setting"),
    (["--set", "straggler_handling_policy.settings.straggler_cutof_time=60"],
     "error: straggler_handling_policy.settings.straggler_cutof_time: unknown setting"),
    # PyYAML's error text spans six lines
    (["--set", "tasks.train.kwargs.epochs=[1"],
     "error: --set tasks.train.kwargs.epochs: the value '[1' is not valid YAML at line 1, column 3: expected ',' or "
     "']', but got '<stream end>'"),
    # a collaborator-side path out of its workspace (src.plan.paths): every collaborator would write there
    (["--set", "task_runner.settings.audit.report_dir=../../x"],
     "error: task_runner.settings.audit.report_dir: '../../x' resolves to "),
    (["--set", "task_runner.settings.audit.plugins=[../../evil.py]"],
     "error: task_runner.settings.audit.plugins[0]: '../../evil.py' resolves to "),
], ids=["epoch", "epochs-float", "aggregator-key", "per-collaborator", "rounds-contradiction", "network-key",
        "collaborator-key", "straggler-key", "set-value-yaml", "report-dir-escape", "plugin-escape"])
def test_workspace_flags_fail_in_one_line_before_any_folder(tmp_path, capsys, flags, line):
    run_dir = tmp_path / "run"
    code, err = tool(["prepare", "--collaborators", "2", "--dir", str(run_dir), *flags], capsys)
    assert code == 2
    assert err.strip().splitlines() == [err.strip()] and err.startswith(line), err
    assert not run_dir.exists()


def test_workspace_plan_file_errors_name_the_flag_and_the_file(tmp_path, capsys):
    for text, says in (("a: [\n", "not valid YAML at line 2, column 1: expected the node content, but found '<stream end>'"),
                       ("- 1\n", "not a plan (a YAML mapping of sections such as task_runner, tasks), got list")):
        plan = tmp_path / "plan.yaml"
        plan.write_text(text)
        code, err = tool(["prepare", "--dir", str(tmp_path / "run"), "--plan", str(plan)], capsys)
        assert code == 2 and err.strip() == f"error: --plan {plan}: {says}", err
    code, err = tool(["prepare", "--dir", str(tmp_path / "run"), "--plan", str(tmp_path / "none.yaml")], capsys)
    assert code == 2 and err.strip() == f"error: --plan {tmp_path / 'none.yaml'}: cannot read the plan (No such file " \
                                        "or directory)", err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------------- entry points

@pytest.mark.slow  # builds the task runner (the checks' imports)
@pytest.mark.parametrize("override, line", [
    ("task_runner.settings.learnig_rate=0.1", "error: task_runner.settings.learnig_rate: unknown setting; known: "),
    ("task_runner.settings.device=cuda:63", "error: task_runner.settings.device: 'cuda:63' is not available on this "
                                            "machine; available here: cpu"),
    ("task_runner.settings.audit.fidel={enabled: true, layer: nope}",
     "error: task_runner.settings.audit.fidel.layer: layer 'nope': no such module"),
])
def test_bad_settings_fail_before_any_certificate_is_made(tmp_path, override, line):
    """docs/deployment.md's promise, on the real tool with mutual TLS: what only building the task runner can check (as
    `fx plan initialize` does) fails in the tool's own process before any folder is made; one line, naming the key.
    Before, it failed in `fx plan initialize` and left --dir holding aggregator/ and setup.log."""
    run_dir = tmp_path / "run"
    result = workspace_here("prepare", "--collaborators", "2", "--rounds", "1", "--dir", run_dir, "--set", override)
    assert result.returncode == 2, result.stderr
    err = result.stderr.strip()
    assert err.splitlines() == [err] and err.startswith(line), err
    assert not run_dir.exists()  # no folder, no aggregator/, no setup.log, no certificate


SMALL = ["--collaborators", "1", "--rounds", "1", "--no-tls", "--set", "tasks.train.kwargs.epochs=1"]


@pytest.mark.federation
@pytest.mark.skipif(not (Path(sys.executable).parent / "fx").exists(), reason="fx comes with openfl in the venv")
def test_a_prepare_refused_in_fx_leaves_nothing_and_the_fixed_command_works(tmp_path):
    """A failure only an `fx` command meets (`fx plan initialize` cannot write the initial model there): before, --dir
    kept aggregator/ and setup.log, and the fixed rerun was refused "not empty". Now nothing is left, and the same
    command with the mistake fixed prepares the folder."""
    run_dir = tmp_path / "run"
    bad = workspace_here("prepare", "--dir", run_dir, *SMALL,
               "--set", f"aggregator.settings.init_state_path={tmp_path / 'no' / 'such' / 'init.pbuf'}")
    assert bad.returncode == 2, bad.stdout[-2000:] + bad.stderr[-2000:]
    assert "`fx plan initialize` failed" in bad.stderr or "fx plan initialize" in bad.stderr, bad.stderr
    assert not run_dir.exists(), sorted(str(p) for p in run_dir.rglob("*"))[:20]
    good = workspace_here("prepare", "--dir", run_dir, *SMALL)
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr[-2000:]
    assert (run_dir / "collaborator1" / "plan" / "plan.yaml").is_file()


def truncated_mnist(root: Path) -> Path:
    """A small MNIST in torchvision's layout whose training images file lost its last 100 bytes."""
    from torchvision_files import write_dataset

    write_dataset(root, "mnist", n_train=60, n_test=20)
    images = root / "MNIST" / "raw" / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-100])
    return root


TRUNCATED = ("MNIST is not available: its files are incomplete or corrupted (train-images-idx3-ubyte: not an idx file "
             "torchvision reads")


@pytest.mark.slow  # torchvision's readers
def test_the_tool_reads_each_partys_data_before_any_certificate(tmp_path):
    """Before: a truncated MNIST file was found only by the collaborators, in round 0, and the tool said "exited with
    code 1 during round 0"; now the tool reads every shard with the loader's own readers before making anything."""
    data = truncated_mnist(tmp_path / "data")
    run_dir = tmp_path / "run"
    result = workspace_here("prepare", "--dir", run_dir, "--collaborators", "2", "--set",
                            "data_loader.settings.dataset=mnist", "--set", f"data_loader.settings.data_dir={data}")
    assert result.returncode == 2, result.stderr
    err = result.stderr.strip()
    assert err.splitlines() == [err] and err.startswith(f"error: {TRUNCATED}"), err
    assert not run_dir.exists()


def test_the_demo_reads_the_data_before_it_makes_log_dir(tmp_path, capsys):
    """Before: bad data left `_run/` in --log_dir."""
    data = truncated_mnist(tmp_path / "data")
    log_dir = tmp_path / "logs"
    code, err = demo([*DEMO, "--dataset", "mnist", "--data-dir", str(data), "--log_dir", str(log_dir)], capsys)
    assert code == 2 and err.strip().splitlines() == [err.strip()] and err.startswith(f"error: {TRUNCATED}"), err
    assert not log_dir.exists()


def test_a_gate_the_population_cannot_resolve_is_refused_at_start(tmp_path, capsys):
    """Before: a gate on TPR at FPR 1e-4 with 404 population samples per party was accepted and compared the TPR at
    population FPR 0 every round."""
    log_dir = tmp_path / "logs"
    split = ["--train_dataset_ratio", "0.1", "--test_dataset_ratio", "0.45", "--audit_dataset_ratio", "0.45"]
    code, err = demo([*DEMO, *split, "--fpr_tolerance", "0.0001", "0.1", "--gate", "withhold",
                      "mia_local_loss_tpr_at_fpr_0.0001=0.5", "--log_dir", str(log_dir)], capsys)
    assert code == 2 and err.strip().splitlines() == [err.strip()], err
    assert err.startswith("error: --gate: mia_local_loss_tpr_at_fpr_0.0001: collaborator1's audit population has 404 "
                          "samples, which resolve FPR tolerances >= 0.00248 (1 / population): TPR at FPR 0.0001 would "
                          "be read at population FPR 0"), err
    assert not log_dir.exists()
    # the tolerance the population resolves may be gated
    from audit.config.per_collaborator import check_gate_resolution, parse_per_collaborator
    from audit.config.audit_settings import AuditSettings

    audit = AuditSettings.from_mapping({"signals": ["loss"], "fpr_tolerance": [0.0001, 0.1]}, prefix="audit")
    default, per = parse_per_collaborator(None, gate={"thresholds": {"mia_local_loss_tpr_at_fpr_0.1": 0.5}},
                                          audit_settings=audit)
    check_gate_resolution("c1", default, per, audit, population=10)
    with pytest.raises(SettingsError, match=r"^task_runner\.settings\.gate\.thresholds\.mia_local_loss_tpr_at_fpr_0\.1: "
                                            r"c1's audit population has 9 samples"):
        check_gate_resolution("c1", default, per, audit, population=9)


def test_the_demos_counts_are_bounded_before_anything(tmp_path, capsys):
    log_dir = tmp_path / "logs"
    for flags, says in (
            (["--comm_round", "1000000000"], "--comm_round: 1,000,000,000 rounds; at most 100,000 (OpenFL's task "
                                             "assigner holds a list per round"),
            (["--collaborators", "100000"], "--collaborators: 100,000 collaborators; at most 359 for digits (1,797 "
                                            "samples): every collaborator needs at least one sample of each set, and "
                                            "--audit_dataset_ratio 0.2 x 1,797 gives 359"),
            (["--audit_sample_size", "5000"], "--audit_sample_size: 5,000 samples per set; at most 1,797")):
        code, err = demo([*DEMO, *flags, "--log_dir", str(log_dir)], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert not log_dir.exists()


@pytest.mark.federation
def test_demo_refuses_a_used_log_dir_unless_asked_to_replace_it(tmp_path, capsys, demo_run):
    log_dir = tmp_path / "logs"
    assert demo_run.proc.returncode == 0, demo_run.proc.stderr[-2000:]
    shutil.copytree(demo_run.log_dir, log_dir, symlinks=True)  # what an earlier demo run wrote (2 rounds)
    args = [*DEMO, "--rmia", "false", "--train_dataset_ratio", "0.1", "--test_dataset_ratio", "0.45",
            "--audit_dataset_ratio", "0.45", "--log_dir", str(log_dir)]
    (log_dir / "collaborator1" / "round_0007").mkdir()  # as if an earlier, longer run had left it
    before = sorted(p.relative_to(log_dir) for p in log_dir.rglob("*"))
    code, err = demo(args, capsys)
    assert code == 2 and err.strip().startswith(f"error: --log_dir {log_dir}: not empty")
    assert sorted(p.relative_to(log_dir) for p in log_dir.rglob("*")) == before
    with no_report_drawing():  # the rounds on disk are read, not the pages
        code, err = demo([*args, "--replace_log_dir"], capsys)
    assert code == 0, err[-2000:]
    assert not (log_dir / "collaborator1" / "round_0007").exists()  # the earlier run's rounds are gone
    assert not (log_dir / "collaborator1" / "round_0001").exists()
    assert (log_dir / "collaborator1" / "round_0000" / "audit.json").is_file()


@pytest.mark.federation
@pytest.mark.skipif(not (Path(sys.executable).parent / "fx").exists(), reason="fx comes with openfl in the venv")
def test_a_deployment_by_hand_fails_at_fx_plan_initialize_and_fx_aggregator_start_naming_the_key(tmp_path, fx_fork):
    """OpenFL's `fx` commands (tests/fx_forks.py) in an aggregator's workspace made as by hand (no tool check before
    them): a misspelt network key fails `fx plan initialize` (before any certificate), a `per_collaborator` name that
    is no collaborator in plan/cols.yaml fails `fx aggregator start` before it listens; each in one EXCEPTION line."""
    from workspace.plan_file import collaborator_names, read_plan
    from workspace.prepare import fx_exception, make_aggregator_workspace

    def fx(ws, *args, timeout=300):
        done = fx_fork(ws, *args, timeout=timeout)
        return done.returncode, fx_exception(done.stdout)

    names = collaborator_names(2)
    plan = merged(read_plan(ROOT / "plan" / "plan.yaml"), FAST)  # the workspace's plan, its paths relative
    config = merged(plan, {"network": {"settings": {"agg_port": 1, "client_reconect_interval": 5}}})
    make_aggregator_workspace(tmp_path / "bad_network", config, names, use_tls=True)
    code, line = fx(tmp_path / "bad_network", "plan", "initialize")
    assert code != 0 and line.startswith("network.settings.client_reconect_interval: unknown setting"), line
    assert not (tmp_path / "bad_network" / "cert").exists()

    config = merged(plan, {**runner({"per_collaborator": {"colaborator2": {"epochs": 2}}}),
                           "network": {"settings": {"agg_port": 1, "use_tls": False}}})
    make_aggregator_workspace(tmp_path / "misspelt", config, names, use_tls=False)  # cols.yaml lists the names
    assert fx(tmp_path / "misspelt", "plan", "initialize") == (0, None)  # the names are not known there
    code, line = fx(tmp_path / "misspelt", "aggregator", "start", timeout=120)  # before: served, waiting
    assert code != 0 and line == ("task_runner.settings.per_collaborator.colaborator2: no collaborator of this "
                                  "federation has that name; its collaborators: collaborator1, collaborator2; did you "
                                  "mean collaborator2?"), line


@pytest.mark.federation
@pytest.mark.skipif(not (Path(sys.executable).parent / "fx").exists(), reason="fx comes with openfl in the venv")
def test_a_deployment_by_hand_checks_included_files_names_and_transport_at_each_fx_command(tmp_path, fx_fork):
    """`fx` run by hand in a workspace the tool did not check (OpenFL's commands: tests/fx_forks.py; the serving
    aggregator a real `fx` process): `fx plan initialize` refuses a `defaults:` file OpenFL
    does not ship (before: read as empty, silently) and an unsafe name in plan/data.yaml; `fx collaborator start -n
    ../../escaped_x` is refused before OpenFL writes anything (before: it wrote logs/../../escaped_x_metrics.txt,
    outside the workspace, and the name was refused only at its first audit); `fx aggregator start` refuses a plan
    without TLS unless FEDERATION_INSECURE says it is meant, and then warns every round."""
    import signal as signals

    from workspace.plan_file import collaborator_names, read_plan
    from workspace.prepare import fx_exception, make_aggregator_workspace
    from workspace.processes import fx_environment

    fx_path = str(Path(sys.executable).parent / "fx")

    def fx(ws, *args, timeout=300):
        done = fx_fork(ws, *args, timeout=timeout)
        return done.returncode, fx_exception(done.stdout)

    names = collaborator_names(1)
    plan = merged(read_plan(ROOT / "plan" / "plan.yaml"), merged(FAST, {
        "network": {"settings": {"agg_port": 1, "use_tls": False}},
        "data_loader": {"settings": {"collaborator_count": 1}}}))

    misspelt = merged(plan, {"network": {"defaults": "plan/defaults/netwrok.yaml"}})
    make_aggregator_workspace(tmp_path / "misspelt", misspelt, names, use_tls=False)
    code, line = fx(tmp_path / "misspelt", "plan", "initialize")
    assert code != 0 and line.startswith("defaults: 'plan/defaults/netwrok.yaml' is no file OpenFL ships (it was "
                                         "read as empty: a section lost OpenFL's defaults)"), line
    assert line.endswith("did you mean plan/defaults/network.yaml?"), line

    ws = tmp_path / "hosts" / "ws"
    make_aggregator_workspace(ws, plan, names, use_tls=False)
    (ws / "plan" / "data.yaml").write_text("collaborator1,1\n")
    assert fx(ws, "plan", "initialize") == (0, None)
    (ws / "plan" / "data.yaml").write_text("collaborator1,1\n../../escaped_x,1\n")
    code, line = fx(ws, "plan", "initialize")
    assert code != 0 and line.startswith("plan/data.yaml: collaborator name '../../escaped_x' is not a safe path "
                                         "component"), line
    code, line = fx(ws, "collaborator", "start", "-n", "../../escaped_x", timeout=120)
    assert code != 0 and line.startswith("plan/data.yaml: collaborator name '../../escaped_x'"), line
    assert not [str(p) for p in tmp_path.rglob("*escaped_x*")]  # nothing written anywhere under its name

    (ws / "plan" / "data.yaml").write_text("collaborator1,1\n")
    code, line = fx(ws, "aggregator", "start", timeout=120)
    assert code != 0 and line.startswith("network.settings.use_tls: false turns TLS off"), line
    env = {**fx_environment("logs/aggregator.log"), "FEDERATION_INSECURE": "tls"}
    (ws / "logs").mkdir(exist_ok=True)
    server = subprocess.Popen([fx_path, "aggregator", "start"], cwd=ws, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        log = ws / "logs" / "aggregator.log"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "Round 0 runs with network.settings.use_tls: false" not in (
                log.read_text(errors="replace") if log.exists() else ""):
            assert server.poll() is None, log.read_text()[-3000:] if log.exists() else "no log"
            time.sleep(0.5)
        assert "Round 0 runs with network.settings.use_tls: false: no TLS" in log.read_text()
    finally:
        os.killpg(server.pid, signals.SIGKILL)
        server.wait()


@pytest.mark.parametrize("flags, refused", [([], True), (["--no-tls"], False)])
def test_a_plan_without_tls_given_by_plan_is_refused_without_no_tls(tmp_path, capsys, flags, refused):
    """docs/deployment.md: a plan turning TLS off is refused without --no-tls. Before, the tool's own use_tls
    replaced the plan's `false` and ran it with mutual TLS without a word."""
    import yaml

    config = yaml.safe_load((ROOT / "plan" / "plan.yaml").read_text())
    config["network"]["settings"]["use_tls"] = False
    plan = tmp_path / "insecure.yaml"
    plan.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    if not refused:  # with the flag the transport check passes; stop at the next check, before any folder
        flags = [*flags, "--set", "tasks.train.kwargs.epoch=1"]
    code, err = tool(["prepare", "--collaborators", "2", "--dir", str(run_dir), "--plan", str(plan), *flags], capsys)
    assert code == 2 and err.strip().splitlines() == [err.strip()], err
    if refused:
        assert err.startswith(f"error: --plan {plan}: network.settings.use_tls: false turns TLS off") and \
            "add --no-tls" in err, err
    else:
        assert err.startswith("error: tasks.train.kwargs.epoch: not an argument"), err
    assert not run_dir.exists()


RATIOS = ("train_dataset_ratio", "test_dataset_ratio", "audit_dataset_ratio")


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("value, says", [(-0.1, "expected a finite number > 0, got -0.1"),
                                         (0, "expected a finite number > 0, got 0"),
                                         (".nan", "expected a finite number > 0, got nan"),
                                         ("many", "expected a finite number > 0, got 'many'")])
def test_a_bad_share_of_the_pool_is_named_as_itself_by_every_entry_point(tmp_path, capsys, ratio, value, says):
    """Before, the collaborators' bound ran first on the tool's and the plan's path: `audit_dataset_ratio=-0.1` was
    reported as "--collaborators: 3 collaborators; at most -180"."""
    run_dir = tmp_path / "run"
    code, err = tool(["prepare", "--dir", str(run_dir), "--set", f"data_loader.settings.{ratio}={value}"], capsys)
    assert code == 2 and err.strip() == f"error: data_loader.settings.{ratio}: {says}", err
    assert not run_dir.exists()
    import yaml

    message = fails_before_anything(tmp_path, {"data_loader": {"settings": {ratio: yaml.safe_load(str(value))}}})
    assert message == f"data_loader.settings.{ratio}: {says}", message
    flag = str(value).replace(".nan", "nan")
    code, err = demo([*DEMO, f"--{ratio}", flag, "--log_dir", str(run_dir)], capsys)
    shown = {"-0.1": "-0.1", "0": "0.0", "nan": "nan", "many": "'many'"}[flag]
    words = (f"argument --{ratio}: invalid float value: 'many'" if flag == "many" else
             f"--{ratio}: expected a finite number > 0, got {shown}")
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    assert not run_dir.exists()


@pytest.mark.parametrize("ratios", [{"train_dataset_ratio": 0.9}, {"audit_dataset_ratio": 0.7}])
def test_shares_summing_above_one_are_named_before_the_collaborators_bound(tmp_path, capsys, ratios):
    flags = [a for key, value in ratios.items() for a in ("--set", f"data_loader.settings.{key}={value}")]
    code, err = tool(["prepare", "--dir", str(tmp_path / "run"), *flags], capsys)
    assert code == 2 and err.startswith("error: data_loader.settings.train_dataset_ratio: data_loader.settings."
                                        "train_dataset_ratio + data_loader.settings.test_dataset_ratio + "
                                        "data_loader.settings.audit_dataset_ratio must be <= 1, got "), err
