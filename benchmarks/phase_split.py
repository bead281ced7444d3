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

Per round and phase: the process's peak RSS while each phase ran (exclusive, as the seconds: a phase nested in
another has its own peak; "between": outside every phase), the high-water mark (VmHWM) reset to the current RSS
(/proc/self/clear_refs, Linux >= 4.0) whenever a phase starts or ends, so a round's train and audit peaks are their
own, not the run's so far. Rounds are the aggregator's: a
round ends when its end-of-round check moves the round number on. A reset also lowers what the kernel reports as the
process's ru_maxrss at exit, so the run's peak (`peak_rss_gb`) is the largest the split saw.

With BENCH_CENSUS=1 in the environment, at the end of each audit and of each round, the live torch tensors (by
storage, each counted once) and numpy arrays that garbage collection can see (and those inside object arrays, e.g.
a pandas frame's column) are summed and grouped by what holds them (the attribute or key path from the nearest
object of a class of ours), with each OpenFL TensorDB's arrays and the aggregator's best and last model, beside
glibc's malloc statistics (mallinfo2: bytes in use, and bytes free but kept by the allocator): written as
"census" (slow: seconds a call; for finding what stays across rounds, not for timing). Arrays held in dicts and
tuples that gc does not track (it stops tracking a container of untracked objects only: a {name: array} tensor
dict, a TensorDB's row tuples) are found by looking inside such containers. Beside it: the process's anonymous
memory page by page against the buffers found ("mappings": copies of them no census reaches, malloc's own mmapped
blocks that hold none of them, zero pages, the rest), the tensors that keep an autograd graph, and bytes objects of
1 MB or more; each entry also goes to stderr as it is taken (a line starting "CENSUS "). BENCH_TRACEMALLOC=1 adds
tracemalloc's total and what grew most since the previous census (Python objects and numpy data; slows the audit
tens of times).
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
                      ("openfl.component.collaborator.collaborator", "Collaborator.send_task_results"),
                      # the plan's collaborator sends by its own method (a revision without it inherits the one above)
                      ("src.collaborator", "AuditingCollaborator.send_task_results")],
    "task other": [("openfl.component.collaborator.collaborator", "Collaborator.do_task")],
}

_seconds: dict[str, float] = {}
_calls: dict[str, int] = {}
_peaks: list[tuple[str, float]] = []  # (phase, VmHWM GB) each time the peak grew at a phase's end
_stack: list[list[float]] = []  # per active phase: [start, seconds of nested phases]
_state = {"start": time.perf_counter(), "first_task": None, "peak": 0.0}
_round = {"number": 0, "resets": True}
_round_peaks: list[dict] = [{}]  # per round: {phase: peak GB while that phase ran in the round}
_census: list[dict] = []


def _status_gb(field: str) -> float:
    """A size of this process from /proc/self/status (VmHWM: the peak RSS, VmRSS: the RSS now), GB; 0 if absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e9
    return 0.0


def _peak_rss_gb() -> float:
    return _status_gb("VmHWM")


def _reset_peak() -> bool:
    """VmHWM back to the current RSS (write 5 to /proc/self/clear_refs); False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _close_interval(phase: str) -> None:
    """The peak since the last reset belongs to `phase` of the current round; then reset for the next interval."""
    peak = round(_peak_rss_gb(), 3)
    _state["peak"] = max(_state["peak"], peak)
    current = _round_peaks[-1]
    current[phase] = max(current.get(phase, 0.0), peak)
    _round["resets"] = _reset_peak() and _round["resets"]


_TRIM = __import__("os").environ.get("BENCH_MALLOC_TRIM") == "1"


def _trim() -> None:
    """glibc's malloc_trim(0): the free memory malloc keeps goes back to the system (a diagnostic: BENCH_MALLOC_TRIM=1
    trims after every train and audit, to see how much of a round's growth is memory freed but kept)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _timed(phase: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _state["first_task"] is None and phase == "task other":
            _state["first_task"] = time.perf_counter()
            _state["setup_peak"] = round(_peak_rss_gb(), 3)
            _round["resets"] = _reset_peak()
        tracking = _state["first_task"] is not None
        if tracking:  # the peak so far was the enclosing phase's (or the gap's)
            _close_interval(_stack[-1][2] if _stack else "between")
        aggregator = args[0] if phase == "end of round" and args else None
        round_before = getattr(aggregator, "round_number", None)
        frame = [time.perf_counter(), 0.0, phase]
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
            peak = max(_peak_rss_gb(), _state["peak"])
            if peak > _state["peak"] + 0.01:
                _peaks.append((phase, round(peak, 3)))
            if round_before is not None and getattr(aggregator, "round_number", round_before) != round_before:
                _round["advance"] = True
            if tracking:
                _close_interval(phase)
                if _TRIM and phase in ("train", "audit"):
                    _trim()
                if phase == "audit" and _census_on() and not any(f[2] == "audit" for f in _stack):
                    _census.append({"round": _round["number"], "at": "audit end", **census()})
                    _show(_census[-1])
                if not _stack and _round.pop("advance", False):
                    if _census_on():
                        _census.append({"round": _round["number"], "at": "round end", **census()})
                        _show(_census[-1])
                    _round["number"] += 1
                    _round_peaks.append({})
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
    if __import__("os").environ.get("BENCH_STEP_TRACE") == "1":  # what the peaks hold (benchmarks/step_trace.py)
        import step_trace

        step_trace.install(out_path.removesuffix(".phases.json") + ".trace.json")

    def dump():
        end = time.perf_counter()
        first = _state["first_task"] or end
        split = dict(_seconds)
        split["setup"] = first - _state["start"]
        if _state["first_task"] is not None:
            _close_interval("after")
        rounds = [r for r in _round_peaks if r]
        overall = max([_state["peak"], _state.get("setup_peak", 0.0), _peak_rss_gb()]
                      + [p for r in rounds for p in r.values()])
        json.dump({"seconds": split, "calls": _calls, "wall_s": end - _state["start"], "peaks": _peaks,
                   "peak_rss_gb": overall, "setup_peak_gb": _state.get("setup_peak"), "round_peaks": rounds,
                   "peak_resets": _round["resets"], "census": _census, "wrapped": wrapped},
                  open(out_path, "w"), indent=1)

    atexit.register(dump)


def _show(entry: dict) -> None:
    """One census entry on stderr as it is taken (the run's output file), less its holders' list."""
    import sys

    print("CENSUS " + json.dumps({k: v for k, v in entry.items() if k != "by_holder"}), file=sys.stderr, flush=True)


def _census_on() -> bool:
    import os

    return os.environ.get("BENCH_CENSUS") == "1"


def _owner_path(obj, holder=None, depth: int = 8, skip: frozenset = frozenset()) -> str:
    """Where `obj` is held: attribute names and keys up to the nearest object of a class outside torch, numpy and
    the builtins (its class starts the path), following gc's referrers (the first one not seen); "?" where the
    trail ends. `holder`: obj's referrer when known (numpy arrays are not tracked by gc)."""
    import gc
    import types

    path, current, seen = [], obj, {id(obj), id(_census), *skip}
    for _ in range(depth):
        if holder is None:
            holder = next((r for r in gc.get_referrers(current) if id(r) not in seen and not isinstance(
                r, (types.FrameType, types.CellType)) and type(r).__name__ != "list_iterator"), None)
        if holder is None:
            path.append("?")
            break
        seen.add(id(holder))
        if isinstance(holder, dict):
            key = next((k for k, v in holder.items() if v is current), "?")
            owner = next((r for r in gc.get_referrers(holder) if getattr(r, "__dict__", None) is holder), None)
            if owner is not None:
                path.append(f"{type(owner).__module__}.{type(owner).__qualname__}.{key}")
                if not type(owner).__module__.startswith(("torch", "numpy")):
                    break
                seen.add(id(owner))
                current, holder = owner, None
                continue
            path.append(f"[{key!r}]" if isinstance(key, (str, int)) and len(str(key)) < 60 else "[...]")
        elif isinstance(holder, (list, tuple, set)):
            path.append("[i]")
        else:
            name = f"{type(holder).__module__}.{type(holder).__qualname__}"
            path.append(name)
            if not name.startswith(("torch", "numpy", "builtins")):
                break
        current, holder = holder, None
    return " <- ".join(path)


def census(top: int = 30) -> dict:
    """Live torch tensors (by storage) and numpy arrays of 1 MB or more, GB in total and per holder (largest
    `top`)."""
    import ctypes
    import gc
    import warnings

    import numpy as np
    import torch

    gc.collect()
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        objects = gc.get_objects()
        found = [(o, None) for o in objects if isinstance(o, torch.Tensor)]
        found += [(a, o) for o in objects for a in gc.get_referents(o) if isinstance(a, np.ndarray)]
        # gc stops tracking a dict or tuple that holds only untracked objects (numpy arrays, bytes, numbers): a
        # {name: array} dict (a tensor dict) is no tracked object's, so look inside those containers too
        untracked = [r for o in objects for r in gc.get_referents(o)
                     if isinstance(r, (dict, tuple)) and not gc.is_tracked(r)]
        untracked = list({id(c): c for c in untracked}.values())
        found += [(a, c) for c in untracked for a in (c.values() if isinstance(c, dict) else c)
                  if isinstance(a, np.ndarray)]
        blobs = {id(b): (b, o) for o in objects + untracked for b in
                 (gc.get_referents(o) if gc.is_tracked(o) else (o.values() if isinstance(o, dict) else o))
                 if isinstance(b, (bytes, bytearray)) and len(b) >= 1 << 20}
        # numpy arrays are not tracked by gc, so arrays held in an object array (a pandas frame's column: OpenFL's
        # TensorDB keeps its tensors so) are no object's referents: look inside the object arrays found
        found += [(a, holder) for arr, holder in list(found) if isinstance(arr, np.ndarray) and arr.dtype == object
                  for a in arr.ravel() if isinstance(a, np.ndarray)]
    skip = frozenset({id(objects), id(found), id(untracked), *map(id, found)})
    groups: dict[str, float] = {}
    seen: set = set()
    totals = {"t": 0.0, "a": 0.0, "small": 0.0}
    known: list = []  # (address, bytes, label) of each buffer found
    for item, holder in found:
        try:
            if isinstance(item, torch.Tensor):
                key, size = ("t", item.untyped_storage().data_ptr()), item.untyped_storage().nbytes()
            else:
                base = item
                while isinstance(base.base, np.ndarray):
                    base = base.base
                key, size = ("a", id(base)), base.nbytes
        except Exception:
            continue
        if key in seen:
            continue
        seen.add(key)
        if size < 1 << 20:  # counted in all, not by holder
            totals["small"] += size / 1e9
            continue
        totals[key[0]] += size / 1e9
        owner = f"{'tensor' if key[0] == 't' else 'array'} " + _owner_path(item, holder, skip=skip)
        groups[owner] = groups.get(owner, 0.0) + size / 1e9
        known.append((key[1] if key[0] == "t" else base.ctypes.data, size, f"{owner} {tuple(item.shape)}"))
    stores = {f"{type(o).__module__}.{type(o).__qualname__}@{id(o):x}": round(_tensor_db_gb(o), 4)
              for o in objects if _is_a(o, "TensorDB")}
    # the aggregator's own copies of whole models (OpenFL keeps the best and the last round's tensors)
    for o in objects:
        if _is_a(o, "Aggregator"):
            for attribute in ("best_tensor_dict", "last_tensor_dict"):
                held = vars(o).get(attribute)
                if isinstance(held, dict):
                    stores[f"Aggregator.{attribute}"] = round(_arrays_gb(held.values()), 4)
    graphs = _graph_tensors(objects)
    blob_list = []
    for b, holder in blobs.values():
        blob_list.append((round(len(b) / 1e6, 1), _owner_path(b, holder, skip=skip)))
        known.append((ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value if isinstance(b, bytes) else
                      ctypes.addressof(ctypes.c_char.from_buffer(b)), len(b), "bytes"))
    graphs["bytes_objects"] = sorted(blob_list, reverse=True)[:20]
    for o in objects:
        if _is_a(o, "TensorDB"):
            try:
                known += [(a.ctypes.data, a.nbytes, "tensordb " + str(a.shape)) for a in o.tensor_db["nparray"]
                          if isinstance(a, np.ndarray)]
            except Exception:
                pass
        if _is_a(o, "Aggregator"):
            for attribute in ("best_tensor_dict", "last_tensor_dict"):
                known += [(a.ctypes.data, a.nbytes, attribute + " " + str(a.shape))
                          for a in (vars(o).get(attribute) or {}).values() if isinstance(a, np.ndarray)]
    mappings = _large_mappings(known)
    del objects, found
    largest = sorted(groups.items(), key=lambda kv: -kv[1])[:top]
    return {"rss_gb": round(_rss_gb(), 3), "rss_anon_gb": round(_status_gb("RssAnon"), 3),
            "rss_file_gb": round(_status_gb("RssFile"), 3), "small_gb": round(totals["small"], 3), "tensors_gb": round(totals["t"], 3), "arrays_gb": round(totals["a"], 3),
            **_malloc_stats(), **_traced(), "graph_tensors": graphs, "mappings": mappings, "tensor_dbs_gb": stores,
            "by_holder": [(k, round(v, 4)) for k, v in largest]}


def _large_mappings(known, minimum: int = 1 << 20) -> dict:
    """What the process's anonymous read-write memory holds besides the buffers of `known` [(address, bytes,
    label)]: each stretch of `minimum` bytes or more outside them, page by page, is matched against the known
    buffers' contents (64 bytes at each 16-byte offset of their second page, so a copy at any 16-byte alignment is
    found): GB per label copied (a copy of a live buffer that no census reaches; freed memory malloc keeps may still
    hold one too), all-zero pages, and the rest."""
    import ctypes

    probe = {}
    for address, size, label in known:
        if size >= 3 * 4096:
            for offset in range(4096, 8192, 16):
                probe.setdefault(ctypes.string_at(address + offset, 64), (label, address, size, offset))
    regions = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if fields[1] != "rw-p" or (len(fields) > 5 and fields[5] != "[heap]"):
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if regions and regions[-1][1] == lo:
                regions[-1][1] = hi
            else:
                regions.append([lo, hi])
    intervals = sorted((a, a + n) for a, n, _ in known)
    copies: dict[str, int] = {}
    totals = {"anonymous_gb": 0, "known_gb": 0, "zero_pages_gb": 0, "other_gb": 0}
    zero = bytes(64)
    blocks: list = []
    for lo, hi in regions:
        totals["anonymous_gb"] += hi - lo
        cursor = lo
        stretches = []
        for a, b in intervals:
            if b <= lo or a >= hi:
                continue
            a, b = max(a, lo), min(b, hi)
            totals["known_gb"] += max(0, b - max(a, cursor))
            if a > cursor:
                stretches.append((cursor, a))
            cursor = max(cursor, b)
        if cursor < hi:
            stretches.append((cursor, hi))
        for a, b in stretches:
            if b - a < minimum:
                continue
            page = (a + 4095) & ~4095
            while page + 64 <= b:
                head = ctypes.string_at(page, 64)
                header = int.from_bytes(ctypes.string_at(page + 8, 8), "little")
                length = header & ~7
                if header & 2 and length >= 1 << 17 and length % 4096 == 0 and page + length <= b:
                    # a block malloc mmapped on its own (IS_MMAPPED): its size and what its contents look like
                    blocks.append((round(length / 1e6, 2), _sketch(page + length // 2)))
                match = probe.get(head)
                if match is not None:  # a copy from page - offset: the rest of it checked at its last 64 bytes
                    label, address, size, offset = match
                    stop = page - offset + size
                    if stop <= b and ctypes.string_at(stop - 64, 64) == ctypes.string_at(address + size - 64, 64):
                        copies[label] = copies.get(label, 0) + size
                        page = (stop + 4095) & ~4095
                        continue
                    totals["other_gb"] += 4096
                elif head == zero:
                    totals["zero_pages_gb"] += 4096
                else:
                    totals["other_gb"] += 4096
                page += 4096
    out = {k: round(v / 1e9, 3) for k, v in totals.items()}
    blocks.sort(key=lambda x: -x[0])
    out["unknown_mmapped_gb"] = round(sum(x[0] for x in blocks) / 1e3, 3)
    out["unknown_mmapped"] = blocks[:30]
    out["copies_gb"] = sorted(((k, round(v / 1e9, 4)) for k, v in copies.items() if v >= 1 << 20), key=lambda x: -x[1])
    return out


def _sketch(address: int) -> str:
    """What 4 kB of memory at `address` look like: as float32, float64 and int64 (the share of plausible values)."""
    import ctypes

    import numpy as np

    raw = ctypes.string_at(address, 4096)
    f4 = np.frombuffer(raw, np.float32)
    f8 = np.frombuffer(raw, np.float64)
    i8 = np.frombuffer(raw, np.int64)
    plausible = lambda x: float(np.mean(np.isfinite(x) & (np.abs(x) < 1e3) & ((np.abs(x) > 1e-12) | (x == 0))))
    return (f"f32 {plausible(f4):.2f} (|mean| {float(np.nanmean(np.abs(f4[np.isfinite(f4)]))) if np.isfinite(f4).any() else 0:.3g}), "
            f"f64 {plausible(f8):.2f}, i64<2^20 {float(np.mean((i8 >= 0) & (i8 < 1 << 20))):.2f}, "
            f"zeros {float(np.mean(f4 == 0)):.2f}")


def _graph_tensors(objects) -> dict:
    """Live tensors that keep an autograd graph (grad_fn set: the graph's saved tensors are native, no census sees
    them) and tensors with a .grad: counts and the tensors' own GB."""
    import torch

    with_graph = [o for o in objects if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    with_grad = [o for o in objects if isinstance(o, torch.Tensor) and o.grad is not None]
    return {"with_grad_fn": len(with_graph), "with_grad_fn_gb": round(sum(t.nbytes for t in with_graph) / 1e9, 4),
            "with_grad_fn_shapes": [str(tuple(t.shape)) + " " + type(t.grad_fn).__name__ for t in with_graph[:10]],
            "with_grad": len(with_grad), "grads_gb": round(sum(t.grad.nbytes for t in with_grad) / 1e9, 4)}


_TRACE_STATE: dict = {}


def _traced() -> dict:
    """BENCH_TRACEMALLOC=1: tracemalloc (started at the first census, so round 1's end is the baseline; it sees Python
    objects and numpy's data, not torch's) - the traced total, and what grew most since the previous census, by the
    allocating lines (5 frames)."""
    import os
    import tracemalloc

    if os.environ.get("BENCH_TRACEMALLOC") != "1":
        return {}
    if not tracemalloc.is_tracing():
        tracemalloc.start(8)
        return {"traced_gb": 0.0}
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    previous, _TRACE_STATE["snap"] = _TRACE_STATE.get("snap"), snap
    first = _TRACE_STATE.setdefault("first", snap)
    current, peak = tracemalloc.get_traced_memory()
    out = {"traced_gb": round(current / 1e9, 4), "traced_peak_gb": round(peak / 1e9, 4)}
    tracemalloc.reset_peak()
    for name, base in (("since_previous", previous), ("since_first", first)):
        if base is None or base is snap:
            continue
        diff = snap.compare_to(base, "traceback")
        out[name] = [(round(d.size_diff / 1e6, 2), d.count_diff, [f"{f.filename}:{f.lineno}" for f in d.traceback][:8])
                     for d in diff[:15]]
    return out


def _is_a(obj, class_name: str) -> bool:
    """Whether obj's class or one of its bases is named class_name (OpenFL's classes, without importing OpenFL)."""
    return any(c.__name__ == class_name for c in type(obj).__mro__)


def _arrays_gb(arrays) -> float:
    return sum(getattr(a, "nbytes", 0) for a in arrays) / 1e9


def _tensor_db_gb(db) -> float:
    """The bytes of the arrays an OpenFL TensorDB holds (its frame's nparray column), GB."""
    try:
        return _arrays_gb(db.tensor_db["nparray"])
    except Exception:
        return float("nan")


def _malloc_stats() -> dict:
    """glibc's mallinfo2 over all arenas, GB: in use (heap and mmapped blocks) and free but kept (none elsewhere)."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                          "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"malloc_in_use_gb": round((info.uordblks + info.hblkhd) / 1e9, 3),
            "malloc_free_kept_gb": round(info.fordblks / 1e9, 3), "malloc_mmapped_gb": round(info.hblkhd / 1e9, 3)}


def _rss_gb() -> float:
    return _status_gb("VmRSS")
