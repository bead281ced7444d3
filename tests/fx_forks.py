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

import subprocess
from pathlib import Path

import pytest

from workspace.prepare import FxRunner
from workspace.processes import ProcessRegistry


class FxForks:
    """`fx ARGS` in a folder, as a fork of one worker (workspace.prepare.FxRunner, what `prepare` runs them through);
    returns what subprocess.run would (output in `stdout`)."""

    def __init__(self, folder: Path):
        self._registry = ProcessRegistry()
        self._runner = FxRunner(self._registry, folder / "setup.log")

    def __call__(self, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        rc, output = self._runner.run(cwd, *args, timeout_s=timeout)
        return subprocess.CompletedProcess(["fx", *args], rc, output, "")

    def close(self) -> None:
        self._runner.close()


@pytest.fixture(scope="session")
def fx_fork(tmp_path_factory):
    """One FxForks per test worker (cheap to share: tests/conftest.py's CHEAP_SHARED)."""
    forks = FxForks(tmp_path_factory.mktemp("fx_forks"))
    yield forks
    forks.close()
