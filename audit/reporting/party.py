"""Per-party privacy-audit reports: one directory per audited round plus cross-round summaries.

Layout (every file written atomically, see :mod:`audit.reporting.atomic_io`)::

    root/index.html                      the run index: every party's leak verdict per round (verdicts.png, a table)
    root/<party>/index.html              headline chart, verdict per round, then collapsed: plots, rounds, metrics
    root/<party>/metrics.csv             one row per round: "round", then the sorted metric names
    root/<party>/headline.png            the headline leakage per round (audit.reporting.headline)
    root/<party>/auc.png                 exact AUC per round, the strongest attack of each family, with error bars
    root/<party>/tpr_at_<fpr:g>.png      TPR at each FPR tolerance per round, the same attacks, with error bars
    root/<party>/all_auc.png, all_tpr_at_<fpr:g>.png   the same for every model x signal
    root/<party>/round_0003/audit.json   the round record, exactly as given
    root/<party>/round_0003/roc.png      ROC curves: one subplot per audited model
    root/<party>/round_0003/signals.png  members' and non-members' per-sample values, one panel per attack
    root/<party>/round_0003/signals.npz, rmia_scores.npz, fidel_grid.png   the party's private files (audit steps):
                                         0600, in a round folder made 0700 (write_private_files); the rest of the
                                         report follows the umask (audit.reporting.atomic_io)

The cross-round files are always rebuilt from the ``audit.json`` files on disk, so they are derived
state: a crash at any point leaves the previous report intact and the next write repairs it.

A round record is an audit.round_record.RoundRecord; ``audit.json`` holds its JSON form (``RoundRecord.to_json``,
with its schema version), whose attacks nest model -> signal -> ``AttackResult.to_dict()`` (``fpr``/``tpr`` lists,
``auc``, ``exact_auc``, ``tpr_at_fpr`` keyed by ``f"{tol:g}"``, ``n_members``/``n_nonmembers``...; non-finite numbers
stored as None). Records are read back as RoundRecords; one of another schema version is skipped with a warning
naming its file.

Two AUCs, labelled as such wherever they are shown: the "grid AUC" (``auc``, metric ``mia_*_auc``) is Privacy
Meter's, the area under the ROC curve drawn in ``roc.png``, whose thresholds are population quantiles on its
alpha grid (it does not reach beyond the population's range, so it under-reads on a small population); the
"exact AUC" (``exact_auc``, metric ``mia_*_exact_auc``) is the members-vs-non-members ROC AUC over every
threshold (Mann-Whitney; ties count half). ``auc.png`` plots the exact AUC.
"""

from __future__ import annotations

import csv
import io
import os
import logging
import re
from pathlib import Path
from typing import Callable, Iterable, Mapping

from audit.config.steps import registered
from audit.reporting.atomic_io import PRIVATE_FILE_MODE, atomic_write_json, atomic_write_text, private_folder
from audit.reporting.background import render_queue
from audit.reporting.html import party_page, write_index
from audit.reporting.headline import strongest_per_family
from audit.reporting.overview_plots import plot_headline
from audit.reporting.plots import plot_per_round, plot_roc, plot_signal_histograms
from audit.reporting.readings import (csv_cell, exact_auc_band, exact_auc_of, rates_at, tolerances_of, tpr_at,
                                      tpr_band_at, unresolvable)
from audit.reporting.records import HISTOGRAMS_FILE, load_cached_round_records, load_round_records, round_dir_name
from audit.reporting.round_views import load_round_views
from audit.reporting.writer import RoundReportWriter

# The final model's audit, in the party's report: its folder, and its drawing job on the report worker (no round).
FINAL_MODEL_DIR = "final_model"
FINAL_MODEL_JOB = -1
from audit.round_record import RoundRecord, validate_party_name, validate_record

__all__ = [
    "ReportWriter",
    "load_round_records",
    "write_index",
    "round_dir_name",
]

_TPR_PLOT_RE = re.compile(r"^tpr_at_.+\.png$")
HEADLINE_PLOT = "headline.png"  # the page's first chart: the headline leakage per round
ALL_SERIES = "all_"  # all_auc.png, all_tpr_at_<t>.png: every attack (auc.png, tpr_at_<t>.png: the strongest per family)
SUMMARY_PLOTS = (HEADLINE_PLOT, "auc.png", ALL_SERIES + "auc.png")
logger = logging.getLogger(__name__)


def _file_names(folder: Path) -> set[str]:
    """The files of a round's folder a page may link (not its hidden ones: the page section kept there, temp files)."""
    return {p.name for p in folder.iterdir() if not p.name.startswith(".")} if folder.is_dir() else set()


def histogram_panels(record: RoundRecord, round_dir: Path) -> list:
    """Every registered step's histogram panels of the round, from the private files it wrote (audit.config.steps
    `histograms`), in the steps' order."""
    panels = []
    for audit_step in registered():
        draw = audit_step.load("histograms")
        if draw is not None:
            panels += draw(record, round_dir)
    return panels



def write_private_files(round_dir: Path, writers: Iterable[Callable[[Path], None]]) -> None:
    """Run the audit steps' private-file writers in the round folder, made private to this user first (0700: no other
    user may list or open anything in it), and make every file they wrote or replaced 0600 (whatever each writer
    did: the per-sample data stays its owner's)."""
    writers = tuple(writers)
    if not writers:
        return
    private_folder(round_dir)
    before = {p.name: p.stat().st_ino for p in round_dir.iterdir()}
    for write in writers:
        write(round_dir)
    for path in round_dir.iterdir():
        if path.is_file() and before.get(path.name) != path.stat().st_ino:
            path.chmod(PRIVATE_FILE_MODE)


def _private_of(record: RoundRecord | Mapping, private) -> tuple:
    """The private-file writers: those given, else the in-memory record's own (a JSON form has none)."""
    if private is not None:
        return tuple(private)
    return record.private if isinstance(record, RoundRecord) else ()


class ReportWriter(RoundReportWriter):
    """Writes one party's audit report under ``root/<party>/``.

    ``write_round(record)`` stores the round (``audit.json`` + ``roc.png``) and rebuilds the cross-round
    files from every ``audit.json`` on disk; all writes are atomic. One writer per party at a time;
    writers for different parties may share ``root`` (the root index is rewritten atomically by each).
    """

    def __init__(self, root: str | os.PathLike, party: str, *, log_scale: bool = True) -> None:
        super().__init__(root)
        self.party = validate_party_name(party)
        self.party_dir: Path = self.root / party
        self.log_scale = bool(log_scale)

    def round_dir(self, round_: int) -> Path:
        return self.party_dir / round_dir_name(round_)

    def record_path(self, round_num: int) -> Path:
        return self.round_dir(round_num) / "audit.json"

    def _stored(self, record: RoundRecord | Mapping) -> tuple[RoundRecord, dict]:
        """The record as it will be read back, and its JSON for audit.json; ValueError naming the offending field for
        an invalid record (nothing is written). `record`: a RoundRecord, or its JSON form."""
        data = validate_record(record, party=self.party)
        return RoundRecord.from_json(data, "record"), data

    def _plot_histograms(self, record: RoundRecord, round_dir: Path) -> None:
        if not plot_signal_histograms(record, histogram_panels(record, round_dir), round_dir / HISTOGRAMS_FILE):
            (round_dir / HISTOGRAMS_FILE).unlink(missing_ok=True)

    def write_round(self, record: RoundRecord | Mapping,
                    private: Iterable[Callable[[Path], None]] | None = None) -> Path:
        """Validate and store one round record (roc.png, the party's private files into the round folder, the signal
        histograms from them, then audit.json), rebuild the summaries; returns the round directory. `private`: the
        private-file writers (default: the record's own, RoundRecord.private). Everything is drawn before it returns;
        write_round_in_background draws later. The pages are drawn from the record as audit.json holds it."""
        stored, data = self._stored(record)
        round_dir = self.round_dir(stored.round)
        round_dir.mkdir(parents=True, exist_ok=True)
        plot_roc(stored, round_dir / "roc.png", self.log_scale)
        write_private_files(round_dir, _private_of(record, private))
        self._plot_histograms(stored, round_dir)
        atomic_write_json(self.record_path(stored.round), data)
        self.rebuild_summary()
        return round_dir

    def store_round(self, record: RoundRecord | Mapping,
                    private: Iterable[Callable[[Path], None]] | None = None) -> Path:
        """The synchronous part of a round: validate, write the private files, then audit.json (atomically);
        nothing is drawn. Returns the round directory."""
        return self._store(record, private)[1]

    def _store(self, record, private) -> tuple[RoundRecord, Path]:
        stored, data = self._stored(record)
        round_dir = self.round_dir(stored.round)
        round_dir.mkdir(parents=True, exist_ok=True)
        write_private_files(round_dir, _private_of(record, private))
        atomic_write_json(self.record_path(stored.round), data)
        return stored, round_dir

    def write_round_in_background(self, record: RoundRecord | Mapping,
                                  private: Iterable[Callable[[Path], None]] | None = None) -> Path:
        """store_round, then queue the drawing (the round's roc.png and histograms, the summaries and pages) on
        the process's report worker (audit.reporting.background; its flush() waits for it). Until drawn, the pages
        show the earlier rounds; a round folder's images are linked only once they exist."""
        stored, round_dir = self._store(record, private)
        render_queue.submit(self, stored.round)
        return round_dir

    def render_key(self) -> str:
        """Jobs of writers with the same key are coalesced (one party's folder)."""
        return str(self.party_dir.resolve())

    def _account(self):
        """The party's account of the run (account.json; None: none yet, or unreadable: logged)."""
        from audit.run_record import ACCOUNT_FILE, PartyRun

        return self._read_if_there(self.party_dir / ACCOUNT_FILE, PartyRun.read)

    def _read_if_there(self, path: Path, read):
        """`read(path)`; None where the file is not there, or where it cannot be read (logged)."""
        if not path.is_file():
            return None
        try:
            return read(path)
        except (OSError, ValueError) as err:
            logger.warning("%s: %s", self.party, err)
            return None

    def final_model_dir(self) -> Path:
        return self.party_dir / FINAL_MODEL_DIR

    def write_final_model(self, record: RoundRecord) -> Path:
        """The final model's audit (audit.round_audit.audit_final_model): its private files and audit.json in the
        party's final_model/ folder, now; its ROC and the pages on the report worker. Returns the folder."""
        stored, data = self._stored(record)
        folder = self.final_model_dir()
        folder.mkdir(parents=True, exist_ok=True)
        write_private_files(folder, _private_of(record, None))
        atomic_write_json(folder / "audit.json", data)
        render_queue.submit(self, FINAL_MODEL_JOB)
        return folder

    def load_final_model(self) -> RoundRecord | None:
        """The final model's record (None: none written, or unreadable: logged)."""
        return self._read_if_there(self.final_model_dir() / "audit.json", RoundRecord.read)

    def render_round(self, round_num: int) -> None:
        """Draw a stored round's images (roc.png, the histograms) from its audit.json and private files on disk (the
        final model's, for FINAL_MODEL_JOB)."""
        if round_num == FINAL_MODEL_JOB:
            record = self.load_final_model()
            if record is not None:
                plot_roc(record, self.final_model_dir() / "roc.png", self.log_scale)
            return
        path = self.record_path(round_num)
        try:
            record = RoundRecord.read(path)  # this round's record alone, not every round's
        except (OSError, ValueError) as err:
            raise FileNotFoundError(f"{path}: missing or unreadable, nothing to draw ({err})") from None
        round_dir = path.parent
        plot_roc(record, round_dir / "roc.png", self.log_scale)
        self._plot_histograms(record, round_dir)

    def load_rounds(self, refused: list[str] | None = None) -> list[RoundRecord]:
        """The readable round records; `refused` gets a line per record of another schema version."""
        return load_cached_round_records(self.party_dir, None, refused)

    def rebuild_summary(self) -> None:
        """Rewrite metrics.csv, auc.png, tpr_at_*.png, index.html and root/index.html from disk: from each round's
        view (audit.reporting.round_views), made once per record, so that a rewrite costs the same in round 200 as
        in round 10."""
        refused: list[str] = []
        views = load_round_views(self.party_dir, refused)
        records = [v.summary for v in views]  # what the plots and the tolerances read
        self.party_dir.mkdir(parents=True, exist_ok=True)
        self._write_metrics_csv(views)
        tols = tolerances_of(records) if records else []
        # A tolerance no record's population can resolve gets no plot (its figure is the TPR at population FPR 0,
        # whatever the tolerance); the page says why, the tables show its values marked.
        unplotted = {t: n for t in tols if (n := unresolvable(records, t)) is not None}
        tpr_files = [f"tpr_at_{t:g}.png" for t in tols if t not in unplotted]
        if records:
            self._plot_over_rounds(records, [v.headline for v in views], [t for t in tols if t not in unplotted],
                                   tpr_files)
        # Derived state: drop plots no longer backed by the records (e.g. a tolerance was removed).
        stale = [p for pattern in ("tpr_at_*.png", ALL_SERIES + "tpr_at_*.png") for p in self.party_dir.glob(pattern)
                 if p.name.removeprefix(ALL_SERIES) not in tpr_files]
        if not records:
            stale += [self.party_dir / name for name in SUMMARY_PLOTS]
        for p in stale:
            if _TPR_PLOT_RE.match(p.name.removeprefix(ALL_SERIES)) or p.name in SUMMARY_PLOTS:
                p.unlink(missing_ok=True)
        final_roc = self.final_model_dir() / "roc.png"
        atomic_write_text(
            self.party_dir / "index.html",
            party_page(self.party, views, tols, tpr_files, self.log_scale, unplotted,
                       {v.round: _file_names(self.round_dir(v.round)) for v in views}, refused=refused,
                       account=self._account(),
                       final_roc=f"{FINAL_MODEL_DIR}/roc.png" if final_roc.is_file() else None)
        )
        write_index(self.root)

    def _plot_over_rounds(self, records: list[RoundRecord], headlines: list, tols: list[float],
                          tpr_files: list[str]) -> None:
        """headline.png (the page's first chart), then each figure per round: the strongest attack of each family
        (auc.png, tpr_at_<t>.png) and every attack (all_auc.png, all_tpr_at_<t>.png, a click away)."""
        plot_headline(records, headlines, self.party_dir / HEADLINE_PLOT, party=self.party)
        for prefix, only in (("", strongest_per_family(records, exact_auc_of)), (ALL_SERIES, None)):
            plot_per_round(
                records, self.party_dir / (prefix + "auc.png"), party=self.party, value_of=exact_auc_of,
                ylabel="exact AUC (every threshold)", chance=0.5, chance_label="chance (AUC 0.5)",
                title="exact AUC per round" + (", strongest attack per family" if only else ", every attack"),
                band_of=exact_auc_band, flag_below=0.5, only=only,
            )
        for t, name in zip(tols, tpr_files):
            def value_of(res, t=t):
                return tpr_at(res, t)

            def counts_of(res, t=t):
                tpr = (rates_at(res, t) or {}).get("tpr") or {}
                return (tpr["k"], tpr["n"]) if "k" in tpr and "n" in tpr else None

            for prefix, only in (("", strongest_per_family(records, value_of)), (ALL_SERIES, None)):
                plot_per_round(
                    records, self.party_dir / (prefix + name), party=self.party, value_of=value_of,
                    ylabel=f"TPR at FPR ≤ {t:g}", chance=t, chance_label=f"chance (TPR = {t:g})",
                    title=f"TPR at FPR ≤ {t:g} per round" + (", strongest attack per family" if only else
                                                              ", every attack"),
                    log_y=self.log_scale, band_of=lambda res, t=t: tpr_band_at(res, t), counts_of=counts_of,
                    only=only,
                )

    def _write_metrics_csv(self, views) -> None:
        names = sorted({k for v in views for k in v.metric_names})
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["round", *(csv_cell(n) for n in names)])
        for v in views:
            metrics = dict(zip(v.metric_names, v.metric_values))
            writer.writerow([v.round, *(csv_cell(metrics.get(n)) for n in names)])
        atomic_write_text(self.party_dir / "metrics.csv", buf.getvalue())
