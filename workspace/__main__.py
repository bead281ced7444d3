"""`python -m workspace`: a real multi-process OpenFL federation on this machine (docs/deployment.md).

    python -m workspace run --collaborators 3 --rounds 3      # prepare + start
    python -m workspace prepare --dir runs/x ...              # workspaces and certificates only
    python -m workspace start --dir runs/x                    # start a prepared folder (once)
    python -m workspace verdict runs/x                        # the run's record (run.json), one line per party

Exit codes: 0 finished, 1 the federation failed (a participant died, timeout), 2 bad options or set-up
failure, 130 interrupted (Ctrl-C) / 143 terminated; every process started is stopped in all cases. `verdict` has
its own (workspace/run_verdict.py: 0 within the plan's limits, 1 beyond them, 2 no run record, 3 incomplete). The first
Ctrl-C (or SIGTERM) stops all queued work at once and the interrupted step cleans up what it made (`prepare`
removes its folder; `start` stops every participant and records how the run ended in federation.json); further
signals only hasten that (every participant killed at once). One command at a time per folder (run_lock).

`workspace/` has no __init__.py on purpose (fx imports its own `workspace` command module by bare name with
the workspace folder first on sys.path); `python -m` runs this file in the namespace package all the same.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from workspace.arguments import SuggestingParser
from workspace.plan_file import WORKSPACE_ROOT

if str(WORKSPACE_ROOT) not in sys.path:  # src.server.settings, audit.reporting.atomic_io
    sys.path.insert(0, str(WORKSPACE_ROOT))

from workspace.federation import stale_state, start  # noqa: E402
from workspace.federation_state import AGGREGATOR, STATE_FILE, FederationLayout, SetupError  # noqa: E402
from workspace.interrupts import Interrupted, Redelivery, in_import  # noqa: E402
from workspace.prepare import prepare  # noqa: E402
from workspace.processes import FxNotFoundError, ProcessRegistry  # noqa: E402
from workspace.run_lock import FolderBusyError, FolderLock  # noqa: E402
from workspace.progress import DEFAULT_LIVENESS_S, MIN_LIVENESS_S, ProgressLine  # noqa: E402
from workspace.run_plan import merge_overrides  # noqa: E402
from workspace.run_summary import print_run_summary, run_account_lines  # noqa: E402


def interrupt_handler(registry: ProcessRegistry):
    """The SIGINT/SIGTERM handler: the first signal cancels the registry (no process starts, every queued job is
    dropped) and raises Interrupted in the main thread, whose handlers clean up (during an import, once it is done:
    workspace.interrupts.in_import); a signal that comes while the tooling winds down anyway (that clean-up, a failed
    set-up's, the end of a run) never interrupts it: it only hastens it (ProcessRegistry.hurry: every process killed
    at once). `handler.redelivery` (workspace.interrupts.Redelivery) is closed by whoever removes the handler."""
    def handler(signum, frame):
        if registry.launching:  # inside a fork's hooks: raised here, the exception would be dropped
            registry.defer(signum)
            return
        first = registry.interrupted_by is None and not registry.winding_down
        if first and in_import(frame):  # handed to this handler again, whole, once the import is done
            redelivery.later(signum)
            return
        registry.cancel()
        if first:
            registry.interrupted_by = signum
            registry.winding_down = True
            raise Interrupted(signum)
        registry.interrupted_by = registry.interrupted_by or signum
        registry.hurry()
    redelivery = Redelivery()
    redelivery.handler = handler
    handler.redelivery = redelivery
    return handler


def _liveness_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value == 0 or MIN_LIVENESS_S <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected 0 (no liveness check) or seconds >= {MIN_LIVENESS_S:g}, "
                                         f"got {text!r}")
    return value


def _whole_number(minimum: int, what: str = ""):
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}{what}, got {text!r}")
        return value
    return convert


def _rounds(text: str) -> int:
    value = _whole_number(1)(text)
    from src.plan.bounds import MAX_ROUNDS

    if value > MAX_ROUNDS:  # the bound by the plan's tasks and this machine's memory is checked with the plan
        raise argparse.ArgumentTypeError(f"{value:,} rounds; at most {MAX_ROUNDS:,}, got {text!r}")
    return value


def _port_number(text: str) -> int:
    try:
        return int(text)  # the range (and whether it is free) is prepare's check_port, for every caller
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port, a whole number in 1..65535, got {text!r}") from None


def _timeout_seconds(text: str) -> float:
    try:
        return float(text)  # > 0 is checked in main, which names --timeout with the value
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0 (leave it out for no limit), "
                                         f"got {text!r}") from None


class Parser(SuggestingParser):
    """Errors in one line that names the flag and the value (argparse's usage block is --help's), with the nearest
    choices of an unknown one (a subcommand)."""

    def error(self, message):
        self.exit(2, f"error: {message}  (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m workspace", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def setup_options(p):
        p.add_argument("--collaborators", type=_whole_number(1), default=3, help="number of collaborators (default 3)")
        p.add_argument("--rounds", type=_rounds, default=3, help="rounds to train (default 3)")
        p.add_argument("--dir", type=Path, default=None, help="run folder (default runs/<timestamp>); must be new or empty")
        p.add_argument("--no-tls", action="store_true",
                       help="plain gRPC, no certificates (debugging only): anyone who reaches the port may join; "
                            "a warning every round")
        p.add_argument("--no-client-auth", action="store_true",
                       help="allow a plan with network.settings.require_client_auth: false (TLS without client "
                            "certificates): anyone who reaches the port may claim a collaborator's name; a warning "
                            "every round")
        p.add_argument("--poll-interval", type=_whole_number(1, " (seconds)"), default=None, metavar="SECONDS",
                       help="aggregator.settings.poll_interval_s: how long an idle collaborator waits before asking again")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="plan override, dotted key and YAML value, e.g. --set tasks.train.kwargs.epochs=1 (repeatable)")
        p.add_argument("--port", type=_port_number, default=None,
                       help="aggregator port on 127.0.0.1 (default: a free one)")
        p.add_argument("--plan", type=Path, default=WORKSPACE_ROOT / "plan" / "plan.yaml", help="base plan")

    def start_options(p):
        p.add_argument("--timeout", type=_timeout_seconds, default=None, metavar="SECONDS",
                       help="stop everything and fail after this long (default: no limit)")
        p.add_argument("--keep-going", action="store_true",
                       help="if a collaborator dies, let the others finish (the plan's straggler policy ends each "
                            "round without it); the run still fails, naming it")
        p.add_argument("--liveness", type=_liveness_seconds, default=DEFAULT_LIVENESS_S, metavar="SECONDS",
                       help="a participant that shows no progress (no log line, no CPU use) for SECONDS while "
                            "stopped or while rounds end without it, or every party when nothing moves for "
                            "max(SECONDS, 3 x the slowest round so far), is named and the run ends as for a dead "
                            f"one (default {DEFAULT_LIVENESS_S:g}; 0: no liveness check)")

    setup_options(run := sub.add_parser("run", help="prepare and start a federation"))
    start_options(run)
    setup_options(sub.add_parser("prepare", help="make the workspaces and certificates only"))
    start_options(st := sub.add_parser("start", help="start a prepared federation folder (once)"))
    st.add_argument("--dir", type=Path, required=True, help="a folder made by `prepare`")
    verdict = sub.add_parser("verdict", help="print a run's record (run.json) per party; exit 1 if a party is "
                                             "beyond the plan's limits (usable as a CI step)")
    verdict.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                         help="the run's report folder: the demo's --log_dir, a run's folder, an fx reports/")
    verdict.add_argument("--fail-on-leak", action="store_true",
                         help="also exit 1 when a party's final model has a leak detected (without a limit set)")
    return parser


def default_run_dir() -> Path:
    base = WORKSPACE_ROOT / "runs" / time.strftime("%Y%m%d-%H%M%S")
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def print_reports(outcome_or_layout, say=print) -> None:
    from workspace.federation import report_locations

    reports = outcome_or_layout.reports if hasattr(outcome_or_layout, "reports") else report_locations(outcome_or_layout)
    say("reports (each party's own folder):")
    for name, path in reports.items():
        page = path / "index.html"
        say(f"  {name:<14} {page if page.exists() else path}{'' if path.exists() else '  (none written)'}")


def _rounds_said(layout) -> str:
    """" after N of M rounds" for a started federation (the rounds its aggregator finished), else nothing."""
    if layout is None or layout.status not in ("running", "interrupted"):
        return ""
    from workspace.federation import metrics_file
    from workspace.progress import rounds_done

    return f" after {min(rounds_done(metrics_file(layout)), layout.rounds)} of {layout.rounds} rounds"


def main(argv=None, *, exiting: bool = False) -> int:
    """The command line; `exiting` (the CLI): the process ends after this, so the signal handlers stay in place (a
    late signal then only hastens the exit, instead of killing it with the default action and another exit code);
    otherwise the caller's handlers come back."""
    args = build_parser().parse_args(argv)
    if args.command == "verdict":  # reads a file: no process to start or stop
        from workspace.run_verdict import verdict

        return verdict(args.run_dir, fail_on_leak=args.fail_on_leak, err=lambda line: print(line, file=sys.stderr))
    registry = ProcessRegistry()
    lock = layout = None
    handler = interrupt_handler(registry)
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if getattr(args, "timeout", None) is not None and not args.timeout > 0:  # also NaN
            raise SetupError(f"--timeout {args.timeout:g}: must be a number of seconds > 0 (leave it out for no limit)")
        if args.command in ("run", "prepare"):
            if args.dir is not None and (args.dir / STATE_FILE).is_file():  # a folder a killed tooling left behind
                stale = stale_state(FederationLayout.load(args.dir))
                if stale:
                    raise SetupError(stale)
            overrides = list(args.overrides)
            if args.poll_interval is not None:
                overrides.append(f"aggregator.settings.poll_interval_s={args.poll_interval}")
            run_dir = (args.dir or default_run_dir()).resolve()
            lock = FolderLock(run_dir)  # taken by prepare before it writes anything there; held through `run`
            layout = prepare(run_dir, collaborators=args.collaborators, rounds=args.rounds,
                             use_tls=not args.no_tls, client_auth=not args.no_client_auth, port=args.port,
                             overrides=merge_overrides(overrides), base_plan=args.plan, registry=registry, lock=lock)
            if args.command == "prepare":
                print(f"prepared {layout.root}; start it with: python -m workspace start --dir {layout.root}")
                return 0
        else:
            FederationLayout.load(args.dir)  # a prepared folder (no lock file is made in any other)
            lock = FolderLock(args.dir.resolve()).acquire()  # before anything is started: one run per folder
            layout = FederationLayout.load(args.dir)  # as it is now that no other command can change it
        outcome = start(layout, registry=registry, timeout_s=args.timeout, keep_going=args.keep_going,
                        progress=ProgressLine(), liveness_s=args.liveness)
        for problem in outcome.problems:
            print(f"error: {problem}", file=sys.stderr)
        status = "finished" if outcome.ok else "FAILED"
        print(f"federation {status}: {outcome.rounds_done}/{outcome.rounds} rounds in {outcome.seconds:.1f} s "
              f"({layout.root})")
        if outcome.round_seconds:
            print("aggregator's seconds per round: " + ", ".join(f"{s:.1f}" for s in outcome.round_seconds))
        # The rounds the aggregator finished: a failed run's unfinished rounds are not "kept (not audited)".
        print_run_summary({name: path for name, path in outcome.reports.items() if name != AGGREGATOR},
                          outcome.reports.get(AGGREGATOR), min(outcome.rounds_done, outcome.rounds))
        for line in run_account_lines(layout.root):
            print(line)
        print_reports(outcome)
        print(f"run index (every party's page and the aggregator's): {outcome.run_index}")
        return 0 if outcome.ok else 1
    except (Interrupted, InterruptedError) as caught:
        # A handler's exception raised while Python runs a finaliser or a GC callback is printed and dropped; the
        # cancelled registry then refuses the next start with InterruptedError: the same interruption.
        if not isinstance(caught, Interrupted) and registry.interrupted_by is None:
            raise
        stop = caught if isinstance(caught, Interrupted) else Interrupted(registry.interrupted_by)
        registry.stop_all()  # a further signal only hastens this (interrupt_handler)
        stopped = registry.stopped_running
        print(f"\ninterrupted ({stop}){_rounds_said(layout)}; stopped {len(stopped)} running process(es): "
              f"{', '.join(stopped) or '-'}", file=sys.stderr)
        return 128 + stop.signum
    except (SetupError, ValueError, FxNotFoundError, TimeoutError, FolderBusyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full or read-only disk before the participants started
        where = f" {err.filename}" if getattr(err, "filename", None) else ""
        print(f"error: cannot write{where}: {err.strerror or err}", file=sys.stderr)
        return 2
    finally:
        registry.winding_down = True
        registry.stop_all()
        if lock is not None:
            lock.release()
        if not exiting:
            for s, earlier in previous.items():
                signal.signal(s, earlier)
            handler.redelivery.close()


if __name__ == "__main__":
    code = main(exiting=True)
    # Everything is stopped, written and recorded: a late signal must not kill the exit with another code, and the
    # interpreter's teardown of what the checks imported (torch, OpenFL, pandas: seconds of freeing objects) is
    # skipped, so that an interrupted command ends as soon as its clean-up is done.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
