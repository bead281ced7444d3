"""Unit tests of audit.config.gate: parsing and validation of the plan's gate, and its decisions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from audit.config.gate import (
    NON_FINITE_UPDATE,
    DPSettings,
    GatePolicy,
    SettingsError,
    GateVerdict,
    audit_metric_names,
    metric_range,
    non_finite_tensors,
)
from audit.round_audit import AuditSets, LocalTraining, audit_round
from audit.training import TrainingRecipe
from audit.config.audit_settings import AuditSettings
from audit.config.per_collaborator import merge_gate, parse_per_collaborator

AUDIT = AuditSettings()
PREFIX = "task_runner.settings.gate"


def policy(mapping, audit=AUDIT):
    return GatePolicy.from_mapping(mapping, audit_settings=audit)


# ---------------------------------------------------------------------------------------------- decisions


def test_update_is_gated_when_any_metric_is_above_its_threshold():
    gate = policy({"action": "withhold", "bound": "point",
                   "thresholds": {"mia_local_loss_auc": 0.7, "mia_update_loss_reduction_auc": 0.6}})
    verdict = gate.decide({"mia_local_loss_auc": 0.71, "mia_update_loss_reduction_auc": 0.6, "other": 9.0})
    assert not verdict.passed
    assert verdict.tripped == {"mia_local_loss_auc": (0.71, 0.7)}  # 0.6 is not above 0.6
    assert verdict.missing == ()


def test_update_passes_at_or_below_every_threshold():
    gate = policy({"bound": "point", "thresholds": {"mia_local_loss_auc": 0.7, "mia_local_loss_tpr_at_fpr_0.1": 0.3}})
    verdict = gate.decide({"mia_local_loss_auc": 0.7, "mia_local_loss_tpr_at_fpr_0.1": 0.29})
    assert verdict.passed and verdict.tripped == {}


def test_several_tripped_metrics_are_all_reported():
    gate = policy({"bound": "point",
                   "thresholds": {"mia_local_loss_auc": 0.6, "mia_global_logits_tpr_at_fpr_0.01": 0.05}})
    verdict = gate.decide({"mia_local_loss_auc": 0.65, "mia_global_logits_tpr_at_fpr_0.01": 0.2})
    assert verdict.tripped == {"mia_local_loss_auc": (0.65, 0.6), "mia_global_logits_tpr_at_fpr_0.01": (0.2, 0.05)}


def test_no_thresholds_never_gates():
    for mapping in (None, {}, {"action": "withhold"}, {"thresholds": {}}):
        gate = policy(mapping)
        assert not gate.enabled
        assert gate.decide({"mia_local_loss_auc": 1.0}).passed


def test_a_missing_metric_trips_the_gate_like_a_nan_one():
    """Fail closed: a watched value the round did not produce cannot pass, and the reason names it."""
    gate = policy({"bound": "point", "thresholds": {"mia_local_loss_auc": 0.6, "mia_update_loss_reduction_auc": 0.6}})
    verdict = gate.decide({"mia_local_loss_auc": 0.5})
    assert not verdict.passed and verdict.missing == ("mia_update_loss_reduction_auc",)
    assert math.isnan(verdict.tripped["mia_update_loss_reduction_auc"][0])
    assert verdict.reason == "missing: mia_update_loss_reduction_auc"
    assert verdict.to_dict()["tripped"]["mia_update_loss_reduction_auc"] == {"value": None, "threshold": 0.6}
    assert gate.decide({}).missing == ("mia_local_loss_auc", "mia_update_loss_reduction_auc")
    assert gate.decide({"mia_local_loss_auc": 0.7}).reason is None  # over threshold as well: not only missing


@pytest.mark.parametrize("bound", ["upper", "lower"])
def test_a_missing_bound_trips_the_gate_instead_of_falling_back_to_the_estimate(bound):
    """Under bound: upper the estimate 0.65 is below 0.7, but its upper bound is what the gate compares: absent, the
    update does not pass (no silent fallback to the point estimate)."""
    gate = policy({"bound": bound, "thresholds": {"mia_local_loss_exact_auc": 0.7}})
    verdict = gate.decide({"mia_local_loss_exact_auc": 0.65})
    assert not verdict.passed and verdict.missing == ("mia_local_loss_exact_auc",)
    assert verdict.compared == {"mia_local_loss_exact_auc": f"mia_local_loss_exact_auc_{bound}"}


def test_non_finite_metric_trips_the_gate():
    gate = policy({"bound": "point", "thresholds": {"mia_local_loss_auc": 0.6}})
    verdict = gate.decide({"mia_local_loss_auc": float("nan")})
    assert not verdict.passed and "mia_local_loss_auc" in verdict.tripped
    assert verdict.to_dict()["tripped"]["mia_local_loss_auc"] == {"value": None, "threshold": 0.6}  # strict JSON


def test_non_finite_verdict_and_dict():
    verdict = GateVerdict.non_finite()
    assert not verdict.passed and verdict.tripped == {NON_FINITE_UPDATE: (1.0, 0.0)}
    assert verdict.to_dict() == {
        "passed": False, "tripped": {NON_FINITE_UPDATE: {"value": 1.0, "threshold": 0.0}}, "missing": [],
        "bound": "point", "compared": {},
    }


def test_non_finite_tensors_names_every_broken_tensor():
    tensors = {
        "a": np.zeros((2, 2), np.float32),
        "b": np.array([1.0, np.nan], np.float32),
        "c": np.array([np.inf]),
        "d": np.array(["true"]),  # non-numeric (e.g. OpenFL's __opt_state_needed) is skipped
        "e": np.array([1, 2]),
    }
    assert non_finite_tensors(tensors) == ["b", "c"]
    assert non_finite_tensors({"a": tensors["a"]}) == []


# ---------------------------------------------------------------------------------------------- parsing


def test_defaults():
    gate = policy(None)
    assert gate.action == "report_only" and dict(gate.thresholds) == {} and gate.bound == "upper"
    assert gate.dp == DPSettings(noise_multiplier=1.0, max_grad_norm=1.0, max_retries=2, delta=1e-5)


def test_plan_values_are_parsed_and_normalised():
    gate = policy({
        "action": "dp_retrain", "bound": "point", "epsilon_budget": 2,
        "thresholds": {"mia_local_loss_tpr_at_fpr_0.1": 0.3, "mia_update_loss_reduction_auc": 1},
        "dp": {"noise_multiplier": 2, "max_grad_norm": 0.5, "max_retries": 3, "delta": 1e-6},
    })
    assert gate.action == "dp_retrain"
    assert dict(gate.thresholds) == {"mia_local_loss_tpr_at_fpr_0.1": 0.3, "mia_update_loss_reduction_auc": 1.0}
    assert isinstance(gate.thresholds["mia_update_loss_reduction_auc"], float)
    assert gate.dp.to_dict() == {"noise_multiplier": 2.0, "max_grad_norm": 0.5, "max_retries": 3, "delta": 1e-6}
    assert gate.to_dict()["action"] == "dp_retrain"
    assert gate.epsilon_budget == 2.0 and isinstance(gate.epsilon_budget, float)
    assert gate.limits == {**gate.thresholds, "leak_epsilon_lb": 2.0}
    with pytest.raises(TypeError):
        gate.thresholds["x"] = 1.0  # read-only


# The audit's figures of one round: the exact AUC 0.62 with its interval [0.55, 0.69], TPR at FPR 0.1 0.2 [0.12, 0.3],
# an epsilon lower bound (a lower bound itself: no interval) and the grid AUC (no interval).
ROUND = {"mia_local_loss_exact_auc": 0.62, "mia_local_loss_exact_auc_lower": 0.55, "mia_local_loss_exact_auc_upper": 0.69,
         "mia_local_loss_tpr_at_fpr_0.1": 0.2, "mia_local_loss_tpr_at_fpr_0.1_lower": 0.12,
         "mia_local_loss_tpr_at_fpr_0.1_upper": 0.3, "mia_local_loss_epsilon_lb": 0.4, "mia_local_loss_auc": 0.61}


@pytest.mark.parametrize("bound, threshold, passes", [
    ("point", 0.6, False), ("point", 0.65, True),
    ("upper", 0.65, False), ("upper", 0.69, True),   # passes only when significantly below
    ("lower", 0.6, True), ("lower", 0.54, False),    # gated only when significantly above
])
def test_the_bound_says_which_value_meets_the_threshold(bound, threshold, passes):
    gate = policy({"action": "withhold", "bound": bound, "thresholds": {"mia_local_loss_exact_auc": threshold}})
    verdict = gate.decide(ROUND)
    compared = "mia_local_loss_exact_auc" + ("" if bound == "point" else f"_{bound}")
    assert verdict.passed is passes and verdict.compared == {"mia_local_loss_exact_auc": compared}
    if not passes:
        assert verdict.tripped == {"mia_local_loss_exact_auc": (ROUND[compared], threshold)}
    assert verdict.to_dict()["bound"] == bound and gate.to_dict()["bound"] == bound


@pytest.mark.parametrize("bound", ["upper", "lower", "point"])
@pytest.mark.parametrize("metric", [
    "mia_local_loss_auc",                   # the grid AUC has no interval
    "mia_local_loss_epsilon_lb",            # a lower confidence bound itself
    "mia_local_loss_tpr_at_fpr_0.1_lower",  # a bound has no bound of its own
    "mia_local_loss_exact_auc_upper",
])
def test_a_metric_the_audit_reports_no_bound_for_is_compared_as_it_is(bound, metric):
    gate = policy({"action": "withhold", "bound": bound, "thresholds": {metric: 0.5}})
    assert gate.compared_name(metric) == metric
    verdict, value = gate.decide(ROUND), ROUND[metric]
    assert verdict.compared == {metric: metric} and verdict.missing == ()
    assert verdict.passed == (value <= 0.5) and (verdict.tripped == {metric: (value, 0.5)}) == (value > 0.5)


def test_the_documented_forms_work_under_the_default_bound():
    """docs/gate.md: a threshold naming a bound and a metric without an interval are compared as they are under the
    default `bound: upper`; a metric with an interval is compared by its upper bound."""
    gate = policy({"action": "withhold", "thresholds": {"mia_local_loss_exact_auc_lower": 0.6,
                                                        "mia_local_loss_epsilon_lb": 0.3,
                                                        "mia_local_loss_tpr_at_fpr_0.1": 0.25}})
    assert gate.bound == "upper"
    verdict = gate.decide(ROUND)
    assert verdict.compared == {"mia_local_loss_exact_auc_lower": "mia_local_loss_exact_auc_lower",
                                "mia_local_loss_epsilon_lb": "mia_local_loss_epsilon_lb",
                                "mia_local_loss_tpr_at_fpr_0.1": "mia_local_loss_tpr_at_fpr_0.1_upper"}
    # 0.55 <= 0.6 passes; the epsilon bound 0.4 > 0.3 and the TPR's upper bound 0.3 > 0.25 trip
    assert verdict.tripped == {"mia_local_loss_epsilon_lb": (0.4, 0.3), "mia_local_loss_tpr_at_fpr_0.1": (0.3, 0.25)}
    assert verdict.to_dict()["compared"]["mia_local_loss_epsilon_lb"] == "mia_local_loss_epsilon_lb"


def test_a_policy_built_without_the_audits_names_compares_the_bound_and_fails_closed():
    """`as_they_are` comes from the plan's audit (from_mapping); a policy built in code without it compares the
    bound, which the round lacks for a metric without an interval: it trips as missing, never passes unchecked."""
    gate = GatePolicy(action="withhold", thresholds={"mia_local_loss_auc": 0.99})
    verdict = gate.decide(ROUND)
    assert not verdict.passed and verdict.missing == ("mia_local_loss_auc",)
    assert verdict.compared == {"mia_local_loss_auc": "mia_local_loss_auc_upper"}


def test_a_collaborators_gate_decides_its_own_bound_for_each_metric():
    """A per-collaborator gate is read against the same audit: its metrics without an interval are compared as
    they are under its own bound too."""
    default, cols = parse_per_collaborator({"c2": {"gate": {"bound": "lower"}}}, audit_settings=AUDIT,
                                           gate={"action": "withhold", "thresholds": {
                                               "mia_local_loss_epsilon_lb": 0.3, "mia_local_loss_exact_auc": 0.6}})
    assert default.gate.compared_name("mia_local_loss_epsilon_lb") == "mia_local_loss_epsilon_lb"
    assert default.gate.compared_name("mia_local_loss_exact_auc") == "mia_local_loss_exact_auc_upper"
    assert cols["c2"].gate.compared_name("mia_local_loss_epsilon_lb") == "mia_local_loss_epsilon_lb"
    assert cols["c2"].gate.compared_name("mia_local_loss_exact_auc") == "mia_local_loss_exact_auc_lower"


def test_a_collaborators_bound_is_merged_key_by_key():
    default, cols = parse_per_collaborator({"c2": {"gate": {"bound": "point"}}}, audit_settings=AUDIT,
                                           gate={"action": "withhold", "bound": "lower",
                                                 "thresholds": {"mia_local_loss_exact_auc": 0.6}})
    assert default.gate.bound == "lower" and cols["c2"].gate.bound == "point"
    assert dict(cols["c2"].gate.thresholds) == {"mia_local_loss_exact_auc": 0.6}
    with pytest.raises(SettingsError, match=r"^task_runner\.settings\.per_collaborator\.c2\.gate\.bound: unknown"):
        parse_per_collaborator({"c2": {"gate": {"bound": "mean"}}}, audit_settings=AUDIT, gate=None)


def test_noise_doubles_on_each_try():
    dp = DPSettings(noise_multiplier=0.5)
    assert [dp.noise_for_try(i) for i in (1, 2, 3)] == [0.5, 1.0, 2.0]


@pytest.mark.parametrize(
    "mapping, key, words",
    [
        ({"action": "block"}, f"{PREFIX}.action", "unknown action"),
        ({"thresholds": {"mia_local_foo_auc": 0.5}}, f"{PREFIX}.thresholds.mia_local_foo_auc", "unknown metric"),
        ({"thresholds": {"mia_local_loss_tpr_at_fpr_0.2": 0.5}}, f"{PREFIX}.thresholds.mia_local_loss_tpr_at_fpr_0.2",
         "unknown metric"),
        ({"thresholds": {"mia_local_loss_auc": 1.5}}, f"{PREFIX}.thresholds.mia_local_loss_auc", "out of range"),
        ({"thresholds": {"mia_local_loss_auc": -0.1}}, f"{PREFIX}.thresholds.mia_local_loss_auc", "out of range"),
        ({"thresholds": {"mia_local_loss_auc": "high"}}, f"{PREFIX}.thresholds.mia_local_loss_auc", "expected a number"),
        ({"thresholds": {"mia_local_loss_auc": True}}, f"{PREFIX}.thresholds.mia_local_loss_auc", "expected a number"),
        ({"thresholds": {"mia_local_loss_auc": float("nan")}}, f"{PREFIX}.thresholds.mia_local_loss_auc",
         "expected a number"),
        ({"thresholds": {"leak_epsilon_lb": 1.0}}, f"{PREFIX}.thresholds.leak_epsilon_lb", "epsilon_budget"),
        ({"epsilon_budget": -1}, f"{PREFIX}.epsilon_budget", "expected a finite number >= 0"),
        ({"epsilon_budget": float("inf")}, f"{PREFIX}.epsilon_budget", "expected a finite number >= 0"),
        ({"epsilon_budget": "1"}, f"{PREFIX}.epsilon_budget", "expected a finite number >= 0"),
        ({"thresholds": [0.5]}, f"{PREFIX}.thresholds", "expected a mapping"),
        ({"dp": {"noise_multiplier": 0}}, f"{PREFIX}.dp.noise_multiplier", "> 0"),
        ({"dp": {"max_grad_norm": float("inf")}}, f"{PREFIX}.dp.max_grad_norm", "finite"),
        ({"dp": {"max_retries": 0}}, f"{PREFIX}.dp.max_retries", "integer in [1, 30]"),
        ({"dp": {"max_retries": 31}}, f"{PREFIX}.dp.max_retries", "integer in [1, 30]"),
        ({"dp": {"max_retries": 1.5}}, f"{PREFIX}.dp.max_retries", "integer"),
        ({"dp": {"delta": 1.0}}, f"{PREFIX}.dp.delta", "(0, 1)"),
        ({"dp": {"epsilon": 1.0}}, f"{PREFIX}.dp.epsilon", "unknown setting"),
        ({"treshold": {}}, f"{PREFIX}.treshold", "unknown setting"),
        ({"bound": "upper95"}, f"{PREFIX}.bound", "unknown bound 'upper95'; known: point, lower, upper"),
        ({"bound": None}, f"{PREFIX}.bound", "unknown bound"),
        ({"thresholds": {"mia_local_loss_epsilon_lb": -1}}, f"{PREFIX}.thresholds.mia_local_loss_epsilon_lb",
         "allowed: >= 0"),
        ({"thresholds": {"mia_local_loss_exact_auc_upper": 1.2}}, f"{PREFIX}.thresholds.mia_local_loss_exact_auc_upper",
         "allowed: [0, 1]"),
        ({"thresholds": {"mia_local_loss_advantage": 2}}, f"{PREFIX}.thresholds.mia_local_loss_advantage",
         "allowed: [0, 1]"),
        ("withhold", PREFIX, "expected a mapping"),
    ],
)
def test_bad_values_name_the_dotted_key(mapping, key, words):
    with pytest.raises(SettingsError) as err:
        policy(mapping)
    message = str(err.value)
    assert message.startswith(key + ":"), message
    assert words in message


def test_unknown_metric_message_suggests_the_nearest_names_in_one_short_line():
    audit = AuditSettings(signals=("loss",), fpr_tolerance=(0.1,), audit_global=False, sections={"rmia": {"enabled": False}})
    with pytest.raises(SettingsError) as err:
        policy({"bound": "point", "thresholds": {"mia_global_loss_auc": 0.6}}, audit)
    assert str(err.value).startswith(f"{PREFIX}.thresholds.mia_global_loss_auc: unknown metric; did you mean "
                                     "mia_local_loss_auc")
    with pytest.raises(SettingsError) as err:  # the default audit produces hundreds of names: never all of them
        policy({"thresholds": {"mia_lcoal_loss_exact_auc": 0.6}})
    assert "did you mean mia_local_loss_exact_auc" in str(err.value) and len(str(err.value)) < 300
    with pytest.raises(SettingsError) as err:
        policy({"thresholds": {"zzz": 0.6}})
    assert "the audit's metrics start with" in str(err.value) and len(str(err.value)) < 300


def test_exact_auc_is_gateable():
    """The members-vs-non-members AUC over every threshold (audit.membership.population_attack, exact_auc) is a gate metric
    with the AUC range."""
    gate = policy({"action": "withhold", "bound": "point",
                   "thresholds": {"mia_local_loss_exact_auc": 0.7, "mia_update_loss_reduction_exact_auc": 0.6}})
    verdict = gate.decide({"mia_local_loss_exact_auc": 0.75, "mia_local_loss_auc": 0.65,
                           "mia_update_loss_reduction_exact_auc": 0.55})
    assert verdict.tripped == {"mia_local_loss_exact_auc": (0.75, 0.7)}
    with pytest.raises(SettingsError, match=r"mia_local_loss_exact_auc: 1\.2 is out of range; allowed: \[0, 1\]"):
        policy({"thresholds": {"mia_local_loss_exact_auc": 1.2}})


def test_thresholds_need_an_enabled_audit():
    with pytest.raises(SettingsError, match=r"audit\.enabled is false"):
        policy({"thresholds": {"mia_local_loss_auc": 0.6}}, AuditSettings(enabled=False))
    with pytest.raises(SettingsError, match=r"^task_runner\.settings\.gate\.epsilon_budget: .*audit\.enabled is false"):
        policy({"epsilon_budget": 1.0}, AuditSettings(enabled=False))
    assert not policy({"action": "withhold"}, AuditSettings(enabled=False)).enabled


# ---------------------------------------------------------------------------------------------- metric names


def _random_sets(seed=0, n=24):
    rng = np.random.default_rng(seed)
    make = lambda: (rng.normal(size=(n, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, n))  # noqa: E731
    return AuditSets(members=make(), nonmembers=make(), population=make())


@pytest.mark.parametrize(
    "audit",
    [
        AuditSettings(),
        AuditSettings(signals=("gradient_norm",), fpr_tolerance=(0.05, 0.25), audit_global=False,
                      sections={"rmia": {"references": ["independent"], "reference_models": 1}}),
        AuditSettings(signals=("logits", "loss"), update_attack=False, fpr_tolerance=(0.001,),
                      sections={"rmia": {"enabled": False}}),
        AuditSettings(signals=("loss",), sections={"rmia": {"references": ["global", "fine_tuned"],
                                                            "offline_a": 0.5, "gamma": 2}}),
    ],
)
def test_audit_metric_names_are_what_a_real_audit_reports(audit):
    torch.manual_seed(0)
    local = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    received = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    initial = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    training = LocalTraining(TrainingRecipe("SGD", 0.05, 0.9, epochs=1, batch_size=8), member_count=24,
                             federation_alpha=None)
    record = audit_round(local, received, _random_sets(n=40), audit, party="p", round_num=0, training=training,
                         initial_model=initial)
    assert audit_metric_names(audit) == tuple(sorted(record.metrics))


# ---------------------------------------------------------------------------------------------- step metrics


def test_a_steps_metrics_can_be_gated_only_when_its_section_is_enabled():
    both = AuditSettings.from_mapping({"fidel": {"enabled": True}, "deanon": {"enabled": True}})
    gate = policy({"bound": "point", "thresholds": {"fidel_revealed_fraction": 0.1, "deanon_ap_over_chance": 3.0}}, both)
    assert gate.decide({"fidel_revealed_fraction": 0.2, "deanon_ap_over_chance": 2.0}).tripped == {
        "fidel_revealed_fraction": (0.2, 0.1)
    }
    with pytest.raises(SettingsError, match=r"thresholds\.fidel_revealed_fraction: 1\.2 is out of range"):
        policy({"bound": "point", "thresholds": {"fidel_revealed_fraction": 1.2}}, both)
    with pytest.raises(SettingsError, match=r"thresholds\.deanon_ap_over_chance: -1 is out of range; allowed: >= 0"):
        policy({"bound": "point", "thresholds": {"deanon_ap_over_chance": -1}}, both)
    with pytest.raises(SettingsError, match="unknown metric"):
        policy({"bound": "point", "thresholds": {"fidel_revealed_fraction": 0.1}})  # the default audit runs no Fidel


def test_metric_ranges_by_suffix():
    assert metric_range("mia_local_loss_auc") == (0.0, 1.0)
    assert metric_range("mia_local_loss_tpr_at_fpr_0.01") == (0.0, 1.0)
    assert metric_range("x_ap_over_chance") == (0.0, math.inf)
    assert metric_range("deanon_mlp_own_rank") == (1.0, math.inf)
    assert metric_range("something_else") is None


# ---------------------------------------------------------------------------------------------- per collaborator


def test_per_collaborator_gate_is_merged_into_the_plan_wide_one():
    plan_gate = {"action": "withhold", "bound": "point", "thresholds": {"mia_local_loss_auc": 0.7},
                 "dp": {"max_retries": 3}}
    assert merge_gate(plan_gate, {"dp": {"delta": 1e-6}}) == {
        "action": "withhold", "bound": "point", "thresholds": {"mia_local_loss_auc": 0.7},
        "dp": {"max_retries": 3, "delta": 1e-6},
    }
    default, cols = parse_per_collaborator(
        {"collaborator2": {"epochs": 20, "learning_rate": 0.01,
                           "gate": {"action": "dp_retrain", "thresholds": {"mia_update_loss_reduction_auc": 0.6}}},
         "collaborator3": {"epochs": 2}},
        gate=plan_gate, audit_settings=AUDIT,
    )
    assert default.gate.action == "withhold" and default.gate.dp.max_retries == 3
    two = cols["collaborator2"]
    assert (two.epochs, two.learning_rate, two.gate.action) == (20, 0.01, "dp_retrain")
    assert dict(two.gate.thresholds) == {"mia_update_loss_reduction_auc": 0.6}  # replaced as a whole
    assert two.gate.dp.max_retries == 3  # dp merged key by key
    assert cols["collaborator3"].gate == default.gate and cols["collaborator3"].learning_rate is None


def test_per_collaborator_mitigation_replaces_the_plan_wide_one():
    default, cols = parse_per_collaborator(
        {"collaborator2": {"mitigation": {"method": "mm_aug", "alpha": 0.5}}, "collaborator3": {"epochs": 2}},
        gate=None, audit_settings=AUDIT, mitigation={"method": "noise", "sigma": 0.01},
    )
    assert (default.mitigation.method, default.mitigation.sigma) == ("noise", 0.01)
    assert (cols["collaborator2"].mitigation.method, cols["collaborator2"].mitigation.alpha) == ("mm_aug", 0.5)
    assert cols["collaborator3"].mitigation == default.mitigation


@pytest.mark.parametrize(
    "plan_wide, per_collaborator, key",
    [
        ({"method": "blur"}, None, "task_runner.settings.mitigation.method"),
        (None, {"collaborator2": {"mitigation": {"method": "bkg_repl", "alpha": 2}}},
         "task_runner.settings.per_collaborator.collaborator2.mitigation.alpha"),
    ],
)
def test_bad_mitigation_names_the_dotted_key(plan_wide, per_collaborator, key):
    with pytest.raises(ValueError) as err:
        parse_per_collaborator(per_collaborator, gate=None, audit_settings=AUDIT, mitigation=plan_wide)
    assert str(err.value).startswith(key + ":"), str(err.value)


@pytest.mark.parametrize(
    "per_collaborator, key",
    [
        ({"collaborator2": {"epoch": 20}}, "task_runner.settings.per_collaborator.collaborator2.epoch"),
        ({"collaborator2": {"epochs": 0}}, "task_runner.settings.per_collaborator.collaborator2.epochs"),
        ({"collaborator2": {"learning_rate": -1}}, "task_runner.settings.per_collaborator.collaborator2.learning_rate"),
        ({"collaborator2": {"gate": {"action": "drop"}}}, "task_runner.settings.per_collaborator.collaborator2.gate.action"),
        ({"collaborator2": {"gate": {"thresholds": {"mia_x_auc": 0.5}}}},
         "task_runner.settings.per_collaborator.collaborator2.gate.thresholds.mia_x_auc"),
        ({"collaborator2": 20}, "task_runner.settings.per_collaborator.collaborator2"),
        ([{"collaborator2": {}}], "task_runner.settings.per_collaborator"),
    ],
)
def test_bad_per_collaborator_values_name_the_dotted_key(per_collaborator, key):
    with pytest.raises(SettingsError) as err:
        parse_per_collaborator(per_collaborator, gate=None, audit_settings=AUDIT)
    assert str(err.value).startswith(key + ":"), str(err.value)


def test_docs_gate_pages_example_is_accepted_and_compares_what_it_says():
    """docs/gate.md's plan fragment, under the plan's own audit settings: each threshold compares the metric its
    comment names."""
    import re
    from pathlib import Path

    import yaml

    from tools.docs_check import read_blocks
    from workspace.plan_file import read_plan

    root = Path(__file__).resolve().parent.parent
    (block,) = [b for b in read_blocks(root / "docs" / "gate.md", root) if b.kind == "yaml"]
    gate = yaml.safe_load("\n".join(block.body))["task_runner"]["settings"]["gate"]
    audit = AuditSettings.from_mapping(read_plan(root / "plan" / "plan.yaml")["task_runner"]["settings"]["audit"])
    policy = GatePolicy.from_mapping(gate, audit_settings=audit)
    said = {}
    for line in block.body:
        found = re.match(r"\s+(\w+): [\d.]+\s+# (?:compared: its upper bound, (\w+)|.*as it is)", line)
        if found:
            said[found.group(1)] = found.group(2) or found.group(1)
    assert len(said) == 3 and {name: policy.compared_name(name) for name in policy.thresholds} == said
