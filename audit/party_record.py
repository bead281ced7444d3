"""A party's round record as its audit (audit.party_audit) completes it, and the scalars it sends.

Every collaborator parses the same plan and OpenFL's aggregator fails at the end of a round when a reported metric is
missing from some collaborators: so every party sends gate_tripped__<name> for every metric any gate of the plan
watches (0.0 when not tripped), and every audited round every audit metric the plan's audit declares that may leave
the party (audit.config.gate_contract; NaN where a round lacks one, e.g. a step that failed), with each membership
attack's population size, so that the aggregator marks the TPR figures a population cannot resolve as the party's
report marks them.
"""

from __future__ import annotations

import math
from typing import Mapping

from audit.config.audit_settings import AuditSettings
from audit.config.gate import audit_metric_names
from audit.config.gate_contract import sent_to_aggregator
from audit.config.vocabulary import EXACT_AUC, population_name
from audit.record_parts import RecordSettings
from audit.reporting.readings import population_sizes
from audit.round_record import RoundRecord

__all__ = ["gate_watched", "sent_metric_names", "sent_scalars", "empty_record", "complete_record", "round_line"]


def gate_watched(default, per_collaborator: Mapping) -> tuple[str, ...]:
    """Every metric any gate of the plan watches (audit.config.per_collaborator.CollaboratorSettings)."""
    watched = set(default.gate.limits)
    for col in per_collaborator.values():
        watched |= set(col.gate.limits)
    return tuple(sorted(watched))


def sent_metric_names(settings: AuditSettings) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The audit metrics an audited round sends, and the population sizes (named after each membership attack: what
    its exact AUC's metric name starts with)."""
    sent = tuple(n for n in audit_metric_names(settings) if sent_to_aggregator(n))
    return sent, tuple(population_name(n[:-len(EXACT_AUC) - 1]) for n in sent if n.endswith("_" + EXACT_AUC))


def sent_scalars(record: RoundRecord, metrics: tuple[str, ...], populations: tuple[str, ...]) -> dict[str, float]:
    scalars = {name: record.metrics.get(name, math.nan) for name in metrics}
    sizes = {key.population_metric: float(n) for key, n in population_sizes(record).items()}
    scalars.update({name: sizes.get(name, math.nan) for name in populations})
    return scalars


def empty_record(party: str, round_num: int, seed, settings: AuditSettings, sizes: dict) -> RoundRecord:
    """The record of a round without an audit (the gate's, the received-model checks' entries still go in)."""
    return RoundRecord(party=party, round=int(round_num), seed=seed, settings=RecordSettings.of(settings),
                       sizes=sizes)


def complete_record(record: RoundRecord, *, outcome, gate, verdict, mitigation_record: dict | None = None,
                    train_loss: float | None = None, train_seconds: float | None = None,
                    audited_in_validation: float = 0.0) -> None:
    """The training's figures, the gate's outcome (audit.gate_flow.GateOutcome under `gate`), the received-model
    checks' verdict (audit.before_training.ReceivedVerdict) and the mitigation's entry, into `record`."""
    if train_seconds is not None:
        record.timings["train_s"] = train_seconds
    if audited_in_validation and "audit_s" in record.timings:
        # The audit's cost wherever it ran: its signals of the received model were computed in validation.
        record.timings["audit_s"] += audited_in_validation
        record.timings["audit_in_validation_s"] = audited_in_validation
    if train_loss is not None and math.isfinite(train_loss):  # report metrics are finite numbers
        record.metrics["train_loss"] = train_loss
    record.extra["gate"] = outcome.record_entry(gate)
    record.extra["received_model"] = verdict.details()
    record.metrics.update(verdict.metrics())
    record.timings.update(verdict.timings)
    if mitigation_record is not None:
        record.extra["mitigation"] = mitigation_record


def round_line(record: RoundRecord, outcome, train_seconds: float) -> str:
    """The round's log line: its AUCs, the audit's and the training's seconds, the gate's verdict."""
    tripped = outcome.gate_verdict.tripped
    return "%s round %d audit: %s (audit %.2fs, train %.2fs); gate: %s%s" % (
        record.party, record.round,
        ", ".join(f"{k}={v:.3f}" for k, v in record.metrics.items() if k.endswith("_auc")),
        record.timings.get("audit_s", 0.0), train_seconds, outcome.verdict,
        f" (tripped {', '.join(tripped)})" if tripped else "")
