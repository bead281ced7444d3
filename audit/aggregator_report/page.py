"""The aggregator report's page (index.html) and its plots from the round records (audit.aggregator_report.record):
the verdicts per round first, the received-model checks, the canary clients' epsilon, the gate metrics' plots, then
each round with its audit metrics.
"""

from __future__ import annotations

import html
import math
import re
from pathlib import Path
from typing import Mapping

from audit.config.gate_contract import (DP_RETRAINED, DP_VIOLATED, KEPT, LEFT_OUT_NON_FINITE, NON_FINITE_UPDATE,
                                        STRAGGLER, WITHHELD)
from audit.config.vocabulary import LEAK_EPSILON_LB, LEAK_P_VALUE
from audit.reporting.page_parts import page
from audit.reporting.records import round_file_name
from audit.reporting.party_page import UNRESOLVED_MARK  # the parties' mark, on their figures here too
from audit.reporting.metric_labels import averageable, metric_label, worse_when_lower
from audit.reporting.plots import plot_collaborators
from audit.aggregator_report.record import STATUS_LISTS, UNRESOLVED_NOTE, fmt, unresolvable, worst_value


def gate_metrics(records: list[dict]) -> list[str]:
    """The metrics the collaborators' gates watch (those they sent limits, trip flags or missing flags for); empty
    when no gate is set."""
    return sorted({m for r in records for e in r["collaborators"].values()
                   for m in (*e.get("thresholds", {}), *e.get("tripped", {}), *e.get("missing", ()))
                   if m not in (NON_FINITE_UPDATE, DP_VIOLATED)})


def plotted_metrics(records: list[dict]) -> list[str]:
    """What the page plots per round: every gate metric, or without a gate the leak verdict's adjusted p-value (how
    sure each party's test is that an attack beats chance), and its epsilon lower bound where one above 0 was proven."""
    watched = gate_metrics(records)
    if watched:
        return watched
    # Without a gate: how sure each party's test is (its adjusted p-value, on a log axis), and the epsilon bound only
    # where a round proved one above 0 (a chart of zeros says nothing).
    sent = {k for r in records for k in r.get("averaged_audit_metrics", {})}
    proven = any((e.get("leak") or {}).get("epsilon_lb") for r in records for e in r["collaborators"].values())
    return [m for m in (LEAK_P_VALUE, LEAK_EPSILON_LB) if m in sent and (m != LEAK_EPSILON_LB or proven)]


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
                               thresholds=[math.nan if t is None else t for t in thresholds], tripped=tripped,
                               label=metric_label(metric), worse_when_lower=worse_when_lower(metric),
                               log_y=worse_when_lower(metric),  # p-values span decades
                               mean=averageable(metric))
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
    text = fmt(value) if value is not None else "–"
    if metric in entry.get("missing", ()):
        return text + "; missing this round: gated (fail closed)"
    if metric in tripped:
        compared = fmt(tripped[metric]) if tripped[metric] is not None else "not finite"
        return text + f"; compared {compared} > {fmt(threshold) if threshold is not None else 'its threshold'} (tripped)"
    if threshold is not None:
        return text + f"; passed (≤ {fmt(threshold)})"
    return text if value is not None else ""


def leak_text(entry: Mapping) -> str:
    """A collaborator's leak verdict as its scalars say it: "leak detected (p 0.003); ε ≥ 0.42" or "no leak
    detected; ε ≥ 0"."""
    leak = entry.get("leak") or {}
    if leak.get("detected") is None:
        return "no leak verdict (not audited)"
    p = leak.get("p_value")
    said = f"trained update: leak detected (p {p:.2g})" if leak["detected"] and p is not None else (
        "trained update: leak detected" if leak["detected"] else "trained update: no leak detected")
    zero = " (beats chance, no ε provable with its counts)" if leak["detected"] and leak.get("epsilon_lb") == 0 else ""
    return said + (f"; ε ≥ {fmt(leak['epsilon_lb'])}{zero}" if leak.get("epsilon_lb") is not None else "")


def _round_row(record: Mapping, names: list[str], watched: list[str], newest: int) -> str:
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
        # the metrics that tripped its gate first; without a trip, every metric its gate watches
        tripped = [m for m in watched if m in entry.get("tripped", {}) or m in entry.get("missing", ())]
        shown = tripped or [m for m in watched if m in entry.get("thresholds", {})]
        details = [f"{metric_label(m)}: {t}{UNRESOLVED_MARK if unresolvable(entry, m) else ''}" for m in shown
                   if (t := _verdict_text(entry, m))]
        if entry.get("received_model") in ("rejected", "alarm"):
            details.insert(0, "rejected the received model" if entry["received_model"] == "rejected"
                           else "alarm on the received model (reported only)")
        if not watched:
            details.append("no gate")
        cells.append(f'<td class="text"><span class="{e(verdict)}">{e(verdict)}</span> · '
                     f'<span class="{state}">{e(leak_text(entry))}</span>'
                     + "".join(f'<br><span class="muted">{e(d)}</span>' for d in details) + "</td>")
    return (f'<tr><td>{_round_link(record, newest)}</td>' + "".join(cells)
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
               "party). For privacy the worst collaborator counts, not the mean: the largest of an AUC, a TPR or an ε "
               "bound, the smallest of a p-value; p-values and bounds are never averaged.")


# OpenFL's average of the parties' validation of the global model they received (aggregator logs, per round).
GLOBAL_ACCURACY = "aggregator/aggregated_model_validation/accuracy"


def utility_sentence(acc: Mapping[int, float], said: list[str], both: bool) -> str:
    """The utility result in one sentence (HTML-escaped), as the aggregator's page and the run index say it."""
    first, last = min(acc), max(acc)
    return html.escape(
        f"The global model's validation accuracy (OpenFL's average over the parties' validation sets) went from "
        f"{fmt(acc[first])} at round {first} to {fmt(acc[last])} at round {last}. Change over a round, by what its "
        f"average took: {'; '.join(said) or 'none measured yet'}"
        + ("" if both else " (the run has no rounds of the other kind to compare with)") + ".")


def utility_view(record: Mapping) -> dict:
    """What the utility section reads of an aggregator's round record (its round, the global model's accuracy, each
    collaborator's status and verdict): kept per round by a run index rewritten every round."""
    logs = record.get("aggregator_logs") or {}
    return {"round": record["round"],
            "aggregator_logs": {GLOBAL_ACCURACY: logs[GLOBAL_ACCURACY]} if GLOBAL_ACCURACY in logs else {},
            "collaborators": {name: {k: entry[k] for k in ("status", "verdict") if k in entry}
                              for name, entry in (record.get("collaborators") or {}).items()}}


def utility_of(records: list[dict]) -> str | None:
    """The utility sentence of an aggregator's round records, None where fewer than 2 rounds have an accuracy."""
    section = _utility_section(records)
    return section[1][3:-4] if section else None


def _utility_section(records: list[dict]) -> list[str]:
    """What the privacy actions cost in utility, as a result: the global model's validation accuracy at each round's
    start (OpenFL's average over the parties), and its change over the rounds whose average was gated (a DP retrain
    in it, or an update withheld) beside the rounds where every update went in as trained, where the run has both."""
    acc = {r["round"]: v for r in records if (v := (r.get("aggregator_logs") or {}).get(GLOBAL_ACCURACY)) is not None}
    if len(acc) < 2:
        return []
    e = html.escape

    def gated(record: Mapping) -> bool:
        return any(entry.get("verdict", entry["status"]) != KEPT for entry in record["collaborators"].values())

    by_round = {r["round"]: r for r in records}
    changes = {"gated": [], "as trained": []}
    rows = []
    for rnd in sorted(acc):
        nxt = acc.get(rnd + 1)
        kind = "gated" if gated(by_round[rnd]) else "as trained"
        what = ", ".join(f"{n} {entry.get('verdict', entry['status'])}" for n, entry in
                         by_round[rnd]["collaborators"].items())
        change = "" if nxt is None else f"{nxt - acc[rnd]:+.3f}"
        if nxt is not None:
            changes[kind].append(nxt - acc[rnd])
        rows.append(f"<tr><td>{rnd}</td><td>{fmt(acc[rnd])}</td><td class=\"text\">{e(what)}</td>"
                    f"<td>{e(change or '– (the next round has not validated it)')}</td></tr>")
    said = []
    for kind, values in changes.items():
        if values:
            said.append(f"rounds averaged {'with a DP retrain or an update withheld' if kind == 'gated' else 'as trained'}"
                        f": {sum(values) / len(values):+.3f} a round on average ({len(values)} round"
                        f"{'s' if len(values) != 1 else ''})")
    first, last = min(acc), max(acc)
    out = ["<h2>Utility: the global model's accuracy</h2>",
           f"<p>{utility_sentence(acc, said, all(changes.values()))}</p>",
           "<details><summary>Accuracy per round</summary>"
           '<div class="scroll"><table><tr><th>round</th><th>accuracy at its start</th><th>its updates</th>'
           "<th>change by the next round</th></tr>", *rows, "</table></div></details>"]
    return out


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
        out.append(f'<tr><td>{_round_link(r, records[-1]["round"])}</td>' + "".join(cells) + "</tr>")
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
           f"parties' dp_fedavg clipping bound {fmt(first['clip'])}, each at {fmt(first['scale'])} of a party's "
           "share) go into the average and as many are held out; from their cosines with the model's change, the "
           f"epsilon of one party's presence in the published model (at delta {fmt(first['delta'])}) is estimated "
           f"(Andrew et al., ICLR 2024): an estimate with its {first['confidence']:.0%} interval, not a bound. Beside "
           f"it the accountant's epsilon of the same release (noise multiplier {fmt(first['sigma'])} of every "
           "averaged party). Held out z: each held-out canary's coordinate along its direction, in units of the "
           "parties' change per value: it must look like N(0, 1).</p>",
           '<div class="scroll"><table><tr><th>round</th><th>ε estimate [interval]</th><th>accountant ε</th>'
           "<th>run so far: ε estimate</th><th>run so far: accountant ε</th><th>held out z: mean, sd</th></tr>"]
    for c in reversed(rows):
        if not c.get("estimated"):
            out.append(f'<tr><td>{c["round"]}</td><td class="text" colspan="5">not estimated: {e(c["why"])}</td></tr>')
            continue
        lo, hi = c["epsilon_interval"]
        accountant = "∞ (no noise)" if c["accountant_epsilon"] is None else fmt(c["accountant_epsilon"])
        run = "∞ (no noise)" if c["accountant_epsilon_run"] is None else fmt(c["accountant_epsilon_run"])
        out.append(f'<tr><td>{c["round"]}</td><td>{fmt(c["epsilon"])} [{fmt(lo)}, {fmt(hi)}]</td>'
                   f"<td>{e(accountant)}</td><td>{fmt(c['epsilon_run'])} ({c['rounds']} rounds)</td>"
                   f"<td>{e(run)}</td><td>{fmt(c['held_out_mean_z'])}, {fmt(c['held_out_sd_z'])}</td></tr>")
    out.append("</table></div>")
    return out


def _summary(records: list[dict], names: list[str], watched: list[str]) -> list[str]:
    """The page's first lines: what was averaged over the run, the gate (only where one is set) and each
    collaborator's leak verdicts, in one sentence each."""
    e = html.escape
    statuses = [entry.get("verdict", entry["status"]) for r in records for entry in r["collaborators"].values()]
    counts = ", ".join(f"{statuses.count(v)} {v.replace('_', ' ')}"
                       for v in (KEPT, DP_RETRAINED, WITHHELD, LEFT_OUT_NON_FINITE, STRAGGLER) if statuses.count(v))
    out = [f"<p>{len(records)} round{'s' if len(records) != 1 else ''}, {len(names)} collaborator"
           f"{'s' if len(names) != 1 else ''}; their updates: {e(counts)}.</p>"]
    if watched:
        rules = []
        for metric in watched:
            thresholds = sorted({t for r in records for entry in r["collaborators"].values()
                                 for m, t in entry.get("thresholds", {}).items() if m == metric and t is not None})
            trips = sum(metric in entry.get("tripped", {}) for r in records for entry in r["collaborators"].values())
            rules.append(f"{e(metric_label(metric))} (<code>{e(metric)}</code>) at most "
                         f"{e(', '.join(fmt(t) for t in thresholds) or '?')}: tripped {trips} time"
                         f"{'s' if trips != 1 else ''}")
        out.append(f"<p>Gate (each collaborator's gate decides on its own update): {'; '.join(rules)}.</p>")
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
        gated = any(e.get("verdict", e["status"]) != KEPT for r in records for e in r["collaborators"].values())
        whose = (" in the trained updates (each party's own verdict; a withheld or DP-retrained update's own leak was "
                 "not sent)" if gated else " (each party's own verdict)")
        out.append(f'<p class="{"leak" if leaked else "no_leak"}">Leak detected{e(whose)}: '
                   f"{e('; '.join(leaks))}.</p>")
    return out


# The rounds whose tables of every audit metric the page shows, the newest (each a table per collaborator and metric):
# a long run's page, and its every rewrite, would grow with its rounds; the older rounds' are in their round files.
SECTIONS_SHOWN = 20


def _round_link(record: Mapping, newest: int) -> str:
    """A round's number, linked to its section on the page, or to its round file when the page shows no section of
    it (SECTIONS_SHOWN)."""
    rnd = int(record["round"])
    target = f"#round-{rnd}" if rnd > newest - SECTIONS_SHOWN else round_file_name(rnd)
    return f'<a href="{target}">{rnd}</a>'


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
        epsilon = (fmt(entry.get("gate_epsilon")) if entry.get("gate_retries") and entry.get("gate_epsilon")
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
           '<div class="scroll"><table><tr><th>metric</th><th>mean</th><th>worst (its direction)</th>'
           "<th>worst collaborator</th>" + "".join(f"<th>{e(n)}</th>" for n in names) + "</tr>"]
    marked = False
    for m, a in averaged.items():
        entries = [record["collaborators"].get(n, {}) for n in names]
        per = [entry.get("audit_metrics", {}).get(m) for entry in entries]
        marks = [UNRESOLVED_MARK if v is not None and unresolvable(entry, m) else "" for entry, v in zip(entries, per)]
        any_mark = UNRESOLVED_MARK if any(marks) else ""
        marked = marked or bool(any_mark)
        worst = worst_value(a)
        sent = {v for v in per if v is not None}
        # A worst collaborator is named only where the values differ: with equal values nobody is worse.
        who = a.get("worst", "") if len(sent) > 1 else ("all equal" if len(sent) == 1 and len(per) > 1 else "")
        mean = (f"{e(fmt(a['mean']))}{any_mark}" if a.get("mean") is not None and averageable(m)
                else "<span class=\"muted\">not averaged</span>")
        out.append(f'<tr><td title="{e(metric_label(m))}">{e(m)}</td><td>{mean}</td>'
                   f"<td>{e(fmt(worst))}{any_mark}</td>"
                   f'<td class="text">{e(who)}</td>'
                   + "".join(f"<td>{e(fmt(v))}{mark}</td>" for v, mark in zip(per, marks)) + "</tr>")
    out.append("</table></div>")
    if marked:
        out.append(f'<p class="muted">{e(UNRESOLVED_NOTE)}</p>')
    out.append("</details>")
    return out


def page_html(records: list[dict], plots: list[tuple[str, str]], *, run_index: bool, deanon: bool) -> str:
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
    watched = gate_metrics(records)
    warning = withheld_warning(records)
    if warning:
        body.append(f'<p class="flag"><strong>Warning:</strong> {e(warning)}.</p>')
    body += _summary(records, names, watched)
    body += _utility_section(records)
    body.append("<h2>Verdict per round</h2>")
    body.append('<div class="scroll"><table><tr><th>round</th>' + "".join(f"<th>{e(n)}</th>" for n in names)
                + "<th>averaged</th></tr>")
    body += [_round_row(r, names, watched, records[-1]["round"]) for r in reversed(records)]
    body.append("</table></div>")
    body += _received_model_section(records, names)
    body += _canary_clients_section(records)
    if any(unresolvable(entry, m) for m in watched for r in records for entry in r["collaborators"].values()):
        body.append(f'<p class="muted">{e(UNRESOLVED_NOTE)}</p>')
    body.append(f'<details><summary>How to read this page</summary><p class="muted">{_VOCABULARY}</p></details>')
    for name, file in plots:
        body.append(f"<h2>{e(metric_label(name))} per round</h2>")
        worst = "smallest" if worse_when_lower(name) else "largest"
        body.append(f'<p class="muted"><code>{e(name)}</code>: each collaborator\'s value (dots), '
                    + ("their mean and " if averageable(name) else "")
                    + f"the worst ({worst}) of them"
                    + ("; the red line is the gate's threshold. A collaborator above the red line, or whose interval "
                       "reaches above it when its gate compares the upper bound (gate.bound: upper, the default), had "
                       "its update withheld or DP-retrained: ringed in red where its gate tripped." if name in watched
                       else ": no gate watches it." + (" A party's leak is detected where its adjusted p-value is "
                                                        "below 1 − the audit's confidence (0.05 at 95%)."
                                                        if worse_when_lower(name) else "")) + "</p>")
        body.append(f'<p><img src="{e(file)}" alt="{e(name)} per round for every collaborator"></p>')
    shown = records[-SECTIONS_SHOWN:]
    older = f"; rounds before {shown[0]['round']}: their round_NNNN.json" if len(records) > len(shown) else ""
    body.append(f"<details><summary>Rounds, newest first ({len(shown)} of {len(records)}{older}): each collaborator's "
                "status, the reason and its audit metrics</summary>")
    for r in reversed(shown):
        body += _round_section(r, names)
    body.append("</details>")
    return page("Aggregator report", body)
