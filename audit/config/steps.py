"""The registry of audit steps: every audit a plan can turn on, its settings section and the metrics it reports.

A step is declared here once, torch-free, so that reading a plan and checking the gate's metric names import no torch;
its `run` is imported on first use. `audit.round_audit.audit_round` runs the enabled steps in the order they were
registered, and the gate's list of metrics is the union of the enabled steps' `metric_names`.

To add an audit: write its `run(context, settings) -> StepResult` (audit.round_audit) in its own module, then call
`register(AuditStep(...))` with its section name, its settings parser and its metric names, in its package's
`__init__` for a built-in family or anywhere before the plan is read for a plug-in. Nothing else changes: the plan
accepts `task_runner.settings.audit.<section>`, the gate accepts its metrics, the reports show them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

# When a step runs in a round: on the update after local training, or on the received global model before it.
AFTER_TRAINING = "after_training"
BEFORE_TRAINING = "before_training"
PHASES = (AFTER_TRAINING, BEFORE_TRAINING)

__all__ = ["AuditStep", "AFTER_TRAINING", "BEFORE_TRAINING", "PHASES", "register", "unregister", "registered",
           "step"]


@dataclass(frozen=True)
class AuditStep:
    """One audit: a plan section, a settings parser, the metric names it reports and its run function.

    section: its key under `task_runner.settings.audit` (a mapping there); None for the membership audit, whose
        settings are the audit section's own keys (signals, fpr_tolerance, ...): it gets the AuditSettings itself.
    parse(dotted_key, value): its settings from the plan's value (None -> defaults); errors name the dotted key. The
        result has an `enabled` attribute and may have `due(round)` (its own schedule within the audited rounds).
    metric_names(step_settings, audit_settings): the scalars it reports under these settings.
    run: `run(context, step_settings) -> StepResult`, or "module:function" to import on first use (keeps torch out of
        plan reading).
    metric_ranges: allowed gate thresholds for names its suffix does not imply (see audit.gate.metric_range).
    needs_global: runs only in rounds where the received global model is known (it audits an update).
    phase: AFTER_TRAINING (audits the trained update, its metrics can be gated) or BEFORE_TRAINING (checks the received
        model before training; see audit.before_training).
    """

    name: str
    section: str | None
    parse: Callable[[str, Any], Any] | None
    metric_names: Callable[[Any, Any], Iterable[str]]
    run: str | Callable
    metric_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    needs_global: bool = True
    phase: str = AFTER_TRAINING

    def load_run(self) -> Callable:
        if callable(self.run):
            return self.run
        module, _, function = self.run.partition(":")
        return getattr(importlib.import_module(module), function)

    def settings_of(self, audit_settings) -> Any:
        """This step's settings within the audit's settings."""
        return audit_settings if self.section is None else audit_settings.sections[self.section]

    def enabled(self, audit_settings) -> bool:
        return bool(audit_settings.enabled and self.settings_of(audit_settings).enabled)

    def due(self, audit_settings, round_num: int) -> bool:
        settings = self.settings_of(audit_settings)
        due = getattr(settings, "due", None) if self.section is not None else None
        return self.enabled(audit_settings) and (due(round_num) if due is not None else True)


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
    _REGISTRY[new.name] = new
    return new


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def registered(phase: str | None = None) -> tuple[AuditStep, ...]:
    """Every step (of `phase`, if given), in registration (= run) order. The built-in families register on import of
    audit.config."""
    return tuple(s for s in _REGISTRY.values() if phase is None or s.phase == phase)


def step(name: str) -> AuditStep:
    return _REGISTRY[name]
