"""How far a running federation is, read from the aggregator's own metrics log, and a one-line display of it.

With `write_logs: true` (the run plan sets it) OpenFL's MetricWriter appends one JSON line per finished
round to the aggregator's logs/aggregator_metrics.txt: the same signal a person would watch.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def rounds_done(metrics_file: Path) -> int:
    """Number of rounds the aggregator has finished (0 if the file is not there yet)."""
    try:
        text = metrics_file.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return 0
    done = set()
    for line in text.splitlines():
        try:
            done.add(int(json.loads(line)["round_number"]))
        except (ValueError, KeyError, TypeError):
            continue  # a line being written
    return len(done)


class ProgressLine:
    """Rewrites one status line on a terminal; elsewhere (CI logs, pipes) prints a line when the status changes."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self.is_tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.monotonic()
        self._last = None

    def update(self, done: int, total: int, states: dict[str, str]) -> None:
        bar = "#" * done + "." * (total - done)
        parties = "  ".join(f"{name}: {state}" for name, state in states.items())
        status = f"rounds {done}/{total} [{bar}]  {parties}"
        if self.is_tty:
            elapsed = time.monotonic() - self.start
            self.stream.write(f"\r\033[K[{elapsed:6.1f}s] {status}")
            self.stream.flush()
        elif status != self._last:
            self.stream.write(f"[{time.monotonic() - self.start:6.1f}s] {status}\n")
            self.stream.flush()
        self._last = status

    def finish(self) -> None:
        if self.is_tty and self._last is not None:
            self.stream.write("\n")
            self.stream.flush()
