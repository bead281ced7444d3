"""The end-of-run summary of the demo (cifar10_PM.py) and of `python -m workspace run`: one definition for both.

Read from the reports on disk, each party's own folder (`round_NNNN/audit.json`) and the aggregator's
(`round_NNNN.json`, `deanon/round_NNNN.json`): per round, each collaborator's gate verdict (kept, dp_retrained,
withheld, with the metric that tripped) and what the aggregator averaged, then per collaborator its leak verdict
(audit.verdict.leak: the strongest figure that beat chance after the family-wise correction, or what the counts could
have detected) with the epsilon lower bound the audit proves, Fidel's revealed fraction and the deanonymization
self-audit's AP over chance when they ran, and the aggregator's own deanonymization audit. A closing warning says
when every update of a collaborator, or of all of them, was kept out of the average.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Iterable, Mapping

from audit import (AS_TRAINED, EPSILON_ZERO_SHORT, GATE_WITHHELD, METRICS, NOTHING_SENT, RUN_BUDGET, RoundRecord,
                   dp_spent_text, epsilon_status, epsilon_zero_note, gate_reason, leak_status, load_round_files,
                   load_round_records, read_run_file, readings, registered, round_file_name, sent_leak_status, sent_of)

__all__ = ["read_party_records", "verdict_text", "averaged_summary", "tpr_reading", "round_lines",
           "lowest_resolvable_tolerance", "summary_lines", "print_run_summary", "run_account_lines"]


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_party_records(party_dir: Path) -> dict[int, RoundRecord]:
    """Round number -> the party's round record (rounds it did not audit have none; unreadable ones, and those of
    another schema version, are logged and skipped by audit.reporting.records.load_round_records)."""
    return {record.round: record for record in load_round_records(party_dir)}


def verdict_text(name: str, record: RoundRecord | None) -> str:
    """`<name> <verdict>` with the compared value and the rule that tripped the gate (audit.reporting.verdicts'
    gate_reason: "upper bound 0.668 of mia_local_loss_exact_auc (estimate 0.6005) > 0.6"), the DP tries' epsilon said
    as what it is, and what was sent; a round without a record was not audited."""
    gate = None if record is None else record.gate
    if gate is None:
        return f"{name} kept (not audited)" if record is None else f"{name} sent as trained (no gate)"
    text = f"{name} {gate.verdict}"
    if RUN_BUDGET in gate.tripped:
        t = gate.tripped[RUN_BUDGET]
        text += (f" (run ε budget {t['threshold']:g}: sending it would make the run's DP ε "
                 + ("not bounded" if t["value"] is None else format(t["value"], ".4g")) + ")")
    else:
        why = gate_reason(record)
        if why:
            text += f" ({why})"
    if gate.retries:
        text += f"; {dp_spent_text(gate)}"
    return text


def averaged_summary(record: dict) -> str:
    """What the aggregator averaged in a round, from its report's record (the decision GatedWeightedAverage
    applied: audit.config.gate_contract), and who was left out and why when not by its own gate's verdict."""
    entries = record.get("collaborators") or {}
    averaged = [name for name, entry in entries.items() if entry.get("averaged")]
    text = f"averaged: {', '.join(averaged) if averaged else 'none (global model unchanged)'}"
    # A withheld verdict is on the line already; the aggregator's own reasons (NaN/Inf tensors, an unreadable
    # verdict, the straggler policy) are not.
    others = [f"{name} {entry['status']}" for name, entry in entries.items()
              if not entry.get("averaged") and entry.get("cause") != GATE_WITHHELD]
    return text + (f" (left out: {', '.join(others)})" if others else "")


def tpr_reading(record: RoundRecord, tol: float) -> str | None:
    """The strongest membership attack's TPR at FPR `tol` (for privacy the worst case counts), its interval if
    recorded, and which attack; None for a record without membership attacks."""
    best = None
    for (model, signal), result in record.attacks.items():
        value = readings.tpr_at(result, tol)
        if not math.isnan(value) and (best is None or value > best[0]):
            best = (value, model, signal, result)
    if best is None:
        return None
    value, model, signal, result = best
    lower, upper = readings.tpr_band_at(result, tol)
    band = f" [{lower:.3f}, {upper:.3f}]" if not (math.isnan(lower) or math.isnan(upper)) else ""
    unresolved = "" if readings.resolvable_at(result, tol) else ", below what its population resolves"
    return f"TPR at FPR {tol:g} {value:.3f}{band} ({model} {signal}{unresolved})"


def _other_audits(record: RoundRecord) -> list[str]:
    """Each registered step's part of the line (audit.config.steps `summary`): its own words, or its metrics."""
    metrics = record.metrics
    out = []
    for audit_step in registered():
        said = audit_step.load("summary")
        if said is not None:
            out.append(said(record))
        elif audit_step.summary == METRICS:
            mine = sorted((k, v) for k, v in metrics.items() if k.startswith(audit_step.metric_prefix))
            if mine:
                out.append(", ".join(f"{k} {readings.float_or_nan(v):.3g}" for k, v in mine[:6])
                           + (f" (+{len(mine) - 6} more)" if len(mine) > 6 else ""))
    return [line for line in out if line]


def _server_deanon(aggregator_dir: Path | None, round_num: int) -> str | None:
    """The aggregator's own deanonymization audit of the round: its strongest closed-world re-identification."""
    if aggregator_dir is None:
        return None
    record = _read_json(Path(aggregator_dir) / "deanon" / round_file_name(round_num))
    if not record or record.get("status") != "evaluated":
        return None
    results = ((record.get("closed_world") or {}).get("reidentification") or {}).items()
    scores = [(readings.float_or_nan(r.get("ap_over_chance")), name) for name, r in results if isinstance(r, Mapping)]
    scores = [s for s in scores if not math.isnan(s[0])]
    if not scores:
        return None
    value, attack = max(scores)
    return f"aggregator's deanonymization: AP {value:.2f}x chance ({attack}, closed world)"


def _gate_header(records: Iterable[RoundRecord], parties: Iterable[str]) -> str | None:
    """The gate each party ran (from its records: per_collaborator gates may differ); None if none had thresholds."""
    gates: dict[str, list[str]] = {}
    for record in records:
        gate = record.gate
        if gate is not None and gate.thresholds:
            limits = ", ".join(f"{name} > {value:g}" for name, value in gate.thresholds.items())
            owners = gates.setdefault(f"{gate.action} if {limits}", [])
            if record.party not in owners:
                owners.append(record.party)
    if not gates:
        return None
    parties = list(parties)
    ungated = [p for p in parties if not any(p in owners for owners in gates.values())]
    if len(gates) == 1 and not ungated:
        return f"gate: {next(iter(gates))}"
    return "gate: " + "; ".join(f"{', '.join(owners)}: {text}" for text, owners in gates.items()) + (
        f" ({', '.join(ungated)}: none)" if ungated else "")


def round_lines(round_num: int, records: Mapping[str, RoundRecord | None], aggregator_dir: Path | None,
                tol: float | None) -> list[str]:
    """One round: the verdicts and what was averaged, then a line per audited collaborator."""
    line = f"round {round_num}: " + "; ".join(
        verdict_text(name, record)
        for name, record in records.items())
    agg = None if aggregator_dir is None else _read_json(Path(aggregator_dir) / round_file_name(round_num))
    if agg is not None:
        line += " | " + averaged_summary(agg)
    lines = [line]
    for name, record in records.items():
        if record is None:
            continue
        sent = sent_of(record)
        whose = "" if sent.what == AS_TRAINED else " (the trained update, not sent)"
        lines.append(f"  {name}{whose}: {leak_status(record)}")
        proven = [epsilon_status(record)] if (record.leak or {}).get("epsilon") else []
        if epsilon_zero_note(record.leak):
            proven[-1] += f" ({EPSILON_ZERO_SHORT}: see the note below)"
        if not record.leak and tol is not None:  # a record without a leak verdict: its strongest TPR
            proven.append(tpr_reading(record, tol) or "")
        parts = [p for p in [*proven, *_other_audits(record)] if p]
        if parts:
            lines.append("    " + "; ".join(parts))
        sent = sent_leak_status(record)
        if sent:
            lines.append(f"    {sent}")
    server = _server_deanon(aggregator_dir, round_num)
    if server:
        lines.append(f"  {server}")
    return lines


def lowest_resolvable_tolerance(records: list[RoundRecord]) -> float | None:
    """The lowest FPR tolerance of the records that every attack of every record resolves (a reading below it is the
    TPR at population FPR 0, audit.config.resolution); the lowest tolerance if none is; None without any."""
    tolerances = sorted(readings.tolerances_of(records)) if records else []
    results = [result for record in records for result in record.attacks.values()]
    for tol in tolerances:
        if all(readings.resolvable_at(result, tol) for result in results):
            return tol
    return tolerances[0] if tolerances else None


def summary_lines(parties: Mapping[str, Path], aggregator_dir: Path | None, rounds: int) -> list[str]:
    """The whole summary; `parties`: collaborator -> its own report folder (the one holding round_NNNN/)."""
    per_party = {name: read_party_records(path) for name, path in parties.items()}
    every = [record for records in per_party.values() for record in records.values()]
    tol = lowest_resolvable_tolerance(every)
    lines = ["", "summary per round (per collaborator: its leak verdict, every attack's figures tested against chance "
                 "with Holm's family-wise correction, and the epsilon lower bound its audit proves):"]
    header = _gate_header(every, parties)
    if header:
        lines.append(header)
    for r in range(rounds):
        lines += round_lines(r, {name: records.get(r) for name, records in per_party.items()}, aggregator_dir, tol)
    lines += sent_lines(per_party)
    zero = next((note for rec in every if (note := epsilon_zero_note(rec.leak))), None)
    if zero:
        lines.append(f"note: {zero}.")
    warning = _withheld_warning(aggregator_dir)
    if warning:
        lines.append(f"WARNING: {warning}")
    return lines


def _rounds(rs: list[int]) -> str:
    return f"round{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"


def sent_lines(per_party: Mapping[str, Mapping[int, RoundRecord]]) -> list[str]:
    """The run's closing verdict in two lines: where the trained updates leaked, and what was sent (as trained, a DP
    retrain, nothing) with the sent updates' own verdicts: a withheld or DP-retrained update's leak was never sent."""
    leaked = {name: [r for r, rec in records.items() if (rec.leak or {}).get("detected")]
              for name, records in per_party.items()}
    said = "; ".join(f"{name} in {_rounds(rs)}" for name, rs in leaked.items() if rs)
    gated = any(rec.gate is not None and rec.gate.verdict not in (None, "kept")
                for records in per_party.values() for rec in records.values())
    if not gated:
        return [f"leak detected: {said}" if said else "no leak detected in any audited round"]
    lines = [f"leak detected in the trained updates: {said}" if said else
             "no leak detected in any audited round's trained update"]
    parts = []
    for name, records in per_party.items():
        by_what: dict[str, list[int]] = {}
        for r, rec in sorted(records.items()):
            sent = sent_of(rec)
            key = sent.what if sent.what == NOTHING_SENT else f"{sent.what} ({sent.text.split('(', 1)[1]}"
            by_what.setdefault(key, []).append(r)
        parts.append(f"{name}: " + ", ".join(
            f"{'nothing (withheld)' if what == NOTHING_SENT else what} in {_rounds(rs)}" for what, rs in by_what.items()))
    sent_leaks = {name: [r for r, rec in records.items() if (s := sent_of(rec)) and s.sent and s.leak == "leak"]
                  for name, records in per_party.items()}
    told = "; ".join(f"{name} in {_rounds(rs)}" for name, rs in sent_leaks.items() if rs)
    lines.append("what was sent: " + "; ".join(parts) + ". "
                 + (f"Leak detected in what was sent: {told}" if told else "No leak detected in what was sent"))
    return lines


def _withheld_warning(aggregator_dir: Path | None) -> str | None:
    """The aggregator report's warning when every update of a collaborator, or of all, was kept out of the average."""
    if aggregator_dir is None or not Path(aggregator_dir).is_dir():
        return None
    from audit import withheld_warning  # its one definition, beside the page that shows it too

    return withheld_warning(load_round_files(Path(aggregator_dir), "aggregator round"))


def print_run_summary(parties: Mapping[str, Path], aggregator_dir: Path | None, rounds: int,
                      say: Callable[[str], None] = print) -> None:
    for line in summary_lines(parties, aggregator_dir, rounds):
        say(line)


def run_account_lines(root: Path) -> list[str]:
    """The run's account from its record (root/run.json, audit.run_record): per party, its final model's verdict
    (the run's headline for it), its DP total, what it sent and what the rounds' audits measured."""
    try:
        record = read_run_file(root)
    except (OSError, ValueError) as err:
        return [f"the run's account: {err}"]
    if record is None or not record.parties:
        return []
    return [f"the run's account ({Path(root) / 'run.json'}, {record.state}; "
            "python -m workspace verdict prints it and exits non-zero beyond the plan's limits):",
            *(f"  {line}" for line in record.lines())]
