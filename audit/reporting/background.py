"""The report's rendering off the round's critical path: one worker thread per process draws the plots and pages.

A round's record and private files are written synchronously by the caller (ReportWriter.store_round); what is drawn
from them (the round's ROC and histogram images, the cross-round plots and pages) is derived state, rebuildable from
disk, so it can be late. One thread draws everything (matplotlib is never used from two threads of this process
for reports), rounds queue per party, and a party with several queued rounds gets its per-round images drawn for
each but its summaries rebuilt once, for the latest; and no more often than their own cost allows (PACE), so that a
long run's growing summaries never take more than a fixed share of the process's CPU time. `flush()` waits until everything queued
is drawn, the summaries too: the in-process run calls it at its end and an atexit hook calls it at interpreter exit
(an `fx` collaborator's process). A drawing error is logged with the party and round and does not stop the worker or
the training.
"""

from __future__ import annotations

import atexit
import gc
import logging
import threading
import time
from typing import Protocol

__all__ = ["RenderQueue", "render_queue", "flush", "cancel"]

logger = logging.getLogger(__name__)


class Renderable(Protocol):
    party: str

    def render_key(self) -> str: ...

    def render_round(self, round_num: int) -> None: ...

    def rebuild_summary(self) -> None: ...


# A writer's summaries (its plots over rounds, its pages) are drawn again once the process has spent PACE times the
# CPU time their last drawing took on other work (its training and audit): they then take at most 1 / (PACE + 1) of
# the process's CPU time, a fixed share of each round's work, whatever the rounds and the machine's load. Their plots
# grow with the rounds (1.3 CPU-s at round 10, 3.6 at round 100 for a party of benchmarks/bench_rounds_flat.py's run):
# drawn every round they took more of each round, and a whole core once they took longer than a round. Each round's
# own images are drawn every round; flush() draws the summaries that wait at once.
PACE = 4.0
_RECHECK_S = 0.5  # how often a worker with summaries waiting looks whether the process's work has paid for them
class RenderQueue:
    """A queue of (writer, round) drawing jobs served by one daemon thread, started on the first job."""

    def __init__(self, name: str = "report-renderer", pace: float = PACE):
        self._name = name
        self._pace = pace
        self._cond = threading.Condition()
        self._pending: dict[str, tuple[Renderable, list[int]]] = {}  # key -> (latest writer, rounds in order)
        self._stale: dict[str, Renderable] = {}  # key -> writer whose summaries wait for their pace
        self._last: dict[str, tuple[float, float]] = {}  # key -> (process CPU-s when its summaries ended, their CPU-s)
        self._forced = False  # flush(): every stale summary now
        self._busy = False
        self._thread: threading.Thread | None = None

    def submit(self, writer: Renderable, round_num: int) -> None:
        """Queue the drawing of `round_num`'s images and the writer's summaries; returns at once."""
        with self._cond:
            key = writer.render_key()
            _, rounds = self._pending.get(key, (writer, []))
            if round_num not in rounds:
                rounds.append(round_num)
            self._pending[key] = (writer, rounds)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued job is drawn, the summaries that wait for their pace too; False if `timeout`
        seconds passed first."""
        if self._thread is threading.current_thread():  # from a job: waiting on itself would never end
            return False
        with self._cond:
            self._forced = True
            self._cond.notify_all()
            done = self._cond.wait_for(lambda: not self._pending and not self._stale and not self._busy, timeout)
            self._forced = False
            return done

    def cancel(self, timeout: float | None = None) -> bool:
        """Drop every queued job and wait for the one being drawn (at most `timeout` seconds): an interrupted run
        stops drawing (its pages are derived state, drawn again from the records by the next write). True when the
        worker is idle on return."""
        with self._cond:
            self._pending.clear()
            self._stale.clear()
            return self._cond.wait_for(lambda: not self._busy, timeout)

    def _due(self, key: str) -> bool:
        """Whether `key`'s summaries may be drawn now (PACE)."""
        if self._forced or key not in self._last:
            return True
        ended, cost = self._last[key]
        return time.process_time() - ended >= self._pace * cost

    def _next_jobs(self) -> tuple[dict, dict]:
        """Wait for work: rounds to draw, or summaries whose pace allows them (called holding the condition)."""
        while True:
            due = {key: w for key, w in self._stale.items() if self._due(key)}
            if self._pending or due:
                jobs, self._pending = self._pending, {}
                for key in due:
                    del self._stale[key]
                return jobs, due
            self._cond.wait(_RECHECK_S if self._stale else None)

    def _work(self) -> None:
        while True:
            with self._cond:
                jobs, due = self._next_jobs()
                self._busy = True
            try:
                for key, (writer, rounds) in jobs.items():
                    _draw_rounds(writer, rounds)
                    with self._cond:
                        if key not in due:
                            if self._due(key):
                                due[key] = writer
                            else:
                                self._stale[key] = writer
                for key, writer in due.items():
                    started = time.thread_time()  # this thread's: what the drawing itself costs
                    _draw_summary(writer)
                    cost = time.thread_time() - started
                    with self._cond:
                        self._last[key] = (time.process_time(), cost)
                # A drawn figure is a web of reference cycles (figure, axes, artists, transforms) holding its data
                # and the renderer's buffers: freed only by a collection of the oldest generation, which a process
                # holding a model's millions of objects runs seldom. Each round's figures are then still held while
                # the next round trains and audits (benchmarks/README.md, "Memory across rounds"). One full
                # collection after each batch, here where the garbage is made, off the round's critical path (it
                # walks every object of the process). What its finalizers let go of (a batch's ROC figure) goes with
                # the next batch's.
                gc.collect()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


def _draw_rounds(writer: Renderable, rounds: list[int]) -> None:
    """Each queued round's own images."""
    for round_num in rounds:
        try:
            writer.render_round(round_num)
        except OSError as err:  # a full or read-only disk: one line, the run says the rest
            logger.error("%s round %d: drawing the round's report images failed: %s", writer.party, round_num, err)
        except Exception:  # noqa: BLE001 - a drawing error must not stop the worker; it is logged, never silent
            logger.exception("%s round %d: drawing the round's report images failed", writer.party, round_num)


def _draw_summary(writer: Renderable) -> None:
    """The writer's summaries (rebuilt from every record on disk)."""
    try:
        writer.rebuild_summary()
    except OSError as err:
        logger.error("%s: rebuilding the report's summaries and pages failed: %s", writer.party, err)
    except Exception:  # noqa: BLE001
        logger.exception("%s: rebuilding the report's summaries and pages failed", writer.party)


render_queue = RenderQueue()  # the process's one worker


def flush(timeout: float | None = None) -> bool:
    """Wait until the process's queued report drawing is done (see RenderQueue.flush)."""
    return render_queue.flush(timeout)


def cancel(timeout: float | None = None) -> bool:
    """Drop the process's queued report drawing and wait for the job being drawn (see RenderQueue.cancel)."""
    return render_queue.cancel(timeout)


# A process that ends without calling flush (an `fx` collaborator) still gets its last round's pages. The worker is
# a daemon thread: it still runs while atexit hooks do.
atexit.register(flush)
