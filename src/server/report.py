"""The aggregator's own per-round report: which collaborators' updates were averaged, which were not and why,
and the averaged audit metrics.

It reads only what the collaborators already send, scalar metrics, from the aggregator's TensorDB at the end
of each round (rows tagged (collaborator, 'metric') for that round), plus whether the tensors each one trained
hold NaN/Inf. The names it reads and the decision "averaged or not, and why" are audit.config.gate_contract's, the
same that src.aggregation.GatedWeightedAverage applies, so a collaborator reported `kept` is one whose update
is in the round's model:

    kept                  averaged (gate_kept 1, or no gate_kept sent: gating may be off, the reason says so)
    withheld              its gate withheld it (gate_kept 0), or its gate_kept is NaN/not a number (fail closed); among
                          them, the parties that rejected the round's global model before training (their verdict,
                          received_model_rejected 1: audit.before_training)
    left_out_non_finite   a tensor it sent holds NaN/Inf, whatever its gate said
    straggler             OpenFL's straggler policy ended the round without it

Layout under `report_dir` (every file written atomically; the summaries are rebuilt from the round files on
disk, so a crash leaves the earlier rounds intact and the next round repairs the summaries):

    round_0003.json   the round record
    decisions.csv     one row per round and collaborator: status, reason, gate metrics
    metrics.csv       one row per round: counts, each audit metric's mean over the collaborators and its worst
                      (largest) value, `worst:<metric>`
    gate_<metric>.png each gate metric per round: every collaborator, the mean, the worst, the threshold
    index.html        all of it on one page: the verdicts per round first, then the plots, then each round
"""

from __future__ import annotations

import csv
import datetime as _dt
import html
import io
import logging
import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from audit.config.gate_contract import (DP_RETRAINED, DP_VIOLATED, DP_VIOLATED_TEXT, GATE_EPSILON, GATE_KEPT,
                                        GATE_KEPT_NOT_FINITE, GATE_MISSING_PREFIX, GATE_RETRIES, GATE_THRESHOLD_PREFIX,
                                        GATE_TRIPPED_PREFIX, KEPT, LEFT_OUT_NON_FINITE, NO_GATE_METRIC,
                                        NON_FINITE_TENSORS, NON_FINITE_UPDATE, RECEIVED_MODEL_ALARM,
                                        RECEIVED_MODEL_REJECTED, STRAGGLER, WITHHELD, Decision, decide)
from audit.config.steps import is_audit_metric
from audit.config.vocabulary import (BOUNDS, LEAK_DETECTED, LEAK_EPSILON_CEILING, LEAK_EPSILON_LB, LEAK_P_VALUE,
                                     POPULATION_PREFIX, tpr_statistic)
from audit.membership.resolution import resolvable
from audit.reporting.atomic_io import atomic_write_json, atomic_write_text
from audit.reporting.background import render_queue
from audit.reporting.csv_cells import spreadsheet_safe_row
from audit.reporting.html import page, write_index
from audit.reporting.party_page import UNRESOLVED_MARK  # the parties' mark, on their figures here too
from audit.reporting.plots import plot_collaborators
from audit.reporting.writer import RoundReportWriter

logger = logging.getLogger(__name__)

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
    missing = sorted(name[len(GATE_MISSING_PREFIX):] for name, value in metrics.items()
                     if name.startswith(GATE_MISSING_PREFIX) and value == 1.0)
    causes = [
        "non-finite update (NaN/Inf)" if name == NON_FINITE_UPDATE else
        f"missing: {name}" if name in missing else
        f"{DP_VIOLATED_TEXT} (canary epsilon >= {_fmt(value)})" if name == DP_VIOLATED else f"{name} = {_fmt(value)}"
        for name, value in tripped.items()
    ] + [f"missing: {name}" for name in missing if name not in tripped]
    retries = _finite_or_none(metrics.get(GATE_RETRIES))
    epsilon = _finite_or_none(metrics.get(GATE_EPSILON))
    thresholds = {name[len(GATE_THRESHOLD_PREFIX):]: _finite_or_none(value) for name, value in sorted(metrics.items())
                  if name.startswith(GATE_THRESHOLD_PREFIX) and _finite_or_none(value) is not None}

    received_model = _received_model_verdict(metrics)
    if straggler:
        status = STRAGGLER
        reason = ("did not report all its tasks in time; OpenFL's straggler policy ended the round without it, "
                  "so its update is not in this round's model")
    else:
        status = decision.status
        reason = _reason(decision, metrics.get(GATE_KEPT), causes, retries)
        if received_model == "rejected" and status == WITHHELD:
            reason = ("did not train: it rejected this round's global model before training (its checks' figures "
                      "stay in its own report)")
    return {
        "status": status,
        # The collaborators' vocabulary: a kept update its gate retrained with DP is dp_retrained.
        "verdict": DP_RETRAINED if status == KEPT and retries else status,
        "cause": STRAGGLER if straggler else decision.cause,
        "averaged": status == KEPT,
        "reason": reason,
        "received_model": received_model,
        "gate_reported": gate_reported,
        "gate_kept": kept_value,
        "gate_retries": retries,
        "gate_epsilon": epsilon,
        "tripped": tripped,
        "missing": missing,
        "thresholds": thresholds,
        # The party's leak verdict (audit.verdict.leak), as its scalars say it: None where it sent none.
        "leak": {"detected": None if (d := _finite_or_none(metrics.get(LEAK_DETECTED))) is None else d >= 0.5,
                 "p_value": _finite_or_none(metrics.get(LEAK_P_VALUE)),
                 "epsilon_lb": _finite_or_none(metrics.get(LEAK_EPSILON_LB)),
                 "epsilon_ceiling": _finite_or_none(metrics.get(LEAK_EPSILON_CEILING))},
        # Every audit step's metrics and the leak verdict's, by the registry's prefixes (audit.config.steps).
        "audit_metrics": {k: _finite_or_none(v) for k, v in sorted(metrics.items()) if is_audit_metric(k)},
        "other_metrics": {
            k: _finite_or_none(v) for k, v in sorted(metrics.items())
            if not is_audit_metric(k) and not k.startswith(("gate_", POPULATION_PREFIX))
        },
        "population": populations_sent(metrics),
    }


def _received_model_verdict(metrics: Mapping[str, float]) -> str | None:
    """What a collaborator's checks said of the global model it received: rejected (not trained on), alarm (reported
    only, trained on), passed; None when it sent no verdict."""
    rejected = _finite_or_none(metrics.get(RECEIVED_MODEL_REJECTED))
    alarm = _finite_or_none(metrics.get(RECEIVED_MODEL_ALARM))
    if rejected is None and alarm is None:
        return None
    if rejected:
        return "rejected"
    return "alarm" if alarm else "passed"


def populations_sent(metrics: Mapping[str, float]) -> dict[str, int]:
    """attack_name -> the population size a collaborator's attack set its thresholds on (population__<attack>)."""
    out = {}
    for name, value in metrics.items():
        n = _finite_or_none(value) if name.startswith(POPULATION_PREFIX) else None
        if n is not None and n >= 0:
            out[name[len(POPULATION_PREFIX):]] = int(n)
    return out


# <attack>_tpr_at_fpr_<tolerance>, or one of its bounds
_TPR_METRIC = re.compile(r"^(?P<attack>.+)_" + re.escape(tpr_statistic(1)[:-1]) + r"(?P<tolerance>[^_]+)"
                         r"(?:_(?:" + "|".join(BOUNDS) + r"))?$")


def unresolvable(entry: Mapping, metric: str) -> bool:
    """Whether a collaborator's `metric` is a TPR at an FPR tolerance its population cannot resolve (fewer than 1/t
    samples: the figure is the TPR at population FPR 0), from the population size it sent; False when it sent
    none (the party's own page still marks it)."""
    match = _TPR_METRIC.match(metric)
    n = (entry.get("population") or {}).get(match.group("attack")) if match else None
    if n is None:
        return False
    try:
        tolerance = float(match.group("tolerance"))
    except ValueError:
        return False
    return not resolvable(tolerance, n)


UNRESOLVED_NOTE = ("* Unresolvable: the collaborator's population (the size it sent) has fewer than 1/t samples, so "
                   "its threshold at FPR t flags none of it and the figure is its TPR at population FPR 0, not at "
                   "FPR t; a mean or worst value marked * includes such a figure.")


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
                 aggregator_logs: Mapping[str, Any] | None = None, canary_clients: Mapping | None = None) -> dict:
    """The report of one round (a JSON-able dict).

    `decisions`: each collaborator's audit.config.gate_contract decision as the average made it
    (src.aggregation.round_decisions on the same TensorDB); a collaborator without one is decided from its
    metrics as if its tensors were finite. `canary_clients`: the round's user-level epsilon estimate
    (audit.canary.clients.CanaryClients.estimate), when the aggregator inserts canary clients.
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
        worst = max((e["audit_metrics"][name], n) for n, e in collaborators.items()
                    if e["audit_metrics"].get(name) is not None)
        # For privacy the worst collaborator counts, not the mean: the largest value and whose it is.
        averaged[name] = {"mean": sum(values) / len(values), "n": len(values), "max": worst[0], "worst": worst[1]}
    # What a reader would not expect from the gates' verdicts alone.
    notes = [f"{n}: {e['reason']}" for n, e in collaborators.items()
             if e["cause"] in (NO_GATE_METRIC, GATE_KEPT_NOT_FINITE, NON_FINITE_TENSORS)]
    return {
        "round": int(round_num),
        "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "authorized_collaborators": sorted(set(authorized)),
        **by_status,  # kept (= the updates averaged), withheld, left_out_non_finite, stragglers
        # the parties that did not train on this round's global model, and those whose checks only reported an alarm
        "rejected_received_model": [n for n, e in collaborators.items() if e["received_model"] == "rejected"],
        "received_model_alarms": [n for n, e in collaborators.items() if e["received_model"] == "alarm"],
        "collaborators": collaborators,
        "averaged_audit_metrics": averaged,
        "aggregator_logs": {k: _finite_or_none(v) for k, v in sorted((aggregator_logs or {}).items())},
        "notes": notes,
        **({"canary_clients": dict(canary_clients)} if canary_clients else {}),
    }


class AggregatorReportWriter(RoundReportWriter):
    """Writes round records under `root` and rebuilds the summaries from the round files on disk."""

    what = "aggregator round"
    party = "aggregator"  # in the report worker's log messages

    def write_round_in_background(self, record: Mapping) -> Path:
        """Store the round's record now and rebuild the summaries (CSVs, plots, page) on the process's report worker
        (audit.reporting.background): the aggregator writes its report inside OpenFL's end of round, which every
        collaborator waits for, and drawing the plots was 0.25-0.45 s of it per round (digits, 2 collaborators).
        Until drawn, the page shows the earlier rounds; the worker's flush() (at the experiment's end, at exit)
        waits for it."""
        record = self.prepare(record)
        path = atomic_write_json(self.record_path(record["round"]), record)
        render_queue.submit(self, record["round"])
        return path

    def render_key(self) -> str:
        return str(self.root.resolve())

    def render_round(self, round_num: int) -> None:
        """Nothing per round: every image is in the summaries (rebuild_summary)."""

    def rebuild_summary(self) -> None:
        records = self.load_rounds()
        atomic_write_text(self.root / "decisions.csv", _decisions_csv(records))
        atomic_write_text(self.root / "metrics.csv", _metrics_csv(records))
        plots = write_plots(records, self.root)
        # In a run's report root (the demo's --log_dir, or collaborators' reports beside it) the run index lists this
        # report and every party's, and this page links back to it.
        run_root = self.root.parent
        in_run = (run_root / "index.html").is_file()
        atomic_write_text(self.root / "index.html", _page(records, plots, run_index=in_run,
                                                          deanon=(self.root / "deanon" / "summary.csv").is_file()))
        if in_run:
            write_index(run_root)


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
                     "tripped", "received_model"])
    for record in records:
        for name, entry in record["collaborators"].items():
            tripped = ";".join(f"{k}={_fmt(v)}" for k, v in entry.get("tripped", {}).items())
            # Text (names, reasons) is escaped for spreadsheets; numbers are written as numbers.
            writer.writerow(spreadsheet_safe_row([
                record["round"], name, entry["status"], entry["reason"], entry["gate_reported"],
                _cell(entry.get("gate_retries")), _cell(entry.get("gate_epsilon")), tripped,
                entry.get("received_model") or ""]))
    return buf.getvalue()


def _metrics_csv(records: list[dict]) -> str:
    names = sorted({k for r in records for k in r.get("averaged_audit_metrics", {})})
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(spreadsheet_safe_row(["round", *STATUS_LISTS, *names, *(f"worst:{n}" for n in names)]))
    for r in records:
        averaged = r.get("averaged_audit_metrics", {})
        writer.writerow([r["round"], *(len(r.get(key, [])) for key in STATUS_LISTS),
                         *(float(averaged[n]["mean"]) if n in averaged else "" for n in names),
                         *(float(averaged[n]["max"]) if "max" in averaged.get(n, {}) else "" for n in names)])
    return buf.getvalue()


def gate_metrics(records: list[dict]) -> list[str]:
    """The metrics the collaborators' gates watch (those they sent limits, trip flags or missing flags for); empty
    when no gate is set."""
    return sorted({m for r in records for e in r["collaborators"].values()
                   for m in (*e.get("thresholds", {}), *e.get("tripped", {}), *e.get("missing", ()))
                   if m not in (NON_FINITE_UPDATE, DP_VIOLATED)})


def plotted_metrics(records: list[dict]) -> list[str]:
    """What the page plots per round: every gate metric, or without a gate the leak verdict's family-wise epsilon
    lower bound (the headline leakage every audited round has)."""
    watched = gate_metrics(records)
    if watched:
        return watched
    sent = {k for r in records for k in r.get("averaged_audit_metrics", {})}
    return [LEAK_EPSILON_LB] if LEAK_EPSILON_LB in sent else []


def _value_of(entry: Mapping, metric: str) -> float | None:
    """A collaborator's estimate of a metric, as it sent it: one kind of value for every collaborator, so the mean and
    the worst compare like with like (the interval bound a gate may compare stays with the party)."""
    return entry.get("audit_metrics", {}).get(metric)


def _plot_file(metric: str) -> str:
    return "gate_" + re.sub(r"[^A-Za-z0-9_.-]", "_", metric) + ".png"


def _threshold_of(record: Mapping, metric: str) -> float | None:
    found = {e.get("thresholds", {}).get(metric) for e in record["collaborators"].values()} - {None}
    return next(iter(found)) if len(found) == 1 else (max(found) if found else None)


def write_plots(records: list[dict], root: Path) -> list[tuple[str, str]]:
    """One plot per plotted metric (see plotted_metrics): each collaborator, the mean and the worst per round, the
    threshold; returns (metric, file name) for the page. Stale plots are removed."""
    made = []
    if records:
        rounds = [r["round"] for r in records]
        names = sorted({n for r in records for n in r["collaborators"]})
        for metric in plotted_metrics(records):
            values = {n: [_value_of(r["collaborators"][n], metric) if n in r["collaborators"] else None
                          for r in records] for n in names}
            values = {n: [math.nan if v is None else v for v in vs] for n, vs in values.items()}
            thresholds = [_threshold_of(r, metric) for r in records]
            tripped = {n: [metric in r["collaborators"].get(n, {}).get("tripped", {}) for r in records] for n in names}
            plot_collaborators(rounds, values, root / _plot_file(metric), metric=metric,
                               thresholds=[math.nan if t is None else t for t in thresholds], tripped=tripped)
            made.append((metric, _plot_file(metric)))
    keep = {name for _, name in made}
    for stale in root.glob("gate_*.png"):
        if stale.name not in keep:
            stale.unlink(missing_ok=True)
    return made


def _verdict_text(entry: Mapping, metric: str) -> str:
    """"0.524; compared 0.5967 > 0.58" for one collaborator and one gate metric: its estimate, and the value its gate
    compared with the threshold where it tripped (passed: at most the threshold)."""
    value, threshold = _value_of(entry, metric), entry.get("thresholds", {}).get(metric)
    tripped = entry.get("tripped", {})
    text = _fmt(value) if value is not None else "–"
    if metric in entry.get("missing", ()):
        return text + "; missing this round: gated (fail closed)"
    if metric in tripped:
        compared = _fmt(tripped[metric]) if tripped[metric] is not None else "not finite"
        return text + f"; compared {compared} > {_fmt(threshold) if threshold is not None else 'its threshold'}"
    if threshold is not None:
        return text + f"; passed (≤ {_fmt(threshold)})"
    return text if value is not None else ""


def leak_text(entry: Mapping) -> str:
    """A collaborator's leak verdict as its scalars say it: "leak detected (p 0.003); ε ≥ 0.42" or "no leak
    detected; ε ≥ 0"."""
    leak = entry.get("leak") or {}
    if leak.get("detected") is None:
        return "no leak verdict (not audited)"
    p = leak.get("p_value")
    said = f"leak detected (p {p:.2g})" if leak["detected"] and p is not None else (
        "leak detected" if leak["detected"] else "no leak detected")
    return said + (f"; ε ≥ {_fmt(leak['epsilon_lb'])}" if leak.get("epsilon_lb") is not None else "")


def _round_row(record: Mapping, names: list[str], metric: str | None) -> str:
    e = html.escape
    cells = []
    for n in names:
        entry = record["collaborators"].get(n)
        if entry is None:
            cells.append("<td></td>")
            continue
        verdict = entry.get("verdict", entry["status"])
        leak = entry.get("leak") or {}
        state = "not_audited" if leak.get("detected") is None else "leak" if leak["detected"] else "no_leak"
        detail = _verdict_text(entry, metric) if metric else ""
        mark = UNRESOLVED_MARK if metric and unresolvable(entry, metric) else ""
        if entry.get("received_model") in ("rejected", "alarm"):
            detail = ("rejected the received model" if entry["received_model"] == "rejected"
                      else "alarm on the received model (reported only)") + (f"; {detail}" if detail else "")
            detail_text = detail
        else:
            detail_text = f"{metric}: {detail}{mark}" if detail else ""
        cells.append(f'<td class="text"><span class="{e(verdict)}">{e(verdict)}</span> · '
                     f'<span class="{state}">{e(leak_text(entry))}</span>'
                     + (f"<br><span class=\"muted\">{e(detail_text)}</span>" if detail_text else "") + "</td>")
    summary = ""
    if metric:
        values = {n: v for n in names if n in record["collaborators"]
                  if (v := _value_of(record["collaborators"][n], metric)) is not None}
        worst = max(values.values()) if values else None
        # A worst collaborator is named only where the values differ: with equal values nobody is worse.
        who = [n for n, v in values.items() if v == worst] if len(set(values.values())) > 1 else []
        threshold = _threshold_of(record, metric)
        mark = UNRESOLVED_MARK if any(unresolvable(record["collaborators"][n], metric) for n in values) else ""
        summary = (f"<td>{e(_fmt(sum(values.values()) / len(values)) if values else '')}{mark}</td>"
                   f"<td>{e(_fmt(worst))}{mark}{e(f' ({who[0]})' if who else '')}</td>"
                   f"<td>{e(_fmt(threshold) if threshold is not None else 'none')}</td>")
    return (f'<tr><td><a href="#round-{record["round"]}">{record["round"]}</a></td>' + "".join(cells) + summary
            + f"<td class=\"text\">{e(', '.join(record['kept']) or 'none')}</td></tr>")


def withheld_warning(records: list[dict]) -> str | None:
    """A warning when every update of a collaborator, or of every collaborator, was kept out of the average over the
    whole run: the global model then never had its data (or never changed at all). None otherwise."""
    if not records:
        return None
    names = sorted({n for r in records for n in r["collaborators"]})
    never = [n for n in names if not any(r["collaborators"].get(n, {}).get("averaged") for r in records)]
    rounds = len(records)
    if never and len(never) == len(names):
        return (f"every update of every collaborator was kept out of the average in all {rounds} rounds: the global "
                "model never changed from the initial one")
    if never:
        return (f"every update of {', '.join(never)} was kept out of the average in all {rounds} rounds: the global "
                "model never learnt from its data")
    return None


_VOCABULARY = ("Leak verdicts, each party's own: <strong>leak detected</strong> when one of its attacks beat chance "
               "after the correction for how many figures it tested (Holm, at the audit's confidence; p: the adjusted "
               "p-value), else <strong>no leak detected</strong>; ε ≥: the epsilon lower bound its audit proves, "
               "corrected for its number of attacks. Gate verdicts, in the collaborators' words: <strong>kept</strong> (averaged as trained), <strong>dp_retrained</strong> (its "
               "gate retrained the update with DP; the DP-retrained update was averaged), <strong>withheld</strong> (its gate "
               "kept the update back: not averaged), <strong>left_out_non_finite</strong> (NaN/Inf in what it sent: not "
               "averaged), <strong>straggler</strong> (the round ended without it). Thresholds: each gate's, as the "
               "collaborators sent them. Values: the estimate each collaborator sent; where its gate tripped, also "
               "the value it compared (an interval's bound, as its gate's bound says: the bounds stay with the "
               "party). For privacy the worst (largest) collaborator counts, not the mean.")


def _received_model_section(records: list[dict], names: list[str]) -> list[str]:
    """Which parties rejected (or only flagged) which round's global model: their verdicts, nothing more."""
    checked = [r for r in records if any(e.get("received_model") for e in r["collaborators"].values())]
    if not checked:
        return []
    e = html.escape
    out = ["<h2>Received global model: checks before training</h2>",
           '<p class="muted">Before training, each party checks the global model it received (architecture, change '
           "against earlier rounds, the signatures of models built to extract data, and how many of its samples the "
           "update would give away; docs/received-model.md). <strong>rejected</strong>: it did not train on it and "
           "sent nothing new; <strong>alarm</strong>: a check fired but its plan only reports. Only the verdict "
           "reaches the aggregator.</p>"]
    flagged = [r for r in checked if r.get("rejected_received_model") or r.get("received_model_alarms")]
    if not flagged:
        out.append(f"<p>No party raised an alarm on any of the {len(checked)} rounds' global models.</p>")
        return out
    out.append('<div class="scroll"><table><tr><th>round</th>' + "".join(f"<th>{e(n)}</th>" for n in names) + "</tr>")
    for r in reversed(flagged):
        cells = []
        for n in names:
            verdict = (r["collaborators"].get(n) or {}).get("received_model") or ""
            css = {"rejected": WITHHELD, "alarm": "dp_retrained", "passed": KEPT}.get(verdict, "")
            cells.append(f'<td class="text"><span class="{css}">{e(verdict)}</span></td>')
        out.append(f'<tr><td><a href="#round-{r["round"]}">{r["round"]}</a></td>' + "".join(cells) + "</tr>")
    out.append("</table></div>")
    out.append(f"<p>{len(flagged)} of {len(checked)} rounds' global models were flagged by at least one party.</p>")
    return out


def _canary_clients_section(records: list[dict]) -> list[str]:
    """The user-level epsilon estimate of the global model per round (canary clients) beside the accountant's."""
    rows = [r["canary_clients"] for r in records if r.get("canary_clients")]
    if not rows:
        return []
    e = html.escape
    first = rows[0]
    out = ["<h2>User-level privacy of the global model (canary clients)</h2>",
           f"<p class=\"muted\">Each round {first['count']} canary clients (random update directions of the "
           f"parties' dp_fedavg clipping bound {_fmt(first['clip'])}, each at {_fmt(first['scale'])} of a party's "
           "share) go into the average and as many are held out; from their cosines with the model's change, the "
           f"epsilon of one party's presence in the published model (at delta {_fmt(first['delta'])}) is estimated "
           f"(Andrew et al., ICLR 2024): an estimate with its {first['confidence']:.0%} interval, not a bound. Beside "
           f"it the accountant's epsilon of the same release (noise multiplier {_fmt(first['sigma'])} of every "
           "averaged party). Held out z: each held-out canary's coordinate along its direction, in units of the "
           "parties' change per value: it must look like N(0, 1).</p>",
           '<div class="scroll"><table><tr><th>round</th><th>ε estimate [interval]</th><th>accountant ε</th>'
           "<th>run so far: ε estimate</th><th>run so far: accountant ε</th><th>held out z: mean, sd</th></tr>"]
    for c in reversed(rows):
        if not c.get("estimated"):
            out.append(f'<tr><td>{c["round"]}</td><td class="text" colspan="5">not estimated: {e(c["why"])}</td></tr>')
            continue
        lo, hi = c["epsilon_interval"]
        accountant = "∞ (no noise)" if c["accountant_epsilon"] is None else _fmt(c["accountant_epsilon"])
        run = "∞ (no noise)" if c["accountant_epsilon_run"] is None else _fmt(c["accountant_epsilon_run"])
        out.append(f'<tr><td>{c["round"]}</td><td>{_fmt(c["epsilon"])} [{_fmt(lo)}, {_fmt(hi)}]</td>'
                   f"<td>{e(accountant)}</td><td>{_fmt(c['epsilon_run'])} ({c['rounds']} rounds)</td>"
                   f"<td>{e(run)}</td><td>{_fmt(c['held_out_mean_z'])}, {_fmt(c['held_out_sd_z'])}</td></tr>")
    out.append("</table></div>")
    return out


def _summary(records: list[dict], names: list[str], metric: str | None) -> list[str]:
    """The page's first lines: what was averaged over the run, the gate (only where one is set) and each
    collaborator's leak verdicts, in one sentence each."""
    e = html.escape
    statuses = [entry.get("verdict", entry["status"]) for r in records for entry in r["collaborators"].values()]
    counts = ", ".join(f"{statuses.count(v)} {v.replace('_', ' ')}"
                       for v in (KEPT, DP_RETRAINED, WITHHELD, LEFT_OUT_NON_FINITE, STRAGGLER) if statuses.count(v))
    out = [f"<p>{len(records)} round{'s' if len(records) != 1 else ''}, {len(names)} collaborator"
           f"{'s' if len(names) != 1 else ''}; their updates: {e(counts)}.</p>"]
    if metric:
        thresholds = sorted({t for r in records for entry in r["collaborators"].values()
                             for m, t in entry.get("thresholds", {}).items() if m == metric and t is not None})
        out.append(f"<p>Gate: <code>{e(metric)}</code> at most {e(', '.join(_fmt(t) for t in thresholds) or '?')} "
                   "(each collaborator's gate decides on its own update).</p>")
    else:
        out.append("<p>No gate is set: every update is averaged as sent; the leak verdicts are the parties' own.</p>")
    leaks, leaked = [], False
    for n in names:
        said = [r["collaborators"][n].get("leak", {}).get("detected") for r in records if n in r["collaborators"]]
        audited = [d for d in said if d is not None]
        if audited:
            leaks.append(f"{n} in {sum(audited)} of {len(audited)} audited rounds")
            leaked = leaked or any(audited)
    if leaks:
        out.append(f'<p class="{"leak" if leaked else "no_leak"}">Leak detected (each party\'s own verdict): '
                   f"{e('; '.join(leaks))}.</p>")
    return out


def _round_section(record: Mapping, names: list[str]) -> list[str]:
    """One round: what was averaged, each collaborator's verdict, its gate metrics against their thresholds, the DP
    epsilon and the reason; then its audit metrics, collapsed."""
    e = html.escape
    counts = ", ".join(f"{key.replace('_', ' ')} {len(record.get(key, []))}" for key in STATUS_LISTS)
    out = [f'<h3 id="round-{record["round"]}">Round {record["round"]}</h3><p>averaged: '
           f"{e(', '.join(record['kept']) or 'none')} ({counts})</p>",
           '<div class="scroll"><table><tr><th>collaborator</th><th>verdict</th><th>gate metric vs threshold'
           "</th><th>DP ε</th><th>reason</th></tr>"]
    for name, entry in record["collaborators"].items():
        verdict = entry.get("verdict", entry["status"])
        checks = "; ".join(f"{m}: {t}" for m in sorted({*entry.get("thresholds", {}), *entry.get("tripped", {})})
                           if (t := _verdict_text(entry, m)))
        epsilon = (_fmt(entry.get("gate_epsilon")) if entry.get("gate_retries") and entry.get("gate_epsilon")
                   is not None else "no DP")
        out.append(f'<tr><td>{e(name)}</td><td class="text {e(verdict)}">{e(verdict)}</td>'
                   f'<td class="text">{e(checks or "–")}</td><td>{e(epsilon)}</td>'
                   f'<td class="text">{e(entry["reason"])}</td></tr>')
    out.append("</table></div>")
    return out + _metrics_table(record, names)


def _metrics_table(record: Mapping, names: list[str]) -> list[str]:
    """The round's audit metrics, collapsed: each one's mean over the collaborators, the worst (largest) value and
    whose it is where the values differ, and each collaborator's value; TPR figures a population cannot resolve
    marked."""
    e = html.escape
    averaged = record.get("averaged_audit_metrics", {})
    if not averaged:
        return []
    out = [f"<details><summary>Audit metrics: mean and worst collaborator ({len(averaged)} metrics)</summary>",
           '<div class="scroll"><table><tr><th>metric</th><th>mean</th><th>worst (max)</th>'
           "<th>worst collaborator</th>" + "".join(f"<th>{e(n)}</th>" for n in names) + "</tr>"]
    marked = False
    for m, a in averaged.items():
        entries = [record["collaborators"].get(n, {}) for n in names]
        per = [entry.get("audit_metrics", {}).get(m) for entry in entries]
        marks = [UNRESOLVED_MARK if v is not None and unresolvable(entry, m) else "" for entry, v in zip(entries, per)]
        any_mark = UNRESOLVED_MARK if any(marks) else ""
        marked = marked or bool(any_mark)
        worst = a.get("max", max((v for v in per if v is not None), default=None))
        sent = {v for v in per if v is not None}
        # A worst collaborator is named only where the values differ: with equal values nobody is worse.
        who = a.get("worst", "") if len(sent) > 1 else ("all equal" if len(sent) == 1 and len(per) > 1 else "")
        out.append(f"<tr><td>{e(m)}</td><td>{e(_fmt(a['mean']))}{any_mark}</td><td>{e(_fmt(worst))}{any_mark}</td>"
                   f'<td class="text">{e(who)}</td>'
                   + "".join(f"<td>{e(_fmt(v))}{mark}</td>" for v, mark in zip(per, marks)) + "</tr>")
    out.append("</table></div>")
    if marked:
        out.append(f'<p class="muted">{e(UNRESOLVED_NOTE)}</p>')
    out.append("</details>")
    return out


def _page(records: list[dict], plots: list[tuple[str, str]], *, run_index: bool, deanon: bool) -> str:
    e = html.escape
    body = (['<p><a href="../index.html">&larr; run index</a></p>'] if run_index else []) + [
        "<h1>Aggregator report</h1>",
        '<p>Data: <a href="decisions.csv">decisions.csv</a>, <a href="metrics.csv">metrics.csv</a>, '
        "one <code>round_NNNN.json</code> per round.</p>"]
    if deanon:
        body.append('<p><strong>Deanonymization (server side)</strong>: <a href="deanon/ap_over_chance.png">ap_over_chance.png'
                    '</a>, <a href="deanon/summary.csv">summary.csv</a>. How well an honest-but-curious server links '
                    "the updates it receives to the collaborator that sent them: average precision over chance per "
                    "attack and round (1 = a random guess; the ceiling, n/H_n for n collaborators, is a perfect "
                    "linkage).</p>"
                    '<p><img src="deanon/ap_over_chance.png" alt="server-side deanonymization: AP over chance per '
                    'round"></p>')
    if not records:
        body.append("<p>No rounds yet.</p>")
        return page("Aggregator report", body)
    names = sorted({n for r in records for n in r["collaborators"]})
    metric = next(iter(gate_metrics(records)), None)
    warning = withheld_warning(records)
    if warning:
        body.append(f'<p class="flag"><strong>Warning:</strong> {e(warning)}.</p>')
    body += _summary(records, names, metric)
    body.append("<h2>Verdict per round</h2>")
    body.append('<div class="scroll"><table><tr><th>round</th>' + "".join(f"<th>{e(n)}</th>" for n in names)
                + ("<th>mean</th><th>worst (max)</th><th>threshold</th>" if metric else "")
                + "<th>averaged</th></tr>")
    body += [_round_row(r, names, metric) for r in reversed(records)]
    body.append("</table></div>")
    body += _received_model_section(records, names)
    body += _canary_clients_section(records)
    if metric and any(unresolvable(entry, metric) for r in records for entry in r["collaborators"].values()):
        body.append(f'<p class="muted">{e(UNRESOLVED_NOTE)}</p>')
    body.append(f'<details><summary>How to read this page</summary><p class="muted">{_VOCABULARY}</p></details>')
    watched = gate_metrics(records)
    for name, file in plots:
        body.append(f"<h2>{e(name)} per round</h2>")
        body.append('<p class="muted">Each collaborator\'s value (dots), their mean and the worst (largest) of them'
                    + ("; the red line is the gate's threshold. A collaborator above the red line, or whose interval "
                       "reaches above it when its gate compares the upper bound (gate.bound: upper, the default), had "
                       "its update withheld or DP-retrained: ringed in red where its gate tripped." if name in watched
                       else ": no gate watches it.") + "</p>")
        body.append(f'<p><img src="{e(file)}" alt="{e(name)} per round for every collaborator"></p>')
    body.append(f"<details><summary>Rounds, newest first ({len(records)}): each collaborator's status, the reason "
                "and its audit metrics</summary>")
    for r in reversed(records):
        body += _round_section(r, names)
    body.append("</details>")
    return page("Aggregator report", body)
