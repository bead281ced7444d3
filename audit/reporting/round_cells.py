"""One round's cells and rows on the pages, from its record: the run index's cell (`grid_cell`), the row of a party's
verdict table (`verdict_row`), a gate verdict's cell (`verdict_cell`), the gate's rule that tripped (`gate_rule`). audit.reporting.round_views makes them once per
round; audit.reporting.html and party_page lay them out."""

from __future__ import annotations

from typing import Mapping

from audit.reporting.page_parts import escape
from audit.reporting.readings import fmt
from audit.reporting.records import round_dir_name
from audit.reporting.verdicts import (AS_TRAINED, DP_RETRAIN_SENT, EPSILON_ZERO_SHORT, LEAK, NO_LEAK,
                                      epsilon_zero_note, inverted_attacks, round_verdict, sent_of)
from audit.round_record import RoundRecord

__all__ = ["grid_cell", "verdict_row", "verdict_cell", "gate_rule", "UNRESOLVED_MARK"]

# A figure read at an FPR tolerance the party's sets are too small for (audit.config.resolution).
UNRESOLVED_MARK = '<sup title="unresolvable: fewer than 1/t population samples">*</sup>'


def verdict_cell(verdict: str | None) -> str:
    """A verdict in the one vocabulary of every page (kept, dp_retrained, withheld, ...), styled by its class."""
    if not verdict:
        return '<td class="text muted">no gate</td>'
    return f'<td class="text {escape(verdict)}">{escape(verdict)}</td>'


def _short_figure(finding: Mapping) -> str:
    statistic = str(finding.get("statistic", ""))
    name = "AUC" if statistic == "exact_auc" else statistic.replace("tpr_at_fpr_", "TPR@")
    return f"{finding.get('attack')}: {name} {fmt(finding.get('estimate'), 2)}"


def grid_cell(record: RoundRecord | None) -> str:
    """One party's round on the run index: coloured by the leak verdict, the headline figure (or the floor), and
    the gate's verdict where it did not keep the update."""
    if record is None:
        return '<td class="text cell-not_audited muted">not audited</td>'
    v = round_verdict(record)
    leak = record.leak or {}
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
        zero = epsilon_zero_note(leak)
        text += f"<br>{escape(EPSILON_ZERO_SHORT) if zero else 'ε ≥ ' + escape(fmt(epsilon, 2))}"
    sent = sent_of(record)
    gate = v.verdict or "kept"  # without a gate the update is sent as trained
    said = ("sent as trained" + ("" if v.verdict else " (no gate)") if sent.what == AS_TRAINED else
            f"dp_retrained: sent a DP retrain, {sent.text.split('(', 1)[1].rstrip(')')}" if sent.what == DP_RETRAIN_SENT
            else "withheld: nothing sent")
    text += f'<br><span class="{escape(gate)}">{escape(said)}</span>'
    return f'<td class="text cell-{escape(v.leak)}" title="{escape(v.leak_text)}">{text}</td>'


def verdict_row(record: RoundRecord) -> str:
    """One round's row of the verdict table."""
    v = round_verdict(record)
    decided = "; ".join(c.text() for c in v.deciding) or "–"
    low = inverted_attacks(record)
    flag = (f'<br><span class="flag">{len(low)} attack{"s" if len(low) != 1 else ""} with AUC below 0.5 '
            "(signal direction wrong, not safer)</span>") if low else ""
    zero = epsilon_zero_note(record.leak)
    proven = escape(v.proven) + (f'<br><span class="muted">{escape(EPSILON_ZERO_SHORT)} (see below)</span>'
                                 if zero else "")
    sent = sent_of(record)
    sent_css = {LEAK: "leak", NO_LEAK: "no_leak"}.get(sent.leak or "", "muted")
    return (f'<tr><td><a href="#{escape(round_dir_name(record.round))}">{escape(record.round)}</a></td>'
            f'<td class="text cell-{escape(v.leak)}">{escape(v.leak_text)}{flag}</td>'
            f'<td class="text">{proven}</td>'
            f"{verdict_cell(v.verdict)}<td class=\"text\">{escape(decided)}</td>"
            f'<td class="text"><span class="{sent_css}">{escape(sent.text)}</span></td><td class="text">'
            f"{escape(v.epsilon)}</td></tr>")


def gate_rule(record: RoundRecord) -> str:
    """The rule that tripped a round's gate, without its figures ("the upper bound of mia_local_loss_exact_auc > 0.6"),
    to say once per party which rules acted; "" where none tripped."""
    v = round_verdict(record)
    rules = [f"{'the ' + c.bound + ' bound of ' if c.bound != 'point' else ''}{c.metric} > {fmt(c.threshold)}"
             for c in v.checks if c.tripped]
    if not rules and record.gate is not None and record.gate.verdict == "withheld":
        return v.status
    return ", ".join(rules)
