"""The registry of audit steps: every audit a plan can turn on, its settings section and the metrics it reports.

A step is declared here once, torch-free, so that reading a plan and checking the gate's metric names import no torch;
its `run` is imported on first use. `audit.round_audit.audit_round` runs the enabled steps in the order they were
registered, and the gate's list of metrics is the union of the enabled steps' `metric_names`.

To add an audit: write its `run(context, settings) -> StepResult` (audit.round_audit) in its own module, then call
`register(AuditStep(...))` with its section name, its settings parser, its metric names and their prefix; the
built-in families are declared in audit.config.builtin_steps, a plug-in in its own module that the plan names under
`task_runner.settings.audit.plugins` (audit.config.plugins imports it before the audit section is read, on every
entry point). Nothing else changes: the plan accepts `task_runner.settings.audit.<section>`, the gate accepts its
metrics, the party's and the aggregator's reports and metrics.csv show them. A step may also declare how it checks
the model at start (`check_model`), the histograms and the page section it adds to the party's report
(`histograms`, `page_section`) and the private files it writes (`private_files`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from audit.config.vocabulary import FINAL_MODEL_PREFIX, LEAK_PREFIX, POPULATION_PREFIX

# When a step runs in a round: on the update after local training, or on the received global model before it.
AFTER_TRAINING = "after_training"
BEFORE_TRAINING = "before_training"
PHASES = (AFTER_TRAINING, BEFORE_TRAINING)

__all__ = ["AuditStep", "AFTER_TRAINING", "BEFORE_TRAINING", "PHASES", "register", "unregister", "registered",
           "step", "metric_prefixes", "is_audit_metric", "producer_of", "private_file_names", "RESERVED_PREFIXES",
           "StepContractError", "check_declared_metrics", "check_step_result", "attack_owner"]

# Scalar names that are not a step's: the round's leak verdict's (audit.verdict.leak), the gate's contract with
# the aggregator (audit.config.gate_contract), the attacks' population sizes and the final model's verdict
# (audit.config.vocabulary). No step's prefix may overlap them.
RESERVED_PREFIXES = (LEAK_PREFIX, "gate_", POPULATION_PREFIX, FINAL_MODEL_PREFIX)


class StepContractError(RuntimeError):
    """A step returned a result it does not own: a metric outside its prefix or one another step produced, or an
    attack another step owns. The round fails (its update is not sent); the message names the step and the name."""


@dataclass(frozen=True)
class AuditStep:
    """One audit: a plan section, a settings parser, the metric names it reports and its run function.

    section: its key under `task_runner.settings.audit` (a mapping there); None for the membership audit, whose
        settings are the audit section's own keys (signals, fpr_tolerance, ...): it gets the AuditSettings itself.
    parse(dotted_key, value): its settings from the plan's value (None -> defaults); errors name the dotted key. The
        result has an `enabled` attribute and may have `due(round)` (its own schedule within the audited rounds).
    metric_names(step_settings, audit_settings): the scalars it reports under these settings, each starting with
        `metric_prefix`.
    metric_prefix: what every one of its metric names starts with ("mia_", "rmia_", "fidel_", ...): how the
        aggregator and the readers, which do not know each party's settings, tell its metrics from others.
    run: `run(context, step_settings) -> StepResult`, or "module:function" to import on first use (keeps torch out of
        plan reading).
    metric_ranges: allowed gate thresholds for names its suffix does not imply (see audit.config.gate.metric_range).
    needs_global: runs only in rounds where the received global model is known (it audits an update).
    check_model: `check_model(model, feature_shape, step_settings, key)` raises SettingsError naming `key` (its plan
        section's dotted key) when the plan's model cannot be audited under these settings; run once at start.
    histograms: `histograms(record, round_dir) -> [HistogramPanel]`: members' and non-members' per-sample values
        from the private files it wrote, for the party's histogram figure.
    page_section: `page_section(record, round_dir_name, files) -> [html]`: its part of a round's section on the
        party's page (files: the names in the round's folder).
    private_files: the names of the files its `write_private` writes into the party's round folder (per-sample
        data: readable by the party's user only).
    summary: its part of a collaborator's line in the end-of-run summary: `summary(record) -> str | None`; the
        default, METRICS, lists its metrics of the round; None says nothing (the membership attacks are in the leak
        verdict's line).
    Each callable may be given as "module:function", imported on first use (keeps torch out of plan reading).
    phase: AFTER_TRAINING (audits the trained update, its metrics can be gated) or BEFORE_TRAINING (checks the received
        model before training; see audit.before_training).
    after_sending: `after_sending(store, sent, step_settings)`, called by the party once a round's update has gone
        out (`sent`: audit.round_audit.SentUpdate; `store`: the party's audit store, the step's entries under its
        name), in every round while the step is enabled: for a step that follows the party's updates across rounds.
    final_model: it audits a model, not an update, and also runs on the final global model after the last round
        (audit.round_audit.audit_final_model; its context's `model_kind` is then FINAL and `global_model` None).
    attack_models: the model kinds of the membership attacks it returns (AttackKey.model: "local", "rmia", ...) that
        no other step may return; a kind no step declares belongs to the first step that returns it in a round.
    """

    name: str
    section: str | None
    parse: Callable[[str, Any], Any] | None
    metric_names: Callable[[Any, Any], Iterable[str]]
    run: str | Callable
    metric_prefix: str = ""
    check_model: str | Callable | None = None
    histograms: str | Callable | None = None
    page_section: str | Callable | None = None
    private_files: tuple[str, ...] = ()
    summary: str | Callable | None = "metrics"
    metric_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    needs_global: bool = True
    phase: str = AFTER_TRAINING
    after_sending: str | Callable | None = None
    final_model: bool = False
    attack_models: tuple[str, ...] = ()

    def load_run(self) -> Callable:
        return _load(self.run)

    def load(self, name: str) -> Callable | None:
        """One of its optional callables (check_model, histograms, page_section, summary, after_sending), imported if
        given by name; None when it declares none (and for summary's METRICS default)."""
        found = getattr(self, name)
        return None if found is None or found == METRICS else _load(found)

    def settings_of(self, audit_settings) -> Any:
        """This step's settings within the audit's settings."""
        return audit_settings if self.section is None else audit_settings.sections[self.section]

    def enabled(self, audit_settings) -> bool:
        return bool(audit_settings.enabled and self.settings_of(audit_settings).enabled)

    def due(self, audit_settings, round_num: int) -> bool:
        settings = self.settings_of(audit_settings)
        due = getattr(settings, "due", None) if self.section is not None else None
        return self.enabled(audit_settings) and (due(round_num) if due is not None else True)


# A step's `summary` default: the end-of-run summary lists the step's metrics of the round.
METRICS = "metrics"


def _load(target: str | Callable) -> Callable:
    if callable(target):
        return target
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


_REGISTRY: dict[str, AuditStep] = {}


def register(new: AuditStep) -> AuditStep:
    """Add a step (after the ones already registered); a name or section taken by another step is an error."""
    for other in _REGISTRY.values():
        if other.name == new.name or (new.section is not None and other.section == new.section):
            raise ValueError(f"audit step {new.name!r}: name or section {new.section!r} is taken by {other.name!r}")
    if new.phase not in PHASES:
        raise ValueError(f"audit step {new.name!r}: phase {new.phase!r}; choose one of {', '.join(PHASES)}")
    if new.section is not None and new.parse is None:
        raise ValueError(f"audit step {new.name!r}: a step with a plan section needs a settings parser")
    if not new.metric_prefix:
        raise ValueError(f"audit step {new.name!r}: needs a metric_prefix (what each of its metric names starts with)")
    for taken, owner in [*((p, "reserved") for p in RESERVED_PREFIXES),
                         *((o.metric_prefix, repr(o.name)) for o in _REGISTRY.values())]:
        if taken.startswith(new.metric_prefix) or new.metric_prefix.startswith(taken):
            raise ValueError(f"audit step {new.name!r}: metric_prefix {new.metric_prefix!r} overlaps {taken!r} "
                             f"({owner})")
    for other in _REGISTRY.values():
        shared = sorted(set(new.attack_models) & set(other.attack_models))
        if shared:
            raise ValueError(f"audit step {new.name!r}: attack model {shared[0]!r} belongs to {other.name!r}")
    _REGISTRY[new.name] = new
    return new


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def registered(phase: str | None = None) -> tuple[AuditStep, ...]:
    """Every step (of `phase`, if given), in registration (= run) order: the built-in ones first (audit.config's
    package registers them on its import, before anything can register a plug-in)."""
    return tuple(s for s in _REGISTRY.values() if phase is None or s.phase == phase)


def step(name: str) -> AuditStep:
    return _REGISTRY[name]


def metric_prefixes() -> tuple[str, ...]:
    """What every audit metric starts with: each registered step's prefix, and the leak verdict's."""
    return (*(s.metric_prefix for s in registered()), LEAK_PREFIX)


def is_audit_metric(name: str) -> bool:
    """Whether a scalar a collaborator sends is an audit metric (a step's or the leak verdict's)."""
    return name.startswith(metric_prefixes())


def producer_of(name: str) -> AuditStep | None:
    """The step whose metrics `name` belongs to (by its prefix); None for the leak verdict's and unknown names."""
    return next((s for s in registered() if name.startswith(s.metric_prefix)), None)


def private_file_names() -> frozenset[str]:
    """Every file name a registered step writes with per-sample data into a party's round folder."""
    return frozenset(name for s in registered() for name in s.private_files)


def attack_owner(model: str) -> AuditStep | None:
    """The step that declares the attack model kind `model` (AuditStep.attack_models); None if none does."""
    return next((s for s in registered() if model in s.attack_models), None)


def check_declared_metrics(audit_step: AuditStep, names: Iterable[str], key: str) -> None:
    """At start: every metric a step declares under these settings starts with its own prefix (which no other step
    and no reserved name shares, see `register`). SettingsError naming `key` (its plan section) and the metric."""
    from audit.config.fields import SettingsError

    for name in names:
        if not str(name).startswith(audit_step.metric_prefix):
            raise SettingsError(f"{key}: audit step {audit_step.name!r} declares metric {name!r}, outside its "
                                f"metric_prefix {audit_step.metric_prefix!r}; a step reports only its own metrics")


def check_step_result(audit_step: AuditStep, metrics: Iterable[str], attacks: Iterable,
                      produced: Mapping[str, str], attacks_produced: Mapping) -> None:
    """At run time, before a step's result enters the round record: each metric name starts with the step's own
    prefix (so never the gate's `gate_*`, the leak verdict's `leak_*` nor another step's) and no earlier step of the
    round produced it; each attack (AttackKey) is of a model kind no other step declares and no earlier step returned.
    `produced`: metric name -> the step that produced it this round; `attacks_produced`: AttackKey -> step name.
    StepContractError naming the step and the name: the round fails rather than let one step overwrite another's
    figure (or the gate's) and get an update past the gate."""
    for name in metrics:
        if not str(name).startswith(audit_step.metric_prefix):
            owner = producer_of(str(name))
            whose = (f"of step {owner.name!r}" if owner is not None else
                     "the gate's" if str(name).startswith("gate_") else
                     "the leak verdict's" if str(name).startswith(LEAK_PREFIX) else
                     "a reserved name" if str(name).startswith(RESERVED_PREFIXES) else "no step's")
            raise StepContractError(f"audit step {audit_step.name!r} returned metric {name!r} ({whose}), outside its "
                                    f"metric_prefix {audit_step.metric_prefix!r}; a step reports only its own metrics")
        if name in produced:
            raise StepContractError(f"audit step {audit_step.name!r} returned metric {name!r}, which step "
                                    f"{produced[name]!r} produced this round; a step reports only its own metrics")
    for key in attacks:
        if key in attacks_produced:
            raise StepContractError(f"audit step {audit_step.name!r} returned attack {key.label()!r}, which step "
                                    f"{attacks_produced[key]!r} returned this round")
        owner = attack_owner(key.model)
        if owner is not None and owner.name != audit_step.name:
            raise StepContractError(f"audit step {audit_step.name!r} returned attack {key.label()!r}, of model kind "
                                    f"{key.model!r}, which belongs to step {owner.name!r}")
