"""Checks of the plan sections OpenFL builds its own objects from: the sections themselves, the files they include
(`defaults:`), `network.settings`, `collaborator.settings`, `straggler_handling_policy` and the `assigner`'s task
groups, each key by its dotted name, with "did you mean" for a close name.

OpenFL hands `network.settings` to its gRPC client and server, which swallow any other key in **kwargs
(`client_reconect_interval: 5` left the interval at 1 s); `collaborator.settings` to Collaborator.__init__ (a
misspelt key was a TypeError at `fx collaborator start`, after the certificates; `opt_treatment: FOO` an
AttributeError); and the straggler policy's settings to CutoffTimePolicy, which swallows unknown keys too
(`straggler_cutof_time: 60` kept the cutoff at 3600 s) and used a string cutoff only in round 0, in a timer thread.
A `defaults:` file that does not exist is read as an empty mapping (`defaults: 'plan/defaults/netwrok.yaml'` left the section
without OpenFL's defaults, silently), and the assigners swallow unknown keys too (`task_group` did nothing) and
check their task groups only with asserts when the aggregator starts.

Torch-free and OpenFL-free (the tooling checks a plan at once); the key lists are OpenFL 1.9's signatures,
written out, and tests/test_settings_at_start.py checks them against those signatures. Every error is a
SettingsError whose message starts with the dotted plan key.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from audit import (SettingsError, anything, boolean, choice, did_you_mean, either, integer, is_real, literal, optional,
                   real, text)

__all__ = ["NETWORK_KEYS", "NETWORK_FILLED", "COLLABORATOR_KEYS", "COLLABORATOR_FILLED", "STRAGGLER_POLICIES",
           "ASSIGNERS", "ASSIGNER_FILLED", "SECTIONS", "check_sections", "check_defaults", "check_included_files",
           "check_network", "check_collaborator", "check_straggler_policy", "check_assigner", "check_openfl_sections",
           "openfl_defaults_root", "as_openfl_reads"]

_SECONDS = real(gt=0, noun="a number of seconds")
_MINIMUM_REPORTING = integer(min=1)


# `network.settings`: the keys of OpenFL's plan/defaults/network.yaml and of AggregatorGRPCClient's and
# AggregatorGRPCServer's constructors that a plan sets, each with its check.
NETWORK_KEYS = {
    "agg_addr": text(),
    "agg_port": either(integer(min=1, max=65535, noun="a TCP port"), literal("auto")),
    "hash_salt": anything(),              # read by OpenFL's Plan when it hashes the plan
    "use_tls": boolean(),
    "require_client_auth": boolean(),
    "client_reconnect_interval": _SECONDS,
    "cert_folder": text(),
    "enable_atomic_connections": boolean(),
    "resend_data_on_reconnection": boolean(),
    "single_col_cert_common_name": optional(text()),
    "transport_protocol": choice(("grpc", "rest")),
}
# Filled in by OpenFL's Plan (get_client_args / get_server_args) or given in code, not by a plan.
NETWORK_FILLED = ("aggregator_uuid", "federation_uuid", "collaborator_name", "root_certificate", "certificate",
                  "private_key", "refetch_server_cert_callback", "root_certificate_refresher_cb")

# `collaborator.settings`: Collaborator.__init__'s parameters a plan sets (OpenFL's Plan.get_collaborator fills in
# COLLABORATOR_FILLED; `secure_aggregation` comes from aggregator.settings).
COLLABORATOR_TEMPLATE = "openfl.component.Collaborator"
# ... and the plan's, which takes the same settings (src.collaborator: its metric writer's tags differ).
COLLABORATOR_TEMPLATES = (COLLABORATOR_TEMPLATE, "src.collaborator.AuditingCollaborator")
COLLABORATOR_KEYS = {
    "opt_treatment": choice(("RESET", "CONTINUE_LOCAL", "CONTINUE_GLOBAL")),
    "device_assignment_policy": choice(("CPU_ONLY", "CUDA_PREFERRED")),  # deprecated by OpenFL, still accepted
    "use_delta_updates": boolean(),
    "db_store_rounds": integer(min=1),
    "log_memory_usage": boolean(),
    "write_logs": boolean(),
    "callbacks": anything(),              # OpenFL's Callback objects, given in code (in-process runs)
    "interop_mode": boolean(),
}
COLLABORATOR_FILLED = ("collaborator_name", "aggregator_uuid", "federation_uuid", "client", "task_runner",
                       "task_config", "compression_pipeline", "secure_aggregation")

# `straggler_handling_policy`: OpenFL's policies by template, each with the settings its constructor reads.
STRAGGLER_MODULE = "openfl.component.aggregator.straggler_handling"
# .inf (YAML) turns the cutoff off, as OpenFL's default does
_CUTOFF = real(gt=0, finite=False, noun="a number of seconds", note=".inf: no cutoff")
_SHARE = real(gt=0, le=1, noun="a fraction of the collaborators")

STRAGGLER_POLICIES = {
    "CutoffTimePolicy": {"straggler_cutoff_time": _CUTOFF, "minimum_reporting": _MINIMUM_REPORTING},
    "PercentagePolicy": {"percent_collaborators_needed": _SHARE, "minimum_reporting": _MINIMUM_REPORTING},
    "WaitForAllPolicy": {},
}


def _check_keys(prefix: str, settings, checks: Mapping, filled=()) -> None:
    if settings is None:
        return
    if not isinstance(settings, Mapping):
        raise SettingsError(f"{prefix}: expected a mapping of settings, got {settings!r}")
    for key, value in settings.items():
        if key in filled:
            continue
        if key not in checks:
            raise SettingsError(f"{prefix}.{key}: unknown setting (it would be ignored or fail later); known: "
                                f"{', '.join(checks) or 'none'}{did_you_mean(key, checks)}")
        checks[key](f"{prefix}.{key}", value)


def _section(config: Mapping, name: str):
    section = config.get(name)
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise SettingsError(f"{name}: expected a mapping with its settings, got {section!r}")
    return section


def check_network(config: Mapping) -> None:
    section = _section(config, "network")
    if section is not None:
        _check_keys("network.settings", section.get("settings"), NETWORK_KEYS, NETWORK_FILLED)


def check_collaborator(config: Mapping) -> None:
    section = _section(config, "collaborator")
    # Another collaborator class takes its own settings; a plan with no template gets OpenFL's (defaults file).
    if section is not None and section.get("template", COLLABORATOR_TEMPLATE) in COLLABORATOR_TEMPLATES:
        _check_keys("collaborator.settings", section.get("settings"), COLLABORATOR_KEYS, COLLABORATOR_FILLED)


def check_straggler_policy(config: Mapping) -> None:
    section = _section(config, "straggler_handling_policy")
    if section is None:
        return
    template = section.get("template")
    module, _, name = str(template).rpartition(".")
    if module != STRAGGLER_MODULE:
        return  # a policy of one's own checks its own settings
    if name not in STRAGGLER_POLICIES:
        raise SettingsError(f"straggler_handling_policy.template: {template!r} is not a policy of {STRAGGLER_MODULE}; "
                            f"allowed: {', '.join(STRAGGLER_POLICIES)}{did_you_mean(name, STRAGGLER_POLICIES)}")
    _check_keys("straggler_handling_policy.settings", section.get("settings"), STRAGGLER_POLICIES[name])


# The top-level sections OpenFL 1.9's Plan reads (openfl/federated/plan/plan.py); any other is ignored. All but
# `tasks` are built from {template, settings} (Plan.build takes any other key as one more setting, or ignores it:
# `aggregator.setings.x` reached the aggregator as a setting named `setings`, `network.setings.x` did nothing).
BUILT_SECTIONS = ("aggregator", "collaborator", "data_loader", "task_runner", "network", "assigner",
                  "straggler_handling_policy", "compression_pipeline", "connector")
SECTIONS = (*BUILT_SECTIONS, "tasks")
SECTION_KEYS = ("defaults", "template", "settings")


def check_sections(config: Mapping) -> None:
    """Only sections OpenFL reads, each a mapping; those it builds hold only defaults, template and settings."""
    for name, section in config.items():
        if name not in SECTIONS:
            raise SettingsError(f"{name}: not a section OpenFL reads (it would be ignored); sections: "
                                f"{', '.join(SECTIONS)}{did_you_mean(name, SECTIONS)}")
        if not isinstance(section, Mapping):
            raise SettingsError(f"{name}: expected a mapping, got {section!r}")
        if name in BUILT_SECTIONS:
            for key in section:
                if key not in SECTION_KEYS:
                    raise SettingsError(f"{name}.{key}: unknown key of a plan section (it would be ignored or taken "
                                        f"for a setting); allowed: {', '.join(SECTION_KEYS)}"
                                        f"{did_you_mean(key, SECTION_KEYS)}")


# ------------------------------------------------------------------------------------------ included files

def openfl_defaults_root() -> Path | None:
    """The folder OpenFL 1.9 reads a section's `defaults:` file from (openfl.interface.cli_helper.WORKSPACE /
    "workspace": <site-packages>/openfl-workspace/workspace), found without importing OpenFL; None without OpenFL."""
    spec = importlib.util.find_spec("openfl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent / "openfl-workspace" / "workspace"


def _known_defaults(root: Path, wanted: str) -> list[str]:
    """The files OpenFL ships near `wanted` (its folder if that exists, else plan/defaults), as a plan names them."""
    folder = (root / wanted).parent
    if not folder.is_dir():
        folder = root / "plan" / "defaults"
    try:
        return sorted(str(p.relative_to(root)) for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    except OSError:
        return []


def check_included_file(key: str, value, root: Path | None = None) -> None:
    """A `defaults:` entry names a file OpenFL ships (read from `root`, see openfl_defaults_root): OpenFL reads a
    missing one as an empty mapping, and the section then lacks every default silently."""
    if not isinstance(value, str) or not value.strip():
        raise SettingsError(f"{key}: expected the path of one of OpenFL's defaults files, e.g. "
                            f"plan/defaults/network.yaml, got {value!r}")
    root = openfl_defaults_root() if root is None else root
    if root is None:
        return  # no OpenFL here to read it: the party that runs OpenFL checks it (src.plan.checks.check_built_plan)
    if not (root / value).is_file():
        known = _known_defaults(root, value)
        raise SettingsError(f"{key}: {value!r} is no file OpenFL ships (it would be read as empty: the section would "
                            f"lose OpenFL's defaults); looked in {root}{did_you_mean(value, known)}")


def check_defaults(config: Mapping, root: Path | None = None) -> None:
    """Every section's `defaults:` file (OpenFL's Plan reads one for any section, `tasks` included)."""
    for name, section in config.items():
        if isinstance(section, Mapping) and "defaults" in section:
            check_included_file(f"{name}.defaults", section["defaults"], root)


def check_included_files(files: Sequence, root: Path | None = None) -> None:
    """The files a parsed plan read (OpenFL's `Plan.files`: the plan, then each section's defaults file, resolved):
    a plan parsed by OpenFL has its `defaults:` keys merged in and removed, so its includes are checked here."""
    root = openfl_defaults_root() if root is None else root
    for path in list(files)[1:]:
        path = Path(path)
        if not path.is_file():
            try:
                named = str(path.relative_to(root)) if root is not None else str(path)
            except ValueError:
                named = str(path)
            known = _known_defaults(root, named) if root is not None else []
            raise SettingsError(f"defaults: {named!r} is no file OpenFL ships (it was read as empty: a section lost "
                                f"OpenFL's defaults); looked in {path.parent}{did_you_mean(named, known)}")


def as_openfl_reads(config: Mapping, root: Path | None = None) -> dict:
    """The plan as OpenFL's Plan.parse reads it (Plan._load_defaults): each section's `defaults:` file under it, the
    file's settings updated with the section's, then the file's other keys with the section's; no `defaults:` key
    left. A plan OpenFL parsed already has none, and comes back as a copy. Check the files first (check_defaults)."""
    out = copy.deepcopy(dict(config))
    root = openfl_defaults_root() if root is None else root
    for name in sorted(out):
        section = out[name]
        if not isinstance(section, Mapping) or "defaults" not in section:
            continue
        section = dict(section)
        path = section.pop("defaults")
        section["settings"] = section.get("settings") or {}
        loaded = yaml.safe_load((root / path).read_text()) if root is not None else None
        loaded = dict(loaded) if isinstance(loaded, Mapping) else {}
        if isinstance(loaded.get("settings"), Mapping):
            section["settings"] = {**loaded["settings"], **section["settings"]}
        loaded.update(section)
        out[name] = loaded
    return out


# ------------------------------------------------------------------------------------------ the assigner

ASSIGNER_MODULE = "openfl.component"
# OpenFL 1.9's assigners by class name, each with the keys of a task group it reads (RandomGroupedAssigner and
# StaticGroupedAssigner.define_task_assignments); both take `task_groups` and the Assigner's `selected_task_group`.
ASSIGNERS = {
    "RandomGroupedAssigner": ("name", "percentage", "tasks"),
    "StaticGroupedAssigner": ("name", "collaborators", "tasks"),
}
ASSIGNER_KEYS = ("task_groups", "selected_task_group")
ASSIGNER_FILLED = ("tasks", "authorized_cols", "rounds_to_train")  # OpenFL's Plan.get_assigner fills these in
# RandomGroupedAssigner asserts that the groups' shares sum to 1 within this.
SHARE_TOLERANCE = 0.01


def _assigner_class(template) -> str | None:
    """The class name of one of OpenFL's assigners (openfl.component.X or openfl.component.assigner[.module].X),
    None for an assigner of one's own (which checks its own settings)."""
    module, _, name = str(template).rpartition(".")
    return name if module.startswith(ASSIGNER_MODULE) and name in ASSIGNERS else None


def task_groups(config: Mapping) -> list[Mapping]:
    """The assigner's task groups as the checks below passed them ([] for an assigner of one's own)."""
    section = config.get("assigner")
    if not isinstance(section, Mapping) or _assigner_class(section.get("template")) is None:
        return []
    return list((section.get("settings") or {}).get("task_groups") or [])


def check_assigner(config: Mapping, task_names: Sequence[str] | None = None,
                   collaborators: Sequence[str] | None = None) -> None:
    """OpenFL's assigner settings: only the keys it reads; task groups with a unique name, tasks of the plan
    (`task_names`, when known) and, for RandomGroupedAssigner, shares in [0, 1] summing to 1 that divide the
    collaborators (when known) whole, as its asserts demand when the aggregator starts; StaticGroupedAssigner's
    groups list every collaborator once."""
    section = _section(config, "assigner")
    if section is None:
        return
    template = section.get("template")
    cls = _assigner_class(template)
    if cls is None:
        module, _, name = str(template).rpartition(".")
        if module.startswith(ASSIGNER_MODULE) and name not in ("Assigner",):
            raise SettingsError(f"assigner.template: {template!r} is not an assigner of OpenFL; allowed: "
                                f"{', '.join(f'{ASSIGNER_MODULE}.{a}' for a in ASSIGNERS)}"
                                f"{did_you_mean(name, ASSIGNERS)}")
        return
    prefix = "assigner.settings"
    _check_keys(prefix, section.get("settings"), {key: anything() for key in ASSIGNER_KEYS}, ASSIGNER_FILLED)
    settings = section.get("settings") or {}
    groups = settings.get("task_groups")
    if not isinstance(groups, Sequence) or isinstance(groups, str) or not groups:
        raise SettingsError(f"{prefix}.task_groups: expected a non-empty list of task groups "
                            f"({{{', '.join(ASSIGNERS[cls])}}}), got {groups!r}")
    group_keys = ASSIGNERS[cls]
    names = []
    for i, group in enumerate(groups):
        where = f"{prefix}.task_groups[{i}]"
        if not isinstance(group, Mapping):
            raise SettingsError(f"{where}: expected a mapping with {', '.join(group_keys)}, got {group!r}")
        for key in group:
            if key not in group_keys:
                raise SettingsError(f"{where}.{key}: unknown key of a task group of {cls} (it would be ignored); "
                                    f"allowed: {', '.join(group_keys)}{did_you_mean(key, group_keys)}")
        for key in group_keys:
            if key not in group:
                raise SettingsError(f"{where}.{key}: missing; {cls} reads {', '.join(group_keys)}")
        name = text()(f"{where}.name", group["name"])
        if name in names:
            raise SettingsError(f"{where}.name: {name!r} names two task groups")
        names.append(name)
        tasks = group["tasks"]
        if not isinstance(tasks, Sequence) or isinstance(tasks, str) or not all(isinstance(t, str) for t in tasks):
            raise SettingsError(f"{where}.tasks: expected a list of task names, got {tasks!r}")
        if task_names is not None:
            for task in tasks:
                if task not in task_names:
                    raise SettingsError(f"{where}.tasks: {task!r} is not a task of the plan; its tasks: "
                                        f"{', '.join(task_names) or 'none'}{did_you_mean(task, task_names)}")
        if cls == "RandomGroupedAssigner":
            share = group["percentage"]
            if not is_real(share) or not 0 <= share <= 1:
                raise SettingsError(f"{where}.percentage: expected a share of the collaborators in [0, 1], "
                                    f"got {share!r}")
    selected = settings.get("selected_task_group")
    if selected is not None and selected not in names:
        raise SettingsError(f"{prefix}.selected_task_group: {selected!r} is no task group; groups: "
                            f"{', '.join(names)}{did_you_mean(selected, names)}")
    chosen = [g for g in groups if selected is None or g["name"] == selected]
    if cls == "RandomGroupedAssigner" and selected is None:  # a selected group gets share 1.0 from OpenFL
        total = sum(float(g["percentage"]) for g in chosen)
        if abs(1.0 - total) >= SHARE_TOLERANCE:
            raise SettingsError(f"{prefix}.task_groups: the groups' percentages sum to {total:g}; they must sum to 1")
        if collaborators is not None:
            n = len(collaborators)
            given = sum(int(float(g["percentage"]) * n) for g in chosen)
            if given != n:
                raise SettingsError(f"{prefix}.task_groups: the percentages give {given} of the {n} collaborators a "
                                    f"group (int(percentage x {n}) each); choose shares that divide {n} whole")
    if cls == "StaticGroupedAssigner" and collaborators is not None:
        listed = [c for g in chosen for c in (g["collaborators"] or [])]
        if sorted(map(str, listed)) != sorted(collaborators):
            raise SettingsError(f"{prefix}.task_groups: the groups' collaborators {listed} must list each of the "
                                f"federation's collaborators ({', '.join(collaborators)}) exactly once")


def check_openfl_sections(config: Mapping, collaborators: Sequence[str] | None = None) -> dict:
    """The checks above on a plan mapping (`collaborators`: the federation's names, when known): its sections and
    included files as written, then the rest on the plan as OpenFL reads it (as_openfl_reads), which is returned."""
    check_sections(config)
    check_defaults(config)
    config = as_openfl_reads(config)
    check_network(config)
    check_collaborator(config)
    check_straggler_policy(config)
    tasks = config.get("tasks")
    names = [t for t in tasks if t not in ("defaults", "settings")] if isinstance(tasks, Mapping) else None
    check_assigner(config, names, collaborators)
    return config
