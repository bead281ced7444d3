"""Checks of a whole plan that no single constructor can make: the `tasks` section and the collaborators' names.

OpenFL hands `tasks.<task>.kwargs` to the task function at call time (Collaborator.do_task) and passes any extra
keyword on to its `**kwargs`, where it does nothing: `tasks.train.kwargs.epoch: 1` trained the plan's 5 epochs, and
`epochs: "1"` failed only inside round 0. The task runner never sees the tasks, nor the federation's collaborator
names (a `per_collaborator` entry for a name no collaborator has did nothing), so these are checked here, on the
plan as a mapping, by whoever holds the whole plan before any work: `python -m workspace prepare` and the demo
(before any folder), and `fx aggregator start` (src.aggregator, from the assigner's tasks).

The collaborators' names, wherever the project reads them (the tool's layout, the plan's `per_collaborator`, and
OpenFL's plan/cols.yaml, plan/data.yaml and `fx collaborator start -n` name where OpenFL builds our classes) must
be safe single path components (audit.round_record.validate_party_name, the one pattern): OpenFL writes files
named after them (`logs/<name>_metrics.txt`, `cert/client/col_<name>.key`), and `../../x` wrote outside the
workspace. The counts the plan asks for are bounded (src.plan.bounds).

Torch-free and OpenFL-free, so the tooling checks a plan at once. Every error is a SettingsError whose message
starts with the dotted plan key.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from audit import (Mismatch, SettingsError, boolean, check_plugins, custom, did_you_mean, integer, to_dict,
                   validate_party_name)
from src.plan import bounds as plan_bounds
from src.plan.openfl_sections import check_included_files, check_openfl_sections
from src.plan.paths import check_collaborator_paths, workspace_of

__all__ = ["TASK_RUNNER_TEMPLATE", "DATA_LOADER_TEMPLATE", "TASK_FUNCTIONS", "FINAL_AUDIT_TASK", "FINAL_AUDIT_FUNCTION",
           "final_round", "check_final_round", "planned_rounds", "task_names", "split_settings",
           "split_ratios", "check_tasks", "check_cross_round", "WEIGHTED_AVERAGES",
           "check_collaborator_names", "check_name", "check_names", "check_plan_bounds", "check_plan",
           "PlanBeingBuilt", "plan_being_built", "check_built_plan", "insecure_transport", "INSECURE_ENV",
           "check_transport"]

TASK_RUNNER_TEMPLATE = "src.taskrunner.AuditedTaskRunner"
DATA_LOADER_TEMPLATE = "src.dataloader.AuditDataLoader"
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
    "final_model_audit_task": {"metrics": _METRICS},
}
# The task of the round after the last (aggregator.settings.final_model_audit: src.aggregator): every collaborator
# audits the final global model against its own members. Named so in the plan's `tasks`, in no task group.
FINAL_AUDIT_TASK = "final_model_audit"
FINAL_AUDIT_FUNCTION = "final_model_audit_task"
AGGREGATOR_TEMPLATE = "src.aggregator.AuditingAggregator"
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
                raise SettingsError(f"{where}.{key}: unknown key of a task; allowed: {', '.join(TASK_KEYS)}"
                                    f"{did_you_mean(key, TASK_KEYS)}")
        function = task.get("function")
        if function not in TASK_FUNCTIONS:
            raise SettingsError(f"{where}.function: {function!r} is not a task function of {TASK_RUNNER_TEMPLATE}; "
                                f"allowed: {', '.join(TASK_FUNCTIONS)}{did_you_mean(function, TASK_FUNCTIONS)}")
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


# The aggregation functions that average the trained models with weights (the identity the cross-round attack's
# derivation rests on, audit.cross_round.others); a task without aggregation_type gets OpenFL's WeightedAverage.
WEIGHTED_AVERAGES = ("src.aggregation.GatedWeightedAverage", "openfl.interface.aggregation_functions.WeightedAverage",
                     "openfl.interface.aggregation_functions.weighted_average.WeightedAverage")


def check_cross_round(config: Mapping) -> None:
    """audit.cross_round with `aggregation: weighted_average` (its default) derives the other parties' update from the
    global models, which only a weighted average allows: a train task aggregated otherwise is refused, naming both
    keys (set `aggregation: other` and every round is skipped, saying why)."""
    settings = (config.get("task_runner") or {}).get("settings")
    audit = settings.get("audit") if isinstance(settings, Mapping) else None
    section = audit.get("cross_round") if isinstance(audit, Mapping) else None
    if not isinstance(section, Mapping) or section.get("enabled") is not True \
            or section.get("aggregation", "weighted_average") != "weighted_average":
        return
    for name, task in (config.get("tasks") or {}).items():
        if name in NOT_TASKS or not isinstance(task, Mapping) or task.get("function") != "train_task":
            continue
        kind = task.get("aggregation_type")
        if isinstance(kind, Mapping):
            template = kind.get("template")
        elif kind is None or isinstance(kind, str):
            template = kind
        else:  # a plan OpenFL has built holds the function itself
            template = f"{type(kind).__module__}.{type(kind).__name__}"
        if template is not None and template not in WEIGHTED_AVERAGES:
            raise SettingsError(f"task_runner.settings.audit.cross_round.aggregation: weighted_average, but "
                                f"tasks.{name}.aggregation_type is {template}: set cross_round.aggregation: other (the "
                                f"others' update cannot be derived; every round is skipped) or aggregate with one of "
                                f"{', '.join(WEIGHTED_AVERAGES[:2])}")


def final_round(config: Mapping) -> bool:
    """Whether the plan's aggregator adds the final model's audit after the last round (this workspace's aggregator
    with aggregator.settings.final_model_audit, true by default)."""
    aggregator = config.get("aggregator")
    if not isinstance(aggregator, Mapping) or aggregator.get("template") != AGGREGATOR_TEMPLATE:
        return False
    settings = aggregator.get("settings")
    return bool((settings if isinstance(settings, Mapping) else {}).get("final_model_audit", True))


def check_final_round(config: Mapping) -> None:
    """With the final model's audit, the plan's `tasks` name its task (FINAL_AUDIT_TASK, function
    FINAL_AUDIT_FUNCTION), which no task group lists (it runs once, after the last round)."""
    if not final_round(config):
        return
    key = "aggregator.settings.final_model_audit"
    task = (config.get("tasks") or {}).get(FINAL_AUDIT_TASK) if isinstance(config.get("tasks"), Mapping) else None
    if not isinstance(task, Mapping) or task.get("function") != FINAL_AUDIT_FUNCTION:
        raise SettingsError(f"{key}: true (the default) needs the task tasks.{FINAL_AUDIT_TASK}: {{function: "
                            f"{FINAL_AUDIT_FUNCTION}, kwargs: {{}}}}, which the collaborators run after the last round; "
                            f"add it to the plan, or set {key}: false (the final model is then audited by no one)")
    assigner = config.get("assigner")
    groups = ((assigner.get("settings") or {}).get("task_groups") or []) if isinstance(assigner, Mapping) else []
    for i, group in enumerate(groups if isinstance(groups, Sequence) else []):
        if isinstance(group, Mapping) and FINAL_AUDIT_TASK in (group.get("tasks") or ()):
            raise SettingsError(f"assigner.settings.task_groups[{i}].tasks: {FINAL_AUDIT_TASK} runs once, after the "
                                f"last round ({key}); take it out of the task group")


def planned_rounds(built) -> int | None:
    """The training rounds of the plan OpenFL is building from (PlanBeingBuilt; None: unknown)."""
    settings = ((getattr(built, "config", None) or {}).get("aggregator") or {}).get("settings") or {}
    rounds = settings.get("rounds_to_train")
    return int(rounds) if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds > 0 else None


def check_collaborator_names(per_collaborator, collaborators: Sequence[str],
                             prefix: str = "task_runner.settings.per_collaborator") -> None:
    """Every `per_collaborator` entry names a collaborator of the federation (its settings would apply to nobody)."""
    if not isinstance(per_collaborator, Mapping):
        return  # its shape is the task runner's to check (audit.config.per_collaborator)
    for name in per_collaborator:
        if name not in collaborators:
            raise SettingsError(f"{prefix}.{name}: no collaborator of this federation has that name; its "
                                f"collaborators: {', '.join(collaborators) or 'none'}{did_you_mean(name, collaborators)}")


def check_name(key: str, name) -> str:
    """A collaborator's name: one safe path component (validate_party_name's pattern), SettingsError naming `key`."""
    try:
        return validate_party_name(name)
    except ValueError as err:
        raise SettingsError(f"{key}: {str(err).replace('party name', 'collaborator name', 1)}") from None


def check_names(key: str, names) -> list[str]:
    """A list of collaborators' names: each safe (check_name), none twice."""
    seen: list[str] = []
    for name in names:
        check_name(key, name)
        if name in seen:
            raise SettingsError(f"{key}: collaborator {name!r} is listed twice")
        seen.append(name)
    return seen


def task_names(config: Mapping) -> list:
    """The plan's tasks (OpenFL's Plan reads `defaults` and `settings` under `tasks` as no task)."""
    tasks = config.get("tasks")
    return [t for t in tasks if t not in NOT_TASKS] if isinstance(tasks, Mapping) else []


def split_settings(config: Mapping) -> dict | None:
    """The settings of this workspace's data loader that decide its split: the plan's values over the loader's
    declared defaults (src.data.loader_settings); None for another data loader."""
    loader = config.get("data_loader")
    if not isinstance(loader, Mapping) or loader.get("template") != DATA_LOADER_TEMPLATE \
            or not isinstance(loader.get("settings") or {}, Mapping):
        return None
    from src.data.loader_settings import DataLoaderSettings

    return {**to_dict(DataLoaderSettings()), **(loader.get("settings") or {})}


def split_ratios(data: Mapping) -> dict:
    return {key: data[key] for key in ("train_dataset_ratio", "test_dataset_ratio", "audit_dataset_ratio")}


def check_plan_bounds(config: Mapping, collaborators: Sequence[str] | None = None) -> None:
    """The counts the plan asks for against what the data and the machine allow (src.plan.bounds): the rounds
    (OpenFL's assigner), the collaborators (a sample of each set each, with this workspace's data loader), the
    audit's sample size and the counts that multiply a round's trainings (epochs, reference models, shadow updates,
    canaries, DP retrains)."""
    tasks, data = task_names(config), split_settings(config)
    count = len(collaborators) if collaborators is not None else (data or {}).get("collaborator_count", 0)
    aggregator = config.get("aggregator")
    settings = aggregator.get("settings") if isinstance(aggregator, Mapping) else None
    if isinstance(settings, Mapping):
        plan_bounds.check_rounds("aggregator.settings.rounds_to_train", settings.get("rounds_to_train"),
                                 tasks=len(tasks), collaborators=count if isinstance(count, int) else 0)
    if data is None:
        return
    plan_bounds.check_collaborators("data_loader.settings.collaborator_count", data["collaborator_count"],
                                    dataset=data["dataset"], ratios=split_ratios(data), prefix="data_loader.settings.")
    runner = config.get("task_runner")
    audit = ((runner.get("settings") or {}).get("audit") if isinstance(runner, Mapping) else None) or {}
    if isinstance(audit, Mapping):
        plan_bounds.check_sample_size("task_runner.settings.audit.sample_size", audit.get("sample_size"),
                                      dataset=data["dataset"])
    plan_bounds.check_training_counts(config, data)


def check_plan(config: Mapping, collaborators: Sequence[str] | None = None) -> None:
    """The checks above on a plan mapping (`collaborators`: the federation's names, when known), and those of the
    sections OpenFL builds from and the files it includes (src.plan.openfl_sections), on the plan as OpenFL reads it.
    Tasks of a task runner that is not this workspace's are left to that runner."""
    if collaborators is not None:
        check_names("collaborators", collaborators)
    config = check_openfl_sections(config, collaborators)
    check_plan_bounds(config, collaborators)
    runner = config.get("task_runner")
    if not isinstance(runner, Mapping) or runner.get("template") != TASK_RUNNER_TEMPLATE:
        return
    check_tasks(config.get("tasks") or {})
    check_cross_round(config)
    check_final_round(config)
    settings = runner.get("settings")
    audit = settings.get("audit") if isinstance(settings, Mapping) else None
    if isinstance(audit, Mapping):  # the plug-in steps register before anyone reads their sections or metrics
        check_plugins("task_runner.settings.audit.plugins", audit.get("plugins"))
    if isinstance(settings, Mapping) and isinstance(settings.get("per_collaborator"), Mapping):
        for name in settings["per_collaborator"]:
            check_name(f"task_runner.settings.per_collaborator.{name}", name)
    if collaborators is not None and isinstance(settings, Mapping):
        check_collaborator_names(settings.get("per_collaborator") or {}, list(collaborators))


# ------------------------------------------------------------------------------------------ plans OpenFL builds

@dataclass(frozen=True)
class PlanBeingBuilt:
    """What OpenFL's Plan holds of a deployment while it builds one of our classes."""

    config: Mapping                  # the whole plan, its `defaults:` files merged in (Plan.config)
    files: tuple = ()                # the plan file, then the defaults files it read (Plan.files)
    authorized_cols: tuple = ()      # plan/cols.yaml
    data_paths: Mapping = field(default_factory=dict)  # plan/data.yaml: collaborator -> data path
    collaborator: str | None = None  # the collaborator Plan.get_collaborator builds (`fx collaborator start -n`)


def plan_being_built() -> PlanBeingBuilt | None:
    """The plan (OpenFL's `Plan`) whose `get_aggregator` or `get_task_runner` is building the caller, or None when
    the caller was built otherwise (Plan.build directly, or by hand).

    OpenFL hands each object it builds only its own section's settings. The aggregator (`fx aggregator start`) is
    the one party of a deployment that knows every collaborator's name (plan/cols.yaml, after the certificates),
    and the task runner is what `fx plan initialize` builds before any certificate and `fx collaborator start`
    before it writes anything: both check the whole plan (check_built_plan), so a deployment by hand fails at those
    commands as `python -m workspace` does before any folder.
    Found on the call stack (OpenFL 1.9: Plan.get_aggregator / get_task_runner -> Plan.build -> the constructor;
    Plan.get_collaborator above them names the collaborator), checked by the Plan class's module, so this module
    needs no OpenFL import.
    """
    frame = sys._getframe(1)
    owner, collaborator = None, None
    while frame is not None:
        name = frame.f_code.co_name
        candidate = frame.f_locals.get("self") if name in ("get_aggregator", "get_task_runner",
                                                           "get_collaborator") else None
        if candidate is not None and type(candidate).__module__ == "openfl.federated.plan.plan" \
                and isinstance(getattr(candidate, "config", None), Mapping):
            if name == "get_collaborator" and (owner is None or candidate is owner):
                collaborator = frame.f_locals.get("collaborator_name")
                owner = candidate
            elif owner is None:
                owner = candidate
        frame = frame.f_back
    if owner is None:
        return None
    return PlanBeingBuilt(config=owner.config, files=tuple(getattr(owner, "files", None) or ()),
                          authorized_cols=tuple(getattr(owner, "authorized_cols", None) or ()),
                          data_paths=dict(getattr(owner, "cols_data_paths", None) or {}), collaborator=collaborator)


def check_built_plan(built: PlanBeingBuilt, collaborators: Sequence[str] | None = None) -> None:
    """What a party built by OpenFL checks before anything is written: the files the plan included, the names in
    plan/cols.yaml, plan/data.yaml and the collaborator being started, then the whole plan (check_plan)."""
    check_included_files(built.files)
    check_names("plan/cols.yaml collaborators", built.authorized_cols)
    for name in built.data_paths:
        check_name("plan/data.yaml", name)
    if built.collaborator is not None:
        check_name("fx collaborator start -n", built.collaborator)
        check_collaborator_paths(built.config, workspace_of(built.files))  # before it writes or reads anything
    check_plan(built.config, collaborators)


# ------------------------------------------------------------------------------------------ transport security

# What `fx` parties read to allow a plan without TLS or without client certificates (the tool sets it from its
# --no-tls and --no-client-auth flags): a comma-separated list of INSECURE_SETTINGS' values.
INSECURE_ENV = "FEDERATION_INSECURE"
INSECURE_SETTINGS = {"use_tls": "tls", "require_client_auth": "client_auth"}


def insecure_transport(config: Mapping) -> list[str]:
    """The keys of network.settings that turn transport security off in this plan (as OpenFL reads it: TLS and
    client authentication are on unless set false)."""
    network = config.get("network")
    settings = network.get("settings") if isinstance(network, Mapping) else None
    settings = settings if isinstance(settings, Mapping) else {}
    if settings.get("use_tls", True) is False:
        return ["use_tls"]  # no TLS: no client certificate either
    return ["require_client_auth"] if settings.get("require_client_auth", True) is False else []


def allowed_insecure(environ: Mapping | None = None) -> set[str]:
    text = (os.environ if environ is None else environ).get(INSECURE_ENV, "")
    return {part.strip() for part in text.split(",") if part.strip()}


def check_transport(config: Mapping, environ: Mapping | None = None) -> list[str]:
    """Refuse a plan that turns TLS or client authentication off unless INSECURE_ENV allows it; returns the keys
    that are off (allowed)."""
    off = insecure_transport(config)
    allowed = allowed_insecure(environ)
    for key in off:
        if INSECURE_SETTINGS[key] not in allowed:
            what = "TLS" if key == "use_tls" else "client authentication (certificates)"
            raise SettingsError(f"network.settings.{key}: false turns {what} off: any process that reaches the "
                                f"aggregator's port could claim a collaborator's name and receive its tasks and the "
                                f"global model; to run so anyway, set {INSECURE_ENV}={INSECURE_SETTINGS[key]} "
                                f"(python -m workspace: --no-tls / --no-client-auth)")
    return off
