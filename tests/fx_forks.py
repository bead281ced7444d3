"""`fx` commands for tests whose subject is what a command does in its workspace, not how a new interpreter starts.

Each command runs through OpenFL's own entry point (`openfl.interface.cli.entry`, what the `fx` script calls), in its
folder, in a fork of one process per test worker that imported OpenFL's libraries and the workspace's once:
workspace/fx_worker.py, the process `python -m workspace prepare` runs its set-up commands in. A fork imports OpenFL
and the workspace's code itself, as a new `fx` process does; it skips the ~4 CPU-seconds of importing torch, pandas,
gRPC, scikit-learn, ... again.

The documented hand-run sequence (tests/test_fx_deployment.py), and a command that needs an environment of its own or
keeps running (a serving aggregator), stay real `fx` processes.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workspace.fx_worker import RC_SUFFIX
from workspace.processes import fx_environment

WORKER = Path(__file__).resolve().parent.parent / "workspace" / "fx_worker.py"


class FxForks:
    """`fx ARGS` in a folder, as a fork of one worker; returns what subprocess.run would (output in `stdout`)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._count = itertools.count()
        self._log = open(folder / "worker.log", "wb")
        self._worker = subprocess.Popen([sys.executable, str(WORKER)], cwd=folder, env=fx_environment(),
                                        stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def __call__(self, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        log = self.folder / f"{next(self._count)}.log"
        done = Path(str(log) + RC_SUFFIX)
        self._worker.stdin.write((json.dumps({"cwd": str(cwd), "args": list(args), "log": str(log)}) + "\n").encode())
        self._worker.stdin.flush()
        deadline = time.monotonic() + timeout
        while not done.exists():
            if self._worker.poll() is not None:
                raise AssertionError(f"the fx worker ended ({self._worker.returncode}): "
                                     f"{(self.folder / 'worker.log').read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"`fx {' '.join(args)}` in {cwd} took more than {timeout} s")
            time.sleep(0.02)
        output = log.read_text(errors="replace") if log.exists() else ""
        return subprocess.CompletedProcess(["fx", *args], int(done.read_text()), output, "")

    def close(self) -> None:
        if self._worker.poll() is None:
            self._worker.stdin.close()
            try:
                self._worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._worker.pid, signal.SIGKILL)
                self._worker.wait()
        self._log.close()


@pytest.fixture(scope="session")
def fx_fork(tmp_path_factory):
    """One FxForks per test worker (cheap to share: tests/conftest.py's CHEAP_SHARED)."""
    forks = FxForks(tmp_path_factory.mktemp("fx_forks"))
    yield forks
    forks.close()
