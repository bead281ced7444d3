"""The plug-in point: a toy audit step registered from a test (no other module edited) is parsed from the plan, runs
in audit_round, lands in the party's report and can be gated on; and the built-in steps declare exactly the metrics
they report."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from audit.config.audit_settings import AuditSettings
from audit.config.fields import SettingsError, boolean, parse, real, setting, to_dict
from audit.config.gate import GatePolicy, audit_metric_names
from audit.config.steps import AuditStep, register, registered, unregister
from audit.gate_flow import WITHHELD, run_gate
from audit.reporting.party import ReportWriter
from audit.round_audit import AuditSets, StepResult, audit_round


@dataclass(frozen=True)
class ToySettings:
    """A plug-in's settings section: task_runner.settings.audit.toy."""

    enabled: bool = setting(False, boolean(), "run the toy step")
    scale: float = setting(1.0, real(gt=0), "what the toy metric is scaled by")

    def to_dict(self):
        return to_dict(self)


def toy_run(context, settings: ToySettings) -> StepResult:
    """Share of the members the local model classifies right, times the scale: a real computation on the context."""
    x, y = context.sets.tensors("members")
    with torch.no_grad():
        right = (context.local_model(x).argmax(dim=1) == y).double().mean().item()
    return StepResult(metrics={"toy_right_fraction": right * settings.scale / max(settings.scale, 1.0)},
                      details={"members": int(len(y)), "scale": settings.scale})


@pytest.fixture
def toy_step():
    step = register(AuditStep(
        name="toy", section="toy",
        parse=lambda key, value: parse(ToySettings, value, key),
        metric_names=lambda settings, _: ["toy_right_fraction"], run=toy_run, metric_prefix="toy_",
    ))
    yield step
    unregister("toy")


def sets():
    rng = np.random.default_rng(0)

    def make(n):
        return rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 3, size=n)

    return AuditSets(members=make(30), nonmembers=make(30), population=make(40))


def models():
    torch.manual_seed(0)
    received = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    local = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    return local, received


@pytest.mark.slow
def test_a_registered_step_is_parsed_run_reported_and_gated(toy_step, tmp_path):
    settings = AuditSettings.from_mapping({"signals": ["loss"], "fpr_tolerance": [0.1], "toy": {"enabled": True},
                                           "rmia": {"enabled": False}}, prefix="task_runner.settings.audit")
    assert settings.toy == ToySettings(enabled=True) and settings.to_dict()["toy"] == {"enabled": True, "scale": 1.0}
    assert "toy_right_fraction" in audit_metric_names(settings)

    local, received = models()
    record = audit_round(local, received, sets(), settings, party="p", round_num=0, seed=0)
    x, y = sets().members
    expected = float((local(torch.as_tensor(x)).argmax(1).numpy() == y).mean())
    assert record.metrics["toy_right_fraction"] == pytest.approx(expected)
    assert record.extra["toy"] == {"members": 30, "scale": 1.0} and "toy_s" in record.timings
    assert set(record.metrics) == set(audit_metric_names(settings))

    # ... lands in the party's report ...
    round_dir = ReportWriter(tmp_path, "p").write_round(record.to_json())
    stored = json.loads((round_dir / "audit.json").read_text())
    assert stored["metrics"]["toy_right_fraction"] == pytest.approx(expected)
    rows = list(csv.DictReader((tmp_path / "p" / "metrics.csv").open()))
    assert float(rows[0]["toy_right_fraction"]) == pytest.approx(expected)

    # ... and the gate acts on it.
    gate = GatePolicy.from_mapping({"action": "withhold", "bound": "point",
                                    "thresholds": {"toy_right_fraction": expected / 2}}, audit_settings=settings)
    outcome = run_gate(gate, {"w": np.zeros(2)}, audited=True, audit_trained=lambda: record,
                       audit_received=lambda: record, empty_record=dict, retrain=None, audit_retrained=None)
    assert outcome.verdict == WITHHELD and "toy_right_fraction" in outcome.gate_verdict.tripped


def test_a_registered_steps_section_is_checked_by_its_dotted_key(toy_step):
    with pytest.raises(SettingsError, match=r"^task_runner\.settings\.audit\.toy\.scale: expected a finite number > 0"):
        AuditSettings.from_mapping({"toy": {"scale": -1}}, prefix="task_runner.settings.audit")
    with pytest.raises(SettingsError, match=r"^task_runner\.settings\.audit\.toy\.colour: unknown setting"):
        AuditSettings.from_mapping({"toy": {"colour": 1}}, prefix="task_runner.settings.audit")
    # disabled by default: not run, and its metric cannot be gated on
    settings = AuditSettings(sections={"rmia": {"enabled": False}})
    assert "toy_right_fraction" not in audit_metric_names(settings)
    local, received = models()
    assert "toy" not in audit_round(local, received, sets(), settings, party="p", round_num=0).extra


def test_without_the_registration_the_section_is_unknown():
    with pytest.raises(SettingsError, match=r"audit\.toy: unknown setting; known: .*rmia, fidel, deanon"):
        AuditSettings.from_mapping({"toy": {"enabled": True}})


def test_a_name_or_section_cannot_be_registered_twice(toy_step):
    with pytest.raises(ValueError, match="taken by 'toy'"):
        register(AuditStep(name="toy2", section="toy", parse=lambda k, v: v, metric_names=lambda s, a: [], run=toy_run,
                           metric_prefix="toy2_"))


@pytest.mark.parametrize("prefix, overlaps", [("toy_r", "toy_"), ("t", "toy_"), ("mia_x_", "mia_"), ("leak_", "leak_"),
                                              ("gate_", "gate_"), ("", None)])
def test_a_steps_metric_prefix_is_its_own(toy_step, prefix, overlaps):
    """The aggregator and the readers tell a step's metrics by its prefix: no two steps (nor the leak verdict or the
    gate's scalars) may share one."""
    with pytest.raises(ValueError, match="overlaps" if overlaps else "needs a metric_prefix"):
        register(AuditStep(name="other", section="other", parse=lambda k, v: v, metric_names=lambda s, a: [],
                           run=toy_run, metric_prefix=prefix))
    assert "other" not in [s.name for s in registered()]


def test_builtin_steps_run_in_order_and_fidel_keys_moved():
    assert [s.name for s in registered()][:4] == ["membership", "rmia", "fidel", "deanon"]
    with pytest.raises(SettingsError, match=r"^audit\.fidel_layer: moved to audit\.fidel\.layer$"):
        AuditSettings.from_mapping({"fidel_layer": "classifier.0"})
    with pytest.raises(SettingsError, match=r"^audit\.fidel: is a section now; write audit\.fidel\.enabled: true$"):
        AuditSettings.from_mapping({"fidel": True})


def test_config_imports_neither_torch_nor_sklearn():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; import audit.config.gate, audit.config.audit_settings, audit.config.mitigation_settings; "
            "bad = [m for m in ('torch', 'sklearn', 'privacy_meter', 'openfl') if m in sys.modules]; "
            "sys.exit(f'imported: {bad}' if bad else 0)")
    subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], check=True, timeout=120)
