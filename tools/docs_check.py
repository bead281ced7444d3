"""`make docs-check`: runs the commands and code blocks of README.md and docs/*.md as written, in a scratch copy of
this workspace, and fails naming the file, the block and the command that failed.

Which blocks run is said by the fence's info string (its first word):
- none, `sh`, `bash`: shell commands. A page's shell blocks run in order in one bash session, as typed into one
  terminal: the folder, the variables and an activated venv carry from block to block. The session starts at the
  copy's root, with `set -e -o pipefail`: the first command that fails stops the page. Its input answers `y` to
  every question (the signing commands' "y/N": the check plays the user who compared the hashes).
- `python`: run by the venv's python at the copy's root, as `python -` there would. A block whose first line is a
  comment naming a `.py` path (`# src/<module>.py`) is that file: written there before the page's blocks run
  (a plan fragment of the page may name it), then run.
- `yaml`: a plan fragment: merged into the copy's `plan/plan.yaml` and checked as every run's plan is before any
  work (`workspace.plan_file.check_run_plan`: settings, plug-ins, the objects `fx plan initialize` builds, each
  party's data).
- `text`, `console`: output, listings and diagrams: shown, never run.
Any other info string fails the check, so no block goes unrun by accident (tests/test_docs.py checks the same
without running anything).

A block is left out only by a marker on the line above its fence, which the check prints with its reason:
    <!-- docs-check: skip (multi-host: each block runs on another host) -->
    <!-- docs-check: skip "make test" (CI runs it as its own step) -->
The first leaves out the whole block; the second the block's lines that run that command. A block identical to
one another page ran (the same commands on two pages) runs once. Inline code in the prose names commands and
flags; a command meant to be run is in a block.

A block may run 1200 s (`--timeout`); the page stops at the first block over it. The limit stops a hang, not a
slow machine: the longest block measured on 2 cores under a load average of 13-17 took 703 s (benchmarks/README.md),
and a busy CI runner must not fail for being busy.

The copy is made as from a fresh clone: the working tree's files (tracked and untracked, not ignored; symlinks as
links, times kept) committed into a new repository, so that a page may `git clone` it, with `.venv` a link to this
checkout's venv (installed: `make docs-check` installs first; the check refuses a venv older than requirements.txt
rather than let a page's `make` reinstall it). Pages run one after another (README.md first); each prints its wall
and CPU time, and each block's wall time. At the end the copy's `git status` must be clean but for the files the
pages' file blocks wrote: the pages leave a user's checkout as it was (they write only where git ignores: runs/,
reports/, save/). The copy is deleted after a passing run and kept after a failing one.

    python -m tools.docs_check [--keep] [--timeout S] [PAGE ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL = ("", "sh", "bash")
PYTHON = "python"
PLAN = "yaml"
SHOWN = ("text", "console")
KINDS = (*SHELL, PYTHON, PLAN, *SHOWN)
FENCE = re.compile(r"^(`{3,})(.*)$")
MARKER = re.compile(r"^<!--\s*docs-check:\s*(.*?)\s*-->\s*$")
SKIP = re.compile(r'^skip\s+(?:"([^"]+)"\s+)?\((.+)\)$')
FILE_LINE = re.compile(r"^#\s*([\w./-]+\.py)\s*$")
TAIL_LINES = 40


class DocsError(ValueError):
    """A page whose blocks cannot be read (unknown info string, bad marker, unclosed fence): file and line named."""


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path           # the page, relative to the copy's root
    line: int            # the line of the opening fence (1-based)
    info: str            # the fence's info string, as written
    body: tuple[str, ...]
    skip: str | None = None       # the whole block is left out, for this reason
    skip_command: str | None = None  # only the lines that run this command are left out
    skip_reason: str | None = None

    @property
    def kind(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line} ({'```' + self.info if self.info else 'a ``` block'})"

    @property
    def file(self) -> str | None:
        """The path a python block is the file of (its first line `# path.py`), else None."""
        if self.kind == PYTHON and self.body:
            match = FILE_LINE.match(self.body[0])
            return match.group(1) if match else None
        return None

    @property
    def runs(self) -> bool:
        return self.kind not in SHOWN and self.skip is None

    def kept_lines(self) -> list[str]:
        """The body, with the lines of a skipped command blanked (line numbers stay)."""
        if self.skip_command is None:
            return list(self.body)
        return ["" if _runs_command(line, self.skip_command) else line for line in self.body]


def _runs_command(line: str, command: str) -> bool:
    code = line.split("#", 1)[0].strip()
    return code == command or code.startswith(command + " ")


def read_blocks(page: Path, root: Path) -> list[Block]:
    """Every fenced block of a page, with its marker; DocsError naming the file and line for an unknown info string,
    a marker that is not one of the two forms, a marker not followed by a fence, or a fence left open."""
    lines = page.read_text(encoding="utf-8").splitlines()
    name = page.relative_to(root) if page.is_absolute() else page
    blocks, i, marker = [], 0, None
    while i < len(lines):
        line = lines[i]
        found = MARKER.match(line.strip())
        if found:
            skip = SKIP.match(found.group(1))
            if not skip:
                raise DocsError(f"{name}:{i + 1}: a docs-check marker is `<!-- docs-check: skip (reason) -->` or "
                                f"`<!-- docs-check: skip \"command\" (reason) -->`, got {line.strip()!r}")
            marker = (i + 1, skip.group(1), skip.group(2))
            i += 1
            continue
        fence = FENCE.match(line.strip())
        if fence is None:
            if marker is not None and line.strip():
                raise DocsError(f"{name}:{marker[0]}: a docs-check marker must be the line above a fence")
            i += 1
            continue
        ticks, info = fence.group(1), fence.group(2).strip()
        start = i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == ticks), None)
        if end is None:
            raise DocsError(f"{name}:{start + 1}: a fence that is never closed")
        kind = info.split()[0] if info else ""
        if kind not in KINDS:
            raise DocsError(f"{name}:{start + 1}: unknown fence info string {info!r}: a block is shell commands "
                            f"(``` or ```sh), ```python, ```yaml (a plan fragment), or ```text / ```console "
                            f"(output, not run)")
        indent = len(line) - len(line.lstrip())
        body = tuple(b[indent:] if b[:indent].strip() == "" else b for b in lines[start + 1:end])
        skip_command = skip_reason = skip = None
        if marker is not None:
            _, skip_command, skip_reason = marker
            if skip_command is None:
                skip = skip_reason
            elif not any(_runs_command(b, skip_command) for b in body):
                raise DocsError(f"{name}:{marker[0]}: the marker skips {skip_command!r}, which the block below does "
                                "not run")
        blocks.append(Block(Path(name), start + 1, info, body, skip, skip_command, skip_reason))
        marker = None
        i = end + 1
    return blocks


def default_pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


# --------------------------------------------------------------------------------------------------------------------
# the scratch copy


def copy_workspace(root: Path, dest: Path) -> None:
    """The working tree's files (tracked and untracked, not ignored) into `dest`, symlinks as links and times kept,
    committed into a new repository there, with `.venv` a link to this checkout's venv."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src, dst = root / rel, dest / rel
        if not os.path.lexists(src):  # deleted in the working tree, not yet in the index
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.is_file():
            shutil.copy2(src, dst)
    git = ["git", "-c", "user.name=docs-check", "-c", "user.email=docs-check@localhost", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "docs-check copy"]):
        subprocess.run([*git, *args], cwd=dest, check=True, capture_output=True)
    venv = root / ".venv"
    if venv.exists():
        os.symlink(os.path.realpath(venv), dest / ".venv")


def venv_problem(dest: Path) -> str | None:
    """Why a page's `make` would reinstall the venv (None: it would not): the check never lets it."""
    if not (dest / ".venv" / "bin" / "python").exists():
        return "no .venv in this checkout: run `make docs-check`, which installs it first"
    stamp = subprocess.run(["make", "-q", ".venv/.installed"], cwd=dest, capture_output=True)
    if stamp.returncode != 0:
        return (".venv is older than requirements.txt (a page's `make` would reinstall it): run `make docs-check`, "
                "which installs first")
    return None


# --------------------------------------------------------------------------------------------------------------------
# running a page


@dataclasses.dataclass
class PageResult:
    page: Path
    ok: bool
    wall_s: float
    cpu_s: float
    failure: str | None = None
    skipped: list[str] = dataclasses.field(default_factory=list)
    ran: int = 0
    files: list[str] = dataclasses.field(default_factory=list)  # written from file blocks (the page says to)
    block_s: dict[str, float] = dataclasses.field(default_factory=dict)  # each block's wall time, by its place


HEREDOC = "DOCS_CHECK_BLOCK_END"


def page_script(blocks: list[Block], dest: Path, trace: Path) -> tuple[str, dict[int, tuple[Block, int | None]]]:
    """The page as one bash script, and for each script line the block and the page line it comes from (None for a
    python or yaml block: its whole fence)."""
    lines = [f"exec 3>>{_quote(trace)}", "set -e -o pipefail",  # the trace of each command on fd 3
             "trap 'printf \"%s\\t%s\\t%s\\n\" \"$LINENO\" \"$EPOCHREALTIME\" \"$BASH_COMMAND\" >&3' DEBUG"]
    where: dict[int, tuple[Block, int | None]] = {}
    python = dest / ".venv" / "bin" / "python"
    for block in blocks:
        if block.kind in SHELL:
            for offset, text in enumerate(block.kept_lines()):
                lines.append(text)
                where[len(lines)] = (block, block.line + 1 + offset)
        else:
            # Simple commands, no subshell: the DEBUG trap, which names the running block, sees only those.
            command = f"{_quote(python)} -" if block.kind == PYTHON else \
                f"{_quote(python)} -m tools.docs_check --plan-fragment -"
            for text in ('DOCS_CHECK_PWD="$PWD"', f"cd {_quote(dest)}", f"{command} <<'{HEREDOC}'"):
                lines.append(text)
                where[len(lines)] = (block, None)
            lines += [*block.body, HEREDOC, 'cd "$DOCS_CHECK_PWD"']
            where[len(lines)] = (block, None)
    return "\n".join(lines) + "\n", where


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


def _environment(dest: Path) -> dict:
    """A fresh terminal's: no venv active, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    venvs = {os.path.realpath(dest / ".venv" / "bin"), os.path.realpath(ROOT / ".venv" / "bin")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and os.path.realpath(p) not in venvs)
    return env


def _stop_group(proc: subprocess.Popen) -> None:
    """Whatever the page left running (a background job), and on a timeout the page itself."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()  # reaps the page's shell: a zombie would count as alive
            if not _group_alive(proc.pid):
                return
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group is still running (zombies, which no one may reap at once, do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def run_page(page: Path, blocks: list[Block], dest: Path, logs: Path, timeout: float,
             already: dict[tuple[str, tuple[str, ...]], str]) -> PageResult:
    """Run a page's blocks in `dest` (one bash session); stop at its first failure."""
    result = PageResult(page, ok=True, wall_s=0.0, cpu_s=0.0)
    todo = []
    for block in blocks:
        if block.kind in SHOWN:
            continue
        if block.skip is not None:
            result.skipped.append(f"{block.where}: not run ({block.skip})")
            continue
        key = (block.kind or "sh", block.body)
        if key in already and already[key][0] != page:
            result.skipped.append(f"{block.where}: the same block as {already[key][1]}, run there")
            continue
        if block.skip_command is not None:
            result.skipped.append(f"{block.where}: `{block.skip_command}` not run ({block.skip_reason})")
        already.setdefault(key, (page, block.where))
        todo.append(block)
    for block in todo:
        if block.file:
            result.files.append(block.file)
            target = dest / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("\n".join(block.body) + "\n", encoding="utf-8")
    result.ran = len(todo)
    if not todo:
        return result
    logs.mkdir(parents=True, exist_ok=True)
    stem = str(page).replace("/", "_")
    script_file, log_file, trace_file = (logs / f"{stem}.sh", logs / f"{stem}.log", logs / f"{stem}.trace")
    script, where = page_script(todo, dest, trace_file)
    script_file.write_text(script, encoding="utf-8")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    trace_file.write_text("")
    # Input: an endless "y", from a process of its own (a reader slurps what a pipe holds, so a finite answer would
    # leave the next question none; and a page's `wait` must not wait for it).
    answers = subprocess.Popen(["yes", "y"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        with open(log_file, "wb") as out:
            proc = subprocess.Popen(["bash", str(script_file)], cwd=dest, stdin=answers.stdout, stdout=out,
                                    stderr=subprocess.STDOUT, env=_environment(dest), start_new_session=True)
            code, timed_out = _wait(proc, trace_file, where, timeout)
            _stop_group(proc)
            proc.wait()
    finally:
        answers.kill()
        answers.wait()
        answers.stdout.close()
    result.wall_s = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result.cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result.block_s = _block_times(trace_file, where, time.time())
    if code == 0 and not timed_out:
        return result
    result.ok = False
    result.failure = _failure(page, where, trace_file, log_file, code, timed_out, timeout)
    return result


def _wait(proc: subprocess.Popen, trace_file: Path, where, timeout: float) -> tuple[int | None, bool]:
    """Wait for the page's shell; stop it when one block has run `timeout` seconds (the trace says which block runs:
    a page's blocks differ in length, a federation's against a file check). Returns (exit code, timed out)."""
    block, since, pending = None, time.monotonic(), b""
    with open(trace_file, "rb") as trace:
        while True:
            try:
                return proc.wait(timeout=0.2), False
            except subprocess.TimeoutExpired:
                pass
            *lines, pending = (pending + trace.read()).split(b"\n")  # complete lines; the rest waits
            for line in lines:
                number = line.partition(b"\t")[0]
                if number.isdigit() and int(number) in where and where[int(number)][0] is not block:
                    block, since = where[int(number)][0], time.monotonic()
            if time.monotonic() - since > timeout:
                return None, True


def _trace(trace_file: Path, where):
    """(script line, time, command) of every traced command of the page's blocks."""
    for line in trace_file.read_text(encoding="utf-8", errors="replace").splitlines():
        number, _, rest = line.partition("\t")
        stamp, _, command = rest.partition("\t")
        if number.isdigit() and int(number) in where:
            yield int(number), float(stamp or 0), command


def _block_times(trace_file: Path, where, end: float) -> dict[str, float]:
    """Each block's wall time: from its first command to the next block's (the last block's: to `end`)."""
    starts = []
    for number, stamp, _ in _trace(trace_file, where):
        block = where[number][0]
        if not starts or starts[-1][0] is not block:
            starts.append((block, stamp))
    return {block.where: (starts[i + 1][1] if i + 1 < len(starts) else end) - stamp
            for i, (block, stamp) in enumerate(starts)}


def _failure(page: Path, where, trace_file: Path, log_file: Path, code, timed_out: bool, timeout: float) -> str:
    last = None
    for number, _, command in _trace(trace_file, where):
        last = (number, command)
    what = f"timed out (its block ran over {timeout:g} s)" if timed_out else f"exited with {code}"
    if last is None:
        head = f"{page}: the page's shell {what} before its first command"
    else:
        block, doc_line = where[last[0]]
        if doc_line is None:
            head = f"{block.where}: the {'plan fragment' if block.kind == PLAN else 'python block'} {what}"
        else:
            text = block.body[doc_line - block.line - 1].split("  #", 1)[0].strip()
            head = f"{block.where}, line {doc_line}: `{text}` {what} (the command: {last[1]})"
    tail = log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL_LINES:]
    return head + "\n" + "\n".join("    " + t for t in tail) + f"\n    (whole output: {log_file})"


# --------------------------------------------------------------------------------------------------------------------
# a plan fragment


def check_plan_fragment(text: str, root: Path) -> None:
    """A yaml block: merged into `root`'s plan/plan.yaml and checked as a run's plan is (ValueError naming the key)."""
    import yaml

    sys.path.insert(0, str(root))
    from workspace.plan_file import check_run_plan, collaborator_names, deep_merge, read_plan

    fragment = yaml.safe_load(text)
    plan = read_plan(root / "plan" / "plan.yaml")
    if not isinstance(fragment, dict) or not set(fragment) <= set(plan):
        raise ValueError(f"not a plan fragment (its top-level keys must be sections of plan/plan.yaml: "
                         f"{', '.join(plan)}); mark a block that is not one ```text")
    merged = deep_merge(plan, fragment)
    count = merged["data_loader"]["settings"].get("collaborator_count", 2)
    check_run_plan(merged, collaborator_names(count))


# --------------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docs_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path, help="pages to run (default: README.md and docs/*.md)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy after a passing run")
    parser.add_argument("--timeout", type=float, default=1200.0,
                        help="seconds one block may run (default 1200: on a busier machine, give more)")
    parser.add_argument("--plan-fragment", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plan_fragment is not None:
        text = sys.stdin.read() if args.plan_fragment == "-" else Path(args.plan_fragment).read_text()
        try:
            check_plan_fragment(text, Path.cwd())
        except ValueError as err:
            print(f"plan fragment refused: {err}", file=sys.stderr)
            return 1
        print("plan fragment accepted")
        return 0

    pages = [p.resolve() for p in args.pages] or default_pages(ROOT)
    missing = [str(p) for p in pages if not p.is_file()]
    if missing:
        parser.error(f"no such page: {', '.join(missing)}")
    try:
        blocks = {p: read_blocks(p, ROOT) for p in pages}
    except DocsError as err:
        print(f"docs-check: {err}", file=sys.stderr)
        return 1
    scratch = Path(tempfile.mkdtemp(prefix="docs-check-"))
    dest, logs = scratch / "checkout", scratch / "logs"
    dest.mkdir()
    print(f"docs-check: a scratch copy in {dest}", flush=True)
    copy_workspace(ROOT, dest)
    problem = venv_problem(dest)
    if problem is not None:
        print(f"docs-check: {problem}", file=sys.stderr)
        shutil.rmtree(scratch, ignore_errors=True)
        return 1
    already: dict = {}
    results = []
    start = time.monotonic()
    for page in pages:
        rel = page.relative_to(ROOT)
        print(f"docs-check: {rel} ...", flush=True)
        result = run_page(rel, blocks[page], dest, logs, args.timeout, already)
        for line in result.skipped:
            print(f"    {line}")
        for where, seconds in result.block_s.items():
            print(f"    {where}: {seconds:.0f} s")
        status = "ok" if result.ok else "FAILED"
        print(f"    {status}: {result.ran} blocks in {result.wall_s:.0f} s wall, {result.cpu_s:.0f} CPU-s", flush=True)
        if result.failure:
            print(f"docs-check: {result.failure}", file=sys.stderr, flush=True)
        results.append(result)
    failed = [str(r.page) for r in results if not r.ok]
    written = {f"?? {name}" for r in results for name in r.files}  # files a page says to create
    changed = [line for line in checkout_changes(dest) if line not in written]
    if changed:
        print(f"docs-check: the pages changed the checkout (a user's would be changed the same way): "
              f"{'; '.join(changed)}", file=sys.stderr)
        failed.append("the checkout")
    wall = time.monotonic() - start
    cpu = sum(r.cpu_s for r in results)
    print(f"docs-check: {sum(r.ran for r in results)} blocks of {len(results)} pages, {len(failed)} failed, "
          f"{wall:.0f} s wall, {cpu:.0f} CPU-s")
    if failed:
        print(f"docs-check: failed: {', '.join(failed)}; the copy is kept in {scratch}", file=sys.stderr)
        return 1
    if args.keep:
        print(f"docs-check: the copy is kept in {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def checkout_changes(dest: Path) -> list[str]:
    """What the pages changed in the copy's tracked files, or left there untracked and not ignored (git status): a
    page's commands leave a user's checkout as it was, writing only where git ignores (runs/, reports/, save/)."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=dest,
                            capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in status.splitlines() if line.strip()]


if __name__ == "__main__":
    sys.exit(main())
