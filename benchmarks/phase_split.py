"""Where a cifar10_PM.py run spends its time and memory: a phase split for benchmarks/bench_tutorial_config.py.

Installed in the benchmark's child process before the script runs (`install(path)`), it wraps a few functions of
OpenFL and of this workspace by name, without changing what they do, and at exit writes to `path` (JSON) the seconds
spent in each phase, counted exclusively (a phase called inside another, e.g. the aggregator's end of round inside
the last collaborator's result sending, is taken out of the outer one), and the process's peak RSS (VmHWM) when each
phase first ended with a new peak. The same names exist in the working tree and in the revisions the benchmark
compares with, so both get the same split. Overhead: two clock reads per wrapped call (a few hundred per round).

Phases:
- train: OpenFL's PyTorchTaskRunner.train_task (the local epochs);
- audit: audit.round_audit.audit_round as the task runner calls it (every enabled step, both models), and the
  signals the task runner computes ahead of it (the received model's, during its validation);
- validation: the validate tasks (the task runner's validate_task);
- reports: the collaborators' reports (ReportWriter.write_round), the aggregator's report callback and the
  tutorial's copies of the plots;
- checkpoint: the aggregator's model save (Aggregator._save_model: protobuf of the model, written to disk);
- end of round: the rest of Aggregator._end_of_round_check (aggregation, metrics, TensorDB clean-up, callbacks);
- communication: the rest of the tensors' way between the parties (Collaborator.get_data_for_tensorkey and
  send_task_results: codecs, named-tensor protobufs, the aggregator's processing of what it receives);
- task other: the rest of Collaborator.do_task (e.g. the copies the train task makes of the received model);
- setup: from install to the first task (imports, data, building the parties).
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import time

_PHASES = {
    # phase: [(module, attribute path)]
    "train": [("openfl.federated.task.runner_pt", "PyTorchTaskRunner.train_task")],
    "audit": [("audit.party_audit", "audit_round"),
              # signals computed ahead of the audit (the received model's, while it is validated)
              ("audit.membership.signal_cache", "compute_signals")],
    "validation": [("src.taskrunner", "AuditedTaskRunner.validate_task")],
    "reports": [("audit.reporting.party", "ReportWriter.write_round"),
                ("src.aggregator", "AggregatorReportCallback.on_round_end"),
                ("workspace.tutorial_outputs", "write_tutorial_outputs")],
    "checkpoint": [("openfl.component.aggregator.aggregator", "Aggregator._save_model")],
    "end of round": [("openfl.component.aggregator.aggregator", "Aggregator._end_of_round_check")],
    "communication": [("openfl.component.collaborator.collaborator", "Collaborator.get_data_for_tensorkey"),
                      ("openfl.component.collaborator.collaborator", "Collaborator.send_task_results")],
    "task other": [("openfl.component.collaborator.collaborator", "Collaborator.do_task")],
}

_seconds: dict[str, float] = {}
_calls: dict[str, int] = {}
_peaks: list[tuple[str, float]] = []  # (phase, VmHWM GB) each time the peak grew at a phase's end
_stack: list[list[float]] = []  # per active phase: [start, seconds of nested phases]
_state = {"start": time.perf_counter(), "first_task": None, "peak": 0.0}


def _peak_rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e9
    return 0.0


def _timed(phase: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _state["first_task"] is None and phase == "task other":
            _state["first_task"] = time.perf_counter()
        frame = [time.perf_counter(), 0.0]
        _stack.append(frame)
        try:
            return fn(*args, **kwargs)
        finally:
            _stack.pop()
            total = time.perf_counter() - frame[0]
            _seconds[phase] = _seconds.get(phase, 0.0) + total - frame[1]
            _calls[phase] = _calls.get(phase, 0) + 1
            if _stack:
                _stack[-1][1] += total
            peak = _peak_rss_gb()
            if peak > _state["peak"] + 0.01:
                _state["peak"] = peak
                _peaks.append((phase, round(peak, 3)))
    wrapper.__phase_wrapped__ = True
    return wrapper


def _wrap(module_name: str, path: str, phase: str) -> bool:
    try:
        owner = importlib.import_module(module_name)
    except ImportError:
        return False
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent, None)
        if owner is None:
            return False
    fn = getattr(owner, name, None)
    if fn is None or getattr(fn, "__phase_wrapped__", False):
        return False
    setattr(owner, name, _timed(phase, fn))
    return True


def install(out_path: str) -> None:
    """Wrap every phase's functions (the workspace must be on sys.path) and write the split to out_path at exit."""
    wrapped = {phase: [f"{m}:{p}" for m, p in targets if _wrap(m, p, phase)] for phase, targets in _PHASES.items()}

    def dump():
        end = time.perf_counter()
        first = _state["first_task"] or end
        split = dict(_seconds)
        split["setup"] = first - _state["start"]
        json.dump({"seconds": split, "calls": _calls, "wall_s": end - _state["start"], "peaks": _peaks,
                   "peak_rss_gb": _peak_rss_gb(), "wrapped": wrapped}, open(out_path, "w"), indent=1)

    atexit.register(dump)
