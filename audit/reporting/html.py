"""The party report's pages: the party's index.html and the run's root index.html."""

from __future__ import annotations

import datetime as _dt
import html
import math

import jinja2
from markupsafe import Markup
import json
import os
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote

from audit.reporting.atomic_io import atomic_write_text
from audit.reporting.readings import (advantage_of, auc_of, confidence_of, csv_cell, epsilon_lb_of, exact_auc_band,
                                      exact_auc_of, fmt, fmt_interval, ordered_models, rates_at, resolvable_at, tpr_at,
                                      unresolvable_metrics)
from audit.reporting.records import ROUND_DIR_RE, round_dir_name

__all__ = ["page", "party_page", "write_index", "escape", "href", "now"]

def escape(text: Any) -> str:
    return html.escape(str(text), quote=True)


def href(*parts: str) -> str:
    return escape("/".join(quote(p) for p in parts))




# One page style for every report page (the party's, the run index, the aggregator's): templates/page.html.
_TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("audit.reporting", "templates"),
                                autoescape=jinja2.select_autoescape(["html"]), keep_trailing_newline=True)


def page(title: str, body: list[str]) -> str:
    """A whole HTML page in the shared style; `body` is HTML already escaped by its builder."""
    return _TEMPLATES.get_template("page.html").render(title=title, body=Markup("\n".join(body)), updated=now())


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


_AUC_NOTE = (
    '<p class="muted">Exact AUC: members against non-members over every threshold (ties count half), with its DeLong '
    "interval. Grid AUC: Privacy Meter's, the area under the curve in the ROC image, whose thresholds are population "
    "quantiles; it stops at the population's range, so it reads low on a small population. TPR @ FPR ≤ t: the "
    "threshold flags at most a share t of the population (ties are flagged whole or not at all); its Clopper-Pearson "
    "interval, and the members and non-members it flags. ε ≥: the empirical epsilon lower bound (TensorFlow "
    "Privacy's definition, Bonferroni-corrected over every threshold; 0 = nothing proven). Advantage: max |TPR − FPR| "
    "with its DKW interval. Intervals cover the sampling of the audited samples given the model, not other "
    "training runs.</p>"
)


# A figure read at an FPR tolerance the party's sets are too small for (audit.membership.resolution).
_UNRESOLVED_MARK = '<sup title="unresolvable: fewer than 1/t population samples">*</sup>'
_UNRESOLVED_NOTE = (
    '<p class="muted">* Unresolvable: the population has fewer than 1/t samples, so the threshold at FPR t flags '
    "none of it and the figure is the TPR at population FPR 0, not at FPR t. Use a larger tolerance or a larger "
    "population (the data loader's audit ratio).</p>"
)


def _rates_cell(res: Mapping, t: float) -> str:
    """TPR at tolerance t with its interval and counts; marked where the sets cannot resolve t."""
    mark = _UNRESOLVED_MARK if not resolvable_at(res, t) else ""
    rates = rates_at(res, t)
    if rates is None or not isinstance(rates.get("tpr"), Mapping) or not isinstance(rates.get("fpr"), Mapping):
        return f"<td>{escape(fmt(tpr_at(res, t)))}{mark}</td>"
    tpr, fpr = rates["tpr"], rates["fpr"]
    text = fmt_interval(tpr.get("rate"), tpr.get("lower"), tpr.get("upper"))
    counts = f"{fmt(tpr.get('k'))}/{fmt(tpr.get('n'))} members, {fmt(fpr.get('k'))}/{fmt(fpr.get('n'))} non-members"
    return (f'<td title="{escape(counts)}">{escape(text)}{mark}<br><span class="muted">{escape(counts)}</span>'
            "</td>")


def round_section(record: Mapping, tols: list[float]) -> list[str]:
    rnd = record["round"]
    d = round_dir_name(rnd)
    out = [f'<section class="round" id="{escape(d)}">', f"<h3>Round {escape(rnd)}</h3>"]
    out.append(f'<p class="muted"><a href="{href(d, "audit.json")}">audit.json</a>'
               + (f" · seed {escape(record['seed'])}" if record.get("seed") is not None else "") + "</p>")
    rows, marked = [], False
    for model in ordered_models(record["attacks"]):
        for signal in sorted(record["attacks"][model]):
            res = record["attacks"][model][signal]
            advantage, adv_lo, adv_hi = advantage_of(res)
            cells = [f"<td>{escape(model)} / {escape(signal)}</td>",
                     f"<td>{escape(fmt_interval(exact_auc_of(res), *exact_auc_band(res)))}</td>",
                     f"<td>{escape(fmt(auc_of(res)))}</td>"]
            cells += [_rates_cell(res, t) for t in tols]
            marked = marked or not all(resolvable_at(res, t) for t in tols)
            cells += [f"<td>{escape(fmt(epsilon_lb_of(res), 3))}</td>",
                      f"<td>{escape(fmt_interval(advantage, adv_lo, adv_hi))}</td>",
                      f"<td>{escape(fmt(res.get('n_members')))} / {escape(fmt(res.get('n_nonmembers')))}"
                      f" / {escape(fmt(res.get('n_population')))}</td>"]
            rows.append("<tr>" + "".join(cells) + "</tr>")
    if rows:
        level = confidence_of([record])
        ci = f" [{fmt(100 * level, 3)}% CI]" if level == level else ""
        head = (f"<tr><th>model / signal</th><th>exact AUC{escape(ci)}</th><th>grid AUC (Privacy Meter)</th>"
                + "".join(f"<th>TPR @ FPR ≤ {escape(f'{t:g}')}{escape(ci)}</th>" for t in tols)
                + "<th>ε ≥</th><th>advantage</th><th>members / non-members / population</th></tr>")
        out += ['<div class="scroll"><table>', head, *rows, "</table></div>", _AUC_NOTE]
        if marked:
            out.append(_UNRESOLVED_NOTE)
    out.append(f'<p><a href="{href(d, "roc.png")}"><img src="{href(d, "roc.png")}" '
               f'alt="{escape(f"ROC curves, round {rnd}")}" loading="lazy"></a></p>')
    details = {k: record[k] for k in ("settings", "timings", "extra") if record.get(k)}
    if details:
        text = json.dumps(details, sort_keys=True, indent=2, default=str)
        out.append(f"<details><summary>settings, timings, extra</summary><pre>{escape(text)}</pre></details>")
    out.append("</section>")
    return out


def party_page(party: str, records: list[dict], tols: list[float], tpr_files: list[str], log_scale: bool,
               unplotted: Mapping[float, int] | None = None) -> str:
    """The party's page; `unplotted`: tolerances without a TPR plot (no record's population resolves them) ->
    population size."""
    body = ['<p><a href="../index.html">&larr; all parties</a></p>', f"<h1>Privacy audit: {escape(party)}</h1>"]
    if not records:
        body.append('<p>No audited rounds yet.</p>')
        return page(f"Privacy audit: {party}", body)
    latest = records[-1]["round"]
    body.append(
        f"<p>{len(records)} audited round{'s' if len(records) != 1 else ''} (latest: "
        f'<a href="#{escape(round_dir_name(latest))}">round {escape(latest)}</a>). '
        'Data: <a href="metrics.csv">metrics.csv</a>.</p>'
    )
    body += ["<h2>Membership-inference AUC per round (exact AUC)</h2>",
             '<p class="muted">Members against non-members over every threshold; bars: its DeLong confidence '
             "interval. Privacy Meter's grid AUC is in the tables: metrics ending in <code>_auc</code> are the grid "
             "AUC, those ending in <code>_exact_auc</code> the exact one (<code>_lower</code>, <code>_upper</code>: "
             "its interval's bounds).</p>",
             '<p><img src="auc.png" alt="exact AUC per round for every model and signal"></p>']
    if tpr_files:
        body.append("<h2>TPR at fixed FPR per round</h2>")
        body.append('<p class="muted">With the threshold flagging at most a share t of the population; bars: '
                    "the TPR's Clopper-Pearson interval. Dotted line: a random guess (TPR = FPR)"
                    + ("; log-scaled TPR" if log_scale else "") + ".</p>")
        for t, name in zip([t for t in tols if t not in (unplotted or {})], tpr_files):
            body.append(f'<p><img src="{href(name)}" alt="{escape(f"TPR at FPR {t:g} per round")}"></p>')
    for t, n in (unplotted or {}).items():
        body.append(f'<p class="muted">TPR at FPR ≤ {escape(f"{t:g}")} is not plotted: {escape(fmt(n))} population '
                    f"samples cannot resolve it (a threshold flags none of them below 1/{escape(fmt(n))}; it needs "
                    f"{escape(fmt(math.ceil(1 / t)))}). The tables show its values, marked *.</p>")
    names = sorted({k for r in records for k in r["metrics"]})
    body.append("<h2>Metrics per round</h2>")
    if names:
        body.append('<div class="scroll"><table>')
        body.append("<tr><th>round</th>" + "".join(f"<th>{escape(n)}</th>" for n in names) + "</tr>")
        any_marked = False
        for r in reversed(records):
            unresolved = unresolvable_metrics(r)
            any_marked = any_marked or bool(unresolved & set(r["metrics"]))
            cells = "".join(
                f'<td title="{escape(csv_cell(r["metrics"][n]))}">{escape(fmt(r["metrics"][n]))}'
                f'{_UNRESOLVED_MARK if n in unresolved else ""}</td>'
                if n in r["metrics"] else "<td></td>"
                for n in names
            )
            body.append(f'<tr><td><a href="#{escape(round_dir_name(r["round"]))}">{escape(r["round"])}</a></td>{cells}</tr>')
        body.append("</table></div>")
        if any_marked:
            body.append(_UNRESOLVED_NOTE)
    else:
        body.append("<p>No metrics recorded.</p>")
    body.append("<h2>Rounds (newest first)</h2>")
    for r in reversed(records):
        body += round_section(r, tols)
    return page(f"Privacy audit: {party}", body)


def write_index(root: str | os.PathLike) -> Path:
    """Write ``root/index.html`` linking every party report (``root/<party>/index.html``) found on disk."""
    root = Path(root)
    parties = []
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except FileNotFoundError:
        entries = []
    for d in entries:
        if d.name.startswith(".") or not d.is_dir() or not (d / "index.html").is_file():
            continue
        rounds = sorted(
            int(m.group(1)) for c in d.iterdir()
            if (m := ROUND_DIR_RE.match(c.name)) and (c / "audit.json").is_file()
        )
        parties.append((d.name, rounds))
    body = ["<h1>Privacy audit reports</h1>"]
    if parties:
        body.append("<table><tr><th>party</th><th>audited rounds</th><th>latest round</th></tr>")
        for name, rounds in parties:
            latest = str(rounds[-1]) if rounds else "–"
            body.append(f'<tr><td><a href="{href(name, "index.html")}">{escape(name)}</a></td>'
                        f"<td>{len(rounds)}</td><td>{escape(latest)}</td></tr>")
        body.append("</table>")
    else:
        body.append("<p>No party reports yet.</p>")
    return atomic_write_text(root / "index.html", page("Privacy audit reports", body))


