"""The run index (root/index.html): one picture of every party's leak verdict per round, the same as a table, and
the aggregator's report. The party's page is audit.reporting.party_page; what every page shares,
audit.reporting.page_parts (both re-exported here)."""

from __future__ import annotations

import json
import math
import os
import re
import threading
from pathlib import Path
from typing import Mapping

from audit.aggregator_report.page import utility_of, utility_view
from audit.reporting.atomic_io import atomic_write_text
from audit.reporting.headline import OVER_SENT, worst_of
from audit.reporting.overview_plots import plot_verdict_grid
from audit.reporting.page_parts import escape, href, now, page
from audit.reporting.party_page import party_page, sampling_note
from audit.reporting.readings import fmt
from audit.reporting.records import load_round_files
from audit.reporting.round_cells import grid_cell, verdict_cell
from audit.reporting.round_views import RoundView, load_round_views, view_of
from audit.reporting.run_file import write_run_file
from audit.reporting.verdicts import AS_TRAINED, DP_RETRAIN_SENT, EPSILON_ZERO_SHORT, LEAK, NO_LEAK
from audit.round_record import RoundRecord
from audit.run_record import RUN_FILE, RunInfo, RunRecord
from audit.run_states import FAILED, FINISHED, INTERRUPTED, RUNNING

__all__ = ["page", "party_page", "write_index", "redraw_index", "run_account_section", "run_state_lines", "escape",
           "href", "now", "verdict_cell", "verdict_grid", "grid_cell", "sampling_note", "AGGREGATOR_MARKER", "GRID_IMAGE"]

# A folder of the run's report root holding this file is the aggregator's report (audit.aggregator_report.writer), not a party's.
AGGREGATOR_MARKER = "decisions.csv"

GRID_IMAGE = "verdicts.png"  # the run index's picture: party x round leak verdicts (overview_plots)


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


def _party_views(folder: Path) -> dict[int, RoundView]:
    """Round -> the view of the party's readable round record (audit.reporting.round_views: made once per record,
    kept for the process; the index is rewritten every round)."""
    return {v.round: v for v in load_round_views(folder)}


def verdict_grid(parties: Mapping[str, Mapping[int, RoundView | RoundRecord]], labels: Mapping[str, str]) -> list[str]:
    """The run index's table under its picture (GRID_IMAGE): a party x round table of leak verdicts (red: leak
    detected, green: none detected, grey: not audited), each cell's figures in full and each party's page linked.
    `parties`: each party's rounds, their views (audit.reporting.round_views) or records."""
    rounds = sorted({r for records in parties.values() for r in records})
    if not rounds:
        return ["<p>No audited rounds yet.</p>"]

    def cell(found) -> str:
        return found.grid_cell if isinstance(found, RoundView) else grid_cell(found)

    out = ['<div class="scroll"><table><tr><th>party</th>' + "".join(f"<th>round {r}</th>" for r in rounds) + "</tr>"]
    for name, records in parties.items():
        out.append(f"<tr>{labels[name]}" + "".join(cell(records.get(r)) for r in rounds) + "</tr>")
    out.append("</table></div>")
    out.append('<p class="muted">Each cell: whether an attack on that party\'s trained update beat chance after the '
               "correction for the number of figures tested (its strongest figure and adjusted p-value), or the "
               "smallest AUC its counts could have detected; the epsilon lower bound the audit proves; what was sent "
               "(as trained, a DP retrain with its own audit's verdict, or nothing).</p>")
    return out


def _worst_how(h, view: RoundView) -> str:
    """The worst round's figure, how sure, and its epsilon bound said as what it is."""
    how = (f"{h.attack} {h.figure} (corrected interval [{fmt(h.corrected[0], 2)}, {fmt(h.corrected[1], 2)}], "
           f"chance {fmt(h.chance, 3)}, adjusted p = {fmt(h.p_adjusted, 2)})")
    if not math.isnan(h.epsilon):
        how += f"; ε ≥ {fmt(h.epsilon, 3)}" + (f" against a budget of {fmt(h.budget)}" if not math.isnan(h.budget)
                                               else "")
        if view.epsilon_zero:
            how += f" ({EPSILON_ZERO_SHORT}: see below)"
    return how


def _sent_summary(views: Mapping[str, Mapping[int, RoundView]]) -> list[str]:
    """What was sent, per party: the rounds sent as trained, as a DP retrain (with its own audit's verdict) or not at
    all, and the rule that tripped the gate (the compared value named), the same words as the console's."""
    items = []
    for name, by_round in views.items():
        groups: dict[str, list[int]] = {}
        for r, view in sorted(by_round.items()):
            sent = view.sent
            if sent.what == AS_TRAINED:
                key = "sent as trained" + ("" if view.gate_set else " (no gate)")
            elif sent.what == DP_RETRAIN_SENT:
                key = f"sent a DP retrain ({sent.text.split('(', 1)[1]}"
            else:
                key = "sent nothing (withheld)"
            groups.setdefault(key, []).append(r)
        said = "; ".join(f"{what} in round{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"
                         for what, rs in groups.items())
        why = sorted({view.rule for view in by_round.values() if view.rule})
        items.append(f"<li><strong>{escape(name)}</strong>: {escape(said)}."
                     + (f'<br><span class="muted">Tripped by: {escape("; ".join(why))}.</span>' if why else "")
                     + "</li>")
    return items


def run_summary(records: Mapping[str, Mapping[int, RoundView | RoundRecord]]) -> list[str]:
    """The run index's first lines: which parties' trained updates leaked in which rounds, the worst round (its
    strongest figure and how sure), what was sent (as trained, a DP retrain with its own verdict, nothing) and the
    rule that tripped each gate, each in one sentence. `records`: each party's rounds, their views
    (audit.reporting.round_views) or records."""
    records = {name: {r: rec if isinstance(rec, RoundView) else view_of(rec) for r, rec in by_round.items()}
               for name, by_round in records.items()}
    headlines = {(name, r): view.headline for name, by_round in records.items() for r, view in by_round.items()}
    audited = sum(1 for h in headlines.values() if h.state in (LEAK, NO_LEAK))
    leaked = [key for key, h in headlines.items() if h.state == LEAK]
    gated = any(view.sent.what != AS_TRAINED for by_round in records.values() for view in by_round.values())
    out = []
    if leaked:
        per_party = {}
        for name, r in sorted(leaked, key=lambda k: (list(records).index(k[0]), k[1])):
            per_party.setdefault(name, []).append(r)
        said = "; ".join(f"{name} in {len(rs)} of {len(records[name])} rounds" for name, rs in per_party.items())
        worst = worst_of({key: headlines[key] for key in leaked})
        h = headlines[worst]
        what = "Leak detected in the trained updates" if gated else "Leak detected"
        out.append(f'<p class="leak">{what}: {escape(said)}. Worst: {escape(worst[0])}, round {worst[1]}: '
                   f"{escape(_worst_how(h, records[worst[0]][worst[1]]))}.</p>")
    elif audited:
        out.append(f'<p class="no_leak"><strong>No leak detected</strong> in any of the {audited} audited rounds '
                   "(\"not detected\" is not \"safe\": each cell below says what its counts could have "
                   "detected).</p>")
    if gated:
        sent_leaks = [key for key in headlines if (s := records[key[0]][key[1]].sent) and s.sent and s.leak == LEAK]
        verdict = (f'<span class="leak">leak detected in {len(sent_leaks)} of the updates sent</span>' if sent_leaks
                   else '<span class="no_leak">no leak detected in any update that was sent</span>')
        out.append(f"<p><strong>What was sent</strong> ({verdict}; a withheld or DP-retrained update's own leak was "
                   "never sent):</p><ul>" + "".join(_sent_summary(records)) + "</ul>")
    else:
        gate_set = any(view.gate_set for by_round in records.values() for view in by_round.values())
        out.append(f"<p>What was sent: every update as trained{'' if gate_set else ' (no gate is set)'}.</p>")
    over = {name: [r for r in sorted(by_round) if headlines[(name, r)].gate == OVER_SENT]
            for name, by_round in records.items()}
    if any(over.values()):
        said = "; ".join(f"{name} in round{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"
                         for name, rs in over.items() if rs)
        out.append(f"<p>Over the gate's limit and sent as trained (the gate only reports): {escape(said)}.</p>")
    zero = next((view.epsilon_zero for by_round in records.values() for view in by_round.values()
                 if view.epsilon_zero), None)
    if zero:
        out.append(f'<p class="muted">{escape(zero)}.</p>')
    return out


def run_account_section(run: RunRecord) -> list[str]:
    """The run index's first lines (from run.json): per party, the final model's verdict (the run's headline for
    it), its DP total and what the rounds' audits measured; the run's state."""
    if not run.parties:
        return []
    state = {RUNNING: "running: the figures cover the rounds written so far", FINISHED: "finished",
             INTERRUPTED: "interrupted: the run ended early; the figures cover the rounds written",
             FAILED: "failed: the run ended early on an error; the figures cover the rounds written"}[run.state]
    out = ["<h2>What the run cost each party</h2>",
           f'<p class="muted">Run {escape(state)}; {escape(RUN_FILE)} holds all of it (python -m workspace verdict '
           "prints it).</p>", "<ul>"]
    for name, party in run.parties.items():
        final = party.final_model
        flagged = final is not None and (final.over_limits or (final.leak is not None and bool(final.leak.detected)))
        css = "leak" if flagged else "no_leak" if final is not None and final.audited else "muted"
        head = final.headline() if final is not None else "the final model: not audited yet"
        out.append(f'<li><strong>{escape(name)}</strong>: <span class="{css}">{escape(head)}</span>.<br>'
                   f"{escape(party.dp.text() if party.dp is not None else 'DP: no round yet')}.<br>"
                   f'<span class="muted">{escape(party.empirical.text())}.</span></li>')
    out.append("</ul>")
    return out


def run_state_lines(run: RunRecord) -> list[str]:
    """The run index's first line: how the run stands (run.json's state, audit.run_states), so that a run that
    stopped early never reads like a finished short run; nothing where no driver said how many rounds it planned (a
    report folder written by other means: its parties' accounts say what they did)."""
    if run.rounds is None:
        return []
    said = run.describe()
    text = escape(said[0].upper() + said[1:])
    if run.state == FINISHED:
        return [f"<p>{text}.</p>"]
    if run.state == RUNNING:
        return [f'<p class="muted">{text}; this page is rewritten as rounds end.</p>']
    return [f'<p class="withheld">{text}. The figures below are those rounds\' only: the run did not finish.</p>']


def write_index(root: str | os.PathLike, *, aggregators: Mapping[str, Path] | None = None,
                parties: Mapping[str, Path] | None = None, info: RunInfo | None = None) -> Path:
    """Write ``root/run.json`` (audit.reporting.run_file: the parties' accounts; `info`: the run's state and settings
    from its driver, else what an earlier write said) and ``root/index.html``, the run index: each party's final model
    and DP total from run.json, the aggregator's report and every party report, each with its latest verdict, linked
    relatively. By default the reports are root's folders with a page (an aggregator's holds AGGREGATOR_MARKER);
    `aggregators` / `parties` (name -> report folder, anywhere) name them instead, as for a multi-process run whose
    participants each write in their own folder (a folder without a page yet is listed unlinked)."""
    root = Path(root)
    scanned = aggregators is None and parties is None
    if scanned:
        aggregators, parties = _scan_reports(root)
    aggregators, parties = dict(aggregators or {}), dict(parties or {})
    run = write_run_file(root, parties=None if scanned else parties, info=info)

    records = {name: _party_views(Path(folder)) for name, folder in parties.items()}

    def name_cell(name: str, folder: Path) -> str:
        if (Path(folder) / "index.html").is_file():
            return f'<td><a href="{_page_link(root, Path(folder))}">{escape(name)}</a></td>'
        held = len(records.get(name) or ())
        said = (f"{held} round record{'s' if held != 1 else ''} written, its page not drawn" if held else
                "no report written")
        return f'<td>{escape(name)} <span class="muted">({said})</span></td>'

    body = ["<h1>Privacy audit: run index</h1>", *run_state_lines(run), *run_account_section(run)]
    if plot_verdict_grid({name: {r: view.headline for r, view in by_round.items()}
                          for name, by_round in records.items()}, root / GRID_IMAGE):
        body += run_summary(records)
        body.append(f'<p><img src="{GRID_IMAGE}" alt="leak verdict per party and round"></p>')
    else:
        (root / GRID_IMAGE).unlink(missing_ok=True)
    body.append("<h2>Leak verdict per party and round</h2>")
    if parties:
        body += verdict_grid(records, {name: name_cell(name, Path(folder)) for name, folder in parties.items()})
    else:
        body.append("<p>No party reports yet.</p>")
    if aggregators:
        for name, folder in aggregators.items():
            utility = utility_of(_utility_views(folder))
            if utility:  # the privacy actions' cost in utility, a result beside the verdicts
                body.insert(body.index("<h2>Leak verdict per party and round</h2>"),
                            f"<p><strong>Utility</strong> ({escape(name)}): {utility}</p>")
        body.append('<h2>Aggregator</h2><p class="muted">Which updates were averaged each round and why, each '
                    "collaborator's leak verdict as its scalars say it, the mean and the worst collaborator; with a "
                    "gate, each collaborator's gated metric beside its threshold.</p>")
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


# The aggregators' round views the run index's utility line reads (report folder -> load_round_files' cache), kept
# for the process: a rewrite reads only the rounds written since the last one.
_UTILITY_VIEWS: dict[Path, dict] = {}
_UTILITY_LOCK = threading.Lock()


def _utility_views(folder) -> list[dict]:
    """The utility views of the aggregator's rounds under `folder`, by round (one thread at a time: the run's thread
    and the report worker both draw the index)."""
    with _UTILITY_LOCK:
        cache = _UTILITY_VIEWS.setdefault(Path(folder).resolve(), {})
        return load_round_files(Path(folder), "aggregator round", cache, make=utility_view)


class _RunIndex:
    """The run index as a job of the report worker (audit.reporting.background): drawn with the reports' pages."""

    party = "run index"

    def __init__(self, root: Path):
        self.root = Path(root)

    def render_key(self) -> str:
        return f"{self.root.resolve()}#index"

    def render_round(self, round_num: int) -> None:
        """Nothing per round."""

    def rebuild_summary(self) -> None:
        write_index(self.root)


def redraw_index(root: str | os.PathLike) -> None:
    """Queue the run index of `root` (and its run.json, keeping the run's state) on the report worker."""
    from audit.reporting.background import render_queue

    render_queue.submit(_RunIndex(Path(root)), 0)
