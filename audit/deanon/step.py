"""The deanonymization step of a round's audit: the party's self-audit (could a server with some prior data of every
user tell this update is ours?), with its non-members as the adversary's prior data of this party."""

from __future__ import annotations

from audit.config.deanon_settings import DeanonSettings
from audit.deanon.self_audit import deanon_self_audit
from audit.round_audit import AuditContext, StepResult

__all__ = ["run"]


def run(context: AuditContext, settings: DeanonSettings) -> StepResult:
    training = context.training
    if training is None:
        raise ValueError("the deanonymization self-audit trains shadow updates like the party: pass audit_round "
                         "the party's LocalTraining (training=)")
    sets = context.sets
    result = deanon_self_audit(
        context.global_model, context.local_model, sets.nonmembers, training.member_count, sets.population,
        training.recipe, settings, federation_alpha=training.federation_alpha, seed=context.seed or 0,
    )
    return StepResult(metrics=result.metrics, details=result.to_dict())
