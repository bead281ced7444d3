"""The Fidel step of a round's audit: how many of the round's training samples (the members) this update reveals."""

from __future__ import annotations

from audit.config.fidel_settings import FidelSettings
from audit.fidel.attack import fidel_audit
from audit.fidel.grid import save_reveal_grid
from audit.fidel.decoder import train_decoder
from audit.reporting.records import FIDEL_GRID_FILE
from audit.round_audit import AuditContext, StepResult

__all__ = ["run"]


def run(context: AuditContext, settings: FidelSettings) -> StepResult:
    sets = context.sets
    decoder = None
    if settings.decoder:  # fitted on the population under the received model, never on members
        decoder = train_decoder(context.global_model, sets.population[0], layer=settings.layer)
    result = fidel_audit(
        context.global_model, context.local_model, sets.members[0], layer=settings.layer,
        threshold=settings.threshold, seed=context.seed or 0, decoder=decoder, batch_size=context.settings.batch_size,
    )
    return StepResult(
        metrics=result.metrics(), details=result.to_dict(),
        # The revealed samples beside their reconstructions: private images, only in the party's own round folder.
        write_private=lambda round_dir: save_reveal_grid(result, sets.members[0], round_dir / FIDEL_GRID_FILE),
    )
