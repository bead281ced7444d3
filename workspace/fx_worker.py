"""OpenFL's `fx` commands, each in a process forked from one that has imported what OpenFL imports.

An `fx` start imports OpenFL's libraries (torch, pandas, gRPC, cryptography, ...; a participant's also torch._dynamo,
scikit-learn, scipy, matplotlib) before a set-up command that takes a fraction of that time, or a participant that
trains for a few seconds (benchmarks/README.md, "Preparing a federation"). This process imports those libraries once, and nothing of OpenFL or of
the workspace: each command runs in a fork of it, which imports OpenFL's own modules and the workspace's code (`src`,
`audit`) in the command's folder and runs OpenFL's entry point (`openfl.interface.cli.entry`, what the `fx` script
calls), as a new `fx` process would. OpenFL's modules are imported in the fork, not here, because they read the
working folder at import (openfl/interface/cli_helper.py: CERT_DIR = Path("cert").absolute()), and so that no
command's state (its logging set-up, sys.path) reaches the next one.

Run as a script (`python workspace/fx_worker.py [--participants]`), so that it imports nothing of this repository
(the forks import their own folder's `src`). Two modes:

- set-up commands (no flag; workspace.prepare.FxRunner), `fx plan initialize` included (it builds the workspace's
  task runner: the libraries a participant's code imports are imported first too): one command at a time, waited
  for. It reads one command per line on stdin, as JSON: {"cwd": folder, "args": [fx arguments], "log": file}; the
  command's stdin is /dev/null and its stdout and stderr go to `log`; then it writes the exit code to `log` + ".rc"
  (written whole, then renamed).
- participants (`--participants`; workspace.processes.ParticipantLauncher, for `python -m workspace start`): the
  long-running `fx aggregator start` / `fx collaborator start`, all at once. A command line also carries the
  participant's environment ("env"); the fork starts its own session (its process group is its PID), asks to be
  killed when this process dies (PR_SET_PDEATHSIG), takes that environment, and exits as the `fx` script would
  (atexit handlers, threads joined). Its PID is written on stdout as {"pid": N} when it starts, and
  {"pid": N, "rc": code} when it ends (code as Popen's returncode: -N for a signal N).
It ends at the end of stdin (participants still running then are killed first).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import importlib
import importlib.util
import json
import os
import select
import signal
import sys
import traceback
from pathlib import Path

RC_SUFFIX = ".rc"
PARTICIPANTS = "--participants"
# What openfl.federated and openfl.interface import that costs time (openfl/federated/task/runner_pt.py: torch); a
# library missing here is imported by the command itself, only slower.
LIBRARIES = ("torch", "pandas", "numpy", "yaml", "click", "dynaconf", "flask", "rich", "grpc", "google.protobuf",
             "cryptography.x509", "cryptography.hazmat.primitives.asymmetric.rsa", "tqdm")
# And what a participant's workspace code (src/, audit/) imports, as `fx plan initialize` does: torch.optim's first
# optimizer imports torch._dynamo; the reports draw with matplotlib's Figure (no pyplot: no backend is chosen here, as
# in the participant) and Agg.
# Only libraries a participant loads anyway: a fork holds nothing a fresh `fx` process would not.
PARTICIPANT_LIBRARIES = LIBRARIES + (
    "torch._dynamo", "torch.optim", "threadpoolctl", "scipy.stats", "scipy.optimize", "scipy.special",
    "sklearn.metrics", "sklearn.exceptions", "matplotlib.figure", "matplotlib.ticker", "matplotlib.colors",
    "matplotlib.backends.backend_agg", "privacy_meter.hypothesis_test", "privacy_meter.metric_result", "jinja2",
    "tensorboardX", "psutil", "PIL.Image")
# The environment variables each library reads once, when it is loaded, for its thread pool; this process loads them
# with one thread each (OpenBLAS would start its threads at load, and a fork has only the thread that forked), and
# each participant's fork sets the pools from its own environment, as a fresh process would have read it.
THREAD_POOL_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# The workspace's own preparation of a process without a GPU (keep triton out before torch._dynamo is imported, drop
# the CUDA libraries' pages once torch is loaded), loaded from its file: importing `src` here would put this
# repository's `src` in every fork.
CUDA_PAGES = Path(__file__).resolve().parent.parent / "src" / "process" / "cuda_pages.py"
POLL_S = 0.1  # how often the participants' launcher looks for ended forks while it waits for a command

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _load_prctl():
    """libc's prctl, resolved now: a fork (or a preexec_fn between fork and exec) should do as little as possible."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def supports_die_with() -> bool:
    return _PRCTL is not None


def die_with(parent: int) -> None:
    """In a child of `parent`: have the kernel SIGKILL it when the parent's forking thread ends (no-op where there is
    no prctl). SIGKILL, because a stopped (SIGSTOP) process would leave a SIGTERM pending. If the parent is already
    gone, the child ends now."""
    if _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request was in place
        os.kill(os.getpid(), signal.SIGKILL)


def _workspace_preparation():
    spec = importlib.util.spec_from_file_location("_fx_worker_cuda_pages", CUDA_PAGES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def import_libraries(names: tuple[str, ...], *, participants: bool = False) -> None:
    """Import `names` (a library that fails to import is left to the command); for participants, prepared as the
    workspace prepares a process without a GPU (src/__init__.py, src.process.cuda_pages)."""
    preparation = _workspace_preparation() if participants else None
    if preparation is not None:
        preparation.keep_triton_out()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    if preparation is not None:
        preparation.release_cuda_library_pages()


def thread_counts(env: dict) -> dict[str, int]:
    """The thread pools a fresh process with `env` would have: OpenMP's (OMP_NUM_THREADS), OpenBLAS's
    (OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, OMP_NUM_THREADS) and torch's intra-op pool (MKL_NUM_THREADS,
    OMP_NUM_THREADS: torch sizes its OpenMP pool to MKL's), each the number of usable CPUs when unset."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def first(*names: str) -> int:
        for name in names:
            try:
                return max(1, int(str(env[name]).split(",")[0]))
            except (KeyError, ValueError):
                continue
        return cpus

    return {"openmp": first("OMP_NUM_THREADS"),
            "blas": first("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"),
            "torch": first("MKL_NUM_THREADS", "OMP_NUM_THREADS")}


def take_environment(env: dict) -> None:
    """In a participant's fork: `env` becomes its environment, and the thread pools the loaded libraries sized from
    this process's environment at load are sized from it (threadpoolctl, torch.set_num_threads)."""
    os.environ.clear()
    os.environ.update(env)
    counts = thread_counts(env)
    if "threadpoolctl" in sys.modules:
        from threadpoolctl import threadpool_limits

        threadpool_limits({"openmp": counts["openmp"], "blas": counts["blas"]})
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(counts["torch"])


def _command(cwd: str, args: list[str], log: str) -> int:
    """In the fork: `fx ARGS` in `cwd`, output to `log`; the exit code the `fx` script would end with."""
    os.chdir(cwd)
    with open(log, "ab") as out:
        for fd in (1, 2):
            os.dup2(out.fileno(), fd)
    sys.argv = ["fx", *args]
    sys.path[0] = os.path.dirname(sys.executable)  # the `fx` script's folder (the venv's bin), not this file's
    try:
        from openfl.interface.cli import entry

        entry()
        return 0
    except SystemExit as stop:  # click ends every command so
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # entry() printed "EXCEPTION : ..." and raised it again: Python prints it and exits 1
        traceback.print_exc()
        return 1


def run_command(cwd: str, args: list[str], log: str) -> int:
    """Fork, run the command in the child, and return its exit code (128 + N if a signal N ended it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _command(cwd, args, log)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code if 0 <= code < 256 else 1)  # no clean-up of the parent's objects in the child
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _stdin_to_null() -> int:
    """The commands come on a copy of stdin (returned); stdin itself becomes /dev/null, as for `fx` run by the tooling:
    a command that asks a question gets an end of file, never the next command."""
    commands = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)
    return commands


def serve_commands() -> int:
    import_libraries(PARTICIPANT_LIBRARIES, participants=True)  # `fx plan initialize` builds the task runner
    commands = os.fdopen(_stdin_to_null(), "r")
    for line in commands:
        if not line.strip():
            continue
        command = json.loads(line)
        code = run_command(command["cwd"], list(command["args"]), command["log"])
        done = command["log"] + RC_SUFFIX
        with open(done + ".tmp", "w") as f:
            f.write(str(code))
        os.replace(done + ".tmp", done)
    return 0


class _Child(Exception):
    """Raised in a participant's fork to leave the launcher's loop; carries its command."""

    def __init__(self, command: dict):
        super().__init__()
        self.command = command


def serve_participants() -> int:
    """The participants' launcher: forks a participant per command line, reports its PID and its end on stdout."""
    for name in THREAD_POOL_VARIABLES:
        os.environ[name] = "1"  # before any library loads (see THREAD_POOL_VARIABLES)
    import_libraries(PARTICIPANT_LIBRARIES, participants=True)
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:  # a fork holds only the thread that forked: whatever the others held (a lock) stays held
        print(f"the participants' launcher runs {threads} threads after its imports; it forks none", file=sys.stderr)
        return 1
    # What the imports made stays shared with every fork until written: the collector's passes would write to each
    # object's header (gc.freeze, as Python's documentation advises before forking workers). Those objects live as
    # long as their modules in a participant anyway.
    gc.freeze()
    commands = _stdin_to_null()
    replies = os.dup(1)
    os.dup2(2, 1)  # nothing else of this process reaches the replies
    launcher = os.getpid()
    running: set[int] = set()
    pending = b""

    def reply(message: dict) -> None:
        os.write(replies, (json.dumps(message) + "\n").encode())

    def reap() -> None:
        while running:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if pid == 0:
                return
            running.discard(pid)
            code = os.waitstatus_to_exitcode(status)  # -N for a signal N, as Popen's returncode
            reply({"pid": pid, "rc": code})
            print(f"participant {pid} ended ({code}) after {usage.ru_utime + usage.ru_stime:.1f} CPU-seconds",
                  file=sys.stderr, flush=True)

    try:
        while True:
            ready, _, _ = select.select([commands], [], [], POLL_S)
            reap()
            if not ready:
                continue
            data = os.read(commands, 65536)
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                command = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                # The PID is reported only once the fork leads its own group: a caller may signal the group at once.
                group_made, group_made_w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(commands)
                    os.close(replies)
                    os.close(group_made)
                    os.setsid()  # its own session: its process group is its PID, as for a participant started by Popen
                    os.close(group_made_w)
                    die_with(launcher)
                    raise _Child(command)
                os.close(group_made_w)
                os.read(group_made, 1)  # end of file once the fork has closed its end, after setsid (or died)
                os.close(group_made)
                running.add(pid)
                reply({"pid": pid})
    finally:
        if os.getpid() == launcher:
            for pid in running:  # the caller stopped reading: no participant outlives the launcher
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
            while running:
                try:
                    pid, status = os.waitpid(-1, 0)
                except ChildProcessError:
                    break
                running.discard(pid)
    return 0


def run_participant(command: dict) -> int:
    """In a participant's fork, out of the launcher's loop: `fx ARGS` in its folder with its environment."""
    take_environment(command["env"])
    return _command(command["cwd"], list(command["args"]), command["log"])


def main(argv: list[str]) -> int:
    if argv[1:] == [PARTICIPANTS]:
        try:
            return serve_participants()
        except _Child as child:
            return run_participant(child.command)
    return serve_commands()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
