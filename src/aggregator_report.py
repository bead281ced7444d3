"""The aggregator's own per-round report: which collaborators were kept or gated and why, averaged audit metrics.

It reads only what the collaborators already send, scalar metrics, from the aggregator's TensorDB at the end
of each round (rows tagged (collaborator, 'metric') for that round). Data contract with the collaborators'
gate (their `train` task):

    gate_kept                1.0 if the update was sent, 0.0 if it was withheld (gated)
    gate_retries             how many times the collaborator retrained before the decision
    gate_epsilon             the privacy budget spent, if the gate reports one
    gate_tripped__<metric>   the measured value of each audit metric that tripped the gate
                             (gate_tripped__non_finite_update = 1.0 for a NaN/Inf update); 0.0 = did not
                             trip: OpenFL averages a task's metrics by the names the first reporter sent, so
                             every collaborator sends every watched name each round
    mia_<model>_<signal>_auc, mia_<model>_<signal>_tpr_at_fpr_<t>   audit metrics

A collaborator that reported no `gate_kept` counts as kept (gating may be off) and the report says so.
A collaborator that OpenFL's straggler policy left out of the round is listed as a straggler.

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
from pathlib import Path
from typing import Any, Iterable, Mapping

from audit.reporting.round_files import load_round_records, round_file_name
from audit.reporting.atomic_io import atomic_write_json, atomic_write_text

logger = logging.getLogger(__name__)

GATE_KEPT = "gate_kept"
GATE_RETRIES = "gate_retries"
GATE_EPSILON = "gate_epsilon"
GATE_TRIPPED_PREFIX = "gate_tripped__"
NON_FINITE_UPDATE = "non_finite_update"
AUDIT_PREFIX = "mia_"

KEPT, GATED, STRAGGLER = "kept", "gated", "straggler"
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


def collaborator_entry(metrics: Mapping[str, float], *, straggler: bool) -> dict:
    """Status, reason and the gate and audit metrics of one collaborator in one round."""
    gate_reported = GATE_KEPT in metrics
    kept_value = _finite_or_none(metrics.get(GATE_KEPT))
    tripped = {  # 0.0 = sent but not tripped (see the module docstring); NaN/Inf = tripped, value unknown
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
    elif not gate_reported:
        status = KEPT
        reason = "reported no gate_kept metric (gating may be off); counted as kept"
    elif kept_value is None:
        status = KEPT
        reason = f"gate_kept is not a finite number ({metrics.get(GATE_KEPT)!r}); counted as kept"
    elif kept_value >= 0.5:
        status = KEPT
        reason = "passed the gate" + (f" after {retries:g} retries" if retries else "")
        if causes:  # e.g. a gate that only reports
            reason = "sent although the gate tripped: " + ", ".join(causes)
    else:
        status = GATED
        reason = "update withheld: " + (", ".join(causes) if causes else "no tripped metric reported")
        if retries:
            reason += f" (after {retries:g} retries)"
    return {
        "status": status,
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


def round_record(round_num: int, *, authorized: Iterable[str], stragglers: Iterable[str],
                 metrics: Mapping[str, Mapping[str, float]], aggregator_logs: Mapping[str, Any] | None = None) -> dict:
    """The report of one round (a JSON-able dict)."""
    stragglers = set(stragglers)
    collaborators = {
        name: collaborator_entry(metrics.get(name, {}), straggler=name in stragglers)
        for name in sorted(set(authorized) | set(metrics))
    }
    by_status = {s: [n for n, e in collaborators.items() if e["status"] == s] for s in (KEPT, GATED, STRAGGLER)}
    # Each collaborator that reported a metric counts once (OpenFL's own averages, in aggregator_logs, are
    # weighted by data size and leave stragglers out).
    names = sorted({k for e in collaborators.values() for k, v in e["audit_metrics"].items() if v is not None})
    averaged = {}
    for name in names:
        values = [e["audit_metrics"][name] for e in collaborators.values() if e["audit_metrics"].get(name) is not None]
        averaged[name] = {"mean": sum(values) / len(values), "n": len(values)}
    notes = [f"{n}: {collaborators[n]['reason']}" for n in collaborators if not collaborators[n]["gate_reported"]
             and collaborators[n]["status"] != STRAGGLER]
    return {
        "round": int(round_num),
        "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "authorized_collaborators": sorted(set(authorized)),
        "kept": by_status[KEPT],
        "gated": by_status[GATED],
        "stragglers": by_status[STRAGGLER],
        "collaborators": collaborators,
        "averaged_audit_metrics": averaged,
        "aggregator_logs": {k: _finite_or_none(v) for k, v in sorted((aggregator_logs or {}).items())},
        "notes": notes,
    }


class AggregatorReportWriter:
    """Writes round records under `root` and rebuilds the summaries from the round files on disk."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def write_round(self, record: Mapping) -> Path:
        path = atomic_write_json(self.root / round_file_name(record["round"]), record)
        self.rebuild_summary()
        return path

    def load_rounds(self) -> list[dict]:
        return load_round_records(self.root, "aggregator round")

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


def _decisions_csv(records: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["round", "collaborator", "status", "reason", "gate_reported", "gate_retries", "gate_epsilon",
                     "tripped"])
    for record in records:
        for name, entry in record["collaborators"].items():
            tripped = ";".join(f"{k}={_fmt(v)}" for k, v in entry.get("tripped", {}).items())
            writer.writerow([record["round"], name, entry["status"], entry["reason"], entry["gate_reported"],
                             _fmt(entry.get("gate_retries")), _fmt(entry.get("gate_epsilon")), tripped])
    return buf.getvalue()


def _metrics_csv(records: list[dict]) -> str:
    names = sorted({k for r in records for k in r.get("averaged_audit_metrics", {})})
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["round", "kept", "gated", "stragglers", *names])
    for r in records:
        averaged = r.get("averaged_audit_metrics", {})
        writer.writerow([r["round"], len(r["kept"]), len(r["gated"]), len(r["stragglers"]),
                         *(repr(averaged[n]["mean"]) if n in averaged else "" for n in names)])
    return buf.getvalue()


_STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:80em}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;font-size:90%}.kept{color:#176117}
.gated{color:#a31515;font-weight:bold}.straggler{color:#8a5a00}.muted{color:#666}"""


def _page(records: list[dict]) -> str:
    e = html.escape
    body = ["<h1>Aggregator report</h1>",
            '<p>Data: <a href="decisions.csv">decisions.csv</a>, <a href="metrics.csv">metrics.csv</a>, '
            "one <code>round_NNNN.json</code> per round.</p>"]
    if not records:
        body.append("<p>No rounds yet.</p>")
    names = sorted({k for r in records for k in r.get("averaged_audit_metrics", {})})
    if names:
        body.append("<h2>Audit metrics averaged over the collaborators</h2><table><tr><th>round</th>"
                    + "".join(f"<th>{e(n)}</th>" for n in names) + "</tr>")
        for r in reversed(records):
            averaged = r.get("averaged_audit_metrics", {})
            body.append(f"<tr><td>{r['round']}</td>" + "".join(
                f"<td>{e(_fmt(averaged[n]['mean'])) if n in averaged else ''}</td>" for n in names) + "</tr>")
        body.append("</table>")
    for r in reversed(records):
        body.append(f"<h2>Round {r['round']}</h2><p>kept {len(r['kept'])}, gated {len(r['gated'])}, "
                    f"stragglers {len(r['stragglers'])}</p><table><tr><th>collaborator</th><th>status</th>"
                    "<th>reason</th></tr>")
        for name, entry in r["collaborators"].items():
            body.append(f"<tr><td>{e(name)}</td><td class=\"{e(entry['status'])}\">{e(entry['status'])}</td>"
                        f"<td>{e(entry['reason'])}</td></tr>")
        body.append("</table>")
    now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Aggregator report</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(body)}<p class=\"muted\">Updated {e(now)}.</p>"
            "</body></html>\n")
