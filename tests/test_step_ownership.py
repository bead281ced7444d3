"""A step owns its names. A step that returns another step's metric, the gate's or the verdict's, or another step's
membership attack, fails the round naming itself and the name (its update is not sent as if it had passed); a step
that declares another's prefix, or metrics outside its own, is refused at start, whether a plug-in file or module
declares it."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from audit.config import plugins
from audit.config.audit_settings import AuditSettings
from audit.config.fields import SettingsError
from audit.config.gate import GatePolicy
from audit.config.steps import AuditStep, StepContractError, register, registered, unregister
from audit.gate_flow import run_gate
from audit.membership.population_attack import population_attack
from audit.round_audit import StepResult, audit_round
from audit.round_record import AttackKey
from test_audit_steps import models, sets

SETTINGS = {"signals": ["loss"], "fpr_tolerance": [0.1], "audit_global": False, "update_attack": False,
            "rmia": {"enabled": False}}


def liar(returns: dict, attacks: dict | None = None, name: str = "liar"):
    """Register a step `name` (prefix `<name>_`) that returns `returns` and `attacks` whatever it declares."""
    return register(AuditStep(
        name=name, section=name, parse=lambda key, value: _Enabled(),
        metric_names=lambda settings, _: [], metric_prefix=f"{name}_",
        run=lambda context, settings: StepResult(metrics=dict(returns), attacks=attacks)))


@pytest.fixture
def unregistering():
    yield
    for name in ("liar", "decl", "copycat"):
        unregister(name)


class _Enabled:
    enabled = True

    def to_dict(self):
        return {"enabled": True}


def _settings():
    return AuditSettings.from_mapping(SETTINGS)


@pytest.mark.parametrize("metric, whose", [
    ("mia_local_loss_exact_auc", "of step 'membership'"),  # the membership step's figure, which the gate watches
    ("rmia_global_exact_auc", "of step 'rmia'"),
    ("gate_kept", "the gate's"),
    ("gate_tripped__mia_local_loss_exact_auc", "the gate's"),
    ("leak_detected", "the leak verdict's"),
    ("leak_epsilon_lb", "the leak verdict's"),
    ("population__mia_local_loss", "a reserved name"),
    ("accuracy", "no step's"),
])
def test_a_step_returning_a_name_it_does_not_own_fails_the_round_naming_both(unregistering, metric, whose):
    liar({metric: 0.0})
    local, received = models()
    with pytest.raises(StepContractError) as err:
        audit_round(local, received, sets(), _settings(), party="p", round_num=0)
    assert str(err.value).startswith(f"audit step 'liar' returned metric {metric!r} ({whose})"), str(err.value)
    assert "\n" not in str(err.value)


def test_a_lying_step_does_not_get_an_update_past_the_gate(unregistering):
    """The issue's probe: a gate `mia_local_loss_exact_auc <= 0` under withhold, and a step that reports 0.0 for it.
    The flow raises instead of deciding: nothing is sent as if it had passed."""
    liar({"mia_local_loss_exact_auc": 0.0})
    settings = _settings()
    gate = GatePolicy.from_mapping({"action": "withhold", "bound": "point",
                                    "thresholds": {"mia_local_loss_exact_auc": 0.0}}, audit_settings=settings)
    local, received = models()
    with pytest.raises(StepContractError, match="'liar' returned metric 'mia_local_loss_exact_auc'"):
        run_gate(gate, {"w": np.zeros(2)}, audited=True,
                 audit_trained=lambda: audit_round(local, received, sets(), settings, party="p", round_num=0),
                 audit_received=None, empty_record=None, retrain=None, audit_retrained=None)


def test_a_step_cannot_return_the_same_metric_as_an_earlier_one():
    """Registered steps have disjoint prefixes; steps handed to audit_round directly need not be registered, and the
    round still refuses a name twice."""
    def step(name, value):
        return AuditStep(name=name, section=name, parse=lambda key, v: _Enabled(), metric_names=lambda s, a: [],
                         metric_prefix="dup_", run=lambda context, settings: StepResult(metrics={"dup_x": value}))

    settings = _settings()
    first, second = step("first", 1.0), step("second", 0.0)
    settings_of = {"first": _Enabled(), "second": _Enabled()}
    for s in (first, second):
        object.__setattr__(s, "settings_of", lambda audit_settings, name=s.name: settings_of[name])
    local, received = models()
    with pytest.raises(StepContractError, match="'second' returned metric 'dup_x', which step 'first' produced"):
        audit_round(local, received, sets(), settings, party="p", round_num=0, steps=(*registered(), first, second))


def _attack():
    rng = np.random.default_rng(1)
    return population_attack(rng.normal(size=40), rng.normal(size=40), rng.normal(size=60), [0.1], attack="x")


@pytest.mark.parametrize("key, says", [
    (AttackKey("local", "loss"), "which step 'membership' returned this round"),  # the same attack: overwritten
    (AttackKey("local", "logits"), "of model kind 'local', which belongs to step 'membership'"),  # not run, but its
    (AttackKey("rmia", "global"), "of model kind 'rmia', which belongs to step 'rmia'"),  # names: RMIA is off
])
def test_a_step_cannot_return_another_steps_attack(unregistering, key, says):
    liar({}, attacks={key: _attack()})
    local, received = models()
    with pytest.raises(StepContractError) as err:
        audit_round(local, received, sets(), _settings(), party="p", round_num=0)
    assert f"audit step 'liar' returned attack {key.label()!r}" in str(err.value) and says in str(err.value)


def test_a_step_with_its_own_attack_kind_and_metrics_runs(unregistering):
    liar({"liar_gap": 0.5}, attacks={AttackKey("liar", "loss"): _attack()})
    local, received = models()
    record = audit_round(local, received, sets(), _settings(), party="p", round_num=0)
    assert record.metrics["liar_gap"] == 0.5 and record.attack("liar", "loss") is not None
    assert record.attack("local", "loss") is not None  # the membership step's, untouched


def test_declared_metrics_outside_the_prefix_are_refused_at_start(unregistering):
    register(AuditStep(name="decl", section="decl", parse=lambda key, value: _Enabled(),
                       metric_names=lambda s, a: ["decl_ok", "mia_local_loss_exact_auc"], metric_prefix="decl_",
                       run=lambda context, settings: StepResult(metrics={})))
    with pytest.raises(SettingsError, match=r"^task_runner\.settings\.audit\.decl: audit step 'decl' declares metric "
                                            r"'mia_local_loss_exact_auc', outside its metric_prefix 'decl_'"):
        AuditSettings.from_mapping({"decl": {}}, prefix="task_runner.settings.audit")


PLUGIN = textwrap.dedent('''
    from audit.config.steps import AuditStep, register
    from audit.round_audit import StepResult
    register(AuditStep(name="thief", section="thief", parse=lambda key, value: value,
                       metric_names=lambda s, a: [], run=lambda c, s: StepResult(metrics={}), metric_prefix={prefix!r}))
''')


@pytest.mark.parametrize("prefix, overlaps", [("mia_", "'mia_' ('membership')"), ("gate_", "'gate_' (reserved)"),
                                              ("leak_x_", "'leak_' (reserved)"), ("rmia_", "'rmia_' ('rmia')")])
@pytest.mark.parametrize("as_module", [False, True])
def test_a_plugin_declaring_a_taken_prefix_is_refused_at_start_naming_the_entry(tmp_path, monkeypatch, prefix,
                                                                                 overlaps, as_module):
    name = f"thief_{abs(hash((prefix, as_module)))}"
    (tmp_path / f"{name}.py").write_text(PLUGIN.replace("{prefix!r}", repr(prefix)))
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = name if as_module else str(tmp_path / f"{name}.py")
    try:
        with pytest.raises(SettingsError) as err:
            AuditSettings.from_mapping({"plugins": [entry]}, prefix="task_runner.settings.audit")
    finally:
        unregister("thief")
        plugins._LOADED.pop(entry, None)
        plugins._LOADED.pop(str((tmp_path / f"{name}.py").resolve()), None)
        sys.modules.pop(name, None)
    text = str(err.value)
    assert text.startswith("task_runner.settings.audit.plugins[0]: ") and "\n" not in text
    assert f"metric_prefix {prefix!r} overlaps {overlaps}" in text
    assert "thief" not in [s.name for s in registered()]
