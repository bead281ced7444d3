"""Tests for audit.config.audit_settings: defaults, validation errors naming the dotted key, round trip, schedule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from audit.membership.population_attack import THRESHOLD_FUNCTIONS
from audit.config.audit_settings import AuditSettings, SettingsError

REPO = Path(__file__).resolve().parents[1]

DEFAULTS = {
    "enabled": True,
    "signals": ["loss", "logits", "gradient_norm"],
    "fpr_tolerance": [0.001, 0.01, 0.1, 0.5],
    "interval": 1,
    "gradient_layer": None,
    "threshold_function": "linear_itp",
    "batch_size": 256,
    "sample_size": 1000,
    "audit_global": True,
    "update_attack": True,
    "log_scale": True,
    "report_dir": "reports",
    "confidence": 0.95,
    "epsilon_delta": 1e-5,
    "plugins": [],
    "rmia": {"enabled": True, "interval": 1, "references": ["global", "independent"],
             "reference_models": 1, "reference_budget": None, "temperature": 2.0, "offline_a": "tune", "gamma": 1.0},
    "fidel": {"enabled": False, "layer": None, "threshold": 0.98, "decoder": False},
    "deanon": {
        "enabled": False, "interval": 1, "crowd_users": 10, "shadows_per_user": 8, "shadow_size": None,
        "layer": None, "attacks": ["mlp", "svm", "knn", "siamese"], "crowd_alpha": "federation",
    },
    "received_model": {"enabled": True, "action": "reject", "max_change_ratio": 10.0, "parallel_rows": 4,
                       "min_support": 0.15, "max_isolating": 0.25, "class_weight_ratio": 10.0, "probe_margin": 0.25,
                       "probe_alpha": 0.01},
    "canary": {"enabled": False, "interval": 1, "count": 500, "construction": "noise", "score": "loss",
               "dp_check": True, "gradient_count": "auto", "gradient_kind": "dirac", "gradient_norm": 10.0},
    "cross_round": {"enabled": False, "signal": "logits", "rounds_kept": 20, "aggregation": "weighted_average",
                    "weights": {}},
}
DEFAULTS_SIGNALS = tuple(DEFAULTS["signals"])


@pytest.mark.parametrize("mapping", [None, {}])
def test_defaults(mapping):
    settings = AuditSettings.from_mapping(mapping)
    assert settings == AuditSettings()
    assert settings.to_dict() == DEFAULTS
    assert settings.signals == ("loss", "logits", "gradient_norm")
    assert settings.fpr_tolerance == (0.001, 0.01, 0.1, 0.5)
    assert settings.gradient_layer is None


def test_plan_values():
    settings = AuditSettings.from_mapping(
        {
            "enabled": False,
            "signals": ["gradient_norm", "loss"],
            "fpr_tolerance": [0.001, 0.2],
            "interval": 3,
            "gradient_layer": "classifier.0",
            "threshold_function": "min_linear_logit",
            "batch_size": 32,
            "audit_global": False,
            "update_attack": False,
            "log_scale": True,
            "report_dir": "out/reports",
        }
    )
    assert settings.enabled is False
    assert settings.signals == ("gradient_norm", "loss")
    assert settings.fpr_tolerance == (0.001, 0.2)
    assert settings.interval == 3 and settings.batch_size == 32
    assert settings.gradient_layer == "classifier.0"
    assert settings.threshold_function == "min_linear_logit"
    assert (settings.audit_global, settings.update_attack, settings.log_scale) == (False, False, True)
    assert settings.report_dir == "out/reports"


def test_single_values_are_wrapped():
    settings = AuditSettings.from_mapping({"signals": "loss", "fpr_tolerance": 0.1})
    assert settings.signals == ("loss",)
    assert settings.fpr_tolerance == (0.1,)
    assert isinstance(settings.fpr_tolerance[0], float)


def test_tuples_and_direct_construction_are_normalised():
    settings = AuditSettings(signals=["loss"], fpr_tolerance=[0.25])
    assert settings.signals == ("loss",) and settings.fpr_tolerance == (0.25,)
    hash(settings)  # frozen and hashable
    with pytest.raises(Exception):
        settings.interval = 2


@pytest.mark.parametrize(
    "mapping",
    [
        {},
        {"signals": ["loss"], "fpr_tolerance": [0.05], "interval": 5, "gradient_layer": "fc1"},
        {"threshold_function": "logit_rescale", "signals": ["loss", "gradient_norm"], "log_scale": True},
        {"enabled": False, "report_dir": "elsewhere", "batch_size": 1, "threshold_function": "gaussian"},
    ],
)
def test_round_trip(mapping):
    settings = AuditSettings.from_mapping(mapping)
    as_dict = settings.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert AuditSettings.from_mapping(as_dict) == settings
    assert AuditSettings.from_mapping(json.loads(json.dumps(as_dict))) == settings


# (mapping, offending key, words the message must contain)
BAD = [
    ({"signalz": ["loss"]}, "signalz", "unknown setting"),
    ({"enabled": "yes"}, "enabled", "true or false"),
    ({"enabled": 1}, "enabled", "true or false"),
    ({"audit_global": 0}, "audit_global", "true or false"),
    ({"update_attack": None}, "update_attack", "true or false"),
    ({"log_scale": "false"}, "log_scale", "true or false"),
    ({"signals": []}, "signals", "empty"),
    ({"signals": ["loss", "entropy"]}, "signals", "entropy"),
    ({"signals": ["loss", "loss"]}, "signals", "twice"),
    ({"signals": [1]}, "signals", "unknown signal 1"),
    ({"signals": {"loss": True}}, "signals", "list"),
    ({"signals": "Loss"}, "signals", "unknown signal"),
    ({"fpr_tolerance": []}, "fpr_tolerance", "empty"),
    ({"fpr_tolerance": [0.1, 1.5]}, "fpr_tolerance", "outside (0, 1)"),
    ({"fpr_tolerance": 0}, "fpr_tolerance", "outside (0, 1)"),
    ({"fpr_tolerance": [1]}, "fpr_tolerance", "outside (0, 1)"),
    ({"fpr_tolerance": [-0.1]}, "fpr_tolerance", "outside (0, 1)"),
    ({"fpr_tolerance": [float("nan")]}, "fpr_tolerance", "outside (0, 1)"),
    ({"fpr_tolerance": ["0.1"]}, "fpr_tolerance", "not a number"),
    ({"fpr_tolerance": "0.1"}, "fpr_tolerance", "list"),
    ({"fpr_tolerance": [True]}, "fpr_tolerance", "not a number"),
    ({"fpr_tolerance": [0.1, 0.1000001]}, "fpr_tolerance", "0.1 and 0.1000001 both give"),  # f"{t:g}" == "0.1"
    ({"fpr_tolerance": [0.5, 0.01, 0.5]}, "fpr_tolerance", "0.5 is listed twice"),
    ({"confidence": 1.0}, "confidence", "[0.5, 1)"),
    ({"confidence": 0.3}, "confidence", "[0.5, 1)"),
    ({"confidence": "95%"}, "confidence", "[0.5, 1)"),
    ({"epsilon_delta": -1e-5}, "epsilon_delta", "[0, 1)"),
    ({"epsilon_delta": float("nan")}, "epsilon_delta", "[0, 1)"),
    ({"epsilon_delta": True}, "epsilon_delta", "[0, 1)"),
    ({"interval": 0}, "interval", ">= 1"),
    ({"interval": -2}, "interval", ">= 1"),
    ({"interval": 1.0}, "interval", "integer"),
    ({"interval": True}, "interval", "integer"),
    ({"batch_size": 0}, "batch_size", ">= 1"),
    ({"batch_size": "256"}, "batch_size", "integer"),
    ({"batch_size": False}, "batch_size", "integer"),
    ({"gradient_layer": 3}, "gradient_layer", "module name"),
    ({"gradient_layer": ""}, "gradient_layer", "module name"),
    ({"threshold_function": "magic"}, "threshold_function", "magic"),
    ({"threshold_function": None}, "threshold_function", "unknown threshold function"),
    ({"report_dir": ""}, "report_dir", "directory"),
    ({"report_dir": 5}, "report_dir", "directory"),
    ({"threshold_function": "logit_rescale"}, "threshold_function", "logits"),  # default signals include logits
    ({"threshold_function": "min_linear_logit", "signals": ["logits"]}, "threshold_function", "logits"),
]


@pytest.mark.parametrize("mapping, key, words", BAD, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(BAD)])
def test_errors_name_the_dotted_key(mapping, key, words):
    with pytest.raises(SettingsError) as info:
        AuditSettings.from_mapping(mapping)
    message = str(info.value)
    assert message.startswith(f"audit.{key}: "), message
    assert words in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("mapping, key, words", BAD[:6] + BAD[-2:])
def test_errors_use_the_given_prefix(mapping, key, words):
    prefix = "task_runner.settings.audit"
    with pytest.raises(SettingsError) as info:
        AuditSettings.from_mapping(mapping, prefix=prefix)
    assert str(info.value).startswith(f"{prefix}.{key}: ")


def test_unknown_key_lists_the_known_ones():
    with pytest.raises(SettingsError) as info:
        AuditSettings.from_mapping({"fpr": [0.1]})
    message = str(info.value)
    assert message.startswith("audit.fpr: unknown setting; known: ")
    for name in DEFAULTS:
        assert name in message


def test_not_a_mapping():
    with pytest.raises(SettingsError) as info:
        AuditSettings.from_mapping(["loss"], prefix="x.audit")
    assert str(info.value).startswith("x.audit: ")


def test_direct_construction_is_validated():
    with pytest.raises(SettingsError, match=r"^audit\.interval: "):
        AuditSettings(interval=0)
    with pytest.raises(SettingsError, match=r"^audit\.signals: "):
        AuditSettings(signals=("loss", "entropy"))


def test_tolerances_with_one_metric_name_are_rejected_naming_both():
    """Issue 10: 0.1 and 0.1000001 both format to "0.1", so mia_<model>_<signal>_tpr_at_fpr_0.1 of one silently
    overwrote the other's."""
    with pytest.raises(SettingsError) as info:
        AuditSettings.from_mapping({"fpr_tolerance": [0.01, 0.1000001, 0.5, 0.1]}, prefix="task_runner.settings.audit")
    assert str(info.value) == (
        "task_runner.settings.audit.fpr_tolerance: 0.1000001 and 0.1 both give the metric name suffix "
        "_tpr_at_fpr_0.1 (tolerances must differ within 6 significant digits)"
    )
    # Apart in the 6th significant digit: two names, both kept in order.
    assert AuditSettings(fpr_tolerance=(0.100001, 0.1)).fpr_tolerance == (0.100001, 0.1)


def test_every_threshold_function_is_accepted_without_logits():
    for name in THRESHOLD_FUNCTIONS:
        settings = AuditSettings.from_mapping({"threshold_function": name, "signals": ["loss", "gradient_norm"]})
        assert settings.threshold_function == name
    for name in ("linear_itp", "gaussian"):
        assert AuditSettings.from_mapping({"threshold_function": name}).signals == DEFAULTS_SIGNALS



@pytest.mark.parametrize(
    "interval, audited",
    [(1, [0, 1, 2, 3, 4, 5, 6]), (2, [0, 2, 4, 6]), (3, [0, 3, 6]), (10, [0])],
)
def test_due(interval, audited):
    settings = AuditSettings(interval=interval)
    assert [r for r in range(7) if settings.due(r)] == audited


def test_due_when_disabled_and_bad_rounds():
    assert not any(AuditSettings(enabled=False).due(r) for r in range(5))
    with pytest.raises(ValueError):
        AuditSettings().due(-1)
    with pytest.raises(TypeError):
        AuditSettings().due(1.0)


@pytest.mark.federation
def test_settings_does_not_import_torch():
    code = "import sys, audit.config.audit_settings\nassert 'torch' not in sys.modules, 'torch imported'\n"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)
