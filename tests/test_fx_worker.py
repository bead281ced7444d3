"""`fx` commands in forks of one process (workspace/fx_worker.py): the set-up's (workspace.prepare.FxRunner), each in
its own folder as a new `fx` process would, its failures read as `fx`'s, and nothing of the worker outlives the runner;
and a federation's participants (workspace.processes.ParticipantLauncher), each in its own session, folder and
environment, seen by the tool as a process it started, and gone with the launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from workspace.federation_state import SetupError
from workspace.prepare import FxRunner
from workspace.processes import (ParticipantLauncher, ProcessRegistry, describe_returncode, fx_environment,
                                 fx_executable, is_running)

pytestmark = [pytest.mark.federation, pytest.mark.skipif(not (Path(sys.executable).parent / "fx").exists(),
                                                     reason="fx is installed with openfl in the project's venv")]


def test_each_command_runs_in_its_own_folder_and_fails_as_fx_does(tmp_path):
    registry = ProcessRegistry()
    setup_log = tmp_path / "setup.log"
    fx = FxRunner(registry, setup_log)
    worker_pid = fx._worker.pid
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    try:
        # OpenFL reads the certificate folder off the working folder when its CLI module is imported: a second
        # command in another folder must make that folder's CA, not write into the first's again.
        fx(first, "workspace", "certify")
        fx(second, "workspace", "certify")
        for folder in (first, second):
            assert (folder / "cert" / "cert_chain.crt").is_file(), sorted(p.name for p in folder.rglob("*"))
        assert (first / "cert" / "cert_chain.crt").read_bytes() != (second / "cert" / "cert_chain.crt").read_bytes()
        # a failing command: its exit code and fx's one-line "EXCEPTION : ..." reach the caller, as from `fx`
        with pytest.raises(SetupError, match=r"(?s)fx collaborator certify --import nowhere\.zip.*in .*first"):
            fx(first, "collaborator", "certify", "--import", "nowhere.zip")
        assert fx._worker.pid == worker_pid and is_running(worker_pid)  # the failure ended its fork, not the worker
        fx(second, "workspace", "certify")  # and the next command still runs
    finally:
        fx.close()
    log = setup_log.read_text()
    assert log.count("===== [") == 4 and "(exit code 0," in log and "nowhere.zip" in log
    assert "Done." in log  # the commands' own output, captured in setup.log
    assert not is_running(worker_pid)
    assert registry.started == []  # nothing of the set-up left for stop_all


def test_an_interrupt_stops_the_worker_and_the_next_command_says_so(tmp_path):
    registry = ProcessRegistry(stop_grace_s=1.0)
    fx = FxRunner(registry, tmp_path / "setup.log")
    worker_pid = fx._worker.pid
    registry.stop_all()  # what an interrupt does
    assert not is_running(worker_pid)
    with pytest.raises(InterruptedError):
        fx(tmp_path, "workspace", "certify")
    assert not (tmp_path / "cert").exists()


# A participant's stand-in: `fx` imports its command modules by bare name with its working folder first on sys.path
# (openfl/interface/cli.py), so a pki.py in the folder runs in place of OpenFL's, in a fork as in a fresh `fx` process.
# It reports what the process is, or fails, or waits to be killed, as PROBE_MODE says.
PROBE = """
import json, os, sys, time
mode = os.environ["PROBE_MODE"]
if mode == "sleep":
    time.sleep(600)
if mode == "fail":
    raise RuntimeError("the probe fails as asked")
import scipy.stats, sklearn.metrics, threadpoolctl, torch
from openfl.interface.cli_helper import CERT_DIR
json.dump({"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0), "cwd": os.getcwd(),
           "argv": sys.argv, "cert_dir": str(CERT_DIR), "marker": os.environ.get("PROBE_MARKER"),
           "stdin": os.read(0, 16).decode(), "torch_threads": torch.get_num_threads(),
           "pools": sorted((p["user_api"], os.path.basename(p["filepath"]), p["num_threads"])
                           for p in threadpoolctl.threadpool_info())},
          open(os.environ["PROBE_OUT"], "w"))
sys.exit(0)
"""


def _probe_folder(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "pki.py").write_text(PROBE)
    return folder


def _start_probe(registry, launcher, folder: Path, mode: str, **env):
    environment = {**fx_environment(f"logs/{folder.name}.log", threads=2), "PROBE_MODE": mode,
                   "PROBE_OUT": str(folder / "report.json"), **env}
    return registry.start(folder.name, [str(fx_executable()), "probe"], cwd=folder,
                          log_path=folder / "console.log", env=environment, launcher=launcher)


def _wait_gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not is_running(pid):
            return True
        time.sleep(0.05)
    return False


def test_participants_are_forks_in_their_own_sessions_folders_and_environments(tmp_path):
    registry = ProcessRegistry(stop_grace_s=2.0)
    launcher = ParticipantLauncher(registry, cwd=tmp_path, log_path=tmp_path / "launcher.log")
    first, second, failing, sleeping = (_probe_folder(tmp_path, n) for n in ("first", "second", "failing", "sleeping"))
    try:
        # More threads than the launcher's own one each (it imports with one): the pools follow the participant's
        # environment, as in a fresh process.
        env = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
        ok = [_start_probe(registry, launcher, folder, "report", PROBE_MARKER=folder.name, **env)
              for folder in (first, second)]
        failed = _start_probe(registry, launcher, failing, "fail")
        asleep = _start_probe(registry, launcher, sleeping, "sleep")
        # its group exists once its pid is reported, so a caller can signal it at once (the fork's setsid came first)
        assert os.getpgid(asleep.pid) == asleep.pid
        for started in (*ok, failed):
            started.popen.wait(timeout=60)
        assert [s.popen.returncode for s in ok] == [0, 0], [(f / "console.log").read_text() for f in (first, second)]
        assert failed.popen.returncode == 1
        assert "RuntimeError: the probe fails as asked" in (failing / "console.log").read_text()
        for started, folder in zip(ok, (first, second)):
            report = json.loads((folder / "report.json").read_text())
            # the pid the tool holds is the participant's, leader of its own session, a child of the launcher
            assert report["pid"] == report["sid"] == report["pgid"] == started.pid
            assert report["ppid"] == launcher.process.pid
            assert report["cwd"] == str(folder) and report["argv"] == ["fx", "probe"]
            # each its own folder's certificate folder (OpenFL reads it off the working folder at import)
            assert report["cert_dir"] == str(folder / "cert")
            assert report["marker"] == folder.name and report["stdin"] == ""
            assert report["torch_threads"] == 2 and {n for _, _, n in report["pools"]} == {2}, report["pools"]
        # the tool sees the sleeping one as it sees any participant: by its pid, its folder, its process group
        assert psutil.Process(asleep.pid).cwd() == str(sleeping) and asleep.popen.poll() is None
        assert os.getpgid(asleep.pid) == asleep.pid
        registry.stop(asleep)
        assert describe_returncode(asleep.popen.returncode) == "killed by SIGTERM"
        assert not is_running(asleep.pid)
        # A launcher closed with a participant still running (an interrupted start) ends it.
        left = _start_probe(registry, launcher, _probe_folder(tmp_path, "left"), "sleep")
        launcher.close()
        assert _wait_gone(left.pid) and left.popen.poll() == -signal.SIGKILL
    finally:
        registry.stop_all()
        launcher.close()
    assert not is_running(launcher.process.pid)
    # A fresh `fx` process with the same environment has the same thread pools.
    fresh_env = {**fx_environment(threads=2), "PROBE_MODE": "report", "PROBE_OUT": str(tmp_path / "fresh.json"),
                 **env}
    done = subprocess.run([str(fx_executable()), "probe"], cwd=first, env=fresh_env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    fresh, forked = (json.loads(p.read_text()) for p in (tmp_path / "fresh.json", first / "report.json"))
    assert (fresh["torch_threads"], fresh["pools"]) == (forked["torch_threads"], forked["pools"])


def test_the_launchers_end_ends_its_participants(tmp_path):
    registry = ProcessRegistry(stop_grace_s=1.0)
    launcher = ParticipantLauncher(registry, cwd=tmp_path, log_path=tmp_path / "launcher.log")
    try:
        asleep = [_start_probe(registry, launcher, _probe_folder(tmp_path, n), "sleep") for n in ("one", "two")]
        os.kill(launcher.process.pid, signal.SIGKILL)  # as when the tooling, and the launcher with it, is killed
        for started in asleep:
            assert _wait_gone(started.pid), f"{started.name} (pid {started.pid}) outlived its launcher"
            assert started.popen.wait(timeout=5) == -signal.SIGKILL  # what the tool reads of it
        assert launcher.process.popen.wait(timeout=5) == -signal.SIGKILL
    finally:
        registry.stop_all()
        launcher.close()
