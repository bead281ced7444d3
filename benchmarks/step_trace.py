"""What a cifar10_PM.py run holds at its memory peaks: a step trace for benchmarks/bench_tutorial_config.py --trace.

Installed by phase_split in the benchmark's child process (BENCH_STEP_TRACE=1), it wraps the audit's steps and
sub-steps, the task runner's tasks and OpenFL's collaborator and aggregator calls by name (without changing what
they do) and records at each one's entry and exit the RSS, glibc's mallinfo2 (bytes in use, of them mmapped, and
free but kept), and the largest RSS since the previous record with the Python stack of the main thread at that
moment: a thread reads the RSS (/proc/self/statm) every few milliseconds, so a transient of a few milliseconds can
be missed, and VmHWM is left to phase_split. Written as JSON at exit, beside the phase split; then

    .venv/bin/python benchmarks/step_trace.py DIR/reports_6000_0.trace.json   # the largest transients, with stacks

prints the intervals whose peak rose most above the RSS at their start.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import importlib
import json
import os
import sys
import threading
import time
import traceback

# (module, attribute path): what is recorded at entry and exit
TARGETS = [
    ("openfl.component.collaborator.collaborator", "Collaborator.do_task"),
    ("openfl.component.collaborator.collaborator", "Collaborator.get_data_for_tensorkey"),
    ("openfl.component.collaborator.collaborator", "Collaborator.send_task_results"),
    ("src.collaborator", "AuditingCollaborator.send_task_results"),
    ("openfl.component.aggregator.aggregator", "Aggregator._end_of_round_check"),
    ("openfl.federated.task.runner_pt", "PyTorchTaskRunner.train_task"),
    ("openfl.federated.task.runner_pt", "PyTorchTaskRunner.rebuild_model"),
    ("src.taskrunner", "AuditedTaskRunner.validate_task"),
    ("src.taskrunner", "AuditedTaskRunner.validate_"),
    ("src.runner.shared_received_model", "SharedReceivedModel.__init__"),
    ("src.runner.shared_received_model", "SharedReceivedModel.check_unchanged"),
    ("src.taskrunner", "release_freed_memory"),
    ("audit.party_audit", "PartyAudit.before_training"),
    ("audit.party_audit", "PartyAudit.after_training"),
    ("audit.party_audit", "run_gate"),
    ("audit.party_audit", "audit_round"),
    ("audit.before_training", "ReceivedVerdict.remember"),
    ("audit.party_mitigation", "PartyMitigation.update"),
    ("audit.membership.step", "run"),
    ("audit.membership.rmia_step", "run"),
    ("audit.membership.rmia_step", "_references"),
    ("audit.membership.references", "train_references"),
    ("audit.training", "TrainedCopies.logits"),
    ("audit.training", "_SpilledCopies.read"),
    ("audit.training", "_SpilledCopies.append"),
    ("audit.membership.signal_cache", "SignalCache.signals"),
    ("audit.membership.signal_cache", "compute_signals"),
    ("audit.fidel.step", "run"),
    ("audit.deanon.step", "run"),
    ("audit.canary.step", "run"),
]

_events: list[dict] = []
_depth = [0]
_sample = {"max": 0.0, "stack": None}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        return libc.mallinfo2
    except (OSError, AttributeError):  # not glibc
        return None


_MALLINFO = _mallinfo()


def _rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e9


def _sampler(main: int) -> None:
    while True:
        rss = _rss_gb()
        if rss > _sample["max"]:
            frame = sys._current_frames().get(main)
            stack = [f"{f.filename.split('/site-packages/')[-1]}:{f.lineno}:{f.name}"
                     for f in (traceback.extract_stack(frame) if frame is not None else [])]
            _sample["max"], _sample["stack"] = rss, [s for s in stack if "step_trace" not in s][-8:]
        time.sleep(0.003)


def _record(label: str, what: str) -> None:
    entry = {"t": round(time.perf_counter(), 2), "depth": _depth[0], "label": label, "what": what,
             "rss_gb": round(_rss_gb(), 3), "peak_gb": round(max(_sample["max"], _rss_gb()), 3),
             "stack": _sample["stack"]}
    if _MALLINFO is not None:
        info = _MALLINFO()
        entry.update(malloc_in_use_gb=round((info.uordblks + info.hblkhd) / 1e9, 3),
                     malloc_mmapped_gb=round(info.hblkhd / 1e9, 3), malloc_free_kept_gb=round(info.fordblks / 1e9, 3))
    _events.append(entry)
    _sample["max"], _sample["stack"] = 0.0, None


def _traced(label: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _record(label, "enter")
        _depth[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _depth[0] -= 1
            _record(label, "exit")
    return wrapper


def install(out_path: str) -> list[str]:
    """Wrap every target that exists in the code under test; write the records to out_path at exit."""
    wrapped = []
    for module_name, path in TARGETS:
        try:
            owner = importlib.import_module(module_name)
        except ImportError:
            continue
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent, None)
        fn = getattr(owner, name, None) if owner is not None else None
        if fn is None or isinstance(owner, type) and name not in vars(owner):  # inherited: traced where defined
            continue
        setattr(owner, name, _traced(f"{module_name.rsplit('.', 1)[-1]}.{path}", fn))
        wrapped.append(f"{module_name}:{path}")
    threading.Thread(target=_sampler, args=(threading.main_thread().ident,), daemon=True).start()
    atexit.register(_write, out_path, wrapped)
    return wrapped


def _write(out_path: str, wrapped: list[str]) -> None:
    """The records so far, written whole (a copy of the list: the sampler thread may still append to it; a file
    that a crash cut would not parse)."""
    events = list(_events)
    with open(f"{out_path}.tmp", "w") as f:
        json.dump({"wrapped": wrapped, "events": events}, f)
    os.replace(f"{out_path}.tmp", out_path)


def largest_transients(events: list[dict], top: int = 12) -> list[dict]:
    """The intervals between consecutive records whose peak rose most above the RSS at their start."""
    found = [{"rise_gb": round(e["peak_gb"] - p["rss_gb"], 3), "peak_gb": e["peak_gb"],
              "from": f"{p['label']} {p['what']}", "to": f"{e['label']} {e['what']}", "stack": e.get("stack") or []}
             for p, e in zip(events, events[1:])]
    return sorted(found, key=lambda f: -f["rise_gb"])[:top]


if __name__ == "__main__":
    for path in sys.argv[1:]:
        events = json.load(open(path))["events"]
        print(f"{path}: {len(events)} records, largest RSS {max(e['peak_gb'] for e in events):.2f} GB")
        for f in largest_transients(events):
            print(f"  +{f['rise_gb']:.2f} GB to {f['peak_gb']:.2f}, from {f['from']} to {f['to']}")
            for line in f["stack"][-4:]:
                print(f"      {line}")
