"""Shared test set-up: the workspace root on sys.path (the plan's templates are `src.*`), headless plots, one torch
thread per process, the fixtures several test files use, and the rule that keeps a shared fixture built once per
test run when pytest-xdist spreads the tests over workers (tests/README.md: how to keep a new test cheap)."""

import gc
import inspect
import os
import socket
import sys
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
# Tiny models train several times faster on one thread when the 2 cores are shared (OpenMP threads spin), and two
# xdist workers must not ask for 2 cores each. Set before torch is imported; child processes (the demo, `fx`
# parties) inherit it. A value the user exported wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shared_runs import demo_run, prepared_federation  # noqa: E402,F401  (session fixtures: tests/shared_runs.py)
from fx_forks import fx_fork  # noqa: E402,F401  (fx commands in forks of one worker: tests/fx_forks.py)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for the module's tests, whatever the process was started with. A module uses it with
    `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: nothing may be downloaded."""
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def saved_figures(monkeypatch):
    """The figures the report writers save, by file name (the files are still written). Every loaded module of
    `audit` that holds atomic_io.atomic_savefig under that name is patched, so a new drawing module needs no list
    here; a module first imported after the fixture ran keeps its figures out, and the test's lookup fails."""
    from audit.reporting import atomic_io

    original = atomic_io.atomic_savefig
    kept = {}

    def keep(fig, path, **kwargs):
        kept[Path(path).name] = fig
        return original(fig, path, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] == "audit" and getattr(module, "atomic_savefig", None) is original:
            monkeypatch.setattr(module, "atomic_savefig", keep)
    return kept


# ---------------------------------------------------------------------------------------------------------
# pytest-xdist (`make test`: -n 2 --dist loadgroup): every test that uses a module- or session-scoped fixture of
# this suite runs on the same worker as every other test using it, so each shared fixture (a federation, a demo
# run) is built once per test run; other tests go to whichever worker is free. Heavy tests are handed out first.

# Shared but cheap (nothing to build, or a process per worker): no need to keep their tests together
CHEAP_SHARED = {"one_torch_thread", "fx_fork"}


def _shared_fixtures(item) -> list[str]:
    keys = []
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in (info.name2fixturedefs.items() if info else ()):
        fixturedef = defs[-1]
        if fixturedef.scope == "function" or name in CHEAP_SHARED:
            continue
        try:
            source = Path(inspect.getsourcefile(fixturedef.func)).resolve()
        except TypeError:
            continue
        if TESTS not in source.parents:  # pytest's own (tmp_path_factory, ...)
            continue
        keys.append(f"{item.path.stem}.{name}" if fixturedef.scope in ("module", "class") else name)
    return keys


def _is_heavy(item) -> bool:
    return item.get_closest_marker("federation") is not None or item.get_closest_marker("slow") is not None


def pytest_collection_finish(session):
    """What the collection loaded (the libraries, the test modules, the items) lives as long as the worker: kept out
    of the collector's full passes (gc.freeze), which would otherwise walk it again at every pass the worker, its
    report worker and its runs make (the cost measured: benchmarks/README.md, "The test suite")."""
    gc.freeze()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which appends the group to the test's id
def pytest_collection_modifyitems(config, items):
    parent = {}

    def find(key):
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    shared = {}
    for item in items:
        keys = _shared_fixtures(item)
        shared[item] = keys
        for key in keys[1:]:
            parent[find(key)] = find(keys[0])
    groups = {}
    for item, keys in shared.items():
        if keys:
            group = find(keys[0])
            item.add_marker(pytest.mark.xdist_group(group))
            groups.setdefault(group, []).append(item)
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return  # one process: the files' own order
    # Longest first: a federation handed out last would leave the other worker idle at the end.
    heavy = {group for group, members in groups.items() if any(_is_heavy(i) for i in members)}
    items.sort(key=lambda i: 0 if _is_heavy(i) or (shared[i] and find(shared[i][0]) in heavy) else 1)
