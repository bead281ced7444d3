"""Ctrl-C and SIGTERM as an exception the commands clean up from: `Interrupted` carries the signal, so that a command
exits 128 + its number (130, 143) after its `finally` blocks ran. Shared by `python -m workspace` (its handler also
stops the processes it started) and the demo (`DemoSignals`).

A handler that runs while the main thread imports a module defers its signal (`in_import`, `Redelivery`): the module
may be a C extension running Python code from C++ (torch's import does), where a raised exception cannot unwind
through the C++ frames and the process ends in abort() (SIGABRT), with no clean-up. The signal is handed to the
handler again once the import is done, inside Python only (`_thread.interrupt_main`): never sent to the process
again, where it would take the default action (exit 143, nothing cleaned up) once the handlers are gone.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time

__all__ = ["Interrupted", "in_import", "Redelivery", "REDELIVER_S", "DemoSignals"]


class Interrupted(KeyboardInterrupt):
    """Raised by a SIGINT/SIGTERM handler so that the `finally` blocks clean up."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# How often a deferred signal is handed to its handler again while the main thread's import goes on.
REDELIVER_S = 0.05
# importlib's frozen modules, by the names they have before and after `importlib` itself is imported (it renames them)
_IMPORT_MODULES = frozenset({"_frozen_importlib", "_frozen_importlib_external", "importlib._bootstrap",
                             "importlib._bootstrap_external"})


def in_import(frame) -> bool:
    """Whether `frame` (the main thread's, where a handler runs) is inside an import: importlib's own frames are on
    its stack. An import in another thread does not count: raising in the main thread is safe then."""
    while frame is not None:
        if frame.f_globals.get("__name__") in _IMPORT_MODULES:
            return True
        frame = frame.f_back
    return False


class Redelivery:
    """Hands a deferred signal to its handler again, REDELIVER_S later, from a daemon thread started with it (never
    from a handler: starting a thread takes locks the interrupted main thread may hold). A handler asks for it with
    `later(signum)`, which only writes a byte to a pipe; `_thread.interrupt_main` then runs the signal's handler in
    the main thread only while Python's handler for it is still `handler` (a signal whose handler is gone is
    dropped: the scope that owned it has ended, and says so). `close()` ends the thread."""

    def __init__(self):
        self._read, self._write = os.pipe()
        self.handler = None  # the handler the deferred signals are meant for
        threading.Thread(target=self._serve, name="signal-redelivery", daemon=True).start()

    def later(self, signum: int) -> None:
        try:
            os.write(self._write, bytes([signum]))
        except OSError:  # closed: the scope has ended
            pass

    def _serve(self) -> None:
        while True:
            try:
                byte = os.read(self._read, 1)
            except OSError:
                return
            if not byte:
                os.close(self._read)
                return
            time.sleep(REDELIVER_S)
            signum = byte[0]
            if self.handler is not None and signal.getsignal(signum) == self.handler:
                _thread.interrupt_main(signum)

    def close(self) -> None:
        self.handler = None
        try:
            os.close(self._write)
        except OSError:
            pass


class DemoSignals:
    """The demo's SIGINT/SIGTERM handling, while installed (a context manager): the first signal raises Interrupted in
    the main thread (during the main thread's import, once it is done); a later one only sets `hurry`, so that the
    clean-up of the first skips what it would wait for. The previous handlers come back on exit; a signal deferred
    until then is raised as the scope ends."""

    def __init__(self):
        self.signum: int | None = None
        self.hurry = False
        self._deferred: int | None = None
        self._previous: dict = {}
        self._redelivery: Redelivery | None = None

    def _handle(self, signum, frame):
        if self.signum is not None:
            self.hurry = True
            return
        if in_import(frame):
            self._deferred = signum
            self._redelivery.later(signum)
            return
        self.signum = signum
        raise Interrupted(signum)

    def __enter__(self) -> "DemoSignals":
        if threading.current_thread() is threading.main_thread():
            self._redelivery = Redelivery()
            self._redelivery.handler = self._handle
            self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, exc_type, *_exc) -> bool:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        if self._redelivery is not None:
            self._redelivery.close()
        if self._deferred is not None and self.signum is None and exc_type is None:
            self.signum = self._deferred  # came during an import that ended just before the scope did
            raise Interrupted(self._deferred)
        return False
