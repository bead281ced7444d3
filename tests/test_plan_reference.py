"""docs/plan-reference.md is what tools/plan_reference.py generates from the settings declarations now (so it cannot
drift from what the plan accepts), and it lists every key the project's settings classes declare, nested ones and the
registered audit steps' sections included."""

from __future__ import annotations

import subprocess
import sys

from audit.config.fields import declared
from audit.config.gate import DPSettings, GatePolicy
from audit.config.mitigation_settings import Mitigation
from src.server.settings import AggregatorSettings, DeanonServerSettings
from src.data.loader_settings import DataLoaderSettings
from src.runner.settings import RunnerSettings
from tools import plan_reference


def test_the_committed_reference_is_current():
    # In a fresh interpreter, as a developer runs it: only the project's own audit steps are registered there (a
    # plug-in a test registered in this process would add its section).
    done = subprocess.run([sys.executable, "-m", "tools.plan_reference", "--check"], cwd=plan_reference.ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_reference_lists_every_declared_key():
    text = plan_reference.generate()
    expected = {"data_loader.settings": DataLoaderSettings, "task_runner.settings": RunnerSettings,
                "task_runner.settings.audit.rmia": None, "task_runner.settings.gate": GatePolicy,
                "task_runner.settings.gate.dp": DPSettings, "task_runner.settings.mitigation": Mitigation,
                "aggregator.settings": AggregatorSettings, "aggregator.settings.deanon": DeanonServerSettings}
    for key, cls in expected.items():
        for f in declared(cls) if cls is not None else ():
            assert f"| `{key}.{f.name}` |" in text, f"{key}.{f.name}"
    for key in ("task_runner.settings.audit.signals", "task_runner.settings.audit.rmia.gamma",
                "task_runner.settings.audit.fidel.threshold", "task_runner.settings.audit.deanon.crowd_alpha",
                "task_runner.settings.per_collaborator.<collaborator>.epochs"):
        assert f"| `{key}` |" in text, key
    assert "`epochs`: an integer >= 1" in text  # the tasks' keyword arguments


def test_check_mode_reports_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "plan-reference.md"
    stale.write_text("old\n")
    monkeypatch.setattr(plan_reference, "REFERENCE", stale)
    monkeypatch.setattr(plan_reference, "ROOT", tmp_path)
    assert plan_reference.main(["--check"]) == 1 and "not current" in capsys.readouterr().err
    assert plan_reference.main([]) == 0 and plan_reference.main(["--check"]) == 0
    assert stale.read_text() == plan_reference.generate()
