"""The report drawn off the round's critical path (audit.reporting.background): the record is on disk when the round
returns, the images and pages come from the process's one worker thread, flush() waits for them, a drawing error is
logged with its party and round and the next round still draws, queued rounds share one summary rebuild, and the
figures a batch drew are freed when it ends."""

import gc
import logging
import threading
import weakref

import pytest
from matplotlib.figure import Figure

import audit.reporting.party as party_module
from audit.reporting.background import flush, render_queue
from audit.reporting.party import ReportWriter
from tests.test_report import PARTY, make_record
from tests.test_report_pages import broken_links
from tests.test_settings_at_start import FAST
from workspace.in_process import run_in_process


@pytest.fixture
def gated_roc(monkeypatch):
    """plot_roc waits for the returned event before drawing: a renderer as slow as the test wants."""
    release = threading.Event()
    real = party_module.plot_roc

    def slow_plot_roc(*args, **kwargs):
        assert release.wait(60), "the test never released the renderer"
        return real(*args, **kwargs)

    monkeypatch.setattr(party_module, "plot_roc", slow_plot_roc)
    yield release
    release.set()
    flush(60)


@pytest.mark.slow
def test_round_returns_before_its_plots_and_flush_draws_them(tmp_path, gated_roc):
    writer = ReportWriter(tmp_path, PARTY)
    round_dir = writer.write_round_in_background(make_record(0))
    # the record is written synchronously; nothing drawn yet
    assert (round_dir / "audit.json").is_file()
    assert not (round_dir / "roc.png").exists() and not (tmp_path / PARTY / "index.html").exists()
    assert not flush(timeout=0.2)  # the worker is still drawing
    gated_roc.set()
    assert flush(timeout=60)
    assert (round_dir / "roc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "round_0000/roc.png" in (tmp_path / PARTY / "index.html").read_text()
    assert (tmp_path / PARTY / "auc.png").is_file() and (tmp_path / "index.html").is_file()
    assert broken_links(tmp_path) == []


@pytest.mark.slow
def test_queued_rounds_share_one_summary_rebuild(tmp_path, gated_roc, monkeypatch):
    rebuilt = []
    real = ReportWriter.rebuild_summary

    def counted(self):
        rebuilt.append(sorted(r.round for r in self.load_rounds()))
        return real(self)

    monkeypatch.setattr(ReportWriter, "rebuild_summary", counted)
    for r in range(4):  # round 0 holds the worker; 1..3 queue behind it
        ReportWriter(tmp_path, PARTY).write_round_in_background(make_record(r))
    gated_roc.set()
    assert flush(timeout=60)
    assert rebuilt[-1] == [0, 1, 2, 3] and len(rebuilt) <= 2  # once for round 0 (maybe), once for 1..3
    for r in range(4):
        assert (tmp_path / PARTY / f"round_{r:04d}" / "roc.png").is_file()
    assert [row.split(",")[0] for row in (tmp_path / PARTY / "metrics.csv").read_text().splitlines()[1:]] == \
        ["0", "1", "2", "3"]


@pytest.mark.slow
def test_a_failing_render_is_logged_and_the_next_round_still_draws(tmp_path, monkeypatch, caplog):
    real = party_module.plot_roc

    def fails_on_round_1(record, path, log_scale):
        if record.round == 1:
            raise RuntimeError("renderer broke")
        return real(record, path, log_scale)

    monkeypatch.setattr(party_module, "plot_roc", fails_on_round_1)
    writer = ReportWriter(tmp_path, PARTY)
    with caplog.at_level(logging.ERROR, logger="audit.reporting.background"):
        writer.write_round_in_background(make_record(0))
        assert flush(timeout=60)
        writer.write_round_in_background(make_record(1))
        assert flush(timeout=60)
        writer.write_round_in_background(make_record(2))
        assert flush(timeout=60)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and f"{PARTY} round 1" in errors[0].getMessage()
    assert "renderer broke" in errors[0].exc_text
    party = tmp_path / PARTY
    assert (party / "round_0001" / "audit.json").is_file() and not (party / "round_0001" / "roc.png").exists()
    assert (party / "round_0002" / "roc.png").is_file()
    page = (party / "index.html").read_text()
    assert "round_0002/roc.png" in page and "round_0001/roc.png" not in page  # only images that exist are linked
    assert broken_links(tmp_path) == []


@pytest.mark.slow
def test_matplotlib_draws_only_on_the_worker_thread(tmp_path, monkeypatch):
    threads = set()
    real = Figure.savefig

    def recording(self, *args, **kwargs):
        threads.add(threading.current_thread().name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording)
    ReportWriter(tmp_path, PARTY).write_round_in_background(make_record(0))
    assert flush(timeout=60)
    assert threads == {render_queue._name}


@pytest.mark.slow
def test_the_worker_frees_the_figures_it_drew_without_waiting_for_pythons_collector(tmp_path, monkeypatch):
    """A drawn figure is reference cycles holding its data: with the interpreter's own collections off (in a process
    with a model's millions of objects the full ones are rare), a batch's figures are freed when it ends, all but
    what the collection's finalizers let go of, and those when the next batch ends."""
    drawn = []
    real = Figure.__init__

    def tracked(self, *args, **kwargs):
        real(self, *args, **kwargs)
        drawn[-1].append(weakref.ref(self))

    monkeypatch.setattr(Figure, "__init__", tracked)
    writer = ReportWriter(tmp_path, PARTY)
    alive = []
    gc.collect()
    gc.disable()
    try:
        for round_num in (0, 1):
            drawn.append([])
            writer.write_round_in_background(make_record(round_num))
            assert flush(timeout=60)
            alive.append([sum(ref() is not None for ref in batch) for batch in drawn])
    finally:
        gc.enable()
    assert all(len(batch) >= 3 for batch in drawn), [len(batch) for batch in drawn]
    assert alive[0][0] <= 1 and alive[1][0] == 0 and alive[1][1] <= 1, alive


@pytest.mark.federation
def test_in_process_round_returns_before_drawing_and_the_run_ends_with_every_page(tmp_path, gated_roc):
    seen = {}

    def on_round_end(round_num, _logs):
        # Both collaborators' train tasks have returned: their records are on disk, their images still queued.
        reports = tmp_path / "reports"
        seen[round_num] = {
            name: ((reports / name / f"round_{round_num:04d}" / "audit.json").is_file(),
                   (reports / name / f"round_{round_num:04d}" / "roc.png").exists())
            for name in ("collaborator1", "collaborator2")}
        gated_roc.set()

    result = run_in_process(tmp_path, collaborators=2, rounds=1, overrides=FAST, on_round_end=on_round_end)
    assert seen == {0: {"collaborator1": (True, False), "collaborator2": (True, False)}}
    for name in ("collaborator1", "collaborator2"):  # run_in_process flushed: everything drawn
        party = result.report_dir / name
        assert (party / "round_0000" / "roc.png").is_file() and (party / "auc.png").is_file()
        assert "round_0000/roc.png" in (party / "index.html").read_text()
    assert broken_links(result.report_dir) == []


def _busy(seconds: float) -> None:
    """Spend `seconds` of this thread's CPU time."""
    import time

    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class _Writer:
    """A writer whose summaries cost `seconds` of CPU time and say which rounds they saw."""

    party = "p"

    def __init__(self, seconds: float):
        self.seconds, self.drawn, self.summaries, self.stored = seconds, [], [], []

    def render_key(self) -> str:
        return "p"

    def render_round(self, round_num: int) -> None:
        self.drawn.append(round_num)

    def rebuild_summary(self) -> None:
        _busy(self.seconds)
        self.summaries.append(max(self.stored))


def test_summaries_are_redrawn_no_faster_than_their_cost_allows_and_flush_draws_the_last():
    """A long run's summaries grow with its rounds: drawn every round they took more and more of each round's work.
    Paced, each drawing waits for the process to spend 4 times its CPU time on other work (a round's training and
    audit, here a busy loop); each round's own images are still drawn every round, and flush() draws the summaries of
    the last round."""
    import time

    from audit.reporting.background import RenderQueue

    queue = RenderQueue("paced-test", pace=4.0)
    writer = _Writer(0.04)
    began = time.process_time()
    for r in range(30):
        writer.stored.append(r)
        queue.submit(writer, r)
        _busy(0.02)  # the round's own work
    assert queue.flush(60)
    work = time.process_time() - began  # the process's, whatever else ran in it meanwhile
    assert writer.drawn == list(range(30))  # every round's images, in order
    assert writer.summaries[0] <= 3  # the first at once (it reads what is stored when it is drawn)
    assert writer.summaries[-1] == 29  # flush: the last round's
    # drawn every round, the summaries would cost twice the rounds' work; paced, each drawing follows at least
    # 4 x 0.04 CPU-s the process spent on other work, and costs 0.04 itself: at most work / 0.2 + the first and flush's
    assert len(writer.summaries) <= work / 0.2 + 2, (len(writer.summaries), work)
    assert len(writer.summaries) >= 2
