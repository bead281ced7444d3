"""The set-up's `fx` commands in forks of one process (workspace/fx_worker.py, workspace.prepare.FxRunner): each runs
in its own folder as a new `fx` process would, its failures read as `fx`'s, and nothing of the worker outlives the
runner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from workspace.federation_state import SetupError
from workspace.prepare import FxRunner
from workspace.processes import ProcessRegistry, is_running

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
