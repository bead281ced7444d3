"""The demo's run (cifar10_PM.py, once its flags, folder and plan are checked): the rounds in one process, what it
shows while they run, and how it ends.

Every end is said in one line and recorded in the report folder's run record (run.json: its state, audit.run_states,
the rounds written and why it stopped), which the run index shows: finished; interrupted by Ctrl-C or SIGTERM (exit 130 / 143: the report drawing stops, no temp file
is left, the rounds written stay); failed on a disk fault (a full or read-only disk: exit 1, naming the file) or on
a step that returned a name it does not own (exit 1, naming the step and the name). A bad setting found only once
the run started exits 2, as the checks before it do.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Callable

from audit import FAILED, FINISHED, INTERRUPTED, RUNNING, RunInfo, StepContractError
from workspace.interrupts import DemoSignals, Interrupted

__all__ = ["run_demo", "CANCEL_DRAWING_S"]

# How long an interrupted run waits for the report worker to finish the page it is drawing (a second signal: not at
# all): what it writes is then complete, and the run index can be drawn by this thread after it.
CANCEL_DRAWING_S = 10.0


class _Run:
    """The run's state as it goes: the rounds written, counted here for the lines it prints, and how it ended, in
    the report folder's run.json (whose rounds written the in-process run keeps as each round ends)."""

    def __init__(self, report_dir: Path, rounds: int):
        self.report_dir, self.rounds, self.rounds_done = report_dir, rounds, 0
        self._write(lambda _earlier: RunInfo(RUNNING, rounds))

    def _write(self, update) -> None:
        from audit import write_run_file

        try:
            write_run_file(self.report_dir, update=update)
        except OSError:  # a disk fault: the run's own writes fail next, and say so
            pass

    def round_ended(self, round_num: int) -> None:
        self.rounds_done = max(self.rounds_done, min(round_num + 1, self.rounds))

    def end(self, state: str, reason: str | None, *, drawing_idle: bool) -> None:
        """Record how the run ended and draw the run index once more (only when the report worker is idle: matplotlib
        is used by one thread at a time)."""
        self._write(lambda info: info.ended(state, reason, self.rounds_done))
        if drawing_idle:
            from audit import write_index

            try:
                write_index(self.report_dir)
            except OSError:
                pass


def run_demo(args, *, names: list[str], run_dir: Path, plan: Path, overrides: dict, signals: DemoSignals,
             start: float, tensorboard: bool, run: Callable | None = None) -> int:
    """Run the federation of the checked flags and say how it ended; the exit code. `run`: the in-process runner
    (workspace.in_process.run_in_process; a test may wrap it)."""
    from audit import cancel_drawing, remove_unfinished_writes
    from src.data.datasets import DatasetUnavailableError
    from src.dataloader import clear_dataset_cache
    from workspace.demo_output import Progress, print_attack_summary, print_summary
    from workspace.in_process import run_in_process
    from workspace.run_summary import print_run_summary, run_account_lines
    from workspace.tutorial_outputs import write_tutorial_outputs

    run = run or run_in_process
    report_dir = args.report_dir
    state = _Run(report_dir, args.comm_round)
    progress = Progress(args.comm_round, args.collaborators, args.auditing_interval, enabled=not args.no_progress)

    def on_round_end(round_num, _logs):
        write_tutorial_outputs(report_dir, names)  # after each round: a crash keeps earlier rounds' files
        state.round_ended(round_num)
        progress.end_round()  # said once the round's reports are written

    pool_cached = [True]

    def on_task(col, phase, round_num):
        if pool_cached:
            # Every collaborator is built before its first task and holds views of its own sets in the loaders' one
            # array of the split's samples: the cache's reference to it is not needed any more.
            pool_cached.clear()
            clear_dataset_cache()
        progress.phase(col, phase, round_num)

    def written() -> str:
        done = state.rounds_done
        return (f"the reports of the {done} round{'s' if done != 1 else ''} written: {report_dir / 'index.html'}"
                if done else f"no round was written ({report_dir})")

    def failed(line: str, code: int) -> int:
        state.end(FAILED, line, drawing_idle=cancel_drawing(0 if signals.hurry else CANCEL_DRAWING_S))
        remove_unfinished_writes()
        print(f"error: {line}", file=sys.stderr)
        print(f"failed after {state.rounds_done} of {args.comm_round} rounds; {written()}", file=sys.stderr)
        return code

    try:
        with progress:
            result = run(run_dir, collaborators=args.collaborators, rounds=args.comm_round, overrides=overrides,
                         on_task=on_task, on_round_end=on_round_end,
                         on_audit_start=lambda col, round_num: progress.phase(col, "audit", round_num), check=False,
                         plan_path=plan)
    except Interrupted as stop:
        idle = cancel_drawing(0 if signals.hurry else CANCEL_DRAWING_S)
        remove_unfinished_writes()
        name = signal.Signals(stop.signum).name
        state.end(INTERRUPTED, name, drawing_idle=idle and not signals.hurry)
        remove_unfinished_writes()
        print(f"\ninterrupted ({name}) after {state.rounds_done} of {args.comm_round} rounds; {written()}",
              file=sys.stderr)
        return 128 + stop.signum
    except (DatasetUnavailableError, ValueError) as err:  # a setting only the run could check: it names the key
        return failed(str(err), 2)
    except StepContractError as err:  # a step that returned a name it does not own: the round was not sent
        return failed(str(err), 1)
    except OSError as err:  # a full or read-only disk, a file that cannot be written
        where = f" ({err.filename})" if getattr(err, "filename", None) else ""
        return failed(f"cannot write the reports: {err.strerror or err}{where}", 1)
    except BaseException as err:
        state.end(FAILED, f"{type(err).__name__}: {err}", drawing_idle=False)
        remove_unfinished_writes()
        raise
    write_tutorial_outputs(report_dir, names)
    state.end(FINISHED, None, drawing_idle=False)  # the in-process run drew the run index that says so

    print_summary(result)
    print_attack_summary(result.report_dir, names)
    print_run_summary({name: result.report_dir / name for name in names}, result.aggregator_report_dir,
                      args.comm_round)
    for line in run_account_lines(result.report_dir):
        print(line)
    print(f"\nfinished {args.comm_round} rounds in {time.perf_counter() - start:.1f}s")
    print(f"reports: {result.report_dir}  (open {result.report_dir / 'index.html'})")
    if result.aggregator_report_dir is not None:
        print(f"aggregator report (kept/withheld per round): {result.aggregator_report_dir / 'index.html'}")
    if tensorboard:  # src.process.metric_writer wrote event files: one run per party, tags named by metric
        from src.process.metric_writer import UNSMOOTHED_URL

        print(f"TensorBoard event files: tensorboard --logdir {run_dir / 'logs'}, then open {UNSMOOTHED_URL} "
              "(one run per party, privacy/<metric> tags overlay the parties; smoothing 0: the event files cannot "
              "set it)")
    return 0
