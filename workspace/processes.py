"""The processes a local federation starts, each in its own process group, and stopping them by PID.

Every `fx` command (set-up commands and the long-running aggregator and collaborators) is started in a new
session, so its process group id is its PID: a Ctrl-C in the terminal reaches only the tooling, and the
tooling stops each process group it started (SIGTERM, then SIGKILL after a grace period), never anything
found by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence


class FxNotFoundError(RuntimeError):
    pass


def fx_executable() -> Path:
    """`fx` installed next to the running interpreter (the project's venv)."""
    fx = Path(sys.executable).parent / "fx"
    if not fx.exists():
        raise FxNotFoundError(f"fx not found at {fx}: run the tooling with the project's venv "
                              "(.venv/bin/python -m workspace ...), where openfl is installed")
    return fx


def fx_environment(log_file: str | None = None) -> dict:
    env = dict(os.environ)
    # Each participant must run its own workspace's code: fx puts its working folder first on sys.path, and a
    # PYTHONPATH pointing at the repository could still shadow what the workspace lacks.
    env.pop("PYTHONPATH", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("COLUMNS", "160")
    if log_file:
        env["LOG_FILE"] = log_file  # OpenFL's plain one-line-per-record log; must be logs/<name>
    else:
        env.pop("LOG_FILE", None)
    return env


def describe_returncode(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


@dataclass
class Started:
    name: str
    popen: subprocess.Popen
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid


class ProcessRegistry:
    """Starts commands in their own process groups and stops every group it started."""

    def __init__(self, stop_grace_s: float = 5.0):
        self.stop_grace_s = stop_grace_s
        self._started: list[Started] = []
        self._lock = threading.Lock()
        self._closed = False
        self.stopped_running: list[str] = []  # every process stop_all() found still running, in order

    @property
    def started(self) -> list[Started]:
        with self._lock:
            return list(self._started)

    def start(self, name: str, argv: Sequence[str], *, cwd: Path, log_path: Path, env: dict) -> Started:
        with self._lock:
            if self._closed:  # stop_all() ran (e.g. Ctrl-C): start nothing new from a worker thread
                raise InterruptedError(f"not starting {name}: the run is being stopped")
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as log:
                popen = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            started = Started(name, popen, log_path)
            self._started.append(started)
            return started

    def run(self, name: str, argv: Sequence[str], *, cwd: Path, log_path: Path, env: dict,
            timeout_s: float) -> int:
        """Run a command to completion (stopped, with a TimeoutError, after timeout_s); returns its exit code."""
        started = self.start(name, argv, cwd=cwd, log_path=log_path, env=env)
        try:
            return started.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop(started)
            raise TimeoutError(f"{name}: `{' '.join(map(str, argv[1:]))}` in {cwd} took more than {timeout_s:g} s "
                               f"(output: {log_path})") from None
        finally:
            with self._lock:
                if started in self._started and started.popen.poll() is not None:
                    self._started.remove(started)

    def stop(self, started: Started) -> None:
        """SIGTERM the process group, SIGKILL it if still there after the grace period, then reap the process."""
        pgid = started.pid  # start_new_session=True: the group id is the PID
        if started.popen.poll() is None:
            _killpg(pgid, signal.SIGTERM)
            try:
                started.popen.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                pass
        # Whatever else runs in the group (a child the participant started) goes too, even if the leader exited.
        _killpg(pgid, signal.SIGKILL)
        try:
            started.popen.wait(timeout=self.stop_grace_s)
        except subprocess.TimeoutExpired:
            pass

    def stop_all(self) -> list[str]:
        """Stop every process group started; returns the names of those that were still running."""
        with self._lock:
            self._closed = True
            started = list(self._started)
        running = [s.name for s in started if s.popen.poll() is None]
        for s in reversed(started):
            self.stop(s)
        with self._lock:
            self.stopped_running += [name for name in running if name not in self.stopped_running]
        return running


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
