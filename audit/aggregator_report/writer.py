"""The aggregator's own per-round report: which collaborators' updates were averaged, which were not and why,
and the averaged audit metrics. The round record is audit.aggregator_report.record's, the page audit.aggregator_report.page's.

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
import io
from pathlib import Path
from typing import Any, Mapping

from audit.reporting.atomic_io import atomic_write_json, atomic_write_text
from audit.reporting.background import render_queue
from audit.reporting.csv_cells import spreadsheet_safe_row
from audit.reporting.html import write_index
from audit.reporting.writer import RoundReportWriter
from audit.aggregator_report.page import page_html, write_plots
from audit.aggregator_report.record import STATUS_LISTS, fmt, worst_value


class AggregatorReportWriter(RoundReportWriter):
    """Writes round records under `root` and rebuilds the summaries from the round files on disk."""

    what = "aggregator round"
    party = "aggregator"  # in the report worker's log messages

    def write_round_in_background(self, record: Mapping) -> Path:
        """Store the round's record now and rebuild the summaries (CSVs, plots, page) on the process's report worker
        (audit.reporting.background): the aggregator writes its report inside OpenFL's end of round, which every
        collaborator waits for, and drawing the plots is most of the report's cost.
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
        atomic_write_text(self.root / "index.html", page_html(records, plots, run_index=in_run,
                                                          deanon=(self.root / "deanon" / "summary.csv").is_file()))
        if in_run:
            write_index(run_root)


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
            tripped = ";".join(f"{k}={fmt(v)}" for k, v in entry.get("tripped", {}).items())
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
        # <metric>: the mean over the collaborators, empty where a mean is no figure (p-values, bounds);
        # worst:<metric>: the worst collaborator's value in the metric's direction (a p-value's smallest)
        writer.writerow([r["round"], *(len(r.get(key, [])) for key in STATUS_LISTS),
                         *(_cell(averaged[n].get("mean")) if n in averaged else "" for n in names),
                         *(_cell(worst_value(averaged[n])) if n in averaged else "" for n in names)])
    return buf.getvalue()
