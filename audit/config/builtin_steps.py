"""The built-in audit steps, declared in run order: membership inference (population and update attacks), RMIA with
the federation's reference models, Fidel reconstruction, deanonymization, the canary audit (one-run epsilon bound).

Each declaration names the step's plan section, its settings parser, the metrics it reports and where its run lives
(imported on first use, so reading a plan needs no torch). See audit.config.steps for how to add one.
"""

from __future__ import annotations

from audit.config.canary_settings import CANARY_METRIC_RANGES, CANARY_METRICS, canary_settings
from audit.config.deanon_settings import deanon_settings
from audit.config.fidel_settings import FIDEL_METRICS, fidel_settings
from audit.config.rmia_settings import rmia_settings
from audit.config.steps import AuditStep, register
from audit.config.vocabulary import attack_statistics, mia_metric

__all__ = ["MEMBERSHIP", "RMIA", "FIDEL", "DEANON", "CANARY", "membership_series"]


def membership_series(settings) -> list[tuple[str, str]]:
    """(model, signal) pairs the membership step attacks: each signal on the local (and global) model, and the update
    attack's loss reduction."""
    series = [("local", s) for s in settings.signals]
    if settings.audit_global:
        series += [("global", s) for s in settings.signals]
    if settings.update_attack:
        series.append(("update", "loss_reduction"))
    return series


def _membership_metric_names(settings, _audit_settings) -> list[str]:
    statistics = attack_statistics(settings.fpr_tolerance)
    return [mia_metric(model, signal, statistic) for model, signal in membership_series(settings)
            for statistic in statistics]


MEMBERSHIP = register(AuditStep(
    name="membership", section=None, parse=None, metric_names=_membership_metric_names,
    run="audit.membership.step:run", needs_global=False,
))
RMIA = register(AuditStep(
    name="rmia", section="rmia", parse=rmia_settings,
    metric_names=lambda settings, audit_settings: settings.metric_names(audit_settings.fpr_tolerance),
    run="audit.membership.rmia_step:run",
))
FIDEL = register(AuditStep(
    name="fidel", section="fidel", parse=fidel_settings, metric_names=lambda settings, _: list(FIDEL_METRICS),
    run="audit.fidel.step:run",
))
DEANON = register(AuditStep(
    name="deanon", section="deanon", parse=deanon_settings, metric_names=lambda settings, _: settings.metric_names(),
    run="audit.deanon.step:run",
))
CANARY = register(AuditStep(
    name="canary", section="canary", parse=canary_settings, metric_names=lambda settings, _: list(CANARY_METRICS),
    run="audit.canary.step:run", metric_ranges=CANARY_METRIC_RANGES,
))
