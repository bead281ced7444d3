"""The processes a local federation starts, each in its own process group, and stopping them by PID.

Every `fx` command (set-up commands and the long-running aggregator and collaborators) is started in a new
session, so its process group id is its PID: a Ctrl-C in the terminal reaches only the tooling, and the
tooling stops each process group it started (SIGTERM, then SIGKILL after a grace period), never anything
found by name. A federation's participants are forks of one ParticipantLauncher (workspace/fx_worker.py), each
in a session of its own, seen here through Popen's interface (ForkedProcess).

A tooling killed outright (SIGKILL, OOM killer) runs no clean-up: on Linux every process it starts asks the
kernel for SIGKILL when the tooling dies (prctl PR_SET_PDEATHSIG), so no participant is left orphaned. The
signal is SIGKILL because a stopped (SIGSTOP) process would leave a SIGTERM pending. Elsewhere there is no
such request; `federation.json` then still names the orphans (see workspace/federation.py). A launcher's forks
make the same request of the launcher, which dies with the tooling.

`snapshot(pid)` reads what /proc shows of a process (state, CPU time, start time) for the liveness check.

Interrupts (workspace/__main__.py): the first SIGINT/SIGTERM cancels the registry (`cancel`: it starts no process,
and the set-up's jobs stop at their next step, `check_cancelled`) and the tooling winds down (`winding_down`); every
further signal only hastens that (`hurry`: each process group is killed at once). Both are safe in a signal
handler: they take no lock.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from src.process.party_events import ENV as PARTY_STATUS_ENV
from workspace import fx_worker


class FxNotFoundError(RuntimeError):
    pass


def fx_executable() -> Path:
    """`fx` installed next to the running interpreter (the project's venv)."""
    fx = Path(sys.executable).parent / "fx"
    if not fx.exists():
        raise FxNotFoundError(f"fx not found at {fx}: run the tooling with the project's venv "
                              "(.venv/bin/python -m workspace ...), where openfl is installed")
    return fx


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def party_threads(collaborators: int, cores: int | None = None) -> int:
    """Intra-op threads for each collaborator process: the machine's cores shared by the collaborators, which train
    and audit at the same time (the aggregator waits meanwhile). torch would start one thread per core in every
    process: with several processes per core, OpenMP threads spin waiting for cores the others hold, and a round
    takes longer than with one thread each."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // max(1, collaborators))


def fx_environment(log_file: str | None = None, *, threads: int | None = None, status_file: str | None = None) -> dict:
    """The environment of an `fx` process; `threads` sets OMP_NUM_THREADS / MKL_NUM_THREADS unless the user's
    environment sets them (theirs win); `status_file`: where it appends its status events (src.process.party_events)."""
    env = dict(os.environ)
    if threads is not None and not any(name in os.environ for name in THREAD_VARIABLES):
        for name in THREAD_VARIABLES:
            env[name] = str(threads)
    # Each participant must run its own workspace's code: fx puts its working folder first on sys.path, and a
    # PYTHONPATH pointing at the repository could still shadow what the workspace lacks.
    env.pop("PYTHONPATH", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("COLUMNS", "160")
    # A participant's output goes to a file: no tqdm bar from any library (tqdm reads TQDM_<arg> for its defaults).
    env["TQDM_DISABLE"] = "1"
    if log_file:
        env["LOG_FILE"] = log_file  # OpenFL's plain one-line-per-record log; must be logs/<name>
    else:
        env.pop("LOG_FILE", None)
    if status_file:
        env[PARTY_STATUS_ENV] = status_file
    else:
        env.pop(PARTY_STATUS_ENV, None)
    return env


KILL_REAP_S = 1.0  # after SIGKILL, how long to wait to reap the process (a process in disk wait dies later)


def die_with_this_process():
    """A preexec_fn that has the child SIGKILLed when the process starting it dies (None where unsupported).

    The kernel sends the signal when the *thread* that forked the child exits: start participants from a
    thread that outlives them (the main thread; `ProcessRegistry.run` waits for its child in the calling thread).
    """
    if not fx_worker.supports_die_with():
        return None
    parent = os.getpid()
    die_with = fx_worker.die_with  # resolved now: the function runs between fork and exec

    def preexec():
        die_with(parent)

    return preexec


@dataclass(frozen=True)
class Snapshot:
    """What /proc/<pid>/stat shows of a process."""

    state: str        # R running, S sleeping, D disk wait, T stopped (SIGSTOP), t traced, Z zombie, ...
    cpu_ticks: int    # user + system time of the process and of its reaped children, in clock ticks
    start_ticks: int  # start time after boot, in clock ticks: with the PID, identifies the process


CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def snapshot(pid: int) -> Snapshot | None:
    """The process's state, CPU time and start time; None if it is gone (or /proc is not there)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except (OSError, ValueError):
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
    fields = text[text.rfind(")") + 2:].split()
    try:
        utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
        return Snapshot(state=fields[0], cpu_ticks=utime + stime + cutime + cstime, start_ticks=int(fields[19]))
    except (IndexError, ValueError):
        return None


def is_running(pid: int | None, start_ticks: int | None = None) -> bool:
    """Whether `pid` is a live process (not a zombie) and, given its recorded start time, the same one."""
    if not pid:
        return False
    snap = snapshot(pid)
    if snap is None or snap.state in ("Z", "X"):
        return False
    return start_ticks is None or snap.start_ticks == int(start_ticks)


def describe_returncode(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class ForkedProcess:
    """A participant forked by a ParticipantLauncher, seen through Popen's interface (pid, args, returncode, poll,
    wait): the launcher, its parent, reaps it and reports its exit code."""

    def __init__(self, launcher: "ParticipantLauncher", pid: int, args: list[str]):
        self.launcher, self.pid, self.args = launcher, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.launcher.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.launcher.wait_for_news(0.05 if deadline is None else min(0.05, max(0.0, deadline - time.monotonic())))
        return self.returncode


class ParticipantLauncher:
    """One process (workspace/fx_worker.py --participants) that has imported what a participant imports, and forks
    each participant (`fx aggregator start`, `fx collaborator start`) in its own session, folder and environment: a
    local federation's participants share that one import's CPU time and library pages. Give it to
    ProcessRegistry.start; close() it once the participants are stopped (their forks die with it anyway)."""

    NAME = "participants' launcher"  # its name in the registry, for the moment before start() leaves it to its owner
    START_TIMEOUT_S = 120.0  # its imports (a few CPU-seconds) then one fork
    CLOSE_S = 5.0  # at the end of its input it kills what is left of its forks, reaps them and exits

    def __init__(self, registry: "ProcessRegistry", *, cwd: Path, log_path: Path):
        self.registry = registry
        self.log_path = log_path
        # The registry starts it (in its own session, killed if the tooling dies) but does not stop it with the
        # participants: their forks would die with it before their grace period.
        self.process = registry.start(self.NAME, [sys.executable, fx_worker.__file__, fx_worker.PARTICIPANTS],
                                      cwd=cwd, log_path=log_path, env=fx_environment(), stdin=subprocess.PIPE,
                                      replies=True)
        registry.detach(self.process)
        self._replies = self.process.popen.stdout.fileno()
        os.set_blocking(self._replies, False)
        self._pending = b""
        self._started: list[int] = []  # PIDs reported, not yet claimed by start()
        self._ended: dict[int, int] = {}
        self.forked = 0  # participants it started, whether or not start() returned them (an interrupt)
        self._closed = False  # its replies ended: whatever has not ended was killed with it

    def start(self, argv: list[str], *, cwd: Path, env: dict, log_path: Path) -> ForkedProcess:
        """Fork `argv` (an `fx` command: argv[0] is fx) in `cwd` with `env`, its output appended to `log_path`."""
        command = {"cwd": str(cwd), "args": list(argv[1:]), "log": str(log_path), "env": env}
        try:
            self.process.popen.stdin.write((json.dumps(command) + "\n").encode())
            self.process.popen.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # it has ended: said below
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while not self._started:
            if self._closed or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
                raise RuntimeError(f"the participants' launcher (pid {self.process.pid}) did not start `fx "
                                   f"{' '.join(argv[1:])}` ({describe_returncode(self.process.popen.poll())}); "
                                   f"its log {self.log_path}:\n{tail}")
            self.wait_for_news(1.0)
        return ForkedProcess(self, self._started.pop(0), list(argv))

    def returncode(self, pid: int) -> int | None:
        self._read()
        if pid in self._ended:
            return self._ended[pid]
        return -signal.SIGKILL if self._closed else None  # PR_SET_PDEATHSIG: killed when the launcher died

    def wait_for_news(self, timeout: float) -> None:
        if not self._closed:
            select.select([self._replies], [], [], timeout)
        else:
            time.sleep(timeout)
        self._read()

    def _read(self) -> None:
        while not self._closed:
            try:
                data = os.read(self._replies, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._closed = True
                return
            self._pending += data
            *lines, self._pending = self._pending.split(b"\n")
            for line in lines:
                reply = json.loads(line)
                if "rc" in reply:
                    self._ended[reply["pid"]] = reply["rc"]
                else:
                    self._started.append(reply["pid"])
                    self.forked += 1

    def close(self, at_once: bool = False) -> None:
        """End the launcher (at the end of its input it kills and reaps what is left of its forks) and reap it;
        `at_once` (an interrupt): kill it now, its forks with it, rather than wait for the end of its imports."""
        popen = self.process.popen
        if popen.stdout.closed:
            return
        try:
            popen.stdin.close()
        except OSError:
            pass
        try:
            popen.wait(timeout=0 if at_once else self.CLOSE_S)
        except subprocess.TimeoutExpired:  # still importing, or stopped: its forks die with it
            _killpg(self.process.pid, signal.SIGKILL)
            try:
                popen.wait(timeout=KILL_REAP_S)
            except subprocess.TimeoutExpired:
                pass
        self._read()
        popen.stdout.close()


@dataclass
class Started:
    name: str
    popen: subprocess.Popen | ForkedProcess
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid


class ProcessRegistry:
    """Starts commands in their own process groups and stops every group it started."""

    def __init__(self, stop_grace_s: float = 5.0):
        self.stop_grace_s = stop_grace_s
        self._started: list[Started] = []
        self._lock = threading.Lock()
        self._closed = False
        self.stopped_running: list[str] = []  # every process stop_all() found still running, in order
        # Set once the tooling stops (an interrupt, a failure, the end of a run): a signal then only hastens it.
        self.winding_down = False
        self.interrupted_by: int | None = None  # the first SIGINT/SIGTERM, if any
        # While the main thread forks a process, a signal handler that raises would raise inside the fork's hooks
        # (logging's lock release), where Python prints the exception and drops it: the handler defers the signal
        # (`defer`) and start() delivers it again once the process is recorded.
        self.launching = False
        self._deferred: int | None = None

    @property
    def cancelled(self) -> bool:
        return self._closed

    def cancel(self) -> None:
        """Start nothing more (safe in a signal handler: no lock; start() reads the flag under its lock)."""
        self._closed = True

    def defer(self, signum: int) -> None:
        """Keep a signal that came while the main thread was starting a process, for start() to deliver again (safe in
        a signal handler: no lock)."""
        self._closed = True
        self._deferred = self._deferred or signum

    def _launched(self) -> None:
        self.launching = False
        signum, self._deferred = self._deferred, None
        if signum is not None:
            signal.raise_signal(signum)  # the handler runs now, outside the fork's hooks

    def check_cancelled(self, what: str = "the next step") -> None:
        """Raise InterruptedError if the run is being stopped: a job calls this before each step of its own."""
        if self._closed:
            raise InterruptedError(f"not starting {what}: the run is being stopped")

    def hurry(self) -> None:
        """Kill every process group started, now, and stop waiting for any (safe in a signal handler)."""
        self._closed = True
        self.stop_grace_s = 0.0
        for started in list(self._started):  # a copy of the list: no lock
            _killpg(started.pid, signal.SIGKILL)

    @property
    def started(self) -> list[Started]:
        with self._lock:
            return list(self._started)

    def start(self, name: str, argv: Sequence[str], *, cwd: Path, log_path: Path, env: dict,
              stdin: int = subprocess.DEVNULL, replies: bool = False,
              launcher: ParticipantLauncher | None = None) -> Started:
        """Start `argv` in its own process group, its output appended to log_path; `stdin`: subprocess.PIPE for a
        process the caller writes to (started.popen.stdin); `replies`: its stdout is a pipe the caller reads
        (started.popen.stdout), its stderr alone goes to log_path; `launcher`: `argv`, an `fx` command, is forked by
        that launcher (a ForkedProcess) instead of started with its own interpreter."""
        with self._lock:
            if self._closed:  # stop_all() ran (e.g. Ctrl-C): start nothing new from a worker thread
                raise InterruptedError(f"not starting {name}: the run is being stopped")
            log_path.parent.mkdir(parents=True, exist_ok=True)
            # Where signal handlers run, and this process forks (a launcher forks in its own process: an interrupt
            # while it does is raised here, and launcher.close() ends a fork it started meanwhile).
            main = threading.current_thread() is threading.main_thread() and launcher is None
            self.launching = main
            try:
                if launcher is not None:
                    popen = launcher.start(list(argv), cwd=cwd, env=env, log_path=log_path)
                else:
                    with open(log_path, "ab") as log:
                        popen = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=stdin,
                                                 stdout=subprocess.PIPE if replies else log,
                                                 stderr=log if replies else subprocess.STDOUT,
                                                 start_new_session=True, preexec_fn=die_with_this_process())
            except BaseException:
                if main:
                    self._launched()
                raise
            started = Started(name, popen, log_path)
            self._started.append(started)  # before a deferred signal: its clean-up stops this process too
            if main:
                self._launched()
            return started

    def run(self, name: str, argv: Sequence[str], *, cwd: Path, log_path: Path, env: dict,
            timeout_s: float) -> int:
        """Run a command to completion (stopped, with a TimeoutError, after timeout_s); returns its exit code."""
        started = self.start(name, argv, cwd=cwd, log_path=log_path, env=env)
        try:
            return started.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop(started)
            raise TimeoutError(f"{name}: `{' '.join(map(str, argv[1:]))}` in {cwd} took more than {timeout_s:g} s "
                               f"(output: {log_path})") from None
        finally:
            self.forget(started)

    def detach(self, started: Started) -> None:
        """Leave a process to its caller: stop_all() and hurry() no longer stop it (the caller ends it)."""
        with self._lock:
            if started in self._started:
                self._started.remove(started)

    def forget(self, started: Started) -> None:
        """Drop a process that has ended from what stop_all() stops."""
        with self._lock:
            if started in self._started and started.popen.poll() is not None:
                self._started.remove(started)

    def stop(self, started: Started, grace: bool = True) -> None:
        """SIGTERM the process group, SIGKILL it if still there after the grace period (at once with grace=False),
        then reap the process."""
        pgid = started.pid  # start_new_session=True: the group id is the PID
        if grace and started.popen.poll() is None and self.stop_grace_s > 0:
            _killpg(pgid, signal.SIGTERM)
            _killpg(pgid, signal.SIGCONT)  # a stopped (SIGSTOP) process would keep the SIGTERM pending
            try:
                started.popen.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                pass
        # Whatever else runs in the group (a child the participant started) goes too, even if the leader exited.
        _killpg(pgid, signal.SIGKILL)
        try:
            started.popen.wait(timeout=max(self.stop_grace_s, KILL_REAP_S))
        except subprocess.TimeoutExpired:
            pass

    def stop_all(self) -> list[str]:
        """Stop every process group started; returns the names of those that were still running."""
        with self._lock:
            self._closed = True
            started = list(self._started)
        running = [s.name for s in started if s.popen.poll() is None]
        # All are asked at once and share one grace period (not one each, in turn), then what is left is killed.
        if self.stop_grace_s > 0:
            for s in started:
                if s.popen.poll() is None:
                    _killpg(s.pid, signal.SIGTERM)
                    _killpg(s.pid, signal.SIGCONT)
            deadline = time.monotonic() + self.stop_grace_s
            for s in started:
                try:
                    s.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for s in reversed(started):
            self.stop(s, grace=False)
        with self._lock:
            self.stopped_running += [name for name in running if name not in self.stopped_running]
        return running


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
