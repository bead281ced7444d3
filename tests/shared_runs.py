"""The end-to-end runs several test files read, each made once per test run (session fixtures; tests/conftest.py
imports them, and keeps every test that uses one on the same xdist worker). A test reads them and never changes
them: one that needs to change a run's folder copies it first."""

import contextlib
import io
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FX = Path(sys.executable).parent / "fx"


# ---------------------------------------------------------------------------------------------------------
# The demo (cifar10_PM.py, the tutorial's command line) on digits: 2 collaborators, 2 rounds of one local epoch,
# its default signals (loss, gradient_norm, logits), FPR tolerances (0.1, 0.5, 0.9) and RMIA, progress bars asked
# for (stderr is a pipe here, so none may be drawn), TensorBoard event files on.

DEMO_ROUNDS = 2
DEMO_ARGS = ["--dataset", "digits", "--train_dataset_ratio", "0.1", "--test_dataset_ratio", "0.45",
             "--audit_dataset_ratio", "0.45", "--local_epochs", "1", "--comm_round", str(DEMO_ROUNDS)]


@dataclass(frozen=True)
class DemoRun:
    proc: subprocess.CompletedProcess
    log_dir: Path


def run_demo(args, cwd: Path, env=None, timeout=600) -> subprocess.CompletedProcess:
    """cifar10_PM.py as a user runs it: a new interpreter, stdout and stderr pipes (no terminal)."""
    env = {**os.environ, "MPLBACKEND": "Agg", **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / "cifar10_PM.py"), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_demo_here(args, cwd: Path) -> subprocess.CompletedProcess:
    """cifar10_PM.main in this process, for a test that reads the run's output and files but not how a new
    interpreter behaves: no torch and OpenFL to import again (several CPU-seconds a run). Its exit code and what it
    printed (log records go to the handlers logging already had)."""
    import cifar10_PM

    out, err = io.StringIO(), io.StringIO()
    openfl_level = logging.getLogger("openfl").level  # main() quietens OpenFL's logger: not for the other tests
    try:
        with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cifar10_PM.main([str(a) for a in args])
            except SystemExit as stop:  # argparse's exit
                code = stop.code
    finally:
        logging.getLogger("openfl").setLevel(openfl_level)
    return subprocess.CompletedProcess(["cifar10_PM.py", *map(str, args)], code, out.getvalue(), err.getvalue())


def workspace_here(*args) -> subprocess.CompletedProcess:
    """`python -m workspace ARGS` through workspace.__main__.main in this process, from the repository's folder: its
    exit code and what it printed, without a new interpreter importing torch and OpenFL (seconds a call). For checks
    that end before the tool starts a child process of its own, or where a new interpreter is not what is tested."""
    from workspace.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as stop:  # argparse's exit
            code = stop.code
    return subprocess.CompletedProcess(["python", "-m", "workspace", *map(str, args)], code, out.getvalue(),
                                       err.getvalue())


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> DemoRun:
    tmp = tmp_path_factory.mktemp("demo")
    log_dir = tmp / "logs"
    proc = run_demo([*DEMO_ARGS, "--log_dir", log_dir], tmp, env={"TENSORBOARD": "1"})
    return DemoRun(proc, log_dir)


# ---------------------------------------------------------------------------------------------------------
# A prepared multi-process federation (`python -m workspace prepare`: workspaces, CA, mTLS certificates; the slow
# part of a multi-process run): 2 collaborators, 2 rounds of one epoch, the loss and logits signals, one FPR
# tolerance, no RMIA (the `fx` federation of tests/test_fx_deployment.py runs it in a collaborator process). A test
# that starts it starts a copy (`start` runs a folder once).

PREPARED_COLLABORATORS = ["collaborator1", "collaborator2"]
PREPARED_ROUNDS = 2
# use_tqdm: OpenFL's own bars asked for, which must not reach the participants' log files.
PREPARED_SETS = ["tasks.train.kwargs.epochs=1", "tasks.train.kwargs.use_tqdm=true",
                 "task_runner.settings.audit.signals=[loss, logits]", "task_runner.settings.audit.fpr_tolerance=[0.1]",
                 "task_runner.settings.audit.rmia.enabled=false"]


def workspace_cli(*args, timeout):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "workspace", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def prepared_federation(tmp_path_factory) -> Path:
    if not FX.exists():
        pytest.skip("fx is installed with openfl in the project's venv")
    run_dir = tmp_path_factory.mktemp("multiprocess") / "prepared"
    sets = [arg for s in PREPARED_SETS for arg in ("--set", s)]
    started = time.monotonic()
    result = workspace_here("prepare", "--collaborators", len(PREPARED_COLLABORATORS), "--rounds", PREPARED_ROUNDS,
                            "--dir", run_dir, *sets)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(f"prepare: {time.monotonic() - started:.1f} s")
    return run_dir
