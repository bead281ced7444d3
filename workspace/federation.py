"""Start a prepared local federation (`fx aggregator start`, `fx collaborator start -n NAME`) and watch it.

Each participant is a separate process in its own process group (a fork of one launcher that imported the
participants' libraries once, workspace.processes.ParticipantLauncher), started in its own workspace folder, with
its console output in <workspace>/logs/<name>.console.log and OpenFL's plain log in <workspace>/logs/<name>.log.
The watcher reads the aggregator's metrics log for progress and the processes' exit codes for failures:

- every collaborator exits 0 after its quit signal and the aggregator exits 0 after the last round: success;
- a participant dies (non-zero exit, killed): by default everything is stopped at once and the run fails
  naming it; with keep_going the surviving collaborators go on (the plan's straggler policy ends each round
  without the dead one) and the run still fails, naming it, once they are done. OpenFL's aggregator itself
  never exits in that case (it waits to send the dead collaborator its quit signal), so it is stopped;
- a participant that stops answering (stopped, deadlocked: no progress within the liveness window, see
  workspace.progress.Liveness) is named and the run ends as for a dead one; with keep_going a frozen
  collaborator is stopped, the others go on, and the run fails naming it;
- the optional overall timeout stops everything and names what was still running.
Every process started is stopped by process group whatever happens (including Ctrl-C, handled by the CLI).
If the tooling itself is killed outright, the participants die with it (workspace.processes) and the next
command on the folder reports the stale state that federation.json was left in (`stale_state`).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from audit import (FAILED, FINISHED, INTERRUPTED, RUNNING, RunInfo, library_versions, remove_leftover_temps,
                   write_index, write_run_file)
from workspace.federation_state import AGGREGATOR, STATE_FILE, FederationLayout, SetupError
from workspace.processes import (ParticipantLauncher, ProcessRegistry, Started, describe_returncode, fx_environment,
                                 fx_executable, is_running, party_threads, snapshot)
from workspace.party_status import StatusFollower, status_file
from workspace.progress import DEFAULT_LIVENESS_S, Liveness, ProgressLine, eta_seconds, rounds_done
from workspace.run_plan import port_is_free
from src.plan.checks import INSECURE_ENV
from src.plan.paths import ALLOWED_ENV, owner_allowance

LAUNCHER_LOG = "launcher.log"  # the participants' launcher's own output (theirs: each in its workspace's logs/)
AGGREGATOR_EXIT_GRACE_S = 30.0  # OpenFL's server checks every 5 s whether every collaborator got its quit signal


@dataclass
class Outcome:
    ok: bool
    rounds_done: int
    rounds: int
    seconds: float
    problems: list[str] = field(default_factory=list)
    dead: dict[str, str] = field(default_factory=dict)
    frozen: dict[str, str] = field(default_factory=dict)  # parties that stopped answering -> why
    reports: dict[str, Path] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    round_seconds: list[float] = field(default_factory=list)  # the aggregator's elapsed_seconds per round
    run_index: Path | None = None  # <federation folder>/index.html (write_run_index)


def metrics_file(layout: FederationLayout) -> Path:
    return layout.workspace(AGGREGATOR) / "logs" / "aggregator_metrics.txt"


def report_locations(layout: FederationLayout) -> dict[str, Path]:
    reports = {AGGREGATOR: layout.workspace(AGGREGATOR) / layout.aggregator_report_dir}
    for name in layout.collaborators:
        reports[name] = layout.workspace(name) / layout.collaborator_report_dir / name
    return reports


def write_run_index(layout: FederationLayout, state: str = RUNNING, *, rounds_done: int = 0,
                    reason: str | None = None) -> Path:
    """Write the run index (audit.reporting.html.write_index: every participant's page, its latest verdict) and the
    run's record (run.json: how the run stands, `state`, with the rounds written and why it stopped) into the
    federation folder, and the same into each participant's report root (a participant's own rewrite of its root's
    index keeps the run's state). Every page links back to "../index.html", its report root's index: writing the full
    run index there (its links relative to where it lies) makes that back link reach the whole run with no
    participant told where the federation folder is. Returns <federation folder>/index.html."""
    reports = report_locations(layout)
    aggregators = {AGGREGATOR: reports[AGGREGATOR]}
    parties = {name: path for name, path in reports.items() if name != AGGREGATOR}
    settings = {"rounds": layout.rounds, "collaborators": list(layout.collaborators),
                "plan": str(layout.workspace(AGGREGATOR) / "plan" / "plan.yaml")}
    rounds = int(layout.rounds)
    info = RunInfo(RUNNING, rounds, settings, library_versions({"openfl": importlib.metadata.version("openfl")}),
                   rounds_done=min(max(0, int(rounds_done)), rounds))
    if state != RUNNING:
        info = info.ended(state, reason)
    for root in dict.fromkeys([layout.root, *(path.parent for path in reports.values())]):
        root.mkdir(parents=True, exist_ok=True)
        write_index(root, aggregators=aggregators, parties=parties, info=info)
    return layout.root / "index.html"


def _rounds_written(layout: FederationLayout, done: int) -> None:
    """Each run.json the tool wrote says `done` rounds written (a participant's own rewrite of its root's index keeps
    it; one that read the file just before loses it until the next round, the run's end sets it for good)."""
    reports = report_locations(layout)
    parties = {name: path for name, path in reports.items() if name != AGGREGATOR}  # as write_run_index gathers them
    for root in dict.fromkeys([layout.root, *(path.parent for path in reports.values())]):
        try:
            write_run_file(root, parties=parties, update=lambda info: info.round_written(done))
        except OSError:  # a disk fault: the run's end names it
            pass


def _ended(outcome: "Outcome", interrupted_by: int | None) -> tuple[str, str | None]:
    """How the run ended (audit.run_states) and why: finished, interrupted (by which signal) or failed (the first
    problem's first line)."""
    import signal

    if interrupted_by is not None:
        return INTERRUPTED, signal.Signals(interrupted_by).name
    if outcome.ok:
        return FINISHED, None
    first = next((p.strip().splitlines()[0] for p in outcome.problems if p.strip()), None)
    return FAILED, None if first is None else first[:300]


def round_seconds(layout: FederationLayout) -> list[float]:
    """The aggregator's own per-round wall time (MetricWriter's elapsed_seconds, round begin to round end)."""
    out = {}
    try:
        lines = metrics_file(layout).read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
            out[int(record["round_number"])] = float(record["elapsed_seconds"])
        except (ValueError, KeyError, TypeError):
            continue
    return [out[r] for r in sorted(out)]


def plan_of(workspace: Path) -> dict:
    """A participant's plan as a mapping ({} where it cannot be read: the participant says why when it starts)."""
    try:
        return yaml.safe_load((workspace / "plan" / "plan.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def straggler_wait_s(layout: FederationLayout) -> float:
    """How long the plan's straggler policy lets a round wait for a missing collaborator (0 if it sets no cutoff)."""
    try:
        plan = yaml.safe_load((layout.workspace(AGGREGATOR) / "plan" / "plan.yaml").read_text()) or {}
        return float(plan["straggler_handling_policy"]["settings"]["straggler_cutoff_time"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return 0.0


def _this_process() -> dict:
    snap = snapshot(os.getpid())
    return {"pid": os.getpid(), "start_ticks": snap.start_ticks if snap else None}


def stale_state(layout: FederationLayout) -> str | None:
    """What to tell about a folder whose federation.json says 'running' (None if it does not).

    `start` records its own PID and each participant's (with their start times, so a reused PID is not
    mistaken for them); a tooling killed outright leaves 'running' behind.
    """
    if layout.status != "running":
        return None
    tool = layout.extra.get("tool") or {}
    if is_running(tool.get("pid"), tool.get("start_ticks")):
        return (f"{layout.root} is running now: the tooling (pid {tool['pid']}) that started it is still up; "
                "stop it with Ctrl-C or kill it")
    starts = layout.extra.get("start_ticks") or {}
    parties = [f"{name} (pid {pid}) " + (f"STILL RUNNING, stop it with: kill -- -{pid}"
                                         if is_running(pid, starts.get(name)) else "gone")
               for name, pid in (layout.extra.get("pids") or {}).items()]
    who = f"the tool (pid {tool['pid']})" if tool.get("pid") else "the tool (its pid was not recorded)"
    return (f"stale: {who} that started {layout.root} is gone (killed?), and its {STATE_FILE} still says "
            f"'running'; participants: {', '.join(parties) or 'none recorded'}. Nothing in it can be resumed: "
            "prepare a fresh folder")


def check_fresh(layout: FederationLayout) -> None:
    """A prepared folder runs once: nothing in it may carry state from an earlier start."""
    stale = stale_state(layout)
    if stale:
        raise SetupError(stale)
    if layout.status != "prepared":
        raise SetupError(f"{layout.root} was already started (status {layout.status!r}); prepare a fresh folder "
                         "so that no participant picks up an earlier run's state")
    leftovers = [p for p in (layout.workspace(AGGREGATOR) / "local_state" / "tensor.db", metrics_file(layout))
                 if p.exists()]
    leftovers += [p for p in report_locations(layout).values() if p.exists()]
    if leftovers:
        raise SetupError(f"{layout.root} holds state of an earlier run: {[str(p) for p in leftovers]}")


# A line that says what a process died of: Python's exception line ("ValueError: ..."), fx's summary of it
# ("EXCEPTION : ..."), or a log record at ERROR or CRITICAL.
ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)(?::\s|$)|EXCEPTION : |\S.*\b(?:ERROR|CRITICAL)\b)")


def last_error_line(*paths: Path) -> str | None:
    """The last line of the first of `paths` (a party's console log, then its OpenFL log) that says what it died of
    (ERROR_LINE), stripped; None if none does."""
    for path in paths:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 256 * 1024))  # the end of a long log is enough
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            continue
        found = [line.strip() for line in text.splitlines() if ERROR_LINE.match(line.strip())]
        if found:
            return found[-1][:500]
    return None


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no output)"
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def start(layout: FederationLayout, *, registry: ProcessRegistry, timeout_s: float | None = None,
          keep_going: bool = False, say: Callable[[str], None] = print, progress: ProgressLine | None = None,
          poll_s: float = 0.25, liveness_s: float | None = DEFAULT_LIVENESS_S) -> Outcome:
    """Start the prepared federation and watch it to its end. `liveness_s` (`--liveness`): how long a party may
    show no progress before it counts as frozen (workspace.progress.Liveness); None or 0: no liveness check."""
    check_fresh(layout)
    if not port_is_free(layout.port):
        raise SetupError(f"port {layout.port} (network.settings.agg_port) is in use on 127.0.0.1; prepare again "
                         "for a new free port, or stop what listens there")
    if layout.insecure:
        say(f"WARNING: {insecure_note(layout)}")
    fx = str(fx_executable())
    begin = time.monotonic()
    total = layout.rounds
    processes: dict[str, Started] = {}
    logs: dict[str, Path] = {}
    outcome = Outcome(ok=False, rounds_done=0, rounds=total, seconds=0.0, reports=report_locations(layout), logs=logs)

    collaborator_threads = party_threads(len(layout.collaborators))
    launcher: ParticipantLauncher | None = None

    def launch(name: str, args: list[str]) -> None:
        ws = layout.workspace(name)
        logs[name] = ws / "logs" / f"{name}.console.log"
        # The aggregator only aggregates between the collaborators' tasks: one thread leaves them the cores.
        threads = 1 if name == AGGREGATOR and collaborator_threads else collaborator_threads
        env = fx_environment(f"logs/{name}.log", threads=threads,
                             status_file=str(status_file(ws, name).relative_to(ws)))
        env[INSECURE_ENV] = ",".join(layout.insecure)  # what the user's flags allowed off, and nothing else
        # The run's owner wrote the plan: the absolute folders it names (data, reports) are allowed (src.plan.paths).
        env[ALLOWED_ENV] = os.pathsep.join([*filter(None, [env.get(ALLOWED_ENV, "")]),
                                            *map(str, owner_allowance(plan_of(ws)))])
        processes[name] = started = registry.start(name, [fx, *args], cwd=ws, log_path=logs[name], env=env,
                                                   launcher=launcher)
        # Recorded as each one starts: an interrupted launch still names every participant that ran
        layout.extra.setdefault("pids", {})[name] = started.pid
        layout.extra.setdefault("start_ticks", {})[name] = getattr(snapshot(started.pid), "start_ticks", None)
        layout.save()

    interrupted = False
    try:
        # Every participant is a fork of one process that imported their libraries once (its imports overlap what
        # follows until the aggregator starts).
        launcher = ParticipantLauncher(registry, cwd=layout.root, log_path=layout.root / LAUNCHER_LOG)
        # Written before the participants start: the aggregator's page links back to its root's index only when one
        # is there (audit.aggregator_report.writer); the parties rewrite theirs each round, the end of the run them all.
        write_run_index(layout)
        layout.status = "running"
        layout.extra["tool"] = _this_process()  # so the next command can tell a killed tooling (stale_state)
        layout.save()
        launch(AGGREGATOR, ["aggregator", "start"])
        for name in layout.collaborators:  # they retry every client_reconnect_interval until the server is up
            launch(name, ["collaborator", "start", "-n", name])
        say("started " + ", ".join(f"{name} (pid {p.pid})" for name, p in processes.items()))
        liveness = None
        if liveness_s:
            liveness = Liveness(floor_s=liveness_s, straggler_wait_s=straggler_wait_s(layout))
            for name, p in processes.items():
                liveness.add(name, p.pid, [logs[name], layout.workspace(name) / "logs" / f"{name}.log"],
                             collaborator=name != AGGREGATOR, now=p.started_at)
        _watch(layout, processes, logs, outcome, total=total, timeout_s=timeout_s, keep_going=keep_going, say=say,
               progress=progress, poll_s=poll_s, begin=begin, liveness=liveness, stop=registry.stop)
    except KeyboardInterrupt:  # workspace.__main__.Interrupted: SIGINT, SIGTERM
        interrupted = True
        raise
    except InterruptedError:  # the registry refused a start: a signal cancelled it, its exception lost (see __main__)
        interrupted = registry.interrupted_by is not None
        raise
    finally:
        # Whatever ends the run, federation.json must say how (a signal now only hastens this, see __main__).
        registry.winding_down = True
        still_running = [name for name in registry.stop_all() if name != ParticipantLauncher.NAME]
        if launcher is not None:
            launcher.close(at_once=interrupted)
        if progress is not None:
            progress.finish()
        outcome.seconds = time.monotonic() - begin
        # The round after the last (the final model's audit) is no training round.
        outcome.rounds_done = min(rounds_done(metrics_file(layout)), total)
        outcome.round_seconds = round_seconds(layout)[:total]
        # A participant ran if the registry holds one, or the launcher forked one that an interrupt kept from it.
        ran = (any(s.name != ParticipantLauncher.NAME for s in registry.started)
               or (launcher is not None and launcher.forked > 0))
        if interrupted and not ran:
            layout.status = "prepared"  # interrupted before any participant started: nothing ran, it may start
            layout.extra.pop("tool", None)
        else:
            layout.status = "interrupted" if interrupted else "finished" if outcome.ok else "failed"
        # Every participant is gone: a write one of them was making when it was stopped (its temp file) never ends.
        for name in (AGGREGATOR, *layout.collaborators):
            remove_leftover_temps(layout.workspace(name))
        layout.extra["stopped_by_tooling"] = still_running
        layout.extra["problems"] = outcome.problems
        # On a full or read-only disk these writes fail too: the run's end is still said (its problems, the summary),
        # and the files that could not be written are named among its problems.
        try:
            layout.save()
        except OSError as err:
            outcome.problems.append(f"could not record how the run ended in {layout.root / STATE_FILE}: "
                                    f"{err.strerror or err}")
        try:
            state, reason = _ended(outcome, (registry.interrupted_by or 2) if interrupted else None)
            outcome.run_index = write_run_index(layout, state, rounds_done=outcome.rounds_done, reason=reason)
        except OSError as err:
            outcome.problems.append(f"could not write the run index in {getattr(err, 'filename', None) or layout.root}"
                                    f": {err.strerror or err}")
            outcome.run_index = None
    return outcome


def insecure_note(layout: FederationLayout) -> str:
    what = "without TLS (--no-tls)" if "tls" in layout.insecure else "without client certificates (--no-client-auth)"
    return (f"this federation runs {what}: any process that reaches port {layout.port} can claim a collaborator's "
            "name and receive its tasks and the global model")


def _watch(layout, processes, logs, outcome, *, total, timeout_s, keep_going, say, progress, poll_s, begin,
           liveness: Liveness | None = None, stop: Callable[[Started], None] | None = None):
    agg = processes[AGGREGATOR]
    cols = {n: processes[n] for n in layout.collaborators}
    exited: dict[str, int] = {}
    agg_exited_at = cols_exited_at = None
    # Each party's phase, from the status events it writes (workspace.party_status); the round times give the ETA.
    followers = {name: StatusFollower(status_file(layout.workspace(name), name)) for name in processes}
    last_done, round_began = 0, begin
    while True:
        done = rounds_done(metrics_file(layout))
        if done != last_done:
            last_done, round_began = done, time.monotonic()
            _rounds_written(layout, min(done, total))
            if layout.insecure and done < total:  # every round it runs that way
                (progress.message if progress is not None else say)(f"WARNING: round {done}: {insecure_note(layout)}")
        for name, follower in followers.items():
            follower.poll()
            for note in follower.take_notes():  # each party says it once (audit.party_audit)
                (progress.message if progress is not None else say)(f"note from {name}: {note}")
        for name, proc in cols.items():
            rc = proc.popen.poll()
            if rc is None or name in exited:
                continue
            exited[name] = rc
            if rc != 0 and name not in outcome.dead:
                cause = last_error_line(logs[name], layout.workspace(name) / "logs" / f"{name}.log")
                outcome.dead[name] = (f"{name} (pid {proc.pid}) {describe_returncode(rc)} during round "
                                      f"{min(done, total - 1)} ({done}/{total} rounds finished)"
                                      f"{f': {cause}' if cause else ''}; log: {logs[name]}")
                say(f"\n!! {outcome.dead[name]}")
        agg_rc = agg.popen.poll()
        now = time.monotonic()
        if liveness is not None and _frozen(layout, processes, logs, outcome, liveness, exited, done=done,
                                            total=total, now=now, keep_going=keep_going, say=say, stop=stop):
            return
        if progress is not None:
            states = {AGGREGATOR: _state(liveness, AGGREGATOR, outcome, followers, len(cols)) if agg_rc is None
                      else describe_returncode(agg_rc)}
            states.update({n: (_state(liveness, n, outcome, followers) if n not in exited else "done" if exited[n] == 0
                               else "FROZEN" if n in outcome.frozen else "DEAD") for n in cols})
            progress.update(min(done, total), total, states,
                            eta_seconds(round_seconds(layout), done, total, now - round_began))

        if outcome.dead and not keep_going:
            outcome.problems.append("stopped the federation because a participant died: "
                                    + "; ".join(outcome.dead.values()))
            return
        if agg_rc is not None:
            if agg_rc != 0 or done < total:
                cause = last_error_line(logs[AGGREGATOR], layout.workspace(AGGREGATOR) / "logs" / f"{AGGREGATOR}.log")
                outcome.problems.append(f"aggregator (pid {agg.pid}) {describe_returncode(agg_rc)} after {done}/{total} "
                                        f"rounds{f': {cause}' if cause else ''}; last lines of {logs[AGGREGATOR]}:\n"
                                        f"{_tail(logs[AGGREGATOR])}")
                return
            if len(exited) == len(cols):  # the normal end: everyone got its quit signal
                outcome.ok = not outcome.dead
                if outcome.dead:
                    outcome.problems.append("finished without: " + "; ".join(outcome.dead.values()))
                return
            agg_exited_at = agg_exited_at or now
            if now - agg_exited_at > AGGREGATOR_EXIT_GRACE_S:
                lingering = [n for n in cols if n not in exited]
                outcome.problems.append(f"{', '.join(lingering)} still running {AGGREGATOR_EXIT_GRACE_S:g} s after "
                                        "the aggregator finished; stopped")
                return
        elif len(exited) == len(cols):
            if done < total:
                outcome.problems.append(f"no collaborator left after {done}/{total} rounds: "
                                        + ("; ".join(outcome.dead.values()) or "they all exited"))
                return
            if outcome.dead:
                # The aggregator would wait forever to send the dead collaborator its quit signal: stop it.
                outcome.problems.append(f"all {total} rounds finished without: " + "; ".join(outcome.dead.values()))
                return
            cols_exited_at = cols_exited_at or now
            if now - cols_exited_at > AGGREGATOR_EXIT_GRACE_S:
                outcome.problems.append(f"the aggregator (pid {agg.pid}) did not exit {AGGREGATOR_EXIT_GRACE_S:g} s "
                                        "after the last round and the collaborators' exit; stopped it")
                return
        if timeout_s is not None and now - begin > timeout_s:
            running = [n for n, p in processes.items() if p.popen.poll() is None]
            outcome.problems.append(f"timed out after {timeout_s:g} s with {done}/{total} rounds finished; "
                                    f"still running: {', '.join(running)}")
            return
        time.sleep(poll_s)


def _state(liveness: Liveness | None, name: str, outcome: Outcome, followers: dict[str, StatusFollower],
           collaborators: int | None = None) -> str:
    if name in outcome.frozen:
        return "FROZEN"
    if liveness is not None and liveness.state(name) in ("T", "t"):
        return "stopped"
    return followers[name].status.text(collaborators)


def _frozen(layout, processes, logs, outcome, liveness, exited, *, done, total, now, keep_going, say, stop) -> bool:
    """Name the parties that stopped answering; True if the run must end (as for a dead participant)."""
    running = [n for n, p in processes.items() if n not in exited and p.popen.poll() is None]
    liveness.observe(running, done, now)
    frozen = liveness.frozen(running, now, round_seconds(layout),
                             waiting_for_stragglers=keep_going and bool(outcome.dead))
    if not frozen:
        return False
    for name, why in frozen.items():
        outcome.frozen[name] = (f"{name} (pid {processes[name].pid}) stopped answering: {why}; during round "
                                f"{min(done, total - 1)} ({done}/{total} rounds finished); log: {logs[name]}")
        say(f"\n!! {outcome.frozen[name]}")
    stalled = AGGREGATOR in frozen or len(frozen) == len(running)
    if keep_going and not stalled and stop is not None:
        # As for a dead collaborator: stop it (a frozen one would hold its round until the straggler cutoff
        # and never take its quit signal), let the others finish, and fail naming it.
        for name in frozen:
            stop(processes[name])
            rc = processes[name].popen.poll()
            exited[name] = -9 if rc is None else rc  # -9: not reaped yet (e.g. in uninterruptible sleep)
            outcome.dead[name] = outcome.frozen[name] + "; stopped it"
        return False
    outcome.problems.append("stopped the federation: " + "; ".join(outcome.frozen[n] for n in frozen))
    return True
