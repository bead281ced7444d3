"""pytest plugin of benchmarks/bench_suite.py: one JSON line per test in $SUITE_CPU_OUT, with the CPU-seconds of this
process ("self") and of the child processes it waited for ("children") while the test ran, its fixtures' set-up
and tear-down included, and its wall seconds. Each xdist worker appends its own lines (one write each)."""

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
    began = time.monotonic()
    yield
    own_after, children_after = _cpu()
    out = os.environ.get("SUITE_CPU_OUT")
    if out:
        line = json.dumps({"id": item.nodeid, "self": round(own_after - own, 3),
                           "children": round(children_after - children, 3),
                           "wall": round(time.monotonic() - began, 3)}) + "\n"
        with open(out, "a") as f:
            f.write(line)
