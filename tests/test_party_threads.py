"""The multi-process tooling's threads per process (workspace.processes.party_threads, fx_environment)."""

import os
import subprocess
import sys

import pytest

from workspace.processes import THREAD_VARIABLES, fx_environment, party_threads


@pytest.mark.parametrize("collaborators, cores, threads", [(2, 2, 1), (4, 2, 1), (1, 8, 8), (3, 8, 2), (2, 3, 1),
                                                           (0, 4, 4)])
def test_the_cores_are_shared_by_the_collaborators(collaborators, cores, threads):
    assert party_threads(collaborators, cores) == threads


@pytest.mark.federation  # a child process
def test_the_thread_count_reaches_the_process_torch_runs_in(monkeypatch):
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    env = fx_environment("logs/x.log", threads=1)
    assert all(env[name] == "1" for name in THREAD_VARIABLES)
    got = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert got == "1"


def test_the_users_own_setting_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    env = fx_environment(threads=1)
    assert env["OMP_NUM_THREADS"] == "3" and "MKL_NUM_THREADS" not in env


def test_without_a_count_nothing_is_set(monkeypatch):
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    env = fx_environment()
    assert not any(name in env for name in THREAD_VARIABLES)
    assert os.environ.get("OMP_NUM_THREADS") is None
