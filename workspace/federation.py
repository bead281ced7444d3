"""Start a prepared local federation (`fx aggregator start`, `fx collaborator start -n NAME`) and watch it.

Each participant is a separate process in its own process group, started in its own workspace folder, with
its console output in <workspace>/logs/<name>.console.log and OpenFL's plain log in <workspace>/logs/<name>.log.
The watcher reads the aggregator's metrics log for progress and the processes' exit codes for failures:

- every collaborator exits 0 after its quit signal and the aggregator exits 0 after the last round: success;
- a participant dies (non-zero exit, killed): by default everything is stopped at once and the run fails
  naming it; with keep_going the surviving collaborators go on (the plan's straggler policy ends each round
  without the dead one) and the run still fails, naming it, once they are done. OpenFL's aggregator itself
  never exits in that case (it waits to send the dead collaborator its quit signal), so it is stopped;
- the optional overall timeout stops everything and names what was still running.
Every process started is stopped by process group whatever happens (including Ctrl-C, handled by the CLI).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from workspace.prepare import AGGREGATOR, FederationLayout, SetupError
from workspace.processes import ProcessRegistry, Started, describe_returncode, fx_environment, fx_executable
from workspace.progress import ProgressLine, rounds_done
from workspace.run_plan import port_is_free

AGGREGATOR_EXIT_GRACE_S = 30.0  # OpenFL's server checks every 5 s whether every collaborator got its quit signal


@dataclass
class Outcome:
    ok: bool
    rounds_done: int
    rounds: int
    seconds: float
    problems: list[str] = field(default_factory=list)
    dead: dict[str, str] = field(default_factory=dict)
    reports: dict[str, Path] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    round_seconds: list[float] = field(default_factory=list)  # the aggregator's elapsed_seconds per round


def metrics_file(layout: FederationLayout) -> Path:
    return layout.workspace(AGGREGATOR) / "logs" / "aggregator_metrics.txt"


def report_locations(layout: FederationLayout) -> dict[str, Path]:
    reports = {AGGREGATOR: layout.workspace(AGGREGATOR) / layout.aggregator_report_dir}
    for name in layout.collaborators:
        reports[name] = layout.workspace(name) / layout.collaborator_report_dir / name
    return reports


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


def check_fresh(layout: FederationLayout) -> None:
    """A prepared folder runs once: nothing in it may carry state from an earlier start."""
    if layout.status != "prepared":
        raise SetupError(f"{layout.root} was already started (status {layout.status!r}); prepare a fresh folder "
                         "so that no participant picks up an earlier run's state")
    leftovers = [p for p in (layout.workspace(AGGREGATOR) / "local_state" / "tensor.db", metrics_file(layout))
                 if p.exists()]
    leftovers += [p for p in report_locations(layout).values() if p.exists()]
    if leftovers:
        raise SetupError(f"{layout.root} holds state of an earlier run: {[str(p) for p in leftovers]}")


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no output)"
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def start(layout: FederationLayout, *, registry: ProcessRegistry, timeout_s: float | None = None,
          keep_going: bool = False, say: Callable[[str], None] = print, progress: ProgressLine | None = None,
          poll_s: float = 0.25) -> Outcome:
    check_fresh(layout)
    if not port_is_free(layout.port):
        raise SetupError(f"port {layout.port} (network.settings.agg_port) is in use on 127.0.0.1; prepare again "
                         "for a new free port, or stop what listens there")
    fx = str(fx_executable())
    begin = time.monotonic()
    total = layout.rounds
    processes: dict[str, Started] = {}
    logs: dict[str, Path] = {}
    outcome = Outcome(ok=False, rounds_done=0, rounds=total, seconds=0.0, reports=report_locations(layout), logs=logs)

    def launch(name: str, args: list[str]) -> None:
        ws = layout.workspace(name)
        logs[name] = ws / "logs" / f"{name}.console.log"
        processes[name] = registry.start(name, [fx, *args], cwd=ws, log_path=logs[name],
                                         env=fx_environment(f"logs/{name}.log"))

    layout.status = "running"
    layout.save()
    try:
        launch(AGGREGATOR, ["aggregator", "start"])
        for name in layout.collaborators:  # they retry every client_reconnect_interval until the server is up
            launch(name, ["collaborator", "start", "-n", name])
        layout.extra["pids"] = {name: p.pid for name, p in processes.items()}
        layout.save()
        say("started " + ", ".join(f"{name} (pid {p.pid})" for name, p in processes.items()))
        _watch(layout, processes, logs, outcome, total=total, timeout_s=timeout_s, keep_going=keep_going, say=say,
               progress=progress, poll_s=poll_s, begin=begin)
    finally:
        still_running = registry.stop_all()
        if progress is not None:
            progress.finish()
        outcome.seconds = time.monotonic() - begin
        outcome.rounds_done = rounds_done(metrics_file(layout))
        outcome.round_seconds = round_seconds(layout)
        layout.status = "finished" if outcome.ok else "failed"
        layout.extra["stopped_by_tooling"] = still_running
        layout.extra["problems"] = outcome.problems
        layout.save()
    return outcome


def _watch(layout, processes, logs, outcome, *, total, timeout_s, keep_going, say, progress, poll_s, begin):
    agg = processes[AGGREGATOR]
    cols = {n: processes[n] for n in layout.collaborators}
    exited: dict[str, int] = {}
    agg_exited_at = cols_exited_at = None
    while True:
        done = rounds_done(metrics_file(layout))
        for name, proc in cols.items():
            rc = proc.popen.poll()
            if rc is None or name in exited:
                continue
            exited[name] = rc
            if rc != 0:
                outcome.dead[name] = (f"{name} (pid {proc.pid}) {describe_returncode(rc)} during round "
                                      f"{min(done, total - 1)} ({done}/{total} rounds finished); log: {logs[name]}")
                say(f"\n!! {outcome.dead[name]}")
        agg_rc = agg.popen.poll()
        if progress is not None:
            states = {AGGREGATOR: "up" if agg_rc is None else describe_returncode(agg_rc)}
            states.update({n: ("up" if n not in exited else "done" if exited[n] == 0 else "DEAD") for n in cols})
            progress.update(min(done, total), total, states)
        now = time.monotonic()

        if outcome.dead and not keep_going:
            outcome.problems.append("stopped the federation because a participant died: "
                                    + "; ".join(outcome.dead.values()))
            return
        if agg_rc is not None:
            if agg_rc != 0 or done < total:
                outcome.problems.append(f"aggregator (pid {agg.pid}) {describe_returncode(agg_rc)} after {done}/{total} "
                                        f"rounds; last lines of {logs[AGGREGATOR]}:\n{_tail(logs[AGGREGATOR])}")
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
