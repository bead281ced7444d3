"""How far a running federation is, read from the aggregator's own metrics log, and a one-line display of it;
and whether each party still makes progress (`Liveness`).

With `write_logs: true` (the run plan sets it) OpenFL's MetricWriter appends one JSON line per finished
round to the aggregator's logs/aggregator_metrics.txt: the same signal a person would watch.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from workspace.processes import CLOCK_TICKS_PER_S, snapshot


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


def eta_seconds(round_seconds: Sequence[float], done: int, total: int, in_round_s: float) -> float | None:
    """Seconds left: the mean finished round's time for each round to go, less the time the current one has run
    (never below the rounds still to come after it); None before any round is finished and once all are. Round 0 is
    left out of the mean once later rounds are known: it also holds the collaborators' start-up (data, model,
    connection)."""
    if not round_seconds or done >= total:
        return None
    rounds = list(round_seconds[1:]) if len(round_seconds) > 1 else list(round_seconds)
    per_round = sum(rounds) / len(rounds)
    after_this = per_round * (total - done - 1)
    return max(per_round * (total - done) - in_round_s, after_this)


BAR_WIDTH = 30  # characters: the bar never grows with the number of rounds


def progress_bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """`#` for the rounds done, `.` for those to go: one character a round up to `width` rounds, else scaled."""
    total = max(int(total), 1)
    cells = min(total, width)
    filled = min(cells, int(cells * max(done, 0) // total))
    return "#" * filled + "." * (cells - filled)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class ProgressLine:
    """Rewrites one status line on a terminal; elsewhere (CI logs, pipes) prints a line only when the rounds or a
    party's phase change (the clock and the ETA alone never print a line)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self.is_tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.monotonic()
        self._last = None
        self._drawn = False

    def update(self, done: int, total: int, states: dict[str, str], eta_s: float | None = None) -> None:
        bar = progress_bar(done, total)
        parties = "  ".join(f"{name}: {state}" for name, state in states.items())
        status = f"rounds {done}/{total} [{bar}]  {parties}"
        eta = "" if eta_s is None else f"  ETA {_duration(eta_s)}"
        line = f"[{time.monotonic() - self.start:6.1f}s] {status}{eta}"
        if self.is_tty:
            width = shutil.get_terminal_size((160, 24)).columns
            # A line wider than the terminal wraps, and \r would then rewrite only its last row.
            self.stream.write("\r\033[K" + (line if len(line) < width else line[:max(width - 2, 1)] + "…"))
            self.stream.flush()
            self._drawn = True
        elif status != self._last:
            self.stream.write(line + "\n")
            self.stream.flush()
        self._last = status

    def message(self, text: str) -> None:
        """A line of its own (on a terminal, the status line is drawn again below it at the next update)."""
        if self.is_tty and self._drawn:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()
        self._drawn = False

    def finish(self) -> None:
        if self.is_tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()


DEFAULT_LIVENESS_S = 120.0
MIN_LIVENESS_S = 2.0         # CPU use is sampled each second: a shorter setting would outrun the first sample
LIVENESS_ROUND_FACTOR = 3.0  # the window is at least this many times the slowest round so far
BUSY_CPU_SHARE = 0.1         # CPU use (share of one core) that counts as working; a party polling uses ~0.1%
CPU_SAMPLE_S = 1.0           # CPU use is measured over at least this long (clock ticks are 10 ms)


@dataclass
class _Party:
    pid: int
    logs: tuple[Path, ...]
    collaborator: bool
    last_active: float
    log_bytes: int = -1
    cpu_ticks: int | None = None
    cpu_at: float = 0.0
    state: str = "?"


@dataclass
class Liveness:
    """Which parties of a running federation stopped making progress.

    A party shows progress by writing to its logs, by using CPU (training, auditing: `BUSY_CPU_SHARE` of a
    core or more), and, for the aggregator, by finishing a round. A party is frozen when it shows none and

    - its process is stopped (state T: SIGSTOP, a debugger) for `floor_s`: it cannot be working, or
    - it is a collaborator and a round ended at least `floor_s` ago, during its silence (a live one logs the
      next round's tasks within a poll interval; a slow one still training uses CPU), or
    - no party showed any progress for the window, max(floor_s, LIVENESS_ROUND_FACTOR x the slowest round so
      far), plus `straggler_wait_s` while the survivors wait for the straggler policy to end a round without a
      dead collaborator: a deadlock somewhere, whose culprit cannot be told from outside; all are named, the
      longest silent first.

    A party merely waiting for others is not frozen: someone else is working, or a round ends and it logs.
    """

    floor_s: float = DEFAULT_LIVENESS_S
    straggler_wait_s: float = 0.0

    def __post_init__(self):
        if self.floor_s < MIN_LIVENESS_S:
            raise ValueError(f"liveness: {self.floor_s:g} s is below {MIN_LIVENESS_S:g} s (CPU use is sampled each "
                             "second)")
    parties: dict[str, _Party] = field(default_factory=dict)
    rounds_done: int = 0
    round_ends: list[float] = field(default_factory=list)  # when each finished round was first seen

    def add(self, name: str, pid: int, logs: Iterable[Path], *, collaborator: bool, now: float) -> None:
        self.parties[name] = _Party(pid=pid, logs=tuple(logs), collaborator=collaborator, last_active=now,
                                    cpu_at=now)

    def window(self, round_seconds: Sequence[float] = ()) -> float:
        return max(self.floor_s, LIVENESS_ROUND_FACTOR * max(round_seconds, default=0.0))

    def observe(self, running: Iterable[str], rounds_done: int, now: float, aggregator: str = "aggregator") -> None:
        """Sample the running parties' logs and CPU time, and the rounds finished so far."""
        if rounds_done > self.rounds_done:
            self.round_ends += [now] * (rounds_done - self.rounds_done)
            self.rounds_done = rounds_done
            if aggregator in self.parties:
                self.parties[aggregator].last_active = now
        for name in running:
            party = self.parties[name]
            size = sum(_size(p) for p in party.logs)
            if size != party.log_bytes:
                party.log_bytes, party.last_active = size, now
            snap = snapshot(party.pid)
            if snap is None:
                continue
            party.state = snap.state
            if party.cpu_ticks is None:
                party.cpu_ticks, party.cpu_at = snap.cpu_ticks, now
            elif now - party.cpu_at >= CPU_SAMPLE_S:
                share = (snap.cpu_ticks - party.cpu_ticks) / CLOCK_TICKS_PER_S / (now - party.cpu_at)
                if share >= BUSY_CPU_SHARE:
                    party.last_active = now
                party.cpu_ticks, party.cpu_at = snap.cpu_ticks, now

    def silent_for(self, name: str, now: float) -> float:
        return now - self.parties[name].last_active

    def frozen(self, running: Iterable[str], now: float, round_seconds: Sequence[float] = (), *,
               waiting_for_stragglers: bool = False) -> dict[str, str]:
        """Frozen running parties -> why, for people (empty if every party is live)."""
        silent = {name: self.silent_for(name, now) for name in running}
        out = {}
        for name, seconds in silent.items():
            party = self.parties[name]
            if seconds < self.floor_s:
                continue
            if party.state in ("T", "t"):
                out[name] = (f"its process is stopped (state {party.state}: SIGSTOP or a debugger); no log line and "
                             f"no CPU use for {seconds:.0f} s")
            elif party.collaborator and (ended := self._first_round_end_after(party.last_active)) is not None \
                    and now - ended >= self.floor_s:
                out[name] = (f"no log line and no CPU use for {seconds:.0f} s, though a round ended "
                             f"{now - ended:.0f} s ago, during its silence (process state {party.state})")
        if out or not silent:
            return out
        window = self.window(round_seconds) + (self.straggler_wait_s if waiting_for_stragglers else 0.0)
        if all(seconds >= window for seconds in silent.values()):
            quiet = min(silent.values())
            for name in sorted(silent, key=silent.get, reverse=True):
                out[name] = (f"no party made progress for {quiet:.0f} s (no log line, no CPU use, no round; liveness "
                             f"window {window:.0f} s); {name} silent for {silent[name]:.0f} s, process state "
                             f"{self.parties[name].state}")
        return out

    def _first_round_end_after(self, moment: float) -> float | None:
        return next((t for t in self.round_ends if t > moment), None)

    def state(self, name: str) -> str:
        return self.parties[name].state if name in self.parties else "?"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
