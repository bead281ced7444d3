"""How a run ends, as the user sees it: a run that stopped early never reads like a finished short one (run.json's
state, the run index, the demo's lines), Ctrl-C and SIGTERM end the demo with 130 / 143 in one line and no traceback, no
temp file of an unfinished write is left, and a full or read-only disk is named in one line, before any work where it
can be found then."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from audit.reporting.atomic_io import (atomic_write_bytes, atomic_write_text, is_temp_name, remove_leftover_temps,
                                       remove_unfinished_writes)
from audit.reporting.run_file import read_run_file, write_run_file
from audit.round_record import RoundRecord
from audit.run_record import RUN_FILE, SCHEMA_VERSION, RunInfo, RunRecord, RunRecordSchemaError
from audit.run_states import FAILED, FINISHED, INTERRUPTED, RUNNING

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------------- the run state

def _run_of(folder: Path) -> RunRecord | None:
    """The folder's run.json, or None while there is none (or it is being replaced)."""
    try:
        return read_run_file(folder)
    except (OSError, ValueError):
        return None


def test_the_run_state_says_how_far_a_run_got_and_round_trips(tmp_path):
    info = RunInfo(RUNNING, 8)
    record = write_run_file(tmp_path, info=info)
    assert record.describe() == "running: 0 of 8 rounds written so far"
    info = info.round_written(2)
    assert info.round_written(1).rounds_done == 2 and info.round_written(99).rounds_done == 8  # never back, or over
    stopped = write_run_file(tmp_path, info=info.ended(INTERRUPTED, "SIGINT"))
    assert stopped.describe() == "interrupted (SIGINT) after 2 of 8 rounds (the last written: round 1)"
    assert RunRecord(FAILED, rounds=8, reason="disk full").describe() == ("failed (disk full) after 0 of 8 rounds (no "
                                                                         "round was written)")
    assert RunRecord(FINISHED, rounds=8, rounds_done=8).describe() == "finished 8 rounds"
    assert info.ended(FINISHED).rounds_done == 8
    assert read_run_file(tmp_path) == stopped
    # a rewrite without the driver's info (a party's rewrite of the index) keeps how the run stands
    assert write_run_file(tmp_path) == stopped
    # an update changes only what it says, under the one writer's lock
    assert write_run_file(tmp_path, update=lambda i: i.ended(FAILED, "disk full")).rounds_done == 2
    data = json.loads((tmp_path / RUN_FILE).read_text())
    assert data["schema_version"] == SCHEMA_VERSION and data["state"] == FAILED and data["rounds_done"] == 2
    assert data["reason"] == "disk full"
    (tmp_path / RUN_FILE).write_text(json.dumps({**data, "schema_version": 99}))
    with pytest.raises(RunRecordSchemaError):  # another schema: not read as this one
        read_run_file(tmp_path)
    with pytest.raises(ValueError, match="run state 'paused'"):
        RunRecord("paused", rounds=3)
    with pytest.raises(ValueError, match="rounds_done 4"):
        RunRecord(RUNNING, rounds=3, rounds_done=4)


def _party_with_records(root: Path, name: str, rounds: int, page: bool) -> None:
    for r in range(rounds):
        folder = root / name / f"round_{r:04d}"
        folder.mkdir(parents=True)
        (folder / "audit.json").write_text(json.dumps(RoundRecord(party=name, round=r).to_json()))
    if page:
        (root / name / "index.html").write_text("<html></html>")


@pytest.mark.slow  # draws the run index's picture
def test_the_run_index_says_a_run_was_interrupted_and_which_pages_were_not_drawn(tmp_path):
    from audit.reporting.html import write_index

    _party_with_records(tmp_path, "collaborator1", 2, page=True)
    _party_with_records(tmp_path, "collaborator2", 2, page=False)
    parties = {"collaborator1": tmp_path / "collaborator1", "collaborator2": tmp_path / "collaborator2",
               "collaborator3": tmp_path / "collaborator3"}
    text = write_index(tmp_path, parties=parties, info=RunInfo(RUNNING, 8, rounds_done=2).ended(INTERRUPTED, "SIGTERM")
                       ).read_text()
    assert "Interrupted (SIGTERM) after 2 of 8 rounds (the last written: round 1). The figures below are those " \
           "rounds&#x27; only: the run did not finish." in text or \
           "Interrupted (SIGTERM) after 2 of 8 rounds (the last written: round 1). The figures below are those " \
           "rounds' only: the run did not finish." in text, text[:2000]
    assert "collaborator2 <span class=\"muted\">(2 round records written, its page not drawn)</span>" in text
    assert "collaborator3 <span class=\"muted\">(no report written)</span>" in text
    assert "<p>Finished 2 rounds.</p>" in write_index(tmp_path, parties=parties,
                                                      info=RunInfo(RUNNING, 2).ended(FINISHED)).read_text()
    (tmp_path / RUN_FILE).unlink()  # a report folder written without a driver (plain fx): no run line is claimed
    text = write_index(tmp_path, parties=parties).read_text()
    assert "Finished" not in text and "Interrupted" not in text


def test_a_round_cut_short_is_not_said_to_be_done():
    from workspace.demo_output import Progress

    stream = io.StringIO()  # not a terminal: a line per round
    with pytest.raises(KeyboardInterrupt):
        with Progress(4, 2, 1, stream=stream) as progress:
            progress.phase("collaborator1", "train", 0)
            progress.end_round()  # round 0's reports written
            progress.phase("collaborator1", "train", 1)
            raise KeyboardInterrupt  # Ctrl-C in round 1
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("round 0 done (1 of 4)"), lines


# ------------------------------------------------------------------------------------------------- temp files

def test_an_unfinished_write_in_another_thread_leaves_no_temp_file(tmp_path):
    target = tmp_path / "page.html"
    atomic_write_text(target, "before")
    started, release, failed = threading.Event(), threading.Event(), []

    def slow(f):
        started.set()
        release.wait(10)
        f.write(b"after")

    def write():
        try:
            from audit.reporting.atomic_io import atomic_write_stream

            atomic_write_stream(target, slow)
        except OSError as err:
            failed.append(err)

    worker = threading.Thread(target=write)
    worker.start()
    assert started.wait(10)
    temps = [p for p in tmp_path.iterdir() if is_temp_name(p.name)]
    assert len(temps) == 1  # the write in flight
    assert remove_unfinished_writes() == [str(temps[0])]  # what an interrupted run does before it says so
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]
    release.set()
    worker.join(10)
    assert target.read_text() == "before" and [p.name for p in tmp_path.iterdir()] == ["page.html"]
    assert len(failed) == 1  # its rename found no temp file: the write failed, the page kept its content


def test_leftover_temps_of_killed_writers_are_removed_and_nothing_else(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    leftover = tmp_path / "a" / "b" / ".signals.png.p5rw0c4_.tmp"
    leftover.write_bytes(b"")
    keep = [tmp_path / "a" / "notes.tmp", tmp_path / "a" / ".hidden", tmp_path / "a" / ".x.tmp"]
    for path in keep:
        path.write_text("mine")
    atomic_write_bytes(tmp_path / "a" / "done.bin", b"1")
    assert remove_leftover_temps(tmp_path) == [leftover]
    assert all(p.exists() for p in keep) and (tmp_path / "a" / "done.bin").read_bytes() == b"1"


# ------------------------------------------------------------------------------------------------- the demo

DEMO = ["--dataset", "digits", "--collaborators", "2", "--train_dataset_ratio", "0.05", "--test_dataset_ratio",
        "0.05", "--audit_dataset_ratio", "0.2", "--local_epochs", "1", "--signals", "loss", "--rmia", "False",
        "--fpr_tolerance", "0.1"]


@pytest.mark.federation
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_demo_exits_in_one_line_and_its_index_says_so(tmp_path, sig, code):
    log_dir = tmp_path / "logs"
    rounds = 6
    env = {**os.environ, "MPLBACKEND": "Agg"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "cifar10_PM.py"), *DEMO, "--comm_round", str(rounds),
                             "--log_dir", str(log_dir)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while getattr(_run_of(log_dir), "rounds_done", 0) < 1:  # a round written, then stop
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    state = read_run_file(log_dir)
    assert state.state == INTERRUPTED and state.reason == sig.name and 1 <= state.rounds_done < rounds, state
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"interrupted ({sig.name}) after {state.rounds_done} of {rounds} rounds; the reports of "
                           f"the {state.rounds_done} round"), err[-2000:]
    # No line claims a round it did not write; no temp file is left; the index says how the run ended.
    done = [line for line in err.splitlines() if re.match(r"round \d+ done \(\d+ of \d+\) in ", line)]
    assert len(done) <= state.rounds_done, done
    assert [str(p) for p in log_dir.rglob("*") if is_temp_name(p.name)] == []
    assert f"Interrupted ({sig.name}) after {state.rounds_done} of {rounds} rounds" in \
        (log_dir / "index.html").read_text()
    assert not (log_dir / ".cifar10_PM.lock").exists()  # the folder is free again


@pytest.mark.federation
def test_a_full_disk_during_the_demo_is_named_in_one_line(tmp_path, monkeypatch):
    """ENOSPC, simulated where the party writes round 1's record (the disk fills during the run): the demo says which
    file could not be written, and how far it got, with exit code 1 and no traceback."""
    import audit.reporting.atomic_io as atomic_io
    from report_drawing import no_report_drawing
    from shared_runs import run_demo_here

    real = atomic_io._atomic_write

    def full_disk(path, write, private=False):
        if "round_0001" in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, write, private)

    monkeypatch.setattr(atomic_io, "_atomic_write", full_disk)
    log_dir = tmp_path / "logs"
    with no_report_drawing():  # what it printed and the run's record are read, not the pages
        result = run_demo_here([*DEMO, "--comm_round", "3", "--no_progress", "--log_dir", log_dir], tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith(("error:", "failed after"))]
    assert lines[0].startswith("error: cannot write the reports: No space left on device (") and \
        "round_0001" in lines[0], lines
    assert lines[1].startswith("failed after 1 of 3 rounds; the reports of the 1 round written"), lines
    state = read_run_file(log_dir)
    assert state.state == FAILED and state.rounds_done == 1 and "No space left on device" in state.reason, state
    assert [str(p) for p in log_dir.rglob("*") if is_temp_name(p.name)] == []


# ------------------------------------------------------------------------------------------------- read-only disks

@pytest.fixture
def read_only(monkeypatch):
    """Make folders read-only as a read-only mount is, for root too: creating anything under them fails with EROFS
    (os.open with O_CREAT, os.mkdir), which the probes and the writers all go through."""
    folders: list[Path] = []
    real_open, real_mkdir = os.open, os.mkdir

    def under(path) -> bool:
        path = Path(os.path.abspath(os.fspath(path)))
        return any(path == f or path.is_relative_to(f) for f in folders)

    def ro_open(path, flags, *args, **kw):
        if flags & os.O_CREAT and under(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kw)

    def ro_mkdir(path, *args, **kw):
        if under(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, *args, **kw)

    monkeypatch.setattr(os, "open", ro_open)
    monkeypatch.setattr(os, "mkdir", ro_mkdir)
    return folders.append


def test_a_read_only_log_dir_is_found_before_any_work(tmp_path, capsys, read_only):
    from test_settings_at_start import DEMO as QUICK, demo

    empty, parent = tmp_path / "empty", tmp_path / "ro"
    empty.mkdir()
    parent.mkdir()
    read_only(empty)
    read_only(parent)
    for log_dir, says in ((empty, f"error: --log_dir {empty}: cannot open its lock file .cifar10_PM.lock (Read-only "
                                  "file system)"),
                          (parent / "logs", f"error: --log_dir {parent / 'logs'}: cannot be made (Read-only file "
                                            "system)")):
        code, err = demo([*QUICK, "--log_dir", str(log_dir)], capsys)
        assert code == 2 and err.strip() == says, err
    assert list(empty.iterdir()) == [] and list(parent.iterdir()) == []


@pytest.mark.parametrize("key", ["aggregator.settings.report_dir", "task_runner.settings.audit.report_dir"])
def test_a_read_only_report_folder_stops_the_tool_before_any_folder_or_certificate(tmp_path, capsys, read_only, key):
    from test_settings_at_start import tool

    ro = tmp_path / "ro"
    ro.mkdir()
    read_only(ro)
    run_dir = tmp_path / "run"
    code, err = tool(["prepare", "--collaborators", "2", "--dir", str(run_dir), "--set", f"{key}={ro / 'reports'}"],
                     capsys)
    assert code == 2 and err.strip() == (f"error: {key}: {ro / 'reports'} cannot be written: {ro} refuses a new "
                                         "file (Read-only file system)"), err
    assert not run_dir.exists() and list(ro.iterdir()) == []


# ------------------------------------------------------------------------------------------------- the tool

@pytest.mark.federation
def test_a_full_disk_when_the_run_ends_still_gives_the_tools_summary(tmp_path, prepared_federation, monkeypatch):
    """The tool's own last writes (federation.json, the run index) on a full disk: it names what it could not write
    among the run's problems and prints its summary, with no traceback. (A participant that dies of the full disk
    is named as any dead participant is: tests/test_federation_faults.py.)"""
    import shutil

    import workspace.federation as federation
    from shared_runs import workspace_here
    from workspace.federation_state import FederationLayout

    run_dir = tmp_path / "run"
    shutil.copytree(prepared_federation, run_dir, symlinks=True)
    real_save, real_index = FederationLayout.save, federation.write_run_index

    def full(path):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    def save(self):
        if self.status in ("finished", "failed", "interrupted"):
            raise full(self.root / "federation.json")
        return real_save(self)

    def write_run_index(layout, state=RUNNING, **ended):
        if state != RUNNING:
            raise full(layout.root / "index.html")
        return real_index(layout, state, **ended)

    monkeypatch.setattr(FederationLayout, "save", save)
    monkeypatch.setattr(federation, "write_run_index", write_run_index)
    result = workspace_here("start", "--dir", run_dir, "--timeout", "2", "--liveness", "0")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    errors = result.stderr.strip().splitlines()
    assert errors[0].startswith("error: timed out after 2 s"), errors
    assert f"error: could not record how the run ended in {run_dir / 'federation.json'}: No space left on device" \
        in errors
    assert f"error: could not write the run index in {run_dir / 'index.html'}: No space left on device" in errors
    assert "federation FAILED: 0/2 rounds" in result.stdout and "reports (each party's own folder):" in result.stdout


@pytest.mark.federation  # the tool's layout of a prepared federation
def test_the_tool_counts_each_rounds_end_in_every_run_json(tmp_path, prepared_federation):
    """While `python -m workspace start` runs, each run.json it wrote (the federation folder's, each participant's
    report root's) says how many rounds were written as they end, with every party's account still gathered."""
    import shutil

    from test_run_record import UNDER, _account, _policy
    from workspace.federation import _rounds_written, report_locations, write_run_index
    from workspace.federation_state import AGGREGATOR, FederationLayout

    run_dir = tmp_path / "run"
    shutil.copytree(prepared_federation, run_dir, symlinks=True)
    layout = FederationLayout.load(run_dir)
    reports = report_locations(layout)
    for name in layout.collaborators:
        _account(_policy(), [UNDER], name=name).write(reports[name].parent)
    write_run_index(layout)
    roots = list(dict.fromkeys([layout.root, *(path.parent for path in reports.values())]))
    assert len(roots) >= 2 and all(read_run_file(root).rounds_done == 0 for root in roots)
    _rounds_written(layout, 1)
    for root in roots:
        run = read_run_file(root)
        assert (run.state, run.rounds_done, run.rounds) == (RUNNING, 1, int(layout.rounds)), root
        assert set(run.parties) == set(layout.collaborators), root
    assert AGGREGATOR not in read_run_file(layout.root).parties
