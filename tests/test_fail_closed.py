"""Fail closed, end to end: a gate metric a round did not produce withholds the update, and says so in the party's
record, the aggregator's report and the run summary; a plan under which a gate metric cannot exist in every audited
round is refused before anything is written; a step added through the registry reaches every consumer (the
aggregator's averages and metrics.csv) with no edit elsewhere; RMIA whose references all diverged produces no
metrics, and a gate on them fails closed."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from audit.config.audit_settings import AuditSettings
from audit.config.fields import SettingsError
from audit.config.gate import GatePolicy
from audit.config.steps import AuditStep, register, unregister
from audit.gate_flow import WITHHELD, run_gate
from audit.round_audit import AuditSets, LocalTraining, StepResult, audit_round
from audit.training import TrainingRecipe
from report_drawing import pages_drawn_at_the_end
from workspace.in_process import run_in_process
from workspace.run_summary import summary_lines

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def toy_run(context, settings) -> StepResult:
    """The share of members the local model classifies right; in round 1 it produces nothing (a step that could not
    measure, as a failed computation would)."""
    if context.round_num == 1:
        return StepResult(metrics={}, details={"skipped": "round 1"})
    x, y = context.sets.tensors("members")
    with torch.no_grad():
        right = float((context.local_model(x).argmax(dim=1) == y).double().mean())
    return StepResult(metrics={"toy_score": right})


@pytest.fixture(scope="module")
def toy_step():
    step = register(AuditStep(name="toy", section=None, parse=None, metric_names=lambda s, a: ["toy_score"],
                              run=toy_run, metric_prefix="toy_", needs_global=False))
    yield step
    unregister("toy")


@pytest.fixture(scope="module")
def run(toy_step, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fail_closed")
    overrides = {
        "tasks": {"train": {"kwargs": {"epochs": 1}}},
        "data_loader": {"settings": {"seed": 0}},
        "task_runner": {"settings": {
            "seed": 0,
            "audit": {"report_dir": str(tmp / "reports"), "signals": ["loss"], "fpr_tolerance": [0.1],
                      "rmia": {"references": ["global"]}},
            "gate": {"action": "withhold", "bound": "point", "thresholds": {"toy_score": 1.0}},
        }},
        "aggregator": {"settings": {"report_dir": str(tmp / "reports" / "aggregator")}},
    }
    with pages_drawn_at_the_end():  # the aggregator's page and metrics.csv are read, not a round's images
        result = run_in_process(tmp / "run", collaborators=2, rounds=3, overrides=overrides)
    return result, tmp / "reports"


@pytest.mark.federation
def test_a_round_without_the_gate_metric_is_withheld_and_says_why(run):
    result, reports = run
    for col in ("collaborator1", "collaborator2"):
        gates = [json.loads((reports / col / f"round_{r:04d}" / "audit.json").read_text())["extra"]["gate"]
                 for r in range(3)]
        assert [g["verdict"] for g in gates] == ["kept", "withheld", "kept"]
        assert gates[1]["reason"] == "missing: toy_score" and gates[1]["missing"] == ["toy_score"]
        assert result.collaborator_metrics[1][f"{col}/train/gate_kept"] == 0.0
        assert result.collaborator_metrics[1][f"{col}/train/gate_missing__toy_score"] == 1.0
        assert result.collaborator_metrics[0][f"{col}/train/gate_missing__toy_score"] == 0.0
    agg = json.loads((reports / "aggregator" / "round_0001.json").read_text())
    assert agg["kept"] == [] and sorted(agg["withheld"]) == ["collaborator1", "collaborator2"]
    assert "missing: toy_score" in agg["collaborators"]["collaborator1"]["reason"]
    page = (reports / "aggregator" / "index.html").read_text()
    assert "missing this round: gated (fail closed)" in page
    lines = "\n".join(summary_lines({c: reports / c for c in ("collaborator1", "collaborator2")},
                                    reports / "aggregator", 3))
    assert "round 1: collaborator1 withheld (missing: toy_score)" in lines


@pytest.mark.federation
def test_a_registered_steps_metrics_and_every_family_reach_the_aggregators_metrics_csv(run):
    _, reports = run
    rows = list(csv.DictReader((reports / "aggregator" / "metrics.csv").open()))
    columns = set(rows[0])
    for name in ("toy_score", "rmia_global_exact_auc", "mia_local_loss_exact_auc", "leak_detected",
                 "leak_epsilon_lb", "leak_p_value", "worst:toy_score", "worst:rmia_global_exact_auc"):
        assert name in columns, name
    assert rows[1]["toy_score"] in ("", "nan")  # round 1: the step produced nothing, sent as NaN
    assert 0.0 <= float(rows[0]["toy_score"]) <= 1.0 and float(rows[0]["leak_detected"]) in (0.0, 0.5, 1.0)


@pytest.mark.federation
def test_a_plan_whose_gate_metric_skips_audited_rounds_is_refused_before_anything_is_written(tmp_path):
    overrides = {"task_runner": {"settings": {
        "audit": {"rmia": {"interval": 2}},
        "gate": {"action": "withhold", "thresholds": {"rmia_global_exact_auc": 0.9}}}}}
    with pytest.raises(SettingsError) as err:
        run_in_process(tmp_path / "run", collaborators=2, rounds=2, overrides=overrides)
    message = str(err.value)
    assert message.startswith("task_runner.settings.gate.thresholds.rmia_global_exact_auc: the audit does not produce "
                              "it in every audited round")
    assert "task_runner.settings.audit.rmia.interval: 2" in message
    assert not (tmp_path / "run").exists()


def test_a_step_schedule_that_divides_the_audit_schedule_is_accepted():
    audit = AuditSettings.from_mapping({"interval": 4, "rmia": {"interval": 2}})
    gate = GatePolicy.from_mapping({"thresholds": {"rmia_global_exact_auc": 0.9}}, audit_settings=audit)
    assert dict(gate.thresholds) == {"rmia_global_exact_auc": 0.9}
    with pytest.raises(SettingsError, match=r"audit\.deanon\.interval: 3 skips round 2"):
        GatePolicy.from_mapping({"bound": "point", "thresholds": {"deanon_ap_over_chance": 2.0}},
                                audit_settings=AuditSettings.from_mapping(
                                    {"interval": 2, "deanon": {"enabled": True, "interval": 3}}))


@pytest.mark.slow
def test_rmia_whose_references_all_diverged_produces_no_metrics_and_its_gate_fails_closed():
    """The references train with the party's recipe; at a learning rate of 1e38 every one diverges. There is then no
    RMIA of that kind: no value stands in for it, and a gate on it withholds the update with the reason."""
    rng = np.random.default_rng(4)

    def sets(n):
        x = rng.normal(size=(n, 1, 6, 6)).astype(np.float32)  # image-shaped, BatchNorm model below
        return x, rng.integers(0, 4, size=n)

    torch.manual_seed(4)

    def model():
        return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(48, 4))

    settings = AuditSettings.from_mapping({"signals": ["loss"], "fpr_tolerance": [0.1],
                                           "rmia": {"references": ["global", "independent"], "reference_models": 2}})
    diverging = LocalTraining(TrainingRecipe("SGD", 1e38, 0.9, epochs=2, batch_size=10), member_count=30,
                              federation_alpha=None)
    record = audit_round(model(), model(), AuditSets(sets(30), sets(30), sets(60)), settings, party="p", round_num=0,
                         training=diverging, initial_model=model())
    assert "rmia_global_exact_auc" in record.metrics
    assert not any(name.startswith("rmia_independent_") for name in record.metrics)
    assert "diverged" in record.extra["rmia"]["independent"]["skipped"]
    gate = GatePolicy.from_mapping({"action": "withhold", "thresholds": {"rmia_independent_exact_auc": 0.99}},
                                   audit_settings=settings)
    out = run_gate(gate, {"w": np.zeros(2)}, audited=True, audit_trained=lambda: record,
                   audit_received=lambda: record, empty_record=dict, retrain=None, audit_retrained=None)
    assert (out.verdict, out.reason) == (WITHHELD, "missing: rmia_independent_exact_auc")
    assert math.isnan(out.gate_verdict.tripped["rmia_independent_exact_auc"][0])


@pytest.mark.slow
def test_rmia_whose_references_give_probability_zero_is_skipped_not_a_crash():
    """A model whose outputs are hundreds apart (an untrained ResNet-like net in eval mode can give that) makes the
    references' true-class probabilities underflow to 0: with offline_a 1, Pr(x) = 0 and RMIA cannot score the sample.
    The kind is left out with the reason, the round's other attacks stand, and a gate on it fails closed."""
    rng = np.random.default_rng(5)

    def sets(n):
        return rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, size=n)

    torch.manual_seed(5)

    def model():  # a huge output scale: true-class log-probabilities far below exp's range at temperature 1
        net = nn.Sequential(nn.Linear(4, 3))
        with torch.no_grad():
            net[0].weight.mul_(5000.0)
        return net

    settings = AuditSettings.from_mapping({"signals": ["loss"], "fpr_tolerance": [0.1],
                                           "rmia": {"references": ["independent"], "reference_models": 2,
                                                    "offline_a": 1.0, "temperature": 1.0}})
    training = LocalTraining(TrainingRecipe("SGD", 1e-9, 0.0, epochs=1, batch_size=10), member_count=30,
                             federation_alpha=None)
    record = audit_round(model(), model(), AuditSets(sets(30), sets(30), sets(60)), settings, party="p", round_num=0,
                         training=training, initial_model=model())
    assert "Pr(x) must be finite and > 0" in record.extra["rmia"]["independent"]["skipped"]
    assert not any(name.startswith("rmia_") for name in record.metrics)
    assert "mia_local_loss_exact_auc" in record.metrics and record.leak["tests"] > 0
