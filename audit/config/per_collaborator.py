"""Per-collaborator settings (`task_runner.settings.per_collaborator`), applied by the party's audit (audit.party_audit).

    per_collaborator:
      collaborator2:
        epochs: 20               # overrides the train task's `epochs` kwarg (plan tasks section)
        learning_rate: 0.01
        gate: {action: withhold} # merged into the plan-wide `gate`, see merge_gate
        mitigation: {method: mm_aug, alpha: 0.5}  # replaces the plan-wide `mitigation` (audit.deanon.mitigation)

Every collaborator parses the same plan, so each knows every other's gate: the runner uses that to send
the same metric names as all others (OpenFL's aggregator needs that, see audit.party_record).
The runner never learns the federation's names, so a name no collaborator has is checked by whoever knows them,
before any work: src.plan.checks.check_collaborator_names (`python -m workspace`, the demo).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from audit.config.audit_settings import AuditSettings
from audit.config.fields import SettingsError, integer, mapping, optional, parse, real, section, setting
from audit.config.gate import GATE_PREFIX, GatePolicy
from audit.config.mitigation_settings import Mitigation
from audit.config.resolution import unresolvable_thresholds

PREFIX = "task_runner.settings.per_collaborator"
MITIGATION_PREFIX = "task_runner.settings.mitigation"


@dataclass(frozen=True)
class CollaboratorOverrides:
    """One collaborator's entry of `task_runner.settings.per_collaborator`, as the plan gives it."""

    epochs: int | None = setting(None, optional(integer(min=1), "the train task's epochs"),
                                 "local epochs of this collaborator's train task")
    learning_rate: float | None = setting(None, optional(real(gt=0), "task_runner.settings.learning_rate"),
                                          "this collaborator's learning rate")
    gate: Mapping | None = setting(None, section(GatePolicy, later=True),
                                   "merged into task_runner.settings.gate key by key (dp too; thresholds replaced as "
                                   "a whole)")
    mitigation: Mapping | None = setting(None, section(Mitigation, later=True),
                                         "replaces task_runner.settings.mitigation as a whole")


#: `task_runner.settings.per_collaborator`: collaborator name -> its overrides.
PER_COLLABORATOR = mapping(section(CollaboratorOverrides), key_name="<collaborator>")


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
    per_collaborator, *, gate: Mapping | None, audit_settings: AuditSettings, mitigation=None
) -> tuple[CollaboratorSettings, dict[str, CollaboratorSettings]]:
    """The plan-wide settings and each listed collaborator's; errors name the dotted key."""
    default_gate = GatePolicy.from_mapping(gate, audit_settings=audit_settings, prefix=GATE_PREFIX)
    default_mitigation = parse(Mitigation, mitigation, MITIGATION_PREFIX)
    default = CollaboratorSettings(gate=default_gate, mitigation=default_mitigation)
    out = {}
    for name, entry in PER_COLLABORATOR(PREFIX, per_collaborator).items():
        col_gate = default_gate
        if entry.gate is not None:
            col_gate = GatePolicy.from_mapping(merge_gate(gate, entry.gate), audit_settings=audit_settings,
                                               prefix=f"{PREFIX}.{name}.gate")
        col_mitigation = default_mitigation
        if entry.mitigation is not None:
            col_mitigation = parse(Mitigation, entry.mitigation, f"{PREFIX}.{name}.mitigation")
        out[name] = CollaboratorSettings(gate=col_gate, epochs=entry.epochs, learning_rate=entry.learning_rate,
                                         mitigation=col_mitigation)
        check_run_budget(out[name], audit_settings, f"{PREFIX}.{name}")
    check_run_budget(default, audit_settings, "task_runner.settings")
    return default, out


def check_run_budget(settings: CollaboratorSettings, audit_settings: AuditSettings, where: str) -> None:
    """A run budget (gate.run_epsilon_budget) sends only DP releases: a party that can make none (no dp_retrain of an
    audited round, no dp_fedavg update with noise) would withhold every update. Refused, naming the keys."""
    gate, mitigation = settings.gate, settings.mitigation
    if gate.run_epsilon_budget is None:
        return
    dp_fedavg = mitigation.method == "dp_fedavg" and mitigation.active and mitigation.sigma > 0
    retrains = gate.action == "dp_retrain" and audit_settings.enabled
    if not (dp_fedavg or retrains):
        raise SettingsError(
            f"{where}.gate.run_epsilon_budget: under a run budget only DP releases are sent, and this party makes none "
            f"(gate.action is {gate.action!r}{'' if audit_settings.enabled else ' and the audit is off'}, mitigation "
            f"{mitigation.method!r}): every update would be withheld; set gate.action: dp_retrain (with the audit on) "
            "or mitigation.method: dp_fedavg with sigma > 0")


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
