"""What the cross-round step adds to the party's report: its line in the end-of-run summary (and the run's account)
and its part of a round's section on the party's page. Torch-free: read from the round record."""

from __future__ import annotations

import math
from typing import Mapping

from audit.config.vocabulary import CROSS_ROUND, tolerance_name
from audit.reporting.readings import (exact_auc_of, float_or_nan, fmt, fmt_interval, resolvable_at, tpr_at,
                                      tpr_band_at)
from audit.round_record import RoundRecord

__all__ = ["summary", "page_section"]

SKIPPED = "skipped"


def _tolerance(result: Mapping) -> float | None:
    """The tolerance the summary reads: 1% where the population resolves it, else the smallest one it resolves."""
    tolerances = sorted(float(t) for t in result.get("tolerances") or [])
    if 0.01 in tolerances and resolvable_at(result, 0.01):
        return 0.01
    return next((t for t in tolerances if resolvable_at(result, t)), None)


def _attack(record: RoundRecord) -> tuple[dict, Mapping | None]:
    details = record.extra.get(CROSS_ROUND)
    details = details if isinstance(details, Mapping) else {}
    signal = details.get("signal")
    result = record.attack(CROSS_ROUND, signal) if signal else None
    if result is not None and hasattr(result, "to_dict"):
        result = result.to_dict()
    return details, result


def summary(record: RoundRecord) -> str | None:
    """"over N rounds (first-last), the aggregator could tell <party>'s members with TPR x [lower, upper] at FPR 0.01
    (exact AUC y); its own update was their most likely source for z of them (chance 1/parties)"; before any round
    was attacked, why not."""
    details, result = _attack(record)
    rounds = details.get("rounds") or []
    if result is None or not rounds:
        skipped = [e for e in details.get("log") or [] if isinstance(e, Mapping) and e.get("status") == SKIPPED]
        return (f"cross-round attack: no round attacked yet (round {skipped[-1].get('round')}: "
                f"{skipped[-1].get('reason')})" if skipped else None)
    tol = _tolerance(result)
    said = f"over {len(rounds)} round{'s' if len(rounds) != 1 else ''} ({rounds[0]}-{rounds[-1]}), the aggregator "
    if tol is None:
        said += f"could tell {record.party}'s members with exact AUC {exact_auc_of(result):.3f}"
    else:
        lower, upper = tpr_band_at(result, tol)
        band = "" if math.isnan(lower) else f" [{lower:.3f}, {upper:.3f}]"
        said += (f"could tell {record.party}'s members with TPR {tpr_at(result, tol):.3f}{band} at FPR "
                 f"{tolerance_name(tol)} (exact AUC {exact_auc_of(result):.3f})")
    source = details.get("source")
    if isinstance(source, Mapping):
        said += (f"; its own update was their most likely source for {float_or_nan(source.get('rate')):.2f} of them "
                 f"(chance {float_or_nan(source.get('chance')):.2f})")
    return said


def page_section(record: RoundRecord, round_dir: str, files: set[str]) -> list[str]:
    """The summary line, what became of each round kept (attacked with its weight and its own exact AUC, or skipped
    and why), and the source inference against chance."""
    from audit.reporting.html import escape

    details, _ = _attack(record)
    if not details:
        return []
    per_round = details.get("per_round_exact_auc") or {}
    rows = []
    for entry in details.get("log") or []:
        if not isinstance(entry, Mapping):
            continue
        said = (f"attacked: weight {fmt(entry.get('weight'), 3)} of {entry.get('parties')} parties; this round alone: "
                f"exact AUC {fmt(per_round.get(str(entry.get('round'))), 3)}" if entry.get("status") == "attacked"
                else f"{entry.get('status')}: {entry.get('reason')}")
        rows.append(f"<tr><td>{escape(entry.get('round'))}</td><td>{escape(said)}</td></tr>")
    source = details.get("source")
    note = ""
    if isinstance(source, Mapping):
        interval = source.get("interval") or [math.nan, math.nan]
        how = ("with two parties this is the aggregator's rule exactly" if source.get("exact") else
               f"with {source.get('parties')} parties the party compares its update with the others' combined one, "
               "an upper estimate of the aggregator's rate")
        note = (f"<p>Source inference: the aggregator would name this party as the source of "
                f"{escape(source.get('members_own'))} of {escape(source.get('members'))} members, "
                f"{escape(fmt_interval(source.get('rate'), interval[0], interval[1], 3))}, against chance "
                f"{escape(fmt(source.get('chance'), 3))} (1 / {escape(source.get('parties'))} parties); the same rule "
                f"names it for {escape(fmt(source.get('nonmember_rate'), 3))} of the non-members ({escape(how)}).</p>")
    line = summary(record)
    return [f'<h4 id="{escape(round_dir)}-cross-round">Across rounds: every update sent</h4>'
            f"<p>{escape(line or 'no round attacked yet')}. The attack sees the others' combined update, where the "
            "aggregator sees each: a lower estimate of what it could tell.</p>" + note,
            '<div class="scroll"><table><tr><th>round</th><th>its update</th></tr>' + "".join(rows) + "</table></div>"]
