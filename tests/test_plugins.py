"""A plug-in audit step that lives outside the project, named in the plan, reaches every consumer with no file of the
project edited: its plan section and model check at start, its metrics in the party's report, the gate, the
aggregator's metrics.csv and the end-of-run summary, and its histogram in the party's figure."""

from __future__ import annotations

import csv
import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from audit.config import plugins
from audit.config.audit_settings import AuditSettings
from audit.config.fields import SettingsError
from audit.config.steps import registered, unregister
from audit.reporting.party import histogram_panels
from audit.round_record import RoundRecord
from report_drawing import no_report_drawing
from tools.docs_check import read_blocks
from workspace.in_process import run_in_process
from workspace.plan_file import deep_merge
from workspace.run_summary import summary_lines

PLUGIN = textwrap.dedent('''
    """A loss-gap attack: non-members' mean loss minus members' (a plug-in written against the registry only)."""
    import io
    from dataclasses import dataclass

    import numpy as np
    import torch
    import torch.nn.functional as F

    from audit import (AttackKey, AuditStep, HistogramPanel, SettingsError, StepResult, atomic_write_bytes, boolean,
                       optional, population_attack, read_npz, register, setting, text, to_dict)
    from audit import parse as parse_settings

    FILE = "lossgap.npz"


    @dataclass(frozen=True)
    class Settings:
        """The loss-gap attack."""

        enabled: bool = setting(False, boolean(), "run the loss-gap attack")
        layer: str | None = setting(None, optional(text("a module name")), "a module the model must have")

        def to_dict(self):
            return to_dict(self)


    def parse(key, value):
        return parse_settings(Settings, value, key)


    def check_model(model, feature_shape, settings, key):
        if settings.enabled and settings.layer and settings.layer not in dict(model.named_modules()):
            raise SettingsError(f"{key}.layer: the model has no module {settings.layer!r}")


    def losses(model, sets, name):
        x, y = sets.tensors(name)
        with torch.no_grad():
            return F.cross_entropy(model(x), y, reduction="none").numpy()


    def run(context, settings):
        members, nonmembers = losses(context.local_model, context.mia_sets, "members"), losses(
            context.local_model, context.mia_sets, "nonmembers")

        def write(round_dir):
            buffer = io.BytesIO()
            np.savez(buffer, members=members, nonmembers=nonmembers)
            atomic_write_bytes(round_dir / FILE, buffer.getvalue())

        # Its membership attack through the typed API: in the record's attacks, the party's tables and the leak
        # verdict (its metrics would be AttackKey("lossgap", "loss").metric(statistic), were it to declare them).
        population = losses(context.local_model, context.mia_sets, "population")
        attack = population_attack(members, nonmembers, population, context.settings.fpr_tolerance, signal="loss",
                                   attack="lossgap", confidence=context.settings.confidence,
                                   delta=context.settings.epsilon_delta)
        return StepResult(metrics={"lossgap_gap": float(nonmembers.mean() - members.mean())},
                          attacks={AttackKey("lossgap", "loss"): attack}, write_private=write)


    def histograms(record, round_dir):
        stored = read_npz(round_dir / FILE)
        if not stored:
            return []
        return [HistogramPanel("loss gap plug-in", stored["members"], stored["nonmembers"], float("nan"), "loss")]


    register(AuditStep(name="lossgap", section="lossgap", parse=parse, metric_names=lambda s, a: ["lossgap_gap"],
                       run=run, metric_prefix="lossgap_", check_model=check_model, histograms=histograms,
                       private_files=(FILE,)))
''')


@pytest.fixture
def plugin_file(tmp_path):
    """The plug-in in a folder of its own, outside the project; forgotten again afterwards (the registry is
    per process)."""
    folder = tmp_path / "outside" / "audits"
    folder.mkdir(parents=True)
    path = folder / "lossgap.py"
    path.write_text(PLUGIN)
    yield path
    unregister("lossgap")
    plugins._LOADED.pop(str(path.resolve()), None)


def _overrides(tmp_path, plugin_file, **lossgap):
    reports = tmp_path / "reports"
    return reports, {
        "tasks": {"train": {"kwargs": {"epochs": 2}}},
        "data_loader": {"settings": {"seed": 1}},
        "aggregator": {"settings": {"report_dir": str(reports / "aggregator")}},
        "task_runner": {"settings": {
            "seed": 1,
            "audit": {"report_dir": str(reports), "signals": ["loss"], "fpr_tolerance": [0.1],
                      "rmia": {"enabled": False}, "plugins": [str(plugin_file)],
                      "lossgap": {"enabled": True, **lossgap}},
            "gate": {"action": "report_only", "thresholds": {"lossgap_gap": 10.0}},  # no interval: as it is
        }},
    }


@pytest.mark.federation
def test_a_plugin_step_named_in_the_plan_reaches_every_report(tmp_path, plugin_file):
    reports, overrides = _overrides(tmp_path, plugin_file)
    result = run_in_process(tmp_path / "run", collaborators=2, rounds=2, overrides=overrides)
    assert "lossgap" in [s.name for s in registered()]
    for col in ("collaborator1", "collaborator2"):
        for r in (0, 1):
            round_dir = reports / col / f"round_{r:04d}"
            record = json.loads((round_dir / "audit.json").read_text())
            assert "lossgap_gap" in record["metrics"] and record["settings"]["lossgap"]["enabled"] is True
            assert record["attacks"]["lossgap"]["loss"]["n_members"] > 0  # its attack, stored like the built-in ones
            assert "lossgap / loss" in (reports / col / "index.html").read_text()  # in the party's attack tables
            # the gate watches it: its limit and value went to the aggregator
            assert result.collaborator_metrics[r][f"{col}/train/gate_threshold__lossgap_gap"] == 10.0
            assert (round_dir / "lossgap.npz").is_file() and (round_dir / "signals.png").is_file()
            assert "loss gap plug-in" in [p.title for p in histogram_panels(RoundRecord.from_json(record), round_dir)]
        rows = list(csv.DictReader((reports / col / "metrics.csv").open()))
        assert all(row["lossgap_gap"] for row in rows)
    rows = list(csv.DictReader((reports / "aggregator" / "metrics.csv").open()))
    assert {"lossgap_gap", "worst:lossgap_gap"} <= set(rows[0]) and rows[0]["lossgap_gap"]
    lines = "\n".join(summary_lines({c: reports / c for c in ("collaborator1", "collaborator2")},
                                    reports / "aggregator", 2))
    assert "lossgap_gap " in lines  # the demo's end-of-run summary lists it


@pytest.mark.federation
def test_a_plugin_checks_the_model_at_start_under_its_own_key(tmp_path, plugin_file):
    _, overrides = _overrides(tmp_path, plugin_file, layer="no_such_layer")
    with pytest.raises(SettingsError, match=r"^task_runner\.settings\.audit\.lossgap\.layer: the model has no module"):
        run_in_process(tmp_path / "run", collaborators=2, rounds=1, overrides=overrides)


@pytest.mark.parametrize("entry, words", [
    ("no_such_module_xyz", "cannot import plug-in module 'no_such_module_xyz'"),
    ("/nowhere/plugin.py", "no such plug-in file"),
])
def test_a_plugin_that_cannot_be_imported_is_named(entry, words):
    with pytest.raises(SettingsError) as err:
        AuditSettings.from_mapping({"plugins": [entry]}, prefix="task_runner.settings.audit")
    assert str(err.value).startswith("task_runner.settings.audit.plugins[0]: ") and words in str(err.value)


def test_a_plugin_that_fails_while_importing_is_named_and_leaves_nothing(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(SettingsError, match=r"plugins\[0\]: importing .*broken\.py failed: RuntimeError: no GPU here"):
        AuditSettings.from_mapping({"plugins": [str(broken)]}, prefix="task_runner.settings.audit")
    with pytest.raises(SettingsError, match=r"plugins: expected a list"):
        AuditSettings.from_mapping({"plugins": "x.py"}, prefix="task_runner.settings.audit")


ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def docs_example(tmp_path):
    """docs/plugins.md's plug-in module, saved where the page says (a module `src.my_audit`: here a folder added to
    the `src` package's path, so the workspace's own `src/` gets no file), and its plan fragment, as written."""
    import src

    blocks = read_blocks(ROOT / "docs" / "plugins.md", ROOT)
    module = next(b for b in blocks if b.file is not None)
    fragment = yaml.safe_load("\n".join(next(b for b in blocks if b.kind == "yaml").body))
    assert module.file == "src/my_audit.py"
    assert fragment["task_runner"]["settings"]["audit"]["plugins"] == ["src.my_audit"]
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "my_audit.py").write_text("\n".join(module.body) + "\n")
    src.__path__.append(str(folder))
    yield fragment
    src.__path__.remove(str(folder))
    sys.modules.pop("src.my_audit", None)
    unregister("lossgap")
    plugins._LOADED.pop("src.my_audit", None)


@pytest.mark.federation
def test_the_docs_example_runs_as_written(tmp_path, docs_example):
    """The page's module and plan fragment unchanged (its gate under the plan's default bound, upper), plus the
    settings of a tiny run: the step reports its metric and the gate compares it as it is."""
    reports = tmp_path / "reports"
    tiny = {"tasks": {"train": {"kwargs": {"epochs": 1}}},
            "aggregator": {"settings": {"report_dir": str(reports / "aggregator")}},
            "task_runner": {"settings": {"audit": {"report_dir": str(reports), "signals": ["loss"],
                                                   "fpr_tolerance": [0.1], "rmia": {"enabled": False},
                                                   "audit_global": False, "update_attack": False}}}}
    with no_report_drawing():  # the round's record is read, not the report's pages
        run_in_process(tmp_path / "run", collaborators=1, rounds=1, overrides=deep_merge(docs_example, tiny))
    record = json.loads((reports / "collaborator1" / "round_0000" / "audit.json").read_text())
    gap = record["metrics"]["lossgap_gap"]
    gate = record["extra"]["gate"]
    assert gate["bound"] == "upper" and gate["compared"] == {"lossgap_gap": "lossgap_gap"}
    assert gate["thresholds"] == {"lossgap_gap": 0.5} and gate["action"] == "withhold"
    assert gate["verdict"] == ("kept" if gap <= 0.5 else "withheld")
