"""For tests of what a federation computes (metrics, counts, decisions), not of its report's images: ways to leave
the report's drawing out. The drawing (each round's ROC and histogram images, the cross-round plots and
pages: audit.reporting.background's queue, derived from the records on disk) is most of a small in-process
federation's CPU (digits, 2 parties, 3 rounds: about 6.5 of 8.5 CPU-seconds); each round's record and private
files are still written, synchronously, as in any run. A test module imports the fixture
(`from report_drawing import without_report_drawing  # noqa: F401`) and asks for it by name; a module- or
session-scoped fixture runs its federation inside `with no_report_drawing():`, or inside
`with pages_drawn_at_the_end():` where its tests read the pages (index.html, metrics.csv)."""

import contextlib
import sys
from pathlib import Path

import pytest

from audit.reporting.background import render_queue


@contextlib.contextmanager
def no_report_drawing():
    """The process's report worker takes no jobs in the block. Yields the jobs it was given, (the writer's key,
    round), so a test can check that the run did ask for its report. Its own MonkeyPatch: a test's
    monkeypatch.undo() leaves it in place."""
    queued = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(render_queue, "submit", lambda writer, round_num: queued.append((writer.render_key(), round_num)))
        yield queued


@pytest.fixture
def without_report_drawing():
    """no_report_drawing for the test."""
    with no_report_drawing() as queued:
        yield queued


@contextlib.contextmanager
def pages_drawn_at_the_end(*, images: bool = True):
    """For a run whose tests read its pages (index.html, the CSVs) but not each round's images: the report worker
    takes no jobs while the run goes, and at its end each report's summaries and pages are rebuilt once from the
    records on disk (rebuild_summary, as the worker's last job for a report does), in the order the reports first
    asked. `images=False`, for tests that read no image at all: the summaries' figures are built but neither rendered
    nor saved (the rendering is most of a rebuild's CPU), so no image file is written. Yields the writers, by report
    folder."""
    writers = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(render_queue, "submit", lambda writer, round_num: writers.setdefault(writer.render_key(), writer))
        yield writers
    render_queue.flush()  # the worker idle (earlier tests' jobs drawn): one thread draws at a time, as in a run
    with pytest.MonkeyPatch.context() as patch:
        if not images:
            _figures_not_saved(patch)
        for writer in writers.values():
            writer.rebuild_summary()


def _figures_not_saved(patch: pytest.MonkeyPatch) -> None:
    """Every loaded module of `audit` that holds the report's figure savers (atomic_io.atomic_savefig,
    figure_fit.save_fitted) gets one that saves nothing; the modules that draw the summaries are loaded first."""
    import audit.aggregator_report.writer  # noqa: F401  (what the summaries draw with, loaded before the patch)
    import audit.reporting.overview_plots  # noqa: F401
    import audit.reporting.plots  # noqa: F401
    from audit.reporting import atomic_io, figure_fit

    savers = {atomic_io.atomic_savefig, figure_fit.save_fitted}

    def not_saved(fig, path, **kwargs):
        return Path(path)

    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] != "audit":
            continue
        for attr in ("atomic_savefig", "save_fitted"):
            if getattr(module, attr, None) in savers:
                patch.setattr(module, attr, not_saved)
