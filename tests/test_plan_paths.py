"""A plan comes from the aggregator: the paths in it that a collaborator reads or writes stay in the collaborator's
workspace, or in folders its owner allows on its host (FEDERATION_ALLOWED_PATHS), refused otherwise in one line
naming the key, before the collaborator reads or writes anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from audit.config.fields import SettingsError
from src.plan.paths import ALLOWED_ENV, check_collaborator_paths, owner_allowance, workspace_of

KEYS = {
    "task_runner.settings.audit.report_dir": lambda v: {"task_runner": {"settings": {"audit": {"report_dir": v}}}},
    "data_loader.settings.data_dir": lambda v: {"data_loader": {"settings": {"data_dir": v}}},
    "network.settings.cert_folder": lambda v: {"network": {"settings": {"cert_folder": v}}},
    "task_runner.settings.audit.plugins[1]": lambda v: {"task_runner": {"settings": {"audit": {
        "plugins": ["src.my_audit", v + "/step.py"]}}}},
}


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("value, inside", [
    ("reports", True), ("./a/../reports", True), ("../../x", False), ("a/../../x", False), ("~/x", False),
    ("{ws}/deep/er", True), ("{ws}/../x", False), ("/etc", False), ("{allowed}/audit", True), ("{allowed}", True),
    ("{allowed}-not", False),
])
def test_a_collaborator_side_path_stays_in_the_workspace_or_an_allowed_folder(tmp_path, key, value, inside):
    ws, allowed = tmp_path / "ws", tmp_path / "data"
    value = value.format(ws=ws, allowed=allowed)
    config = KEYS[key](value)
    if inside:
        check_collaborator_paths(config, ws, [allowed])
        return
    with pytest.raises(SettingsError) as err:
        check_collaborator_paths(config, ws, [allowed])
    text = str(err.value)
    shown = value + "/step.py" if key.endswith("]") else value
    assert text.startswith(f"{key}: {shown!r} resolves to ") and f"outside this collaborator's workspace {ws}" in text
    assert ALLOWED_ENV in text and "\n" not in text


def test_the_allow_list_is_the_hosts_own_setting(tmp_path, monkeypatch):
    config = KEYS["data_loader.settings.data_dir"]("/srv/datasets")
    with pytest.raises(SettingsError):
        check_collaborator_paths(config, tmp_path)
    monkeypatch.setenv(ALLOWED_ENV, os.pathsep.join(["/elsewhere", "/srv"]))
    check_collaborator_paths(config, tmp_path)  # allowed by this host's owner, not by the plan


def test_an_owner_run_allows_the_absolute_paths_its_plan_names_never_a_relative_escape(tmp_path):
    config = {"task_runner": {"settings": {"audit": {"report_dir": str(tmp_path / "r"),
                                                     "plugins": [str(tmp_path / "p" / "x.py"), "mod"]}}},
              "data_loader": {"settings": {"data_dir": "../../data"}}}
    assert owner_allowance(config) == [tmp_path / "r", tmp_path / "p"]
    with pytest.raises(SettingsError, match=r"^data_loader\.settings\.data_dir: '\.\./\.\./data' resolves to "):
        check_collaborator_paths(config, tmp_path / "ws", owner_allowance(config))


def test_the_workspace_is_the_folder_of_the_plan(tmp_path, monkeypatch):
    assert workspace_of([tmp_path / "ws" / "plan" / "plan.yaml", "plan/defaults/x.yaml"]) == tmp_path / "ws"
    monkeypatch.chdir(tmp_path)
    assert workspace_of(["plan/plan.yaml"]) == tmp_path
    assert workspace_of([]) == tmp_path


@pytest.mark.slow  # builds a collaborator with OpenFL's Plan
@pytest.mark.parametrize("override, key", [
    ({"task_runner": {"settings": {"audit": {"report_dir": "../../x"}}}}, "task_runner.settings.audit.report_dir"),
    ({"data_loader": {"settings": {"data_dir": "/nowhere/data", "dataset": "mnist"}}},
     "data_loader.settings.data_dir"),
])
def test_a_collaborator_built_from_an_aggregators_plan_refuses_a_path_out_of_its_workspace(tmp_path, override, key):
    """OpenFL's own Plan.get_collaborator (what `fx collaborator start -n` runs) on a workspace made as by
    `fx workspace import`: refused when the data loader or the task runner is built, before either reads or writes;
    nothing is written outside (no x beside the workspace)."""
    from workspace.in_process import DirectClient, parse_plan
    from workspace.plan_file import write_run_plan

    ws = tmp_path / "fl_workspace"
    plan_dir = write_run_plan(ws, collaborators=2, rounds=1, overrides=override)
    assert plan_dir == ws / "plan"
    plan = parse_plan(plan_dir)
    with pytest.raises(SettingsError) as err:
        plan.get_collaborator("collaborator1", client=DirectClient(None, "collaborator1"))
    assert str(err.value).startswith(f"{key}: "), str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fl_workspace"]
    assert not Path("/nowhere").exists()


@pytest.mark.federation  # builds the in-process federation's checks and a collaborator
def test_the_in_process_runner_refuses_a_relative_escape(tmp_path):
    from workspace.in_process import run_in_process

    reports = tmp_path / "run" / "reports"
    with pytest.raises(SettingsError, match=r"^task_runner\.settings\.audit\.report_dir: '\.\./\.\./x' resolves to "):
        run_in_process(tmp_path / "run", collaborators=1, rounds=1, overrides={
            "task_runner": {"settings": {"audit": {"report_dir": "../../x"}}},
            "aggregator": {"settings": {"report_dir": str(reports / "aggregator")}}})
    assert not (tmp_path.parent / "x").exists() and not (tmp_path / "x").exists()
