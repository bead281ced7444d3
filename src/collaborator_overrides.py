"""Per-collaborator settings (`task_runner.settings.per_collaborator`), applied by the task runner.

    per_collaborator:
      collaborator2:
        epochs: 20               # overrides the train task's `epochs` kwarg (plan tasks section)
        learning_rate: 0.01
        gate: {action: withhold} # merged into the plan-wide `gate`, see merge_gate
        mitigation: {method: mm_aug, alpha: 0.5}  # replaces the plan-wide `mitigation` (audit.deanon.mitigation)

Every collaborator parses the same plan, so each knows every other's gate: the runner uses that to send
the same metric names as all others (OpenFL's aggregator needs that, see src.taskrunner).
The runner never learns the federation's names, so a name no collaborator has is checked by whoever knows them,
before any work: src.plan_checks.check_collaborator_names (`python -m workspace`, the demo).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Real

from audit.config.mitigation_settings import Mitigation
from audit.config.gate import GATE_PREFIX, GatePolicy, SettingsError
from audit.config.audit_settings import AuditSettings
from audit.membership.resolution import unresolvable_thresholds

PREFIX = "task_runner.settings.per_collaborator"
KEYS = ("epochs", "learning_rate", "gate", "mitigation")
MITIGATION_PREFIX = "task_runner.settings.mitigation"


@dataclass(frozen=True)
class CollaboratorSettings:
    """The settings one collaborator trains and gates with."""

    gate: GatePolicy
    epochs: int | None = None  # None: the train task's `epochs` kwarg
    learning_rate: float | None = None  # None: task_runner.settings.learning_rate
    mitigation: Mitigation = Mitigation()  # deanonymization mitigation; default: task_runner.settings.mitigation


def merge_gate(base: Mapping | None, override: Mapping | None) -> dict:
    """A collaborator's gate mapping: `override` merged into `base` key by key, `dp` too;
    `thresholds` is replaced as a whole (so a collaborator can drop a plan-wide threshold)."""
    merged = dict(base or {})
    for key, value in (override or {}).items():
        if key == "dp" and isinstance(value, Mapping) and isinstance(merged.get("dp"), Mapping):
            merged["dp"] = {**merged["dp"], **value}
        else:
            merged[key] = value
    return merged


def parse_per_collaborator(
    mapping, *, gate: Mapping | None, audit_settings: AuditSettings, mitigation: Mapping | None = None
) -> tuple[CollaboratorSettings, dict[str, CollaboratorSettings]]:
    """The plan-wide settings and each listed collaborator's; errors name the dotted key."""
    default_gate = GatePolicy.from_mapping(gate, audit_settings=audit_settings, prefix=GATE_PREFIX)
    default_mitigation = Mitigation.from_mapping(mitigation, prefix=MITIGATION_PREFIX)
    default = CollaboratorSettings(gate=default_gate, mitigation=default_mitigation)
    if mapping is None:
        return default, {}
    if not isinstance(mapping, Mapping):
        raise SettingsError(f"{PREFIX}: expected a mapping of collaborator name -> settings, got {mapping!r}")
    out = {}
    for name, entry in mapping.items():
        key = f"{PREFIX}.{name}"
        if not isinstance(name, str) or not name.strip():
            raise SettingsError(f"{PREFIX}: collaborator names must be non-empty strings, got {name!r}")
        if entry is None:
            entry = {}
        if not isinstance(entry, Mapping):
            raise SettingsError(f"{key}: expected a mapping of settings, got {entry!r}")
        for setting in entry:
            if setting not in KEYS:
                raise SettingsError(f"{key}.{setting}: unknown setting; known: {', '.join(KEYS)}")
        epochs = entry.get("epochs")
        if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, Integral) or epochs < 1):
            raise SettingsError(f"{key}.epochs: expected an integer >= 1, got {epochs!r}")
        lr = entry.get("learning_rate")
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, Real) or not math.isfinite(lr) or lr <= 0):
            raise SettingsError(f"{key}.learning_rate: expected a finite number > 0, got {lr!r}")
        col_gate = default_gate
        if entry.get("gate") is not None:
            if not isinstance(entry["gate"], Mapping):
                raise SettingsError(f"{key}.gate: expected a mapping, got {entry['gate']!r}")
            col_gate = GatePolicy.from_mapping(
                merge_gate(gate, entry["gate"]), audit_settings=audit_settings, prefix=f"{key}.gate"
            )
        col_mitigation = default_mitigation
        if entry.get("mitigation") is not None:
            col_mitigation = Mitigation.from_mapping(entry["mitigation"], prefix=f"{key}.mitigation")
        out[name] = CollaboratorSettings(
            gate=col_gate,
            epochs=None if epochs is None else int(epochs),
            learning_rate=None if lr is None else float(lr),
            mitigation=col_mitigation,
        )
    return default, out


def check_gate_resolution(party: str, default: CollaboratorSettings, per_collaborator: Mapping[str, CollaboratorSettings],
                          audit_settings: AuditSettings, population: int) -> None:
    """A gate on TPR at an FPR tolerance this party's audit population (`population` samples, after audit.sample_size)
    cannot resolve would compare the TPR at population FPR 0: refused, naming the threshold's key."""
    own = per_collaborator.get(party)
    gate = (own or default).gate
    if not audit_settings.enabled or not gate.thresholds:
        return
    for metric, tol in unresolvable_thresholds(gate.thresholds, audit_settings.fpr_tolerance, population):
        where = f"{PREFIX}.{party}.gate" if own is not None and metric not in default.gate.thresholds else GATE_PREFIX
        raise SettingsError(f"{where}.thresholds.{metric}: {party}'s audit population has {population} samples, which "
                            f"resolve FPR tolerances >= {1 / population if population else 1:.3g} (1 / population): "
                            f"TPR at FPR {tol:g} would be read at population FPR 0; gate a tolerance it resolves, or "
                            f"give each party more population samples (data_loader.settings.audit_dataset_ratio, "
                            f"fewer collaborators, task_runner.settings.audit.sample_size)")
