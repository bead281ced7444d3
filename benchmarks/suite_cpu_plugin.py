"""pytest plugin of benchmarks/bench_suite.py: one JSON line per test in $SUITE_CPU_OUT, with the CPU-seconds of this
process ("self") and of the child processes it waited for ("children") while the test ran, its fixtures' set-up
and tear-down included, its wall seconds, its worker and its start (seconds since the epoch). Each xdist worker
appends its own lines (one write each)."""

from __future__ import annotations

import json
import os
import resource
import time

import pytest


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own, children = _cpu()
    began, started = time.monotonic(), time.time()
    yield
    own_after, children_after = _cpu()
    out = os.environ.get("SUITE_CPU_OUT")
    if out:
        line = json.dumps({"id": item.nodeid, "self": round(own_after - own, 3),
                           "children": round(children_after - children, 3),
                           "wall": round(time.monotonic() - began, 3),
                           # which worker, and when (the epoch: one clock for every worker): the workers' timeline
                           "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "start": round(started, 3)}) + "\n"
        with open(out, "a") as f:
            f.write(line)
