"""The party report's pages: the party's index.html and the run's root index.html."""

from __future__ import annotations

import datetime as _dt
import html
import math
import re

import jinja2
from markupsafe import Markup
import json
import os
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote

from audit.config.fields import is_int
from audit.reporting.atomic_io import atomic_write_text
from audit.reporting.readings import (advantage_of, auc_of, confidence_of, csv_cell, epsilon_lb_of, exact_auc_band,
                                      exact_auc_of, float_or_nan, fmt, fmt_interval, ordered_models, rates_at, resolvable_at, tpr_at,
                                      unresolvable_metrics)
from audit.config.steps import registered
from audit.reporting.records import (HISTOGRAMS_FILE, load_cached_round_records,
                                     round_dir_name)
from audit.reporting.verdicts import LEAK, NO_LEAK, inverted_attacks, round_verdict

__all__ = ["page", "party_page", "write_index", "escape", "href", "now", "verdict_cell", "verdict_grid", "grid_cell",
           "AGGREGATOR_MARKER"]

# A folder of the run's report root holding this file is the aggregator's report (src.aggregator_report), not a party's.
AGGREGATOR_MARKER = "decisions.csv"

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
    '<p class="muted">Exact AUC: members against non-members over every threshold (ties count half), with its '
    "interval (each side holds at its level, near AUC 1 and at small sizes too). Grid AUC: Privacy Meter's, the area "
    "under the curve in the ROC image, whose thresholds are population quantiles; it stops at the population's "
    "range, so it reads low on a small population. TPR @ FPR ≤ t: the "
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


_INVERTED = "below 0.5: signal direction wrong, not a safer model"
_VERDICT_WORDS = {"kept": "kept", "dp_retrained": "dp_retrained (DP-retrained update sent)", "withheld": "withheld"}


def verdict_cell(verdict: str | None) -> str:
    """A verdict in the one vocabulary of every page (kept, dp_retrained, withheld, ...), styled by its class."""
    if not verdict:
        return '<td class="text muted">no gate</td>'
    return f'<td class="text {escape(verdict)}">{escape(verdict)}</td>'


def verdict_block(record: Mapping) -> list[str]:
    """The round's verdict, first on its section: the gate's verdict, the checks that decided it, the epsilon spent
    and the leak status in plain words; AUCs below 0.5 flagged."""
    v = round_verdict(record)
    cls = escape(v.verdict or "none")
    out = [f'<div class="verdict v-{cls}"><p><strong>Leak verdict: <span class="{escape(v.leak)}">'
           f'{escape(v.leak_text)}</span></strong></p><p><strong>Proven:</strong> {escape(v.proven)}</p>'
           + (f"<p><strong>What was sent:</strong> {escape(v.sent)}</p>" if v.sent else "")
           + f'<p><strong>Gate: <span class="{cls}">{escape(v.verdict or "no gate")}</span>'
           f"</strong>{escape(f' (action: {v.action})' if v.action else '')}"
           + (f" · {escape(v.status)}" if v.verdict else "") + f" · <strong>DP:</strong> {escape(v.epsilon)}</p>"]
    if v.checks:
        out.append("<ul>" + "".join(
            f'<li class="{"tripped" if c.tripped else ""}">{"<strong>decided it</strong>: " if c in v.deciding else ""}'
            f"{escape(c.text())}</li>" for c in v.checks) + "</ul>")
    low = inverted_attacks(record)
    if low:
        out.append(f'<p class="flag">Exact AUC below 0.5 ({escape(_INVERTED)}; reversed it would score 1 − AUC): '
                   + ", ".join(escape(f"{name} {fmt_interval(a, lo, hi, 3)}") for name, a, lo, hi in low) + "</p>")
    out.append("</div>")
    return out


_HIST_NOTE = ("Members' (blue) and non-members' (grey) per-sample values of each attack's signal: the more the two "
              "differ, the better a threshold tells them apart (the exact AUC above each panel). Panels in red have "
              "an AUC below 0.5.")


def _private_views(record: Mapping, d: str, files: set[str]) -> list[str]:
    """The round's histograms of the party's per-sample values, then each registered step's own section (Fidel's
    grid, the deanonymization self-audit's table, a plug-in's view: audit.config.steps `page_section`)."""
    out = []
    if HISTOGRAMS_FILE in files:
        link = href(d, HISTOGRAMS_FILE)
        out.append(f'<h4>Signal histograms</h4><p>{escape(_HIST_NOTE)}</p><p><a href="{link}"><img src="{link}" '
                   f'alt="{escape("signal histograms, round " + str(record["round"]))}" loading="lazy"></a></p>')
    for audit_step in registered():
        section = audit_step.load("page_section")
        if section is not None:
            out += section(record, d, files)
    return out


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


def sampling_note(record: Mapping) -> str | None:
    """One sentence when the membership audits used a sample of a set (audit.sample_size), else None."""
    sets = (record.get("sampling") or {}).get("sets") or {}
    cut = [(name, s) for name, s in sets.items()
           if isinstance(s, Mapping) and is_int(s.get("audited")) and is_int(s.get("of")) and s["audited"] < s["of"]]
    if not cut:
        return None
    names = {"members": "members", "nonmembers": "non-members", "population": "population samples"}
    parts = ", ".join(f"{s['audited']:,} of {s['of']:,} {names.get(name, name)}" for name, s in cut)
    return (f"Sampled: the membership attacks used {parts} (a random sample, the same every round; "
            f"audit.sample_size {record['sampling'].get('sample_size')}). Their intervals and counts are the "
            "sample's, so they cover the sampling.")


def round_section(record: Mapping, tols: list[float], files: set[str] | None = None) -> list[str]:
    """One round: its verdict first, then the views of the party's private files (`files`: those in its folder; None:
    not known, the ROC image linked as well), the attacks' table and the ROC image."""
    rnd = record["round"]
    d = round_dir_name(rnd)
    out = [f'<section class="round" id="{escape(d)}">', f"<h3>Round {escape(rnd)}</h3>"]
    out += verdict_block(record)
    sampled = sampling_note(record)
    if sampled:
        out.append(f'<p class="sampled">{escape(sampled)}</p>')
    out.append(f'<p class="muted"><a href="{href(d, "audit.json")}">audit.json</a>'
               + (f" · seed {escape(record['seed'])}" if record.get("seed") is not None else "") + "</p>")
    rows, marked = [], False
    for model in ordered_models(record["attacks"]):
        for signal in sorted(record["attacks"][model]):
            res = record["attacks"][model][signal]
            advantage, adv_lo, adv_hi = advantage_of(res)
            low = exact_auc_of(res) < 0.5
            cells = [f"<td>{escape(model)} / {escape(signal)}</td>",
                     f'<td{" class=inverted" if low else ""}>{escape(fmt_interval(exact_auc_of(res), *exact_auc_band(res)))}'
                     + (f'<br><span class="flag">{escape(_INVERTED)}</span>' if low else "") + "</td>",
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
        out += ["<h4>Membership-inference attacks</h4>", '<div class="scroll"><table>', head, *rows, "</table></div>",
                _AUC_NOTE]
        if marked:
            out.append(_UNRESOLVED_NOTE)
    if files is None or "roc.png" in files:  # drawn after the record (audit.reporting.background): maybe not yet
        out.append(f'<p><a href="{href(d, "roc.png")}"><img src="{href(d, "roc.png")}" '
                   f'alt="{escape(f"ROC curves, round {rnd}")}" loading="lazy"></a></p>')
    out += _private_views(record, d, files or set())
    details = {k: record[k] for k in ("settings", "timings", "extra") if record.get(k)}
    if details:
        text = json.dumps(details, sort_keys=True, indent=2, default=str)
        out.append(f"<details><summary>settings, timings, extra</summary><pre>{escape(text)}</pre></details>")
    out.append("</section>")
    return out


def verdict_table(records: list[dict]) -> list[str]:
    """Every round's verdict, newest first: what the page leads with."""
    rows = []
    for r in reversed(records):
        v = round_verdict(r)
        decided = "; ".join(c.text() for c in v.deciding) or "–"
        low = inverted_attacks(r)
        flag = (f'<br><span class="flag">{len(low)} attack{"s" if len(low) != 1 else ""} with AUC below 0.5 '
                "(signal direction wrong, not safer)</span>") if low else ""
        rows.append(f'<tr><td><a href="#{escape(round_dir_name(r["round"]))}">{escape(r["round"])}</a></td>'
                    f'<td class="text cell-{escape(v.leak)}">{escape(v.leak_text)}{flag}</td>'
                    f'<td class="text">{escape(v.proven)}</td>'
                    f"{verdict_cell(v.verdict)}<td class=\"text\">{escape(decided)}</td><td class=\"text\">"
                    f"{escape(v.epsilon)}</td></tr>")
    return ["<h2>Verdict per round</h2>",
            '<p class="muted">Leak verdict: whether any attack beat chance after the correction for how many figures '
            "were tested (Holm, at the audit's confidence), with the strongest figure, its interval and the interval "
            "corrected for the number of tests; when none did, what this round's counts could have detected at all "
            "(\"not detected\" is not \"safe\"). Proven: the epsilon lower bound of the strongest attack, corrected "
            "for the number of attacks. Gate: its verdict on the update this party sent (kept, dp_retrained: a "
            "DP-retrained update was sent, withheld: the received model was sent back), the metric and limit that "
            "decided it, and the epsilon DP training spent.</p>",
            '<div class="scroll"><table><tr><th>round</th><th>leak verdict</th><th>proven</th><th>gate</th>'
            "<th>decided by</th><th>DP ε spent</th></tr>", *rows, "</table></div>"]


def party_page(party: str, records: list[dict], tols: list[float], tpr_files: list[str], log_scale: bool,
               unplotted: Mapping[float, int] | None = None, round_files: Mapping[int, set[str]] | None = None) -> str:
    """The party's page; `unplotted`: tolerances without a TPR plot (no record's population resolves them) ->
    population size; `round_files`: round -> the file names in its folder (the private views it links)."""
    body = ['<p><a href="../index.html">&larr; run index</a></p>', f"<h1>Privacy audit: {escape(party)}</h1>"]
    if not records:
        body.append('<p>No audited rounds yet.</p>')
        return page(f"Privacy audit: {party}", body)
    latest = records[-1]["round"]
    body.append(
        f"<p>{len(records)} audited round{'s' if len(records) != 1 else ''} (latest: "
        f'<a href="#{escape(round_dir_name(latest))}">round {escape(latest)}</a>). '
        'Data: <a href="metrics.csv">metrics.csv</a>.</p>'
    )
    body += verdict_table(records)
    body += ["<h2>Membership-inference AUC per round (exact AUC)</h2>",
             '<p class="muted">Members against non-members over every threshold; bars: its confidence '
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
        body += round_section(r, tols, None if round_files is None else round_files.get(r["round"]))
    return page(f"Privacy audit: {party}", body)


def _latest_json(paths: list[Path]) -> dict | None:
    for path in reversed(paths):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def _page_link(root: Path, folder: Path) -> str:
    """The relative link from `root`'s index.html to `folder`'s page (``name/index.html`` for a folder of root)."""
    return href(*Path(os.path.relpath(folder / "index.html", root)).parts)


def _scan_reports(root: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """The aggregator reports (folders holding AGGREGATOR_MARKER) and party reports among root's folders that have a
    page: the demo's layout, every report beside the others in one root."""
    parties, aggregators = {}, {}
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except FileNotFoundError:
        entries = []
    for d in entries:
        if d.name.startswith(".") or not d.is_dir() or not (d / "index.html").is_file():
            continue
        (aggregators if (d / AGGREGATOR_MARKER).is_file() else parties)[d.name] = d
    return aggregators, parties


# Parsed round records of the parties, kept across index writes (the index is rewritten every round; a record is
# parsed again only when its file changed: audit.reporting.records.load_cached_round_records).
_RECORD_CACHE: dict = {}


def _party_records(folder: Path) -> dict[int, dict]:
    """Round -> the party's readable round record."""
    return {r["round"]: r for r in load_cached_round_records(folder, _RECORD_CACHE)}


def _short_figure(finding: Mapping) -> str:
    statistic = str(finding.get("statistic", ""))
    name = "AUC" if statistic == "exact_auc" else statistic.replace("tpr_at_fpr_", "TPR@")
    return f"{finding.get('attack')}: {name} {fmt(finding.get('estimate'), 2)}"


def grid_cell(record: Mapping | None) -> str:
    """One party's round on the run index: coloured by the leak verdict, the headline figure (or the floor), and
    the gate's verdict where it did not keep the update."""
    if record is None:
        return '<td class="text cell-not_audited muted">not audited</td>'
    v = round_verdict(record)
    leak = record.get("leak") or {}
    if v.leak == LEAK:
        head = leak.get("headline") or {}
        text = f"<strong>leak</strong><br>{escape(_short_figure(head))}<br>p {escape(fmt(head.get('p_adjusted'), 2))}"
    elif v.leak == NO_LEAK:
        floor = leak.get("floor") or {}
        text = ("no leak<br><span class=\"muted\">could detect AUC ≥ "
                f"{escape(fmt(floor.get('exact_auc'), 2))}</span>")
    else:
        text = "no verdict"
    epsilon = (leak.get("epsilon") or {}).get("value")
    if epsilon is not None:
        text += f"<br>ε ≥ {escape(fmt(epsilon, 2))}"
    gate = v.verdict or "kept"  # without a gate the update is sent as trained
    text += f'<br><span class="{escape(gate)}">{escape(gate if v.verdict else "sent (no gate)")}</span>'
    return f'<td class="text cell-{escape(v.leak)}" title="{escape(v.leak_text)}">{text}</td>'


def verdict_grid(parties: Mapping[str, Mapping[int, dict]], labels: Mapping[str, str]) -> list[str]:
    """The run index's picture: a party x round table of leak verdicts (red: leak detected, green: none detected,
    grey: not audited), so the worst party and round stand out at a glance."""
    rounds = sorted({r for records in parties.values() for r in records})
    if not rounds:
        return ["<p>No audited rounds yet.</p>"]
    leaking = {name: [r for r, rec in records.items() if (rec.get("leak") or {}).get("detected")]
               for name, records in parties.items()}
    said = "; ".join(f"{name} in round{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"
                     for name, rs in leaking.items() if rs)
    out = [f'<p class="{"flag" if said else "muted"}">' + (f"Leak detected: {escape(said)}." if said else
           "No leak detected in any audited round (see each cell for what its counts could have detected).") + "</p>",
           '<div class="scroll"><table><tr><th>party</th>' + "".join(f"<th>round {r}</th>" for r in rounds) + "</tr>"]
    for name, records in parties.items():
        out.append(f"<tr>{labels[name]}" + "".join(grid_cell(records.get(r)) for r in rounds) + "</tr>")
    out.append("</table></div>")
    out.append('<p class="muted">Each cell: whether an attack on that party\'s update beat chance after the '
               "correction for the number of figures tested (its strongest figure and adjusted p-value), or the "
               "smallest AUC its counts could have detected; the epsilon lower bound the audit proves; the gate's "
               "verdict where the update was not sent as trained.</p>")
    return out


def write_index(root: str | os.PathLike, *, aggregators: Mapping[str, Path] | None = None,
                parties: Mapping[str, Path] | None = None) -> Path:
    """Write ``root/index.html``, the run index: the aggregator's report and every party report, each with its latest
    verdict, linked relatively. By default the reports are root's folders with a page (an aggregator's holds
    AGGREGATOR_MARKER); `aggregators` / `parties` (name -> report folder, anywhere) name them instead, as for a
    multi-process run whose participants each write in their own folder (a folder without a page yet is listed
    unlinked)."""
    root = Path(root)
    if aggregators is None and parties is None:
        aggregators, parties = _scan_reports(root)
    aggregators, parties = dict(aggregators or {}), dict(parties or {})

    def name_cell(name: str, folder: Path) -> str:
        if (Path(folder) / "index.html").is_file():
            return f'<td><a href="{_page_link(root, Path(folder))}">{escape(name)}</a></td>'
        return f'<td>{escape(name)} <span class="muted">(no report written)</span></td>'

    body = ["<h1>Privacy audit: run index</h1>"]
    body.append("<h2>Leak verdict per party and round</h2>")
    if parties:
        body += verdict_grid({name: _party_records(Path(folder)) for name, folder in parties.items()},
                             {name: name_cell(name, Path(folder)) for name, folder in parties.items()})
    else:
        body.append("<p>No party reports yet.</p>")
    if aggregators:
        body.append('<h2>Aggregator</h2><p class="muted">Which updates were averaged each round, each collaborator\'s '
                    "gate metric beside its threshold, the mean and the worst collaborator.</p>")
        body.append('<div class="scroll"><table><tr><th>report</th><th>rounds</th><th>latest round</th>'
                    "<th>latest round's updates</th></tr>")
        for name, folder in aggregators.items():
            files = sorted((c for c in Path(folder).glob("round_*.json") if re.match(r"^round_\d+\.json$", c.name)),
                           key=lambda c: c.name)
            latest = _latest_json(files) or {}
            counts = ", ".join(f"{key.replace('_', ' ')}: {', '.join(latest.get(key) or []) or 'none'}"
                               for key in ("kept", "withheld", "left_out_non_finite", "stragglers") if key in latest)
            body.append(f"<tr>{name_cell(name, folder)}<td>{len(files)}</td>"
                        f'<td>{escape(latest.get("round", "–"))}</td><td class="text">{escape(counts or "–")}</td></tr>')
        body.append("</table></div>")
    return atomic_write_text(root / "index.html", page("Privacy audit: run index", body))
