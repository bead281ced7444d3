"""Plan settings are validated when the task runner is built, with errors naming the bad key."""

import pytest

from workspace.in_process import initial_tensor_dict, parse_plan
from workspace.plan_file import write_run_plan


def build_runner(tmp_path, overrides):
    plan = parse_plan(write_run_plan(tmp_path, collaborators=2, rounds=1, overrides=overrides))
    return initial_tensor_dict(plan)


@pytest.mark.parametrize(
    "audit, key",
    [
        ({"signals": ["loss", "entropy"]}, "task_runner.settings.audit.signals"),
        ({"fpr_tolerance": [0.1, 1.5]}, "task_runner.settings.audit.fpr_tolerance"),
        ({"interval": 0}, "task_runner.settings.audit.interval"),
        ({"threshold_function": "magic"}, "task_runner.settings.audit.threshold_function"),
        ({"signalz": ["loss"]}, "task_runner.settings.audit.signalz"),
        ({"gradient_layer": "no_such_layer"}, "task_runner.settings.audit.gradient_layer"),
    ],
)
def test_bad_audit_setting_names_its_key(tmp_path, audit, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        build_runner(tmp_path, {"task_runner": {"settings": {"audit": audit}}})


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"optimizer": "Adagrad"}, "task_runner.settings.optimizer"),
        ({"learning_rate": -1}, "task_runner.settings.learning_rate"),
        ({"model": "resnet"}, "task_runner.settings.model"),
        ({"model_settings": {"activation": "swish"}}, "task_runner.settings.model_settings"),
    ],
)
def test_bad_runner_setting_names_its_key(tmp_path, settings, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        build_runner(tmp_path, {"task_runner": {"settings": settings}})


def test_default_plan_builds(tmp_path):
    tensors = build_runner(tmp_path, {})
    assert tensors and all(v.size > 0 for v in tensors.values())
