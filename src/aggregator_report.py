"""The aggregator's own per-round report: which collaborators' updates were averaged, which were not and why,
and the averaged audit metrics.

It reads only what the collaborators already send, scalar metrics, from the aggregator's TensorDB at the end
of each round (rows tagged (collaborator, 'metric') for that round), plus whether the tensors each one trained
hold NaN/Inf. The names it reads and the decision "averaged or not, and why" are audit.config.gate_contract's, the
same that src.aggregation.GatedWeightedAverage applies, so a collaborator reported `kept` is one whose update
is in the round's model:

    kept                  averaged (gate_kept 1, or no gate_kept sent: gating may be off, the reason says so)
    withheld              its gate withheld it (gate_kept 0), or its gate_kept is NaN/not a number (fail closed)
    left_out_non_finite   a tensor it sent holds NaN/Inf, whatever its gate said
    straggler             OpenFL's straggler policy ended the round without it

Layout under `report_dir` (every file written atomically; the summaries are rebuilt from the round files on
disk, so a crash leaves the earlier rounds intact and the next round repairs the summaries):

    round_0003.json   the round record
    decisions.csv     one row per round and collaborator: status, reason, gate metrics
    metrics.csv       one row per round: counts and the audit metrics averaged over the collaborators
    index.html        all of it on one page, newest round first
"""

from __future__ import annotations

import csv
import datetime as _dt
import html
import io
import logging
import math
from typing import Any, Iterable, Mapping

from audit.config.gate_contract import (GATE_EPSILON, GATE_KEPT, GATE_KEPT_NOT_FINITE, GATE_RETRIES, GATE_TRIPPED_PREFIX,
                                        KEPT, LEFT_OUT_NON_FINITE, NO_GATE_METRIC, NON_FINITE_TENSORS, NON_FINITE_UPDATE,
                                        STRAGGLER, WITHHELD, Decision, decide)
from audit.reporting.atomic_io import atomic_write_text
from audit.reporting.csv_cells import spreadsheet_safe_row
from audit.reporting.html import page
from audit.reporting.writer import RoundReportWriter

logger = logging.getLogger(__name__)

AUDIT_PREFIX = "mia_"
# The record's lists of collaborators by status (key -> status); "stragglers" predates the others.
STATUS_LISTS = {"kept": KEPT, "withheld": WITHHELD, "left_out_non_finite": LEFT_OUT_NON_FINITE,
                "stragglers": STRAGGLER}


def _finite_or_none(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def metrics_from_tensor_db(frame, round_num: int, collaborators: Iterable[str]) -> dict[str, dict[str, float]]:
    """Each collaborator's scalar metrics of `round_num` from an aggregator TensorDB frame.

    Rows whose tags are exactly {collaborator, 'metric'} (the train task's metrics) keep their name; other
    metric rows of the collaborator (e.g. validation accuracy tagged 'validate_agg') are named
    `<name>[<other tags>]` so that two tasks' `accuracy` do not overwrite each other.
    """
    names = set(collaborators)
    out: dict[str, dict[str, float]] = {}
    rows = frame[(frame["round"].astype(int) == int(round_num)) & frame["report"].astype(bool)]
    for tensor_name, tags, value in zip(rows["tensor_name"], rows["tags"], rows["nparray"]):
        tags = set(tags or ())
        if "metric" not in tags:
            continue
        owners = tags & names
        if len(owners) != 1:
            continue  # the aggregator's own averages carry no collaborator tag
        (col,) = owners
        extra = sorted(tags - {"metric", col})
        key = str(tensor_name) + (f"[{'+'.join(extra)}]" if extra else "")
        try:
            out.setdefault(col, {})[key] = float(value)
        except (TypeError, ValueError):
            logger.warning("round %d: %s sent a non-scalar metric %s; left out of the report", round_num, col, key)
    return out


def collaborator_entry(metrics: Mapping[str, float], *, straggler: bool, decision: Decision | None = None) -> dict:
    """Status, reason and the gate and audit metrics of one collaborator in one round.

    `decision` is audit.config.gate_contract's for this collaborator (src.aggregation.round_decisions, which also
    knows whether its tensors were finite); None decides from its metrics alone, as for finite tensors.
    """
    gate_reported = GATE_KEPT in metrics
    if decision is None:
        decision = decide(metrics.get(GATE_KEPT), finite_update=True)
    kept_value = _finite_or_none(metrics.get(GATE_KEPT))
    tripped = {  # 0.0 = sent but not tripped (see audit.config.gate_contract); NaN/Inf = tripped, value unknown
        name[len(GATE_TRIPPED_PREFIX):]: _finite_or_none(value)
        for name, value in sorted(metrics.items()) if name.startswith(GATE_TRIPPED_PREFIX) and value != 0.0
    }
    causes = [
        "non-finite update (NaN/Inf)" if name == NON_FINITE_UPDATE else f"{name} = {_fmt(value)}"
        for name, value in tripped.items()
    ]
    retries = _finite_or_none(metrics.get(GATE_RETRIES))
    epsilon = _finite_or_none(metrics.get(GATE_EPSILON))

    if straggler:
        status = STRAGGLER
        reason = ("did not report all its tasks in time; OpenFL's straggler policy ended the round without it, "
                  "so its update is not in this round's model")
    else:
        status = decision.status
        reason = _reason(decision, metrics.get(GATE_KEPT), causes, retries)
    return {
        "status": status,
        "cause": STRAGGLER if straggler else decision.cause,
        "averaged": status == KEPT,
        "reason": reason,
        "gate_reported": gate_reported,
        "gate_kept": kept_value,
        "gate_retries": retries,
        "gate_epsilon": epsilon,
        "tripped": tripped,
        "audit_metrics": {k: _finite_or_none(v) for k, v in sorted(metrics.items()) if k.startswith(AUDIT_PREFIX)},
        "other_metrics": {
            k: _finite_or_none(v) for k, v in sorted(metrics.items())
            if not k.startswith(AUDIT_PREFIX) and not k.startswith("gate_")
        },
    }


def _reason(decision: Decision, gate_kept, causes: list[str], retries: float | None) -> str:
    after = f" (after {retries:g} retries)" if retries else ""
    if decision.status == LEFT_OUT_NON_FINITE:
        said = "" if gate_kept is None else f"; its gate_kept was {_number(gate_kept)}"
        return f"left out of the average: a tensor it sent holds NaN/Inf{said}"
    if decision.cause == NO_GATE_METRIC:
        return "reported no gate_kept metric (gating may be off); averaged"
    if decision.cause == GATE_KEPT_NOT_FINITE:
        return f"gate_kept is not a finite number ({_number(gate_kept)}); treated as withheld, left out of the average"
    if decision.status == WITHHELD:
        return "update withheld: " + (", ".join(causes) if causes else "no tripped metric reported") + after
    if causes:  # e.g. a gate that only reports
        return "sent although the gate tripped: " + ", ".join(causes)
    return "passed the gate" + (f" after {retries:g} retries" if retries else "")


def _number(value: Any) -> str:
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return repr(value)


def round_record(round_num: int, *, authorized: Iterable[str], stragglers: Iterable[str],
                 metrics: Mapping[str, Mapping[str, float]], decisions: Mapping[str, Decision] | None = None,
                 aggregator_logs: Mapping[str, Any] | None = None) -> dict:
    """The report of one round (a JSON-able dict).

    `decisions`: each collaborator's audit.config.gate_contract decision as the average made it
    (src.aggregation.round_decisions on the same TensorDB); a collaborator without one is decided from its
    metrics as if its tensors were finite.
    """
    stragglers = set(stragglers)
    decisions = decisions or {}
    collaborators = {
        name: collaborator_entry(metrics.get(name, {}), straggler=name in stragglers, decision=decisions.get(name))
        for name in sorted(set(authorized) | set(metrics))
    }
    by_status = {key: [n for n, e in collaborators.items() if e["status"] == status]
                 for key, status in STATUS_LISTS.items()}
    # Each collaborator that reported a metric counts once (OpenFL's own averages, in aggregator_logs, are
    # weighted by data size and leave stragglers out).
    names = sorted({k for e in collaborators.values() for k, v in e["audit_metrics"].items() if v is not None})
    averaged = {}
    for name in names:
        values = [e["audit_metrics"][name] for e in collaborators.values() if e["audit_metrics"].get(name) is not None]
        averaged[name] = {"mean": sum(values) / len(values), "n": len(values)}
    # What a reader would not expect from the gates' verdicts alone.
    notes = [f"{n}: {e['reason']}" for n, e in collaborators.items()
             if e["cause"] in (NO_GATE_METRIC, GATE_KEPT_NOT_FINITE, NON_FINITE_TENSORS)]
    return {
        "round": int(round_num),
        "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "authorized_collaborators": sorted(set(authorized)),
        **by_status,  # kept (= the updates averaged), withheld, left_out_non_finite, stragglers
        "collaborators": collaborators,
        "averaged_audit_metrics": averaged,
        "aggregator_logs": {k: _finite_or_none(v) for k, v in sorted((aggregator_logs or {}).items())},
        "notes": notes,
    }


class AggregatorReportWriter(RoundReportWriter):
    """Writes round records under `root` and rebuilds the summaries from the round files on disk."""

    what = "aggregator round"

    def rebuild_summary(self) -> None:
        records = self.load_rounds()
        atomic_write_text(self.root / "decisions.csv", _decisions_csv(records))
        atomic_write_text(self.root / "metrics.csv", _metrics_csv(records))
        atomic_write_text(self.root / "index.html", _page(records))


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _cell(value: Any) -> Any:
    """A number for a CSV cell: ints as ints, floats in full (repr), None empty."""
    if value is None:
        return ""
    return int(value) if float(value).is_integer() else float(value)


def _decisions_csv(records: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["round", "collaborator", "status", "reason", "gate_reported", "gate_retries", "gate_epsilon",
                     "tripped"])
    for record in records:
        for name, entry in record["collaborators"].items():
            tripped = ";".join(f"{k}={_fmt(v)}" for k, v in entry.get("tripped", {}).items())
            # Text (names, reasons) is escaped for spreadsheets; numbers are written as numbers.
            writer.writerow(spreadsheet_safe_row([
                record["round"], name, entry["status"], entry["reason"], entry["gate_reported"],
                _cell(entry.get("gate_retries")), _cell(entry.get("gate_epsilon")), tripped]))
    return buf.getvalue()


def _metrics_csv(records: list[dict]) -> str:
    names = sorted({k for r in records for k in r.get("averaged_audit_metrics", {})})
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(spreadsheet_safe_row(["round", *STATUS_LISTS, *names]))
    for r in records:
        averaged = r.get("averaged_audit_metrics", {})
        writer.writerow([r["round"], *(len(r.get(key, [])) for key in STATUS_LISTS),
                         *(float(averaged[n]["mean"]) if n in averaged else "" for n in names)])
    return buf.getvalue()


def _page(records: list[dict]) -> str:
    e = html.escape
    body = ["<h1>Aggregator report</h1>",
            '<p>Data: <a href="decisions.csv">decisions.csv</a>, <a href="metrics.csv">metrics.csv</a>, '
            "one <code>round_NNNN.json</code> per round.</p>"]
    if not records:
        body.append("<p>No rounds yet.</p>")
    names = sorted({k for r in records for k in r.get("averaged_audit_metrics", {})})
    if names:
        body.append('<h2>Audit metrics averaged over the collaborators</h2><div class="scroll"><table><tr><th>round</th>'
                    + "".join(f"<th>{e(n)}</th>" for n in names) + "</tr>")
        for r in reversed(records):
            averaged = r.get("averaged_audit_metrics", {})
            body.append(f"<tr><td>{r['round']}</td>" + "".join(
                f"<td>{e(_fmt(averaged[n]['mean'])) if n in averaged else ''}</td>" for n in names) + "</tr>")
        body.append("</table></div>")
    for r in reversed(records):
        counts = ", ".join(f"{key.replace('_', ' ')} {len(r.get(key, []))}" for key in STATUS_LISTS)
        body.append(f"<h2>Round {r['round']}</h2><p>averaged: {e(', '.join(r['kept']) or 'none')} ({counts})</p>"
                    "<table><tr><th>collaborator</th><th>status</th><th>reason</th></tr>")
        for name, entry in r["collaborators"].items():
            body.append(f"<tr><td>{e(name)}</td><td class=\"text {e(entry['status'])}\">{e(entry['status'])}</td>"
                        f"<td class=\"text\">{e(entry['reason'])}</td></tr>")
        body.append("</table>")
    return page("Aggregator report", body)
