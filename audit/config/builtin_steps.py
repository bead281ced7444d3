"""The built-in audit steps, declared in run order: membership inference (population and update attacks), RMIA with
the federation's reference models, Fidel reconstruction, deanonymization, the canary audit (one-run epsilon
bound), the cross-round attack (every update the party sent against the other parties' combined one); and, before
training, the check of the received global model (phase BEFORE_TRAINING).

Each declaration names the step's plan section, its settings parser, the metrics it reports and where its run lives
(imported on first use, so reading a plan needs no torch). See audit.config.steps for how to add one.
"""

from __future__ import annotations

from audit.config.attack_key import AttackKey
from audit.config.canary_settings import CANARY_METRIC_RANGES, CANARY_METRICS, canary_settings
from audit.config.cross_round_settings import cross_round_settings
from audit.config.deanon_settings import deanon_settings
from audit.config.fidel_settings import FIDEL_METRICS, fidel_settings
from audit.config.received_model_settings import METRICS as RECEIVED_MODEL_METRICS, received_model_settings
from audit.config.rmia_settings import rmia_settings
from audit.config.steps import BEFORE_TRAINING, AuditStep, register
from audit.config.vocabulary import (CANARY_FILE, CROSS_ROUND, CROSS_ROUND_FILE, FIDEL_GRID_FILE, MIA_PREFIX,
                                     MODEL_KINDS, RMIA, RMIA_SCORES_FILE, SIGNALS_FILE, attack_statistics)

__all__ = ["MEMBERSHIP", "RMIA", "FIDEL", "DEANON", "RECEIVED_MODEL", "CANARY", "CROSS_ROUND_STEP", "membership_series"]


# The model kinds of the membership step's attacks: the trained update, the received model, the update attack, the
# final global model.
MEMBERSHIP_MODELS = MODEL_KINDS


def membership_series(settings) -> list[AttackKey]:
    """The attacks the membership step runs: each signal on the local (and global) model, and the update attack's
    loss reduction."""
    series = [AttackKey("local", s) for s in settings.signals]
    if settings.audit_global:
        series += [AttackKey("global", s) for s in settings.signals]
    if settings.update_attack:
        series.append(AttackKey("update", "loss_reduction"))
    return series


def _membership_metric_names(settings, _audit_settings) -> list[str]:
    statistics = attack_statistics(settings.fpr_tolerance)
    return [key.metric(statistic) for key in membership_series(settings) for statistic in statistics]


MEMBERSHIP = register(AuditStep(
    name="membership", section=None, parse=None, metric_names=_membership_metric_names,
    run="audit.membership.step:run", needs_global=False, metric_prefix=MIA_PREFIX,
    check_model="audit.membership.views:check_gradient_layer", histograms="audit.membership.views:membership_histograms",
    private_files=(SIGNALS_FILE,), summary=None, final_model=True, attack_models=MEMBERSHIP_MODELS,
))
RMIA = register(AuditStep(
    name="rmia", section="rmia", parse=rmia_settings,
    metric_names=lambda settings, audit_settings: settings.metric_names(audit_settings.fpr_tolerance),
    run="audit.membership.rmia_step:run", metric_prefix=RMIA + "_",
    check_model="audit.membership.rmia_step:check_references",
    histograms="audit.membership.views:rmia_histograms", private_files=(RMIA_SCORES_FILE,), summary=None,
    final_model=True, attack_models=(RMIA,),
))
FIDEL = register(AuditStep(
    name="fidel", section="fidel", parse=fidel_settings, metric_names=lambda settings, _: list(FIDEL_METRICS),
    run="audit.fidel.step:run", metric_prefix="fidel_",
    check_model="audit.fidel.views:check_layer", page_section="audit.fidel.views:page_section",
    private_files=(FIDEL_GRID_FILE,), summary="audit.fidel.views:summary_line",
))
DEANON = register(AuditStep(
    name="deanon", section="deanon", parse=deanon_settings, metric_names=lambda settings, _: settings.metric_names(),
    run="audit.deanon.step:run", metric_prefix="deanon_",
    check_model="audit.deanon.views:check_layer", page_section="audit.deanon.views:page_section",
    summary="audit.deanon.views:summary_line",
))
RECEIVED_MODEL = register(AuditStep(
    name="received_model", section="received_model", parse=received_model_settings,
    metric_names=lambda settings, _: list(RECEIVED_MODEL_METRICS), run="audit.received_model.check:run",
    needs_global=False, phase=BEFORE_TRAINING, metric_prefix="received_model_", summary=None,
))
CANARY = register(AuditStep(
    name="canary", section="canary", parse=canary_settings, metric_names=lambda settings, _: list(CANARY_METRICS),
    run="audit.canary.step:run", metric_ranges=CANARY_METRIC_RANGES, metric_prefix="canary_",
    private_files=(CANARY_FILE,),
))
CROSS_ROUND_STEP = register(AuditStep(
    name=CROSS_ROUND, section=CROSS_ROUND, parse=cross_round_settings,
    metric_names=lambda settings, audit_settings: settings.metric_names(audit_settings.fpr_tolerance),
    run="audit.cross_round.step:run", metric_prefix=CROSS_ROUND + "_", private_files=(CROSS_ROUND_FILE,),
    summary="audit.cross_round.views:summary", page_section="audit.cross_round.views:page_section",
    after_sending="audit.cross_round.step:after_sending", attack_models=(CROSS_ROUND,),
))
