"""The project's import structure, read from the code: every module outside `audit/` uses the auditor through its
public API alone (`from audit import <name in audit.__all__>`), no import runs back up a layer, and no files import
each other in a circle.

Layers, lowest first: audit/config (torch-free settings) < the rest of audit/ < src/ (OpenFL's side) < workspace/ and
tools/ < benchmarks/ and the demo (cifar10_PM.py). Function-local imports count: they run too.

Slow: parsing every file of the project costs about a CPU-second, and resolving every name of the API imports torch.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

import audit

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("audit/config/", "audit/", "src/", ("workspace/", "tools/"), ("benchmarks/", "cifar10_PM.py"))


def _sources() -> dict[str, Path]:
    """Every .py file of the project but the tests and the shipped link (src/shipped/audit is audit/ itself)."""
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("tests/", "src/shipped/")) or any(part.startswith(".") for part in Path(rel).parts):
            continue
        out[rel] = path
    return out


SOURCES = _sources()


@functools.cache
def _tree(rel: str) -> ast.Module:
    return ast.parse(SOURCES[rel].read_text(encoding="utf-8"), rel)


def _module_name(rel: str) -> str:
    name = rel[:-3].replace("/", ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


MODULES = {_module_name(rel): rel for rel in SOURCES}


def _file_of(dotted: str) -> str | None:
    """The file a dotted name lives in: the longest module prefix that is a file of the project."""
    while dotted:
        if dotted in MODULES:
            return MODULES[dotted]
        dotted = dotted.rpartition(".")[0]
    return None


def _imported(rel: str) -> list[tuple[ast.AST, str]]:
    """(node, dotted name) of every import in the file, `from a import b` as a.b (a submodule or a name of a)."""
    package = _module_name(rel) if rel.endswith("__init__.py") else _module_name(rel).rpartition(".")[0]
    out = []
    for node in ast.walk(_tree(rel)):
        if isinstance(node, ast.Import):
            out += [(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out += [(node, f"{base}.{alias.name}") for alias in node.names]
    return out


@functools.cache
def _edges() -> dict[str, set[str]]:
    edges = {}
    for rel in SOURCES:
        edges[rel] = {target for _, name in _imported(rel) if (target := _file_of(name)) not in (None, rel)}
    return edges


def _layer(rel: str) -> int:
    return next(i for i, prefixes in enumerate(LAYERS) if rel.startswith(prefixes))


def test_outside_audit_only_the_public_api_is_imported():
    api = set(audit.__all__)
    wrong = []
    for rel in SOURCES:
        if rel.startswith("audit/"):
            continue
        for node in ast.walk(_tree(rel)):
            if isinstance(node, ast.Import):
                wrong += [f"{rel}:{node.lineno}: import {a.name}" for a in node.names if a.name.startswith("audit.")]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and (node.module == "audit" or node.module.startswith("audit.")):
                if node.module != "audit":
                    wrong.append(f"{rel}:{node.lineno}: from {node.module} import ...")
                else:
                    wrong += [f"{rel}:{node.lineno}: {a.name} is not in audit.__all__" for a in node.names
                              if a.name not in api]
    assert not wrong, "imports of the auditor's internals:\n" + "\n".join(wrong)


def test_namespaces_of_the_api_are_read_through_their_own_all():
    """A module the API hands on as a namespace (`readings`) is read only through the names its __all__ lists."""
    namespaces = set(audit._MODULES)
    assert namespaces, "the API hands on no namespace: drop this test"
    wrong = []
    for rel in SOURCES:
        if rel.startswith("audit/"):
            continue
        bound = {}
        for node in ast.walk(_tree(rel)):
            if isinstance(node, ast.ImportFrom) and node.module == "audit":
                bound.update({a.asname or a.name: a.name for a in node.names if a.name in namespaces})
        for node in ast.walk(_tree(rel)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
                public = getattr(audit, bound[node.value.id]).__all__
                if node.attr not in public:
                    wrong.append(f"{rel}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not wrong, "names read off a namespace that its __all__ does not list:\n" + "\n".join(wrong)


def test_every_name_of_the_api_resolves_and_is_listed_once():
    assert len(audit.__all__) == len(set(audit.__all__))
    for name in audit.__all__:
        assert getattr(audit, name) is not None, name
    with pytest.raises(AttributeError, match="has no attribute 'PartyAudits'"):
        audit.PartyAudits  # noqa: B018


def test_no_import_runs_back_up_a_layer():
    up = [f"{a} -> {b}" for a, targets in _edges().items() for b in sorted(targets) if _layer(b) > _layer(a)]
    assert not up, "imports back up a layer:\n" + "\n".join(up)


def test_no_files_import_each_other_in_a_circle():
    edges = _edges()
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges)))
    for node in edges:
        if node not in index:
            visit(node)
    assert not circles, f"files that import each other: {circles}"


def test_the_checks_see_a_circle_and_an_import_up():
    """The graph above is read right: the layer of every kind of file, and a relative import resolved."""
    assert [_layer(f) for f in ("audit/config/fields.py", "audit/round_record.py", "src/taskrunner.py",
                                "workspace/run_summary.py", "tools/plan_reference.py", "cifar10_PM.py",
                                "benchmarks/bench_audit.py")] == [0, 1, 2, 3, 3, 4, 4]
    assert "audit/config/fields.py" in _edges()["audit/config/audit_settings.py"]
    assert "audit/config/builtin_steps.py" in _edges()["audit/config/__init__.py"]


def test_the_api_and_the_settings_import_no_torch():
    code = ("import sys, audit\n"
            "from audit import AttackKey, AuditSettings, GatePolicy, Mitigation, RoundRecord, parse, registered\n"
            "audit_settings = AuditSettings.from_mapping({'fpr_tolerance': [0.1], 'rmia': {'enabled': False}})\n"
            "GatePolicy.from_mapping({'epsilon_budget': 1.0}, audit_settings=audit_settings)\n"
            "parse(Mitigation, {'method': 'none'}, 'mitigation')\n"
            "heavy = [m for m in ('torch', 'sklearn', 'privacy_meter', 'openfl') if m in sys.modules]\n"
            "sys.exit(f'imported: {heavy}' if heavy else 0)\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_the_task_runner_stays_a_thin_adapter():
    """src/taskrunner.py is OpenFL's side only: a concern of its own goes in a module under src/runner/."""
    lines = len((ROOT / "src" / "taskrunner.py").read_text(encoding="utf-8").splitlines())
    assert lines <= 200, f"src/taskrunner.py has {lines} lines"
