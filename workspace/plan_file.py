"""A run's plan file: reading one (one line naming the file, and the line of a YAML error), the checks every run's
plan gets before any work (settings, the objects `fx plan initialize` builds, each party's data), and the workspace
plan with a run's paths and overrides, written into the run's folder for a run in one process (workspace.in_process).
`python -m workspace` builds its multi-process run's plan from these (workspace.run_plan).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Mapping

import yaml

WORKSPACE_ROOT = Path(__file__).resolve().parent.parent


def deep_merge(base: dict, overrides: Mapping) -> dict:
    """A copy of `base` with `overrides` merged in, key by key for nested mappings."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def collaborator_names(count: int) -> list[str]:
    return [f"collaborator{i}" for i in range(1, count + 1)]


class PlanFileError(ValueError):
    """A plan file that cannot be read as a plan; the message starts with the file's path."""


def yaml_problem(err: Exception) -> str:
    """A YAML error in one line, " at line L, column C: problem" (PyYAML's own text spans several lines)."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{where}: {problem}"


def read_plan(path: Path) -> dict:
    """The plan file as a mapping; PlanFileError in one line naming the file (and the line of a YAML error)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise PlanFileError(f"{path}: cannot read the plan ({getattr(err, 'strerror', None) or err})") from None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PlanFileError(f"{path}: not valid YAML{yaml_problem(err)}") from None
    if not isinstance(config, dict):
        raise PlanFileError(f"{path}: not a plan (a YAML mapping of sections such as task_runner, tasks), got "
                            f"{type(config).__name__}")
    return config


def check_settings(config: Mapping, collaborators: list[str]) -> None:
    """The checks of a run's plan that need neither torch nor OpenFL (the tooling makes them before any folder):
    the aggregator's settings, the tasks, the per-collaborator names and the network, collaborator and
    straggler-policy settings (src.plan.checks). ValueError naming the key."""
    from src.server.settings import AggregatorSettings
    from src.plan.checks import check_plan

    aggregator = config.get("aggregator")
    if not isinstance(aggregator, Mapping) or not isinstance(aggregator.get("settings") or {}, Mapping):
        raise ValueError("aggregator.settings: expected a mapping")
    AggregatorSettings.from_mapping(aggregator.get("settings"))
    check_plan(config, collaborators)


def check_buildable(config: Mapping) -> None:
    """What `fx plan initialize` checks, on the plan in memory: the data loader (without data) and the task runner
    are built, so every setting they validate (each collaborator's too) fails here, naming its key."""
    from openfl.federated import Plan

    if str(WORKSPACE_ROOT) not in sys.path:  # the plan's templates are `src.*` modules of this workspace
        sys.path.insert(0, str(WORKSPACE_ROOT))
    sections = {}
    for name in ("data_loader", "task_runner"):
        section = config.get(name)
        if not isinstance(section, Mapping) or not isinstance(section.get("template"), str) \
                or not isinstance(section.get("settings") or {}, Mapping):
            raise ValueError(f"{name}: expected a mapping with a template and its settings")
        sections[name] = section
    loader = Plan.build(sections["data_loader"]["template"],
                        {**(sections["data_loader"].get("settings") or {}), "data_path": None})
    Plan.build(sections["task_runner"]["template"], {**(sections["task_runner"].get("settings") or {}),
                                                     "data_loader": loader})


def check_party_data(config: Mapping, collaborators: list[str]) -> None:
    """Each party's data, read in this process by the plan's data loader (the readers and the split each collaborator
    uses; collaborator i+1 of the list gets shard i+1), before any certificate or folder: missing or corrupt files,
    a split that leaves a party without samples, and a gate on a tolerance a party's audit population cannot resolve
    (audit.config.per_collaborator.check_gate_resolution) fail here in one line. The loaded dataset stays in the
    loaders' cache for a run in this process (src.dataloader.clear_dataset_cache frees it)."""
    from openfl.federated import Plan

    from audit import AuditSettings, check_gate_resolution, parse_per_collaborator
    from src.plan.checks import DATA_LOADER_TEMPLATE, TASK_RUNNER_TEMPLATE

    loader_section, runner_section = config.get("data_loader") or {}, config.get("task_runner") or {}
    if loader_section.get("template") != DATA_LOADER_TEMPLATE:
        return  # another loader's data_path means something else
    settings = dict(loader_section.get("settings") or {})
    gates = None
    if runner_section.get("template") == TASK_RUNNER_TEMPLATE:
        runner = runner_section.get("settings") or {}
        audit = AuditSettings.from_mapping(runner.get("audit"), prefix="task_runner.settings.audit")
        gates = (audit, *parse_per_collaborator(runner.get("per_collaborator"), gate=runner.get("gate"),
                                                audit_settings=audit, mitigation=runner.get("mitigation")))
    if str(WORKSPACE_ROOT) not in sys.path:
        sys.path.insert(0, str(WORKSPACE_ROOT))
    for shard, name in enumerate(collaborators, 1):
        loader = Plan.build(DATA_LOADER_TEMPLATE, {**settings, "data_path": str(shard)})
        if gates is not None:
            audit, default, per_collaborator = gates
            population = len(loader.y_population)
            if audit.sample_size is not None:
                population = min(population, audit.sample_size)
            check_gate_resolution(name, default, per_collaborator, audit, population)


def check_run_plan(config: Mapping, collaborators: list[str]) -> None:
    """Every check a run's plan gets before anything is written: check_settings, check_buildable, then each
    party's data (check_party_data)."""
    check_settings(config, collaborators)
    check_buildable(config)
    check_party_data(config, collaborators)


def run_plan_config(run_dir: Path, *, collaborators: int, rounds: int, overrides: Mapping | None = None,
                    plan_path: Path | None = None) -> dict:
    """The workspace plan with this run's paths and the overrides (see write_run_plan); nothing is written."""
    if collaborators < 1:
        raise ValueError(f"collaborators: need at least 1, got {collaborators}")
    if rounds < 1:
        raise ValueError(f"rounds: need at least 1, got {rounds}")
    run_dir = Path(run_dir).resolve()
    config = read_plan(Path(plan_path or WORKSPACE_ROOT / "plan" / "plan.yaml"))
    run_settings = {
        "aggregator": {"settings": {
            "rounds_to_train": rounds,
            "init_state_path": str(run_dir / "save" / "init.pbuf"),
            "best_state_path": str(run_dir / "save" / "best.pbuf"),
            "last_state_path": str(run_dir / "save" / "last.pbuf"),
            "persist_checkpoint": False,
            "write_logs": False,  # OpenFL's writer would write to ./logs: run_in_process gives its own, run_dir/logs
            "report_dir": str(run_dir / "aggregator_report"),
        }},
        "collaborator": {"settings": {"write_logs": False}},
        "data_loader": {"settings": {"collaborator_count": collaborators}},
        "task_runner": {"settings": {"audit": {"report_dir": str(run_dir / "reports")}}},
    }
    return deep_merge(deep_merge(config, run_settings), overrides or {})


def write_run_plan(run_dir: Path, *, collaborators: int, rounds: int, overrides: Mapping | None = None,
                   plan_path: Path | None = None) -> Path:
    """Write the workspace plan, with overrides and this run's paths, into run_dir/plan; returns that folder.

    The aggregator's state files go to run_dir/save, the collaborators' reports to run_dir/reports and the
    aggregator's report to run_dir/aggregator_report (not inside run_dir/reports, whose index lists the parties
    the audit reports are about) unless the overrides say otherwise; no checkpoint database is kept, so a new
    run never resumes an old one.
    """
    config = run_plan_config(run_dir, collaborators=collaborators, rounds=rounds, overrides=overrides,
                             plan_path=plan_path)
    run_dir = Path(run_dir).resolve()
    plan_dir = run_dir / "plan"
    plan_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "save").mkdir(exist_ok=True)
    (plan_dir / "plan.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    names = collaborator_names(collaborators)
    (plan_dir / "cols.yaml").write_text(yaml.safe_dump({"collaborators": names}))
    (plan_dir / "data.yaml").write_text("".join(f"{name},{i}\n" for i, name in enumerate(names, 1)))
    return plan_dir
