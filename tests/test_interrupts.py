"""Interrupts and one run per folder, on the real tool (`python -m workspace` in a child process, real `fx` commands).

One, two and three signals (SIGINT and SIGTERM mixed, random gaps) at random moments of each phase of `prepare`,
`start` and `run`. After each: the tool exits within seconds with 130/143, no process of the run is left, nothing in
the folder changes any more, `federation.json` says how it ended (never `running`), and the next command works.
Before: two SIGTERMs during `prepare` printed "interrupted" while the set-up pool went on copying the export for every
queued collaborator; two SIGINTs during `start` left `federation.json` saying `running`. Two `start --dir D` at the
same instant both started.

The random moments come from one seed each for the prepares, the starts and the run, printed, so that a failure
can be replayed (INTERRUPT_SEED=...).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from audit.reporting.atomic_io import is_temp_name
from audit.reporting.run_file import read_run_file
from shared_runs import workspace_here
from test_federation_multiprocess import FX, is_gone, state

pytestmark = [pytest.mark.skipif(not FX.exists(), reason="fx is installed with openfl in the project's venv"),
              pytest.mark.federation]

ROOT = Path(__file__).resolve().parent.parent
FAST = ["tasks.train.kwargs.epochs=1", "task_runner.settings.audit.signals=[loss]",
        "task_runner.settings.audit.fpr_tolerance=[0.1]", "task_runner.settings.audit.rmia.enabled=false"]
# Three collaborators on two set-up workers: one collaborator's chain waits in the queue, the runaway's material.
PREPARE = ["--collaborators", "3", "--rounds", "1", "--no-tls", *[a for s in FAST for a in ("--set", s)]]
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
STOP_WITHIN_S = 60  # generous on a loaded machine; a stop takes a few seconds


def seeded(name: str) -> random.Random:
    seed = int(os.environ.get("INTERRUPT_SEED", random.randrange(2**31)))
    print(f"{name}: INTERRUPT_SEED={seed}")
    return random.Random(seed)


def tool(*args, out: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with open(out, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "workspace", *map(str, args)], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def handles_sigterm(pid: int) -> bool:
    """Whether the tool has installed its handler (Python catches SIGINT from the start, SIGTERM only then)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def wait_for(condition, timeout_s: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            return None  # it ended before the moment came: the caller says what that means
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}" + (f":\n{log.read_text()[-3000:]}"
                                                                               if log else ""))


def send(proc: subprocess.Popen, count: int, rng: random.Random) -> list[signal.Signals]:
    """`count` signals to the tool (not its group: as `kill PID` does), SIGINT or SIGTERM, 0-0.4 s apart."""
    sent = []
    for i in range(count):
        if i:
            time.sleep(rng.uniform(0, 0.4))
        sig = rng.choice([signal.SIGINT, signal.SIGTERM])
        if proc.poll() is None:
            os.kill(proc.pid, sig)
            sent.append(sig)
    return sent


def snapshot(folder: Path) -> dict:
    """Every file under `folder` with its size and modification time (nothing if the folder is gone)."""
    out = {}
    if folder.exists():
        for path in folder.rglob("*"):
            try:
                info = path.lstat()
            except FileNotFoundError:
                continue
            out[str(path.relative_to(folder))] = (info.st_size, info.st_mtime_ns)
    return out


def processes_in(folder: Path) -> list[str]:
    """Processes whose working folder lies in `folder` (every fx command the tool starts runs in one)."""
    found = []
    for proc in psutil.process_iter(["pid", "cwd", "cmdline"]):
        cwd = proc.info.get("cwd") or ""
        if cwd == str(folder) or cwd.startswith(str(folder) + os.sep):
            found.append(f"{proc.info['pid']}: {' '.join(proc.info.get('cmdline') or [])}")
    return found


def assert_stopped_and_still(proc: subprocess.Popen, folder: Path, sent: list, log: Path) -> str:
    """The tool ends within STOP_WITHIN_S with the first signal's code, leaves no process in the folder, and nothing
    there changes afterwards. Returns its output."""
    try:
        proc.wait(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"still running {STOP_WITHIN_S} s after {sent}:\n{log.read_text()[-3000:]}")
    output = log.read_text()
    if sent:
        # The signal that interrupted it: the first sent, or, when several were pending at once while Python was in
        # C code (an import, a wait), the lowest numbered (CPython runs pending handlers in signal-number order).
        assert proc.returncode in {EXIT_CODES[s] for s in sent}, (sent, proc.returncode, output[-3000:])
        first = signal.Signals(proc.returncode - 128).name
        assert f"interrupted ({first})" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    # No unfinished write is left behind (a participant stopped in the middle of one: the tool removes its temp file)
    assert [p for p in snapshot(folder) if is_temp_name(Path(p).name)] == []
    before = snapshot(folder)
    time.sleep(2.0)
    assert processes_in(folder) == [], processes_in(folder)
    assert snapshot(folder) == before, "the folder changed after the tool had exited"
    return output


# ---------------------------------------------------------------------------------------------------------
# prepare: the checks (no folder yet), the aggregator's workspace and `fx plan initialize`, the collaborators' chains

PREPARE_PHASES = {
    "checks": lambda d: not d.exists(),
    "aggregator": lambda d: (d / "aggregator" / "plan" / "plan.yaml").exists(),
    "collaborators": lambda d: (d / "aggregator" / "aggregator.zip").exists(),
}


@pytest.fixture(scope="module")
def interrupted_prepares(tmp_path_factory):
    """`prepare --dir D` interrupted in each phase (1, 2 and 3 signals, dealt to the phases at random), each followed
    by the checks of assert_stopped_and_still; then the same command, uninterrupted, prepares D (the folder the start
    tests copy). Returns (D, what each interrupt left)."""
    rng = seeded("prepare")
    base = tmp_path_factory.mktemp("interrupts")
    run_dir = base / "prepared"
    seen = []
    counts = rng.sample([1, 2, 3], 3)
    for (phase, reached), count in zip(PREPARE_PHASES.items(), counts):
        log = base / f"prepare-{phase}.log"
        proc = tool("prepare", "--dir", run_dir, *PREPARE, out=log)
        wait_for(lambda: handles_sigterm(proc.pid), 60, "the tool's signal handler", proc)
        moment = wait_for(lambda: reached(run_dir), 300, f"phase {phase}", proc, log)
        time.sleep(rng.uniform(0, 1.5 if phase == "collaborators" else 3.0))
        sent = send(proc, count, rng) if moment else []
        output = assert_stopped_and_still(proc, base, sent, log)
        seen.append({"phase": phase, "count": count, "sent": sent, "returncode": proc.returncode,
                     "left": snapshot(run_dir), "state": state(run_dir), "output": output})
        if proc.returncode == 0:  # it finished before the moment came: start from a fresh folder again
            shutil.rmtree(run_dir)
    done = workspace_here("prepare", "--dir", run_dir, *PREPARE)  # the same command, in this process
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir, seen


def test_an_interrupted_prepare_stops_its_work_and_leaves_nothing(interrupted_prepares):
    run_dir, seen = interrupted_prepares
    for case in seen:
        print(case["phase"], case["count"], [s.name for s in case["sent"]], case["returncode"])
        if not case["sent"]:
            continue
        # Everything it made is gone, the folder included (it made it): no archive copies, no setup.log.
        assert case["left"] == {}, (case["phase"], sorted(case["left"])[:20])
        assert case["state"] == {}
    # The same command then works: the folder is prepared, every collaborator with its workspace.
    assert state(run_dir)["status"] == "prepared"
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == ["aggregator", "collaborator1",
                                                                       "collaborator2", "collaborator3"]
    assert not list(run_dir.glob("*.zip"))


# ---------------------------------------------------------------------------------------------------------
# start: before any participant, while they start and train, after a round

def started(log: Path) -> bool:
    return "started aggregator (pid" in log.read_text(errors="replace")


def round_done(run_dir: Path) -> bool:
    metrics = run_dir / "aggregator" / "logs" / "aggregator_metrics.txt"
    return metrics.exists() and metrics.stat().st_size > 0


START_PHASES = {
    "launching": lambda d, log: True,  # as soon as the handler is there: the checks, the index, the launches
    "training": lambda d, log: started(log),
    "after a round": lambda d, log: round_done(d),
}


@pytest.fixture(scope="module")
def interrupted_starts(interrupted_prepares, tmp_path_factory):
    """`start --dir` on a fresh copy of the prepared folder, interrupted in each phase (1, 2 and 3 signals, dealt to
    the phases at random), each followed by the checks of assert_stopped_and_still and, if a signal was sent, the same
    command again. In the training phase two starts of the folder are launched at the same instant: one is refused,
    and the one that runs is the one interrupted (a run whose folder another command just tried). Returns what each
    interrupt left."""
    rng = seeded("start")
    prepared, _ = interrupted_prepares
    base = tmp_path_factory.mktemp("starts")
    counts = rng.sample([1, 2, 3], 3)
    cases = []
    for (phase, reached), count in zip(START_PHASES.items(), counts):
        run_dir = base / phase.replace(" ", "_")
        shutil.copytree(prepared, run_dir)
        log = base / f"start-{run_dir.name}.log"
        case = {"phase": phase, "count": count, "run_dir": run_dir}
        if phase == "training":
            logs = [log, base / f"start-{run_dir.name}-second.log"]
            procs = [tool("start", "--dir", run_dir, "--timeout", 600, out=out) for out in logs]
            refused = wait_for(lambda: [p for p in procs if p.poll() is not None], 120, "one of them to be refused")
            if len(refused) != 1:
                for p in procs:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                raise AssertionError(f"two starts at once: {[p.returncode for p in procs]}, not one refused:\n"
                                     + "\n".join(out.read_text()[-2000:] for out in logs))
            loser = procs.index(refused[0])
            proc, log = procs[1 - loser], logs[1 - loser]
            case["refused"] = {"returncode": refused[0].returncode, "output": logs[loser].read_text(),
                               "winner": proc.pid}
        else:
            proc = tool("start", "--dir", run_dir, "--timeout", 600, out=log)
        wait_for(lambda: handles_sigterm(proc.pid), 60, "the tool's signal handler", proc)
        moment = wait_for(lambda: reached(run_dir, log), 300, f"phase {phase}", proc, log)
        if phase != "launching":
            time.sleep(rng.uniform(0, 2.0))
        sent = send(proc, count, rng) if moment else []
        print(phase, count, [s.name for s in sent], proc.poll())
        assert_stopped_and_still(proc, run_dir, sent, log)
        pids = state(run_dir).get("extra", {}).get("pids", {})
        case.update(sent=sent, status=state(run_dir)["status"], pids=pids,
                    left_running=[pid for pid in pids.values() if not is_gone(pid)],
                    run_state=read_run_file(run_dir),
                    index=(run_dir / "index.html").read_text() if (run_dir / "index.html").is_file() else "")
        if sent:
            case["again"] = workspace_here("start", "--dir", run_dir, "--timeout", 600)
            case["status_after_again"] = state(run_dir)["status"]
        cases.append(case)
    return cases


def test_an_interrupted_start_stops_every_participant_and_says_so(interrupted_starts):
    for case in interrupted_starts:
        print(case["phase"], case["count"], [s.name for s in case["sent"]], case["status"])
        assert case["left_running"] == [], case
        if not case["sent"]:
            assert case["status"] == "finished"
            continue
        # Never `running`: `prepared` only if no participant had started (nothing ran), else `interrupted`.
        assert case["status"] == ("prepared" if not case["pids"] else "interrupted"), case
        again, run_dir = case["again"], case["run_dir"]
        # The run index says it was interrupted, and after how many of its rounds: never a finished short run.
        state = case["run_state"]
        assert state is not None and state.state == "interrupted" and state.reason in ("SIGINT", "SIGTERM"), state
        assert f"Interrupted ({state.reason}) after {state.rounds_done} of {state.rounds} rounds" in case["index"]
        if case["status"] == "interrupted":  # the next command says so, in one line, at once
            assert again.returncode == 2, again.stdout[-2000:] + again.stderr[-2000:]
            assert again.stderr.strip() == (f"error: {run_dir} was already started (status 'interrupted'); prepare "
                                            "a fresh folder so that no participant picks up an earlier run's state")
        else:  # nothing had run: the folder starts and finishes
            assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
            assert case["status_after_again"] == "finished"


def test_two_starts_at_the_same_instant_one_runs_the_other_is_refused(interrupted_starts):
    """Before: both started, two aggregators shared the port, no round in 400 s. The lock is taken before anything
    else; the one that runs is then interrupted at a random moment of round 0 (the training phase of
    interrupted_starts)."""
    case = next(c for c in interrupted_starts if c["phase"] == "training")
    refused, run_dir = case["refused"], case["run_dir"]
    assert refused["returncode"] == 2
    output = refused["output"]
    assert output.strip().startswith(f"error: --dir {run_dir}: in use by another `python -m workspace` "
                                     f"(pid {refused['winner']}); one run per folder"), output
    assert len(output.strip().splitlines()) == 1, output
    assert case["sent"] and case["status"] == "interrupted", case


# ---------------------------------------------------------------------------------------------------------
# run: prepare and start in one command

def test_an_interrupted_run_cleans_up_the_step_it_was_in(tmp_path):
    rng = seeded("run")
    run_dir = tmp_path / "run"
    log = tmp_path / "run.log"
    proc = tool("run", "--dir", run_dir, *PREPARE, "--timeout", 600, out=log)
    wait_for(lambda: handles_sigterm(proc.pid), 60, "the tool's signal handler", proc)
    phase = rng.choice(["preparing", "started"])
    reached = (lambda: (run_dir / "aggregator").exists()) if phase == "preparing" else (lambda: started(log))
    moment = wait_for(reached, 400, phase, proc, log)
    time.sleep(rng.uniform(0, 2.0))
    sent = send(proc, rng.choice([1, 2, 3]), rng)
    print(phase, [s.name for s in sent], moment)
    assert_stopped_and_still(proc, tmp_path, sent, log)
    if not sent:
        return
    if not (run_dir / "federation.json").exists() or state(run_dir)["status"] == "prepared" and not started(log):
        # interrupted while preparing: nothing of it is left, and the same command prepares again
        assert not run_dir.exists(), sorted(snapshot(run_dir))[:20]
    else:
        assert state(run_dir)["status"] in ("interrupted", "prepared"), state(run_dir)["status"]
