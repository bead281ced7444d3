"""Checks of a whole plan that no single constructor can make: the `tasks` section and the collaborators' names.

OpenFL hands `tasks.<task>.kwargs` to the task function at call time (Collaborator.do_task) and passes any extra
keyword on to its `**kwargs`, where it does nothing: `tasks.train.kwargs.epoch: 1` trained the plan's 5 epochs, and
`epochs: "1"` failed only inside round 0. The task runner never sees the tasks, nor the federation's collaborator
names (a `per_collaborator` entry for a name no collaborator has did nothing), so these are checked here, on the
plan as a mapping, by whoever holds the whole plan before any work: `python -m workspace prepare` and the demo
(before any folder), and `fx aggregator start` (src.aggregator, from the assigner's tasks).

Torch-free and OpenFL-free, so the tooling checks a plan at once. Every error is a SettingsError whose message
starts with the dotted plan key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sys

from audit.config.fields import Mismatch, SettingsError, boolean, custom, did_you_mean, integer
from audit.config.plugins import check_plugins
from src.openfl_sections import check_openfl_sections

__all__ = ["TASK_RUNNER_TEMPLATE", "TASK_FUNCTIONS", "check_tasks", "check_collaborator_names", "check_plan",
           "plan_being_built"]

TASK_RUNNER_TEMPLATE = "src.taskrunner.AuditedTaskRunner"
# Keys of a task besides its function's keyword arguments (OpenFL's Plan.get_tasks / Assigner read them).
TASK_KEYS = ("function", "kwargs", "aggregation_type")
# OpenFL's Plan reads these under `tasks` (not tasks).
NOT_TASKS = ("defaults", "settings")


def _metric_names(_key: str, value) -> list:
    # OpenFL's workspace templates list a task's metrics; PyTorchTaskRunner reports its loss and accuracy whatever
    # the list says. Kept for plans written from those templates, checked for shape only.
    if not isinstance(value, Sequence) or isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise Mismatch
    return list(value)


def _apply(_key: str, value) -> str:
    if value not in ("local", "global"):
        raise Mismatch
    return value


_METRICS = custom("a list of metric names", _metric_names)
_APPLY = custom("local (the locally trained model) or global (the received one)", _apply)

# The keyword arguments each task function of AuditedTaskRunner takes from a plan (OpenFL's PyTorchTaskRunner's
# train_task(epochs, use_tqdm) and validate_task(apply, use_tqdm)), each with its check; tests/test_settings_at_start
# checks the names against the functions' signatures. Written out so that the tooling needs no torch.
TASK_FUNCTIONS: Mapping[str, Mapping] = {
    "train_task": {"epochs": integer(min=1), "use_tqdm": boolean(), "metrics": _METRICS},
    "validate_task": {"apply": _APPLY, "use_tqdm": boolean(), "metrics": _METRICS},
}
REQUIRED_KWARGS = {"validate_task": ("apply",)}  # PyTorchTaskRunner.validate_task reads kwargs["apply"]


def check_tasks(tasks, prefix: str = "tasks") -> None:
    """Every task of the plan names a task function of AuditedTaskRunner and gives it only keyword arguments it
    takes, each a valid value."""
    if not isinstance(tasks, Mapping):
        raise SettingsError(f"{prefix}: expected a mapping of task name -> {{function, kwargs}}, got {tasks!r}")
    for name, task in tasks.items():
        if name in NOT_TASKS:
            continue
        where = f"{prefix}.{name}"
        if not isinstance(task, Mapping):
            raise SettingsError(f"{where}: expected a mapping with function and kwargs, got {task!r}")
        for key in task:
            if key not in TASK_KEYS:
                raise SettingsError(f"{where}.{key}: unknown key of a task; allowed: {', '.join(TASK_KEYS)}")
        function = task.get("function")
        if function not in TASK_FUNCTIONS:
            raise SettingsError(f"{where}.function: {function!r} is not a task function of {TASK_RUNNER_TEMPLATE}; "
                                f"allowed: {', '.join(TASK_FUNCTIONS)}")
        kwargs = task.get("kwargs")
        kwargs = {} if kwargs is None else kwargs
        if not isinstance(kwargs, Mapping):
            raise SettingsError(f"{where}.kwargs: expected a mapping of keyword arguments, got {kwargs!r}")
        allowed = TASK_FUNCTIONS[function]
        for key, value in kwargs.items():
            if key not in allowed:
                raise SettingsError(f"{where}.kwargs.{key}: not an argument of {function} (it would be ignored); "
                                    f"allowed: {', '.join(allowed)}{did_you_mean(key, allowed)}")
            allowed[key](f"{where}.kwargs.{key}", value)
        for key in REQUIRED_KWARGS.get(function, ()):
            if key not in kwargs:
                raise SettingsError(f"{where}.kwargs.{key}: missing; {function} needs it")


def check_collaborator_names(per_collaborator, collaborators: Sequence[str],
                             prefix: str = "task_runner.settings.per_collaborator") -> None:
    """Every `per_collaborator` entry names a collaborator of the federation (its settings would apply to nobody)."""
    if not isinstance(per_collaborator, Mapping):
        return  # its shape is the task runner's to check (src.collaborator_overrides)
    for name in per_collaborator:
        if name not in collaborators:
            raise SettingsError(f"{prefix}.{name}: no collaborator of this federation has that name; its "
                                f"collaborators: {', '.join(collaborators) or 'none'}")


def check_plan(config: Mapping, collaborators: Sequence[str] | None = None) -> None:
    """The checks above on a plan mapping (`collaborators`: the federation's names, when known), and those of the
    sections OpenFL builds from (src.openfl_sections). Tasks of a task runner that is not this workspace's are left
    to that runner."""
    check_openfl_sections(config)
    runner = config.get("task_runner")
    if not isinstance(runner, Mapping) or runner.get("template") != TASK_RUNNER_TEMPLATE:
        return
    check_tasks(config.get("tasks") or {})
    settings = runner.get("settings")
    audit = settings.get("audit") if isinstance(settings, Mapping) else None
    if isinstance(audit, Mapping):  # the plug-in steps register before anyone reads their sections or metrics
        check_plugins("task_runner.settings.audit.plugins", audit.get("plugins"))
    if collaborators is not None and isinstance(settings, Mapping):
        check_collaborator_names(settings.get("per_collaborator") or {}, list(collaborators))


def plan_being_built() -> Mapping | None:
    """The whole plan (OpenFL's `Plan.config`) whose `get_aggregator` or `get_task_runner` is building the caller,
    or None when the caller was built otherwise (Plan.build directly, or by hand).

    OpenFL hands each object it builds only its own section's settings. The aggregator (`fx aggregator start`) is
    the one party of a deployment that knows every collaborator's name (plan/cols.yaml, after the certificates),
    and the task runner is what `fx plan initialize` builds before any certificate: both check the whole plan
    (check_plan), so a deployment by hand fails at those commands as `python -m workspace` does before any folder.
    Found on the call stack (OpenFL 1.9: Plan.get_aggregator / get_task_runner -> Plan.build -> the constructor),
    checked by the Plan class's module, so this module needs no OpenFL import.
    """
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self") if frame.f_code.co_name in ("get_aggregator", "get_task_runner") else None
        if owner is not None and type(owner).__module__ == "openfl.federated.plan.plan" \
                and isinstance(getattr(owner, "config", None), Mapping):
            return owner.config
        frame = frame.f_back
    return None
