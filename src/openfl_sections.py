"""Checks of the plan sections OpenFL builds its own objects from: the sections themselves, `network.settings`,
`collaborator.settings` and `straggler_handling_policy`, each key by its dotted name.

OpenFL hands `network.settings` to its gRPC client and server, which swallow any other key in **kwargs
(`client_reconect_interval: 5` left the interval at 1 s); `collaborator.settings` to Collaborator.__init__ (a
misspelt key was a TypeError at `fx collaborator start`, after the certificates; `opt_treatment: FOO` an
AttributeError); and the straggler policy's settings to CutoffTimePolicy, which swallows unknown keys too
(`straggler_cutof_time: 60` kept the cutoff at 3600 s) and used a string cutoff only in round 0, in a timer thread.

Torch-free and OpenFL-free (the tooling checks a plan at once); the key lists are OpenFL 1.9's signatures,
written out, and tests/test_settings_at_start.py checks them against those signatures. Every error is a
SettingsError whose message starts with the dotted plan key.
"""

from __future__ import annotations

from collections.abc import Mapping

from audit.config.fields import (SettingsError, anything, boolean, choice, did_you_mean, either, integer, literal,
                                 optional, real, text)

__all__ = ["NETWORK_KEYS", "NETWORK_FILLED", "COLLABORATOR_KEYS", "COLLABORATOR_FILLED", "STRAGGLER_POLICIES",
           "SECTIONS", "check_sections", "check_network", "check_collaborator", "check_straggler_policy",
           "check_openfl_sections"]

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
                            f"allowed: {', '.join(STRAGGLER_POLICIES)}")
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
                                f"{', '.join(SECTIONS)}")
        if not isinstance(section, Mapping):
            raise SettingsError(f"{name}: expected a mapping, got {section!r}")
        if name in BUILT_SECTIONS:
            for key in section:
                if key not in SECTION_KEYS:
                    raise SettingsError(f"{name}.{key}: unknown key of a plan section (it would be ignored or taken "
                                        f"for a setting); allowed: {', '.join(SECTION_KEYS)}")


def check_openfl_sections(config: Mapping) -> None:
    """The checks above on a plan mapping."""
    check_sections(config)
    check_network(config)
    check_collaborator(config)
    check_straggler_policy(config)
