"""Ctrl-C and SIGTERM as an exception the commands clean up from: `Interrupted` carries the signal, so that a command
exits 128 + its number (130, 143) after its `finally` blocks ran. Shared by `python -m workspace` (its handler also
stops the processes it started) and the demo (`demo_handler`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

__all__ = ["Interrupted", "importing", "REDELIVER_S", "DemoSignals"]


class Interrupted(KeyboardInterrupt):
    """Raised by a SIGINT/SIGTERM handler so that the `finally` blocks clean up."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# A module being imported may be a C extension running Python code from C++ (torch's import does): an exception a
# signal handler raises there cannot unwind through the C++ frames, and the process ends in abort() (SIGABRT), with
# no clean-up and no exit code of its own. So a signal that comes during an import is delivered again this much later.
REDELIVER_S = 0.05


def importing() -> bool:
    """Whether any module is being imported now, in any thread (importlib marks its spec while it runs)."""
    return any(getattr(getattr(module, "__spec__", None), "_initializing", False)
               for module in list(sys.modules.values()))


class DemoSignals:
    """The demo's SIGINT/SIGTERM handling, while installed (a context manager): the first signal raises Interrupted in
    the main thread (during an import, once it is done); a later one only sets `hurry`, so that the clean-up of the
    first skips what it would wait for. The previous handlers come back on exit."""

    def __init__(self):
        self.signum: int | None = None
        self.hurry = False
        self._previous: dict = {}

    def _handle(self, signum, _frame):
        if self.signum is not None:
            self.hurry = True
            return
        if importing():
            threading.Timer(REDELIVER_S, os.kill, (os.getpid(), signum)).start()
            return
        self.signum = signum
        raise Interrupted(signum)

    def __enter__(self) -> "DemoSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> bool:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        return False
