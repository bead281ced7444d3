"""A party's page (root/<party>/index.html): what a reader needs in ten seconds first, the rest a click away.

Order: the headline chart (audit.reporting.overview_plots.plot_headline: the proven epsilon against the budget, or
the strongest figure against chance, per round), the verdict per round, then collapsed: how to read the page (once,
not per round), the attacks over rounds (the strongest attack per family; every attack a click further), each
round's section (its verdict, the strongest attack per family, every attack a click further, ROC curves,
histograms, the steps' own views) and the metrics per round.
"""

from __future__ import annotations

import json
import math
from typing import Mapping, Sequence

from audit.config.fields import is_int
from audit.config.steps import registered
from audit.reporting.headline import strongest_in_round
from audit.reporting.overview_plots import GATE_COLORS, epsilon_chart
from audit.reporting.page_parts import escape, href, page
from audit.reporting.readings import (advantage_of, auc_of, confidence_of, epsilon_lb_of, exact_auc_band, exact_auc_of,
                                      fmt, fmt_interval, rates_at, resolvable_at, series_keys, tpr_at)
from audit.reporting.records import HISTOGRAMS_FILE, round_dir_name
from audit.reporting.round_cells import UNRESOLVED_MARK, verdict_cell, verdict_row
from audit.reporting.round_views import RoundView, metric_cells, view_of
from audit.reporting.verdicts import LEAK, NO_LEAK, inverted_attacks, round_verdict
from audit.round_record import RoundRecord

__all__ = ["party_page", "round_section", "verdict_block", "verdict_row", "verdict_table", "metrics_table",
           "sampling_note", "verdict_cell", "UNRESOLVED_MARK"]

_AUC_NOTE = (
    "Exact AUC: members against non-members over every threshold (ties count half), with its "
    "interval (each side holds at its level, near AUC 1 and at small sizes too). Grid AUC: Privacy Meter's, the area "
    "under the curve in the ROC image, whose thresholds are population quantiles; it stops at the population's "
    "range, so it reads low on a small population. TPR @ FPR ≤ t: the "
    "threshold flags at most a share t of the population (ties are flagged whole or not at all); its Clopper-Pearson "
    "interval, and the members and non-members it flags. ε ≥: the empirical epsilon lower bound (TensorFlow "
    "Privacy's definition, Bonferroni-corrected over every threshold; 0 = nothing proven). Advantage: "
    "max |TPR − FPR| with its DKW interval. Intervals cover the sampling of the audited samples given the model, not other "
    "training runs. Metrics ending in _auc are the grid AUC, those ending in _exact_auc the exact one."
)
_VERDICT_NOTE = (
    "Leak verdict: whether any attack beat chance after the correction for how many figures were tested (Holm, at "
    "the audit's confidence), with the strongest figure, its interval and the interval corrected for the number of "
    "tests; when none did, what this round's counts could have detected at all (\"not detected\" is not \"safe\"). "
    "Proven: the epsilon lower bound of the strongest attack, corrected for the number of attacks. Gate: its verdict "
    "on the update this party sent (kept, dp_retrained: a DP-retrained update was sent, withheld: the received model "
    "was sent back), the metric and limit that decided it, and the epsilon DP training spent."
)
_FAMILY_NOTE = (
    "Default views show the strongest attack of each family (the population attack on the local model, on the "
    "received global model, the update attack, RMIA, any plug-in's); every attack is one click further."
)
_HIST_NOTE = ("Histograms: members' (blue) and non-members' (grey) per-sample values of each attack's signal; the more "
              "the two differ, the better a threshold tells them apart (the exact AUC above each panel). Panels in "
              "red have an AUC below 0.5; a log axis where the values span decades (losses near 0).")

_UNRESOLVED_NOTE = (
    "* Unresolvable: the population has fewer than 1/t samples, so the threshold at FPR t flags "
    "none of it and the figure is the TPR at population FPR 0, not at FPR t. Use a larger tolerance or a larger "
    "population (the data loader's audit ratio)."
)

_INVERTED = "below 0.5: signal direction wrong, not a safer model"


def verdict_block(record: RoundRecord) -> list[str]:
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


def _private_views(record: RoundRecord, d: str, files: set[str]) -> list[str]:
    """The round's histograms of the party's per-sample values, then each registered step's own section (Fidel's
    grid, the deanonymization self-audit's table, a plug-in's view: audit.config.steps `page_section`)."""
    out = []
    if HISTOGRAMS_FILE in files:
        link = href(d, HISTOGRAMS_FILE)
        out.append(f'<h4>Signal histograms</h4><p><a href="{link}"><img src="{link}" '
                   f'alt="{escape("signal histograms, round " + str(record.round))}" loading="lazy"></a></p>')
    for audit_step in registered():
        section = audit_step.load("page_section")
        if section is not None:
            out += section(record, d, files)
    return out


def _rates_cell(res: Mapping, t: float) -> str:
    """TPR at tolerance t with its interval and counts; marked where the sets cannot resolve t."""
    mark = UNRESOLVED_MARK if not resolvable_at(res, t) else ""
    rates = rates_at(res, t)
    if rates is None or not isinstance(rates.get("tpr"), Mapping) or not isinstance(rates.get("fpr"), Mapping):
        return f"<td>{escape(fmt(tpr_at(res, t)))}{mark}</td>"
    tpr, fpr = rates["tpr"], rates["fpr"]
    text = fmt_interval(tpr.get("rate"), tpr.get("lower"), tpr.get("upper"))
    counts = f"{fmt(tpr.get('k'))}/{fmt(tpr.get('n'))} members, {fmt(fpr.get('k'))}/{fmt(fpr.get('n'))} non-members"
    return (f'<td title="{escape(counts)}">{escape(text)}{mark}<br><span class="muted">{escape(counts)}</span>'
            "</td>")


def sampling_note(record: RoundRecord) -> str | None:
    """One sentence when the membership audits used a sample of a set (audit.sample_size), else None."""
    sets = (record.sampling or {}).get("sets") or {}
    cut = [(name, s) for name, s in sets.items()
           if isinstance(s, Mapping) and is_int(s.get("audited")) and is_int(s.get("of")) and s["audited"] < s["of"]]
    if not cut:
        return None
    names = {"members": "members", "nonmembers": "non-members", "population": "population samples"}
    parts = ", ".join(f"{s['audited']:,} of {s['of']:,} {names.get(name, name)}" for name, s in cut)
    return (f"Sampled: the membership attacks used {parts} (a random sample, the same every round; "
            f"audit.sample_size {record.sampling.get('sample_size')}). Their intervals and counts are the "
            "sample's, so they cover the sampling.")


def _attack_row(model: str, signal: str, res: Mapping, tols: list[float]) -> str:
    advantage, adv_lo, adv_hi = advantage_of(res)
    low = exact_auc_of(res) < 0.5
    cells = [f"<td>{escape(model)} / {escape(signal)}</td>",
             f'<td{" class=inverted" if low else ""}>{escape(fmt_interval(exact_auc_of(res), *exact_auc_band(res)))}'
             + (f'<br><span class="flag">{escape(_INVERTED)}</span>' if low else "") + "</td>",
             f"<td>{escape(fmt(auc_of(res)))}</td>"]
    cells += [_rates_cell(res, t) for t in tols]
    cells += [f"<td>{escape(fmt(epsilon_lb_of(res), 3))}</td>",
              f"<td>{escape(fmt_interval(advantage, adv_lo, adv_hi))}</td>",
              f"<td>{escape(fmt(res.get('n_members')))} / {escape(fmt(res.get('n_nonmembers')))}"
              f" / {escape(fmt(res.get('n_population')))}</td>"]
    return "<tr>" + "".join(cells) + "</tr>"


def _attack_table(record: RoundRecord, tols: list[float], pairs: list[tuple[str, str]]) -> list[str]:
    level = confidence_of([record])
    ci = f" [{fmt(100 * level, 3)}% CI]" if level == level else ""
    head = (f"<tr><th>model / signal</th><th>exact AUC{escape(ci)}</th><th>grid AUC (Privacy Meter)</th>"
            + "".join(f"<th>TPR @ FPR ≤ {escape(f'{t:g}')}{escape(ci)}</th>" for t in tols)
            + "<th>ε ≥</th><th>advantage</th><th>members / non-members / population</th></tr>")
    rows = [_attack_row(model, signal, record.attack(model, signal), tols) for model, signal in pairs]
    return ['<div class="scroll"><table>', head, *rows, "</table></div>"]


def _short_status(record: RoundRecord) -> str:
    v = round_verdict(record)
    leak = {LEAK: "leak detected", NO_LEAK: "no leak detected"}.get(v.leak, "no leak verdict")
    return f"{leak} · {v.verdict or 'no gate'}"


def round_section(record: RoundRecord, tols: list[float], files: set[str] | None = None, *,
                  open_: bool = False) -> list[str]:
    """One round, collapsed to its one-line status: its verdict first, then the views of the party's private files
    (`files`: those in its folder; None: not known, the ROC image linked as well), the strongest attack of each family
    (every attack a click further) and the ROC image."""
    rnd = record.round
    d = round_dir_name(rnd)
    v = round_verdict(record)
    out = [f'<details class="round" id="{escape(d)}"{" open" if open_ else ""}>',
           f'<summary><h3>Round {escape(rnd)}</h3> <span class="{escape(v.leak)}">{escape(_short_status(record))}'
           "</span></summary>"]
    out += verdict_block(record)
    sampled = sampling_note(record)
    if sampled:
        out.append(f'<p class="sampled">{escape(sampled)}</p>')
    out.append(f'<p class="muted"><a href="{href(d, "audit.json")}">audit.json</a>'
               + (f" · seed {escape(record.seed)}" if record.seed is not None else "") + "</p>")
    every = [tuple(key) for key in series_keys([record])]
    if every:
        strongest = strongest_in_round(record, exact_auc_of)
        out.append("<h4>Membership-inference attacks: the strongest of each family (by exact AUC)</h4>")
        out += _attack_table(record, tols, strongest)
        if len(strongest) < len(every):
            out.append(f"<details><summary>every attack ({len(every)})</summary>")
            out += _attack_table(record, tols, every)
            out.append("</details>")
    if files is None or "roc.png" in files:  # drawn after the record (audit.reporting.background): maybe not yet
        out.append(f'<p><a href="{href(d, "roc.png")}"><img src="{href(d, "roc.png")}" '
                   f'alt="{escape(f"ROC curves, round {rnd}")}" loading="lazy"></a></p>')
    out += _private_views(record, d, files or set())
    stored = record.to_json()  # as audit.json holds them
    details = {name: stored[name] for name in ("settings", "timings", "extra") if stored[name]}
    if details:
        text = json.dumps(details, sort_keys=True, indent=2, default=str)
        out.append(f"<details><summary>settings, timings, extra</summary><pre>{escape(text)}</pre></details>")
    out.append("</details>")
    return out


def verdict_table(views: list[RoundView]) -> list[str]:
    """Every round's verdict, newest first: what the page leads with after its chart."""
    notes = sorted({v.epsilon_zero for v in views if v.epsilon_zero})
    return ["<h2>Verdict per round</h2>",
            '<div class="scroll"><table><tr><th>round</th><th>leak verdict (the trained update)</th><th>proven</th>'
            "<th>gate</th><th>decided by</th><th>sent</th><th>DP ε spent</th></tr>", *(v.verdict_row for v in reversed(views)),
            "</table></div>", *(f'<p class="muted">{escape(notes[0])}.</p>' for _ in notes[:1])]


def metrics_table(views: list[RoundView]) -> tuple[list[str], bool]:
    """Every metric (a row) per round (a column, newest first), each with its interval where the record has both
    bounds (`<metric>_lower`, `<metric>_upper`: no columns of their own); returns the rows and whether any figure
    is marked unresolvable."""
    newest = list(reversed(views))
    cells = [metric_cells(v) for v in newest]
    shown = sorted({name for by_name in cells for name in by_name})
    out = ['<div class="scroll"><table><tr><th>metric</th>'
           + "".join(f'<th><a href="#{escape(round_dir_name(v.round))}">round {escape(v.round)}</a></th>'
                     for v in newest) + "</tr>"]
    for name in shown:
        out.append(f"<tr><td>{escape(name)}</td>" + "".join(by_name.get(name, "<td></td>") for by_name in cells)
                   + "</tr>")
    out.append("</table></div>")
    return out, any(v.unresolved & set(by_name) for v, by_name in zip(newest, cells))


def _summary_line(views: list[RoundView]) -> str:
    states = [v.verdict for v in views]
    leaked = [r.round for r, v in zip(views, states) if v.leak == LEAK]
    gated = {kind: [r.round for r, v in zip(views, states) if v.verdict == kind]
             for kind in ("withheld", "dp_retrained")}
    latest = views[-1].round
    text = (f"{len(views)} audited round{'s' if len(views) != 1 else ''} (latest: "
            f'<a href="#{escape(round_dir_name(latest))}">round {escape(latest)}</a>). ')
    if leaked:
        text += (f'<strong class="leak">Leak detected in {len(leaked)} of {len(views)}</strong> '
                 f"(rounds {escape(', '.join(map(str, leaked)))}). ")
    else:
        text += '<strong class="no_leak">No leak detected in any audited round</strong> (not the same as safe). '
    for kind, rounds in gated.items():
        if rounds:
            text += (f'<span class="{kind}">Update {escape(kind.replace("_", "-"))} in round'
                     f'{"s" if len(rounds) > 1 else ""} {escape(", ".join(map(str, rounds)))}.</span> ')
    over = [r.round for r, v in zip(views, states) if v.verdict == "kept" and any(c.tripped for c in v.checks)]
    if over:
        text += (f'<span class="flag">Over the gate\'s limit in round{"s" if len(over) > 1 else ""} '
                 f'{escape(", ".join(map(str, over)))}, sent all the same (its action only reports).</span> ')
    elif not any(gated.values()):
        gate_set = any(v.checks or r.budget_set for r, v in zip(views, states))
        text += "Every update was sent as trained" + ("" if gate_set else " (no gate is set)") + ". "
    return f"<p>{text}Data: <a href=\"metrics.csv\">metrics.csv</a>.</p>"


def _headline_caption(views: list[RoundView]) -> str:
    hatched = (" Shaded rounds, named under the axis: the update was withheld, DP-retrained, or over the gate's "
               "limit and sent all the same (a gate that only reports)."
               if any(v.headline.gate in GATE_COLORS for v in views) else "")
    if epsilon_chart([v.headline for v in views]):
        actions = {v.verdict.action for v in views if v.budget_set}
        done = ("only reported (the gate's action is report_only)" if actions == {"report_only"} else
                "withheld or DP-retrained, as the gate's action says")
        return ("Each dot: the epsilon lower bound the round's audit proves (family-wise over its attacks, at the "
                f"audit's confidence), red where a leak was detected; red line: the budget (an update whose bound "
                f"exceeds it is {done}); dashed: the most these counts could prove." + hatched)
    return ("Each dot: how sure the round's audit is that its strongest attack beats chance, -log10 of the "
            "Holm-adjusted p-value of its most significant test (one scale whether that figure is an exact AUC or a "
            "TPR at an FPR tolerance; the figure is written above the dot), red where a leak was detected (above the "
            "red line), green where none was. The audit is of the trained update." + hatched)


def _run_account(account, final_roc: str | None) -> list[str]:
    """The party's run in three lines (its account.json): the final model's verdict, the DP total, the rounds'."""
    final = account.final_model
    flagged = final is not None and (final.over_limits or (final.leak is not None and bool(final.leak.detected)))
    css = "leak" if flagged else "no_leak" if final is not None and final.audited else "muted"
    head = final.headline() if final is not None else "the final model: not audited yet (after the last round)"
    accuracy = (f" Its accuracy on this party's non-members: {fmt(final.accuracy, 3)}."
                if final is not None and final.accuracy is not None else "")
    roc = f' <a href="{href(*final_roc.split("/"))}">ROC</a>' if final_roc else ""
    dp = account.dp.text() if account.dp is not None else "DP: no round yet"
    return [f'<p class="{css}"><strong>{escape(head[0].upper() + head[1:])}</strong>.{escape(accuracy)}{roc}</p>',
            f"<p>{escape(dp)}; {escape(account.empirical.text())} (account.json).</p>"]


def party_page(party: str, records: list[RoundRecord] | list[RoundView], tols: list[float], tpr_files: list[str],
               log_scale: bool, unplotted: Mapping[float, int] | None = None,
               round_files: Mapping[int, set[str]] | None = None, *, headline: str | None = "headline.png",
               all_prefix: str = "all_", refused: Sequence[str] = (), account=None, final_roc: str | None = None) -> str:
    """The party's page, from its rounds' records or their views (audit.reporting.round_views); `unplotted`:
    tolerances without a TPR plot (no record's population resolves them) -> population size; `round_files`: round ->
    the file names in its folder (the private views it links); `headline`: the headline chart's file (None: none
    drawn); `all_prefix`: the every-attack plots' prefix; `refused`: a line per round record left out for its schema
    version (audit.round_record.RecordSchemaError); `account`: the party's account of the run
    (audit.run_record.PartyRun; None: none yet), shown first; `final_roc`: the final model's ROC image, relative to
    the page."""
    views = [r if isinstance(r, RoundView) else view_of(r) for r in records]
    body = ['<p><a href="../index.html">&larr; run index</a></p>', f"<h1>Privacy audit: {escape(party)}</h1>"]
    body += [f'<p class="flag">Not shown: {escape(line)}</p>' for line in refused]
    if account is not None:
        body += _run_account(account, final_roc)
    if not views:
        body.append('<p>No audited rounds yet.</p>')
        return page(f"Privacy audit: {party}", body)
    body.append(_summary_line(views))
    if headline:
        body.append(f'<p><img src="{href(headline)}" alt="{escape(party)}: headline leakage per round"></p>'
                    f'<p class="muted">{escape(_headline_caption(views))}</p>')
    body += verdict_table(views)

    marked = any(not resolvable_at(res, t) for summary in (v.summary for v in views)
                 for res in summary.attacks.values() for t in tols)
    notes = [_VERDICT_NOTE, _FAMILY_NOTE, _AUC_NOTE, _HIST_NOTE] + ([_UNRESOLVED_NOTE] if marked else [])
    body.append("<details><summary>How to read this page</summary>"
                + "".join(f'<p class="muted">{escape(n)}</p>' for n in notes) + "</details>")

    plotted = [t for t in tols if t not in (unplotted or {})]
    body.append("<details><summary>Attacks over rounds: exact AUC and TPR at each FPR tolerance, the strongest "
                "attack of each family</summary>")
    body.append('<p class="muted">Bars: each value\'s confidence interval; dotted line: a random guess'
                + ("; TPRs on a log axis where they span decades, a zero drawn as an open marker on its floor"
                   if log_scale else "") + ".</p>")
    body.append('<p><img src="auc.png" alt="exact AUC per round, the strongest attack of each family" '
                'loading="lazy"></p>')
    for t, name in zip(plotted, tpr_files):
        body.append(f'<p><img src="{href(name)}" alt="{escape(f"TPR at FPR {t:g} per round")}" loading="lazy"></p>')
    for t, n in (unplotted or {}).items():
        body.append(f'<p class="muted">TPR at FPR ≤ {escape(f"{t:g}")} is not plotted: {escape(fmt(n))} population '
                    f"samples cannot resolve it (a threshold flags none of them below 1/{escape(fmt(n))}; it needs "
                    f"{escape(fmt(math.ceil(1 / t)))}). The tables show its values, marked *.</p>")
    body.append("<details><summary>every attack</summary>"
                + f'<p><img src="{href(all_prefix + "auc.png")}" alt="exact AUC per round, every attack" '
                'loading="lazy"></p>'
                + "".join(f'<p><img src="{href(all_prefix + name)}" alt="{escape(f"TPR at FPR {t:g}, every attack")}"'
                          ' loading="lazy"></p>' for t, name in zip(plotted, tpr_files))
                + "</details></details>")

    body.append(f"<details><summary>Rounds, newest first ({len(views)}): each round's verdict, attacks, ROC "
                "curves and histograms</summary>")
    for v in reversed(views):
        body += v.section(round_section, tols, None if round_files is None else round_files.get(v.round),
                          v is views[-1])
    body.append("</details>")

    body.append("<details><summary>Metrics per round (table: one row per metric, its interval beside it)</summary>")
    if any(v.metric_names for v in views):
        table, any_marked = metrics_table(views)
        body += table
        if any_marked:
            body.append(f'<p class="muted">{escape(_UNRESOLVED_NOTE)}</p>')
    else:
        body.append("<p>No metrics recorded.</p>")
    body.append("</details>")
    return page(f"Privacy audit: {party}", body)
