"""Each round of a party's report as the summaries read it, made once from its record and kept for the run.

A party's summaries (the page, the plots over rounds, metrics.csv) and the run index are rewritten after every
round from every round's record. Parsing every record each time, or keeping every parsed record (a round's is a few
hundred KB of Python objects: its ROC curves, every interval), made each rewrite, and the process, grow with the
rounds. A `RoundView` holds instead what those summaries read of one round: its record projected to the figures the
plots and tables over rounds read (each attack's exact AUC, TPR at each tolerance, their intervals and counts; no
curves, no per-sample anything), its headline and verdict, its rows of the page's tables and its cell of the run
index, computed once; and its section of the page, drawn from the record on disk when its inputs change (the
tolerances shown, the files in its folder, whether it is the newest round). Views are kept per record file for the
process (`load_round_views`) and made again when the file changes (os.replace: a new inode).

`project` is tested against the full record: every reading the summaries make of it gives the same value
(tests/test_round_views.py).
"""

from __future__ import annotations

import os
import pickle
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from audit.config.vocabulary import BOUNDS
from audit.reporting.atomic_io import atomic_write_text
from audit.reporting.headline import Headline, headline_of
from audit.reporting.readings import csv_cell, fmt_interval, unresolvable_metrics
from audit.reporting.page_parts import escape
from audit.reporting.records import load_cached_round_records
from audit.reporting.round_cells import UNRESOLVED_MARK, gate_rule, grid_cell, verdict_row
from audit.reporting.verdicts import RoundVerdict, Sent, epsilon_zero_note, round_verdict, sent_of
from audit.record_parts import RecordSettings
from audit.round_record import RoundRecord

__all__ = ["RoundView", "project", "view_of", "metric_cells", "load_round_views", "forget_views", "SECTION_FILE"]

# What the summaries over rounds read of an attack's result (audit.reporting.readings, verdicts, plots).
_ATTACK_KEYS = ("attack", "signal", "auc", "exact_auc", "tpr_at_fpr", "resolvable", "tolerances", "n_members",
                "n_nonmembers", "n_population")
_UNCERTAINTY_KEYS = ("exact_auc", "epsilon_lb", "confidence", "advantage")
_AT_FPR_KEYS = ("tpr", "resolvable", "n_population", "population_fpr")
_SETTINGS_KEYS = ("fpr_tolerance", "confidence", "epsilon_delta")


def _project_attack(result) -> Mapping:
    if not isinstance(result, Mapping):
        return result
    out = {k: result[k] for k in _ATTACK_KEYS if k in result}
    u = result.get("uncertainty")
    if isinstance(u, Mapping):
        small = {k: u[k] for k in _UNCERTAINTY_KEYS if k in u}
        at = u.get("at_fpr")
        if isinstance(at, Mapping):
            small["at_fpr"] = {t: ({k: v[k] for k in _AT_FPR_KEYS if k in v} if isinstance(v, Mapping) else v)
                               for t, v in at.items()}
        out["uncertainty"] = small
    return out


def project(record: RoundRecord) -> RoundRecord:
    """The record as the summaries over rounds read it: its round, the settings they read, each attack's figures and
    intervals (no curves); no metrics, details or leak verdict (its headline and verdict are the view's)."""
    settings = record.settings
    return RoundRecord(party=record.party, round=record.round, seed=record.seed,
                       settings=RecordSettings({k: settings.stated[k] for k in _SETTINGS_KEYS if k in settings.stated},
                                               settings.fpr_tolerance, settings.confidence, settings.epsilon_delta),
                       attacks={key: _project_attack(result) for key, result in record.attacks.items()},
                       sampling=record.sampling)


def _packed(value) -> bytes:
    return zlib.compress(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), 1)


def _unpacked(data: bytes):
    return pickle.loads(zlib.decompress(data))  # noqa: S301 - bytes this process packed itself (_packed)


SECTION_FILE = ".page_section.part"  # beside audit.json: the round's section of the page (HTML), drawn once per inputs


@dataclass(eq=False)
class RoundView:
    """One round of a party's report, as its summaries read it (module docstring). What the summaries read of every
    round at once (its projection, its metrics) is kept packed (a few KB) and unpacked while they are drawn; its page
    section is drawn once and kept in its round folder."""

    round: int
    headline: Headline
    verdict: RoundVerdict
    verdict_row: str              # its row of the page's verdict table (newest first there)
    grid_cell: str                # its cell of the run index's table
    gate_set: bool                # a threshold or an epsilon budget: the gate had something to decide on
    sent: Sent                    # what the party sent, and that update's leak verdict
    rule: str                     # the gate's rule that tripped ("" where none did)
    epsilon_zero: str | None      # why a detected leak proves an epsilon bound of 0 (None unless both hold)
    budget_set: bool              # an epsilon budget
    metric_names: tuple[str, ...]
    unresolved: frozenset         # its metric names read at a tolerance its sets could not resolve
    path: Path | None = None      # its audit.json, read again when its page section must be drawn anew
    _summary: bytes = field(default=b"", repr=False)
    _values: bytes = field(default=b"", repr=False)
    _record: RoundRecord | None = field(default=None, repr=False)  # the full record, for a view made without a file
    _section: tuple | None = field(default=None, repr=False)  # (key, html) in memory, for a view made without a file

    @property
    def summary(self) -> RoundRecord:
        """project(record)."""
        return _unpacked(self._summary)

    @property
    def metric_values(self) -> tuple:
        return _unpacked(self._values)

    def section(self, draw, tols: list[float], files: set[str] | None, open_: bool) -> list[str]:
        """Its section of the party's page, `draw(record, tols, files, open_=...)` (audit.reporting.party_page's
        round_section), drawn once per inputs (kept in its round folder, SECTION_FILE, with the inputs' key)."""
        key = repr((tuple(tols), None if files is None else sorted(files), open_))
        if self.path is None:
            if self._section is None or self._section[0] != key:
                self._section = (key, "\n".join(draw(self._record, tols, files, open_=open_)))
            return [self._section[1]]
        kept = self.path.parent / SECTION_FILE
        try:
            stored_key, _, html = kept.read_text(encoding="utf-8").partition("\n")
            if stored_key == key:
                return [html]
        except OSError:
            pass
        html = "\n".join(draw(RoundRecord.read(self.path), tols, files, open_=open_))
        try:
            atomic_write_text(kept, f"{key}\n{html}")
        except OSError:  # a full disk: drawn again next time
            pass
        return [html]


_NAMES: dict[tuple, tuple] = {}  # the rounds' metric names, one tuple for all the rounds that share them


def metric_cells(view: RoundView) -> dict[str, str]:
    """Its cells of the page's metrics table: each metric (but the bounds of an interval, shown with their estimate)
    with its interval, marked where unresolvable."""
    names = view.metric_names
    m = dict(zip(names, view.metric_values))
    bounds = {f"{n}_{b}" for n in names for b in BOUNDS}
    cells = {}
    for name in names:
        if name in bounds:
            continue
        text = fmt_interval(m[name], m.get(f"{name}_lower"), m.get(f"{name}_upper"))
        mark = UNRESOLVED_MARK if name in view.unresolved else ""
        cells[name] = f'<td title="{escape(csv_cell(m[name]))}">{escape(text)}{mark}</td>'
    return cells


def view_of(record: RoundRecord, path: Path | None = None) -> RoundView:
    """The view of one full record (`path`: its audit.json, or None to keep the record in the view)."""
    names = tuple(sorted(record.metrics))
    names = _NAMES.setdefault(names, names)
    return RoundView(
        round=record.round, headline=headline_of(record), verdict=round_verdict(record),
        verdict_row=verdict_row(record), grid_cell=grid_cell(record),
        gate_set=record.gate is not None and record.gate.decides, sent=sent_of(record), rule=gate_rule(record),
        epsilon_zero=epsilon_zero_note(record.leak),
        budget_set=record.gate is not None and record.gate.has_budget,
        metric_names=names, unresolved=frozenset(unresolvable_metrics(record)), path=path,
        _summary=_packed(project(record)), _values=_packed(tuple(record.metrics[n] for n in names)),
        _record=record if path is None else None)


# party folder -> its views' cache (audit.reporting.records.load_cached_round_records): every view this process made
_VIEWS: dict[Path, dict] = {}
_LOCK = threading.Lock()


def forget_views(party_dir: str | os.PathLike | None = None) -> None:
    """Drop the kept views (of one party's folder, or all)."""
    with _LOCK:
        if party_dir is None:
            _VIEWS.clear()
        else:
            _VIEWS.pop(Path(party_dir).resolve(), None)


def load_round_views(party_dir: str | os.PathLike, refused: list[str] | None = None) -> list[RoundView]:
    """The views of every readable round record under `party_dir` (round_*/audit.json), by round; a record is read
    only when its file is new or changed, and what load_round_records skips is skipped (`refused`: the line of each
    record of another schema version)."""
    party_dir = Path(party_dir)
    with _LOCK:
        cache = _VIEWS.setdefault(party_dir.resolve(), {})
    return load_cached_round_records(party_dir, cache, refused, make=view_of)
