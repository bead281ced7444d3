"""tools/docs_check.py, the runner behind `make docs-check`: which blocks of a page it runs, and that a failure names
the page, the block and the command. On tiny pages of shell commands in a temporary folder (bash only, no Python
child); the real pages are run by `make docs-check` itself, and tests/test_docs.py checks that every block of the
README and docs/ is one the runner knows."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tools.docs_check import (DocsError, check_plan_fragment, checkout_changes, copy_workspace, read_blocks,
                               run_page)

ROOT = Path(__file__).resolve().parent.parent
# These start child processes (bash, git, a bare python): marked as the suite marks every test that does (pytest.ini);
# each costs a few hundredths of a CPU-second.
CHILDREN = pytest.mark.federation


def page(tmp_path, text, name="page.md") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def run(tmp_path, path, timeout=60.0, already=None):
    blocks = read_blocks(path, tmp_path)
    return run_page(path.relative_to(tmp_path), blocks, tmp_path, tmp_path / "logs", timeout,
                    {} if already is None else already)


def test_the_info_string_says_what_runs(tmp_path):
    path = page(tmp_path, '''\
        # A page
        ```
        echo bare
        ```
        ```sh
        echo sh
        ```
        ```text
        output
        ```
        ```console
        $ shown
        ```
        ```python
        # pkg/my_module.py
        print(1)
        ```
        ```yaml
        task_runner: {}
        ```
        <!-- docs-check: skip (multi-host: another host) -->
        ```sh
        ssh elsewhere
        ```
        - in a list:
          ```sh
          echo indented
          ```
        ''')
    blocks = read_blocks(path, tmp_path)
    assert [(b.line, b.kind, b.runs) for b in blocks] == [
        (2, "", True), (5, "sh", True), (8, "text", False), (11, "console", False), (14, "python", True),
        (18, "yaml", True), (22, "sh", False), (26, "sh", True)]
    assert blocks[4].file == "pkg/my_module.py" and blocks[0].file is None
    assert blocks[6].skip == "multi-host: another host"
    assert blocks[7].body == ("echo indented",)


@pytest.mark.parametrize("text, message", [
    ("```bash-session\nls\n```\n", "page.md:1: unknown fence info string 'bash-session'"),
    ("```sh\nls\n", "page.md:1: a fence that is never closed"),
    ("<!-- docs-check: skip -->\n```sh\nls\n```\n", "page.md:1: a docs-check marker is"),
    ("<!-- docs-check: skip (why) -->\n\nsome prose\n```sh\nls\n```\n", "page.md:1: a docs-check marker must be"),
    ('<!-- docs-check: skip "make test" (why) -->\n```sh\nmake demo\n```\n', "page.md:1: the marker skips 'make test', which"),
])
def test_a_page_the_runner_cannot_read_is_refused_naming_the_line(tmp_path, text, message):
    with pytest.raises(DocsError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        read_blocks(page(tmp_path, text), tmp_path)


@CHILDREN
def test_blocks_share_one_session_and_a_failure_names_page_block_line_and_command(tmp_path):
    path = page(tmp_path, '''\
        ```sh
        mkdir -p there && cd there
        NAME=value
        ```
        Prose.
        ```sh
        test "$(basename "$PWD")" = there && test "$NAME" = value   # the folder and variables carried over
        echo before > before.txt
        grep -q nothing before.txt   # fails
        echo never > after.txt
        ```
        ''')
    result = run(tmp_path, path)
    assert not result.ok and result.ran == 2
    head = result.failure.splitlines()[0]
    assert head.startswith("page.md:6 (```sh), line 9: `grep -q nothing before.txt` exited with 1")
    assert "(the command: grep -q nothing before.txt)" in head
    assert (tmp_path / "there" / "before.txt").is_file() and not (tmp_path / "there" / "after.txt").exists()


@CHILDREN
def test_a_python_block_runs_at_the_root_and_a_failing_one_is_named(tmp_path):
    """A python block runs at the copy's root whatever folder the session is in, which it keeps; its failure names
    the block."""
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, tmp_path / ".venv" / "bin" / "python")
    path = page(tmp_path, '''\
        ```sh
        mkdir -p sub && cd sub
        ```
        ```python
        import os, pathlib
        pathlib.Path("root.txt").write_text(os.getcwd())
        ```
        ```sh
        test "$(basename "$PWD")" = sub
        ```
        ```python
        raise SystemExit(3)
        ```
        ''')
    result = run(tmp_path, path)
    assert (tmp_path / "root.txt").read_text() == str(tmp_path)
    assert result.failure.startswith("page.md:11 (```python): the python block exited with 3"), result.failure
    assert list(result.block_s) == ["page.md:1 (```sh)", "page.md:4 (```python)", "page.md:8 (```sh)",
                                    "page.md:11 (```python)"]


@CHILDREN
def test_a_command_in_a_loop_is_named_by_its_own_line(tmp_path):
    path = page(tmp_path, '''\
        ```sh
        for N in 1 2; do
          touch file$N
          test $N = 1
        done
        ```
        ''')
    result = run(tmp_path, path)
    assert "page.md:1 (```sh), line 4: `test $N = 1` exited with 1" in result.failure
    assert (tmp_path / "file2").is_file()


@CHILDREN
def test_a_passing_page_answers_y_and_ends_what_it_left_running(tmp_path):
    path = page(tmp_path, '''\
        ```sh
        python3 -c 'import sys; assert sys.stdin.readline() == "y\\n"'   # a y/N question, read buffered
        read answer && test "$answer" = y                                 # and another
        (sleep 0.1) &
        wait                      # for the page's own jobs only: returns
        sleep 300 & echo $! > pid
        ```
        ''')
    result = run(tmp_path, path)
    assert result.ok and result.failure is None, result.failure
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (not yet reaped by init) counts as ended
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


@CHILDREN
def test_a_page_that_runs_too_long_is_stopped_naming_the_command(tmp_path):
    path = page(tmp_path, '''\
        ```sh
        echo started
        sleep 30
        ```
        ''')
    start = time.monotonic()
    result = run(tmp_path, path, timeout=1.0)
    assert time.monotonic() - start < 10  # stopped at once, not after the grace a stuck process gets
    assert "page.md:1 (```sh), line 3: `sleep 30` timed out (its block ran over 1 s)" in result.failure


@CHILDREN
def test_the_time_limit_is_per_block(tmp_path):
    """Three blocks of 0.6 s each under a limit of 1.5 s: the page runs longer than the limit, no block does."""
    path = page(tmp_path, "".join("```sh\nsleep 0.6\n```\n" + f"Block {i}.\n" for i in range(3)))
    result = run(tmp_path, path, timeout=1.5)
    assert result.ok and result.wall_s > 1.5, result.failure
    assert len(result.block_s) == 3 and all(0.55 < t < 1.5 for t in result.block_s.values()), result.block_s


@CHILDREN
def test_skipped_blocks_and_commands_are_not_run_and_are_listed_with_their_reason(tmp_path):
    path = page(tmp_path, '''\
        <!-- docs-check: skip "false" (another step runs it) -->
        ```sh
        echo ran > ran.txt
        false --with-args   # left out
        ```
        <!-- docs-check: skip (multi-host) -->
        ```sh
        false
        ```
        ''')
    result = run(tmp_path, path)
    assert result.ok and (tmp_path / "ran.txt").is_file()
    assert result.skipped == ["page.md:2 (```sh): `false` not run (another step runs it)",
                              "page.md:7 (```sh): not run (multi-host)"]


@CHILDREN
def test_a_block_on_two_pages_runs_once(tmp_path):
    block = "```sh\necho x >> count.txt\n```\n"
    first, second = page(tmp_path, block, "a.md"), page(tmp_path, block, "b.md")
    already: dict = {}
    assert run(tmp_path, first, already=already).ok and run(tmp_path, second, already=already).ok
    assert (tmp_path / "count.txt").read_text() == "x\n"


@CHILDREN
def test_the_copy_is_a_fresh_clone_of_the_working_tree(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "code.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text("ignored/\n.venv\n")
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big.bin").write_text("no")
    os.symlink("../pkg", repo / "pkg" / "link")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=repo, check=True)
    (repo / "pkg" / "code.py").write_text("x = 2\n")  # an edit not committed: the copy has it
    (repo / "new.md").write_text("new\n")             # an untracked file: the copy has it
    os.utime(repo / "new.md", (1_000_000, 1_000_000))
    dest = tmp_path / "copy"
    dest.mkdir()
    copy_workspace(repo, dest)
    assert (dest / "pkg" / "code.py").read_text() == "x = 2\n" and (dest / "new.md").is_file()
    assert os.readlink(dest / "pkg" / "link") == "../pkg" and not (dest / "ignored").exists()
    assert (dest / "new.md").stat().st_mtime == 1_000_000  # times kept: make sees what the checkout's make sees
    assert checkout_changes(dest) == []  # committed: a page may git clone it
    (dest / "ignored").mkdir()
    (dest / "ignored" / "run.log").write_text("a page may write where git ignores\n")
    (dest / "pkg" / "code.py").write_text("x = 3\n")
    (dest / "pkg" / "plan_1234.yaml").write_text("left behind\n")
    assert checkout_changes(dest) == ["M pkg/code.py", "?? pkg/plan_1234.yaml"]


@pytest.mark.parametrize("fragment, message", [
    ("network: {settings: {agg_port: 0}}\n", "network.settings.agg_port"),
    ("reports: {dir: x}\n", "not a plan fragment"),
])
def test_a_plan_fragment_is_checked_as_a_plan(fragment, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        check_plan_fragment(fragment, ROOT)
