"""What the run index and run.json read at each rewrite (every round's end): only what changed since the last one,
with the same figures as reading everything again. The aggregator's round files are read once each for the utility
line; a party's account.json once per change; run.json's run-level fields are those this process last wrote while
the file is that write, and another process's write is read."""

from __future__ import annotations

import json
import os

import pytest

from audit.aggregator_report.page import GLOBAL_ACCURACY, utility_of
from audit.reporting import html, run_file
from audit.reporting.atomic_io import atomic_write_json
from audit.reporting.records import load_round_files, round_file_name
from audit.run_record import ACCOUNT_FILE, RUN_FILE, PartyRun, RoundEntry, RunInfo, RunRecord
from audit.run_states import INTERRUPTED, RUNNING


@pytest.fixture
def reads(monkeypatch):
    """The files json.loads parsed, counted (records' and run_record's reads go through it)."""
    count = []
    real = json.loads

    def counting(text, *args, **kwargs):
        count.append(1)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    return count


def _aggregator_round(folder, r, accuracy, statuses):
    atomic_write_json(folder / round_file_name(r), {
        "round": r, "aggregator_logs": {GLOBAL_ACCURACY: accuracy, "other/metric": 1.0},
        "collaborators": {name: {"status": s, "metric": 0.5} for name, s in statuses.items()}, "kept": []})


def test_the_utility_line_reads_only_new_rounds_and_says_what_a_full_read_says(tmp_path, reads):
    folder = tmp_path / "aggregator"
    folder.mkdir()
    statuses = ({"a": "kept", "b": "kept"}, {"a": "withheld", "b": "kept"}, {"a": "kept", "b": "dp_retrained"})
    for r in range(9):
        _aggregator_round(folder, r, 0.1 + 0.03 * r + 0.01 * (r % 2), statuses[r % 3])
        before = len(reads)
        line = utility_of(html._utility_views(folder))
        assert len(reads) - before == 1  # the new round's file only
        assert line == utility_of(load_round_files(folder, "aggregator round")) and (r < 1 or line)
    earlier = line
    _aggregator_round(folder, 4, 0.9, statuses[0])  # a round's file replaced (a new inode): read again
    (folder / round_file_name(8)).unlink()  # and one gone
    before = len(reads)
    line = utility_of(html._utility_views(folder))
    assert len(reads) - before == 1
    assert line == utility_of(load_round_files(folder, "aggregator round")) != earlier
    assert "at round 7" in line and "at round 8" in earlier  # round 8's file is gone: the last round said is 7


def _account(root, name, rounds):
    party = PartyRun(party=name, rounds=tuple(RoundEntry(r, True, "passed", "kept") for r in range(rounds)))
    atomic_write_json(root / name / ACCOUNT_FILE, party.to_json(versioned=True))


def _full(root) -> dict:
    """run.json as a process with no reads kept would write it."""
    run_file._ACCOUNTS.clear()
    run_file._WRITTEN.clear()
    return run_file.write_run_file(root).to_json()


def test_run_json_reads_an_account_once_it_changed_and_matches_a_full_rewrite(tmp_path, reads):
    (tmp_path / "c1").mkdir()
    (tmp_path / "c2").mkdir()
    run_file.write_run_file(tmp_path, info=RunInfo(RUNNING, 5, {"rounds": 5}))
    for r in range(1, 5):
        _account(tmp_path, "c1", r)
        _account(tmp_path, "c2", r)
        run_file.write_run_file(tmp_path, update=lambda info: info.round_written(r))
        before = len(reads)
        again = run_file.write_run_file(tmp_path).to_json()  # nothing changed since: nothing read
        assert len(reads) == before
        assert again == _full(tmp_path) and again["rounds_done"] == r and len(again["parties"]["c2"]["rounds"]) == r
    _account(tmp_path, "c1", 5)  # one party's account changed: it alone is read
    before = len(reads)
    record = run_file.write_run_file(tmp_path)
    assert len(reads) - before == 1 and len(record.parties["c1"].rounds) == 5 and len(record.parties["c2"].rounds) == 4


def test_run_json_written_by_another_process_is_read_not_the_last_own_write(tmp_path):
    run_file.write_run_file(tmp_path, info=RunInfo(RUNNING, 3))
    other = RunRecord(INTERRUPTED, rounds=3, rounds_done=2, reason="SIGTERM").to_json()
    tmp = tmp_path / "other.json"
    tmp.write_text(json.dumps(other))
    os.replace(tmp, tmp_path / RUN_FILE)  # as another process's atomic write: a new inode
    assert run_file.write_run_file(tmp_path).info == RunInfo(INTERRUPTED, 3, rounds_done=2, reason="SIGTERM")
