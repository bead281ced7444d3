"""The report's rendering off the round's critical path: one worker thread per process draws the plots and pages.

A round's record and private files are written synchronously by the caller (ReportWriter.store_round); what is drawn
from them (the round's ROC and histogram images, the cross-round plots and pages) is derived state, rebuildable from
disk, so it can be late. One thread draws everything (matplotlib is never used from two threads of this process
for reports), rounds queue per party, and a party with several queued rounds gets its per-round images drawn for
each but its summaries rebuilt once, for the latest. `flush()` waits until everything queued is drawn: the in-process
run calls it at its end and an atexit hook calls it at interpreter exit (an `fx` collaborator's process).
A drawing error is logged with the party and round and does not stop the worker or the training.
"""

from __future__ import annotations

import atexit
import gc
import logging
import threading
from typing import Protocol

__all__ = ["RenderQueue", "render_queue", "flush", "cancel"]

logger = logging.getLogger(__name__)


class Renderable(Protocol):
    party: str

    def render_key(self) -> str: ...

    def render_round(self, round_num: int) -> None: ...

    def rebuild_summary(self) -> None: ...


class RenderQueue:
    """A queue of (writer, round) drawing jobs served by one daemon thread, started on the first job."""

    def __init__(self, name: str = "report-renderer"):
        self._name = name
        self._cond = threading.Condition()
        self._pending: dict[str, tuple[Renderable, list[int]]] = {}  # key -> (latest writer, rounds in order)
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
        """Wait until every queued job is drawn; False if `timeout` seconds passed first."""
        if self._thread is threading.current_thread():  # from a job: waiting on itself would never end
            return False
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def cancel(self, timeout: float | None = None) -> bool:
        """Drop every queued job and wait for the one being drawn (at most `timeout` seconds): an interrupted run
        stops drawing (its pages are derived state, drawn again from the records by the next write). True when the
        worker is idle on return."""
        with self._cond:
            self._pending.clear()
            return self._cond.wait_for(lambda: not self._busy, timeout)

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending))
                jobs, self._pending = self._pending, {}
                self._busy = True
            try:
                for writer, rounds in jobs.values():
                    _draw(writer, rounds)
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


def _draw(writer: Renderable, rounds: list[int]) -> None:
    """Each queued round's images, then the summaries once (they are rebuilt from every record on disk)."""
    for round_num in rounds:
        try:
            writer.render_round(round_num)
        except Exception:  # noqa: BLE001 - a drawing error must not stop the worker; it is logged, never silent
            logger.exception("%s round %d: drawing the round's report images failed", writer.party, round_num)
    try:
        writer.rebuild_summary()
    except Exception:  # noqa: BLE001
        logger.exception("%s round %d: rebuilding the report's summaries and pages failed", writer.party, rounds[-1])


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
