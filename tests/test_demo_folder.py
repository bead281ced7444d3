"""The demo's report folder: one demo per --log_dir (a second is refused in one line naming the folder, before any
work, and never replaces the first's reports), and a relative --log_dir stays under reports/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import cifar10_PM
from test_settings_at_start import DEMO, demo
from workspace.report_folder import LOCK_FILE, LogDirClaim

ROOT = Path(__file__).resolve().parent.parent


def earlier_run(folder: Path) -> list[Path]:
    """A folder as an earlier demo left it (its _run/ makes it replaceable with --replace_log_dir); what it holds."""
    (folder / "_run").mkdir(parents=True)
    (folder / "collaborator1" / "round_0000").mkdir(parents=True)
    (folder / "collaborator1" / "round_0000" / "audit.json").write_text("{}")
    return sorted(folder.rglob("*"))


def test_a_second_demo_on_a_folder_in_use_is_refused_in_one_line(tmp_path, capsys):
    folder = tmp_path / "logs"
    before = earlier_run(folder)
    first = LogDirClaim(folder).acquire()  # the first demo's hold (another open file: flock refuses this process too)
    try:
        code, err = demo([*DEMO, "--replace_log_dir", "--log_dir", str(folder)], capsys)
        assert code == 2 and err.strip().splitlines() == [err.strip()], err
        assert err.startswith(f"error: --log_dir {folder}: in use by another cifar10_PM.py (pid "), err
        assert sorted(folder.rglob("*")) == sorted([*before, folder / LOCK_FILE])  # nothing replaced, nothing added
    finally:
        first.release()
    assert sorted(folder.rglob("*")) == before  # the first demo's lock file goes with it


@pytest.mark.federation  # a child process holds the folder
def test_a_demo_running_in_another_process_keeps_its_folder(tmp_path, capsys):
    folder = tmp_path / "logs"
    before = earlier_run(folder)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "from workspace.report_folder import LogDirClaim; LogDirClaim(sys.argv[2]).acquire(); print('held', "
         "flush=True); sys.stdin.read()", str(ROOT), str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, err = demo([*DEMO, "--replace_log_dir", "--log_dir", str(folder)], capsys)
        assert code == 2 and err.startswith(f"error: --log_dir {folder}: in use by another cifar10_PM.py (pid "
                                            f"{holder.pid}); one run per folder"), err
        assert sorted(folder.rglob("*")) == sorted([*before, folder / LOCK_FILE])
    finally:
        holder.communicate("", timeout=30)
    assert holder.returncode == 0


def test_a_refused_start_leaves_no_folder_and_no_lock(tmp_path, capsys):
    folder = tmp_path / "new" / "logs"
    code, err = demo([*DEMO, "--collaborators", "100000", "--log_dir", str(folder)], capsys)
    assert code == 2 and "--collaborators: 100,000 collaborators" in err, err
    assert not (tmp_path / "new").exists()  # the claim made both folders, and took them back
    used = tmp_path / "used"
    before = earlier_run(used)
    code, err = demo([*DEMO, "--log_dir", str(used)], capsys)
    assert code == 2 and "not empty" in err and sorted(used.rglob("*")) == before


@pytest.mark.parametrize("log_dir, says", [
    ("../../x", "resolves to {outside}, outside {reports}"),
    ("a/../../x", "resolves to {reports_parent}/x, outside {reports}"),
    (".", "is reports/ itself"),
    ("escape/inner", "resolves to {outside_link}/inner, outside {reports}"),  # through a symlink out of reports/
])
def test_a_relative_log_dir_stays_under_reports(tmp_path, capsys, monkeypatch, log_dir, says):
    reports = tmp_path / "project" / "reports"
    reports.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (reports / "escape").symlink_to(elsewhere)
    monkeypatch.setattr(cifar10_PM, "REPORTS", reports)
    code, err = demo([*DEMO, "--log_dir", log_dir], capsys)
    shown = says.format(outside=tmp_path / "x", reports=reports, reports_parent=tmp_path / "project",
                        outside_link=elsewhere)
    assert code == 2 and err.strip() == (f"error: --log_dir {log_dir}: a relative --log_dir is a folder under "
                                         f"reports/, and this one {shown}; give a name such as demo (reports/demo), "
                                         "or an absolute path"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "project"]  # no x made
    assert list(elsewhere.iterdir()) == [] and sorted(p.name for p in reports.iterdir()) == ["escape"]


def test_a_relative_log_dir_inside_reports_and_an_absolute_one_are_taken(tmp_path, monkeypatch):
    reports = tmp_path / "reports"
    reports.mkdir()
    monkeypatch.setattr(cifar10_PM, "REPORTS", reports)
    from workspace.report_folder import resolve_log_dir

    assert resolve_log_dir("demo", reports) == reports / "demo"
    assert resolve_log_dir("runs/../demo", reports) == reports / "demo"
    assert resolve_log_dir(str(tmp_path / "anywhere"), reports) == tmp_path / "anywhere"
