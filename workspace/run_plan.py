"""The plan of a local multi-process run: the workspace plan plus this run's network, rounds and overrides.

Everything here is decided before `fx workspace export`: the plan's hash names the federation
(`federation_uuid`), so the aggregator and the collaborators must run the very same plan file.
"""

from __future__ import annotations

import copy
import json
import socket
from pathlib import Path
from typing import Iterable, Mapping

import yaml

from workspace.plan_file import PlanFileError, check_settings, collaborator_names, deep_merge, read_plan, yaml_problem

AGG_ADDR = "localhost"  # the aggregator's certificate is made for this name; gRPC binds it to 127.0.0.1
# Plan keys this tool sets from its own flags (the run's state, e.g. federation.json's port and rounds, must agree
# with the plan), so `--set` may not change them.
FLAG_KEYS = {
    ("aggregator", "settings", "rounds_to_train"): "use --rounds",
    ("data_loader", "settings", "collaborator_count"): "use --collaborators",
    ("network", "settings", "agg_port"): "use --port",
    ("network", "settings", "use_tls"): "use --no-tls for plain gRPC",
    ("network", "settings", "agg_addr"): f"a local run uses {AGG_ADDR!r}, the name on the aggregator's certificate",
}


class PlanOverrideError(ValueError):
    pass


def parse_set_option(text: str) -> dict:
    """`a.b.c=value` -> {"a": {"b": {"c": value}}}; the value is read as YAML (1, 0.5, true, [1, 2], {k: v})."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise PlanOverrideError(f"--set {text!r}: expected KEY=VALUE with a dotted plan key, "
                                "e.g. --set aggregator.settings.poll_interval_s=2")
    parts = key.split(".")
    if any(not p for p in parts):
        raise PlanOverrideError(f"--set {text!r}: empty part in the key {key!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise PlanOverrideError(f"--set {key}: the value {raw!r} is not valid YAML{yaml_problem(err)}") from None
    nested: dict = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        nested = {part: nested}
    return nested


def shown(value) -> str:
    """A plan value as it would be written after --set KEY= (JSON is YAML: 5, null, "text", [1, 2])."""
    return json.dumps(value, default=str)


def merge_overrides(items: Iterable[str | Mapping]) -> dict:
    merged: dict = {}
    for item in items:
        merged = deep_merge(merged, parse_set_option(item) if isinstance(item, str) else item)
    return merged


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (it could be taken before the aggregator binds it; `port_is_free` rechecks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_problem(port: int, host: str = "127.0.0.1") -> str | None:
    """Why the aggregator could not listen on `port` now (None if it could): taken, or reserved for root."""
    # SO_REUSEADDR as gRPC sets it (connections of an earlier run in TIME_WAIT do not block the port), but no
    # SO_REUSEPORT: gRPC servers set that too, so a leftover aggregator here would silently share the port.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except PermissionError:
            return "below 1024, a port only root may listen on"
        except OSError:
            return f"in use on {host} (something listens there)"
    return None


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    return port_problem(port, host) is None


def build_run_plan(base_plan: Path, *, collaborators: int, rounds: int, port: int, use_tls: bool,
                   overrides: Mapping | None = None, client_auth: bool = True,
                   workspace: Path | None = None) -> dict:
    """The run's plan: the base plan, this run's settings, then the user's overrides (which win). TLS is off only by
    `use_tls` (--no-tls); client authentication may be off (network.settings.require_client_auth: false) only with
    client_auth=False (--no-client-auth): a plan turning either off otherwise is refused. `workspace`: a
    collaborator's workspace folder, where its plan's paths are checked (src.plan.paths) before anything reads
    them: inside it, or an absolute folder the plan names (this run's owner wrote it); `../../x` is refused."""
    if collaborators < 1:
        raise PlanOverrideError(f"--collaborators: need at least 1, got {collaborators}")
    if rounds < 1:
        raise PlanOverrideError(f"--rounds: need at least 1, got {rounds}")
    try:
        config = read_plan(Path(base_plan))
    except PlanFileError as err:
        raise PlanOverrideError(f"--plan {err}") from None
    check_plan_transport(base_plan, config, use_tls=use_tls)
    run_settings = {
        "aggregator": {"settings": {
            "rounds_to_train": rounds,
            # Fresh folders already make every run start from round 0; no checkpoint database either.
            "persist_checkpoint": False,
            "write_logs": True,  # logs/aggregator_metrics.txt: one line per finished round, read for progress
        }},
        "data_loader": {"settings": {"collaborator_count": collaborators}},
        "network": {"settings": {"agg_addr": AGG_ADDR, "agg_port": port, "use_tls": use_tls}},
    }
    config = deep_merge(config, run_settings)
    check_overrides(config, overrides or {})
    config = deep_merge(config, overrides or {})
    if workspace is not None:
        from src.plan.paths import check_collaborator_paths, owner_allowance

        check_collaborator_paths(config, workspace, owner_allowance(config))
    check_flag_bounds(config, collaborators=collaborators, rounds=rounds)
    check_run_plan(config, collaborator_names(collaborators))
    from src.plan.checks import INSECURE_ENV, check_transport

    check_transport(config, {INSECURE_ENV: ",".join(insecure_allowed(use_tls, client_auth))})
    return config


def check_plan_transport(base_plan: Path, config: Mapping, *, use_tls: bool) -> None:
    """A base plan that turns TLS off runs so only with --no-tls: the run's own `use_tls` (from the flag) would
    otherwise replace the plan's `false` and run it with mutual TLS, silently. (A plan turning client authentication
    off is refused without --no-client-auth by check_transport, on the merged plan.)"""
    network = config.get("network")
    settings = network.get("settings") if isinstance(network, Mapping) else None
    if use_tls and isinstance(settings, Mapping) and settings.get("use_tls", True) is False:
        raise PlanOverrideError(f"--plan {base_plan}: network.settings.use_tls: false turns TLS off: any process that "
                                "reaches the aggregator's port could claim a collaborator's name and receive its tasks "
                                "and the global model; add --no-tls to run it without TLS, or remove the key to run it "
                                "with mutual TLS")


def insecure_allowed(use_tls: bool, client_auth: bool) -> list[str]:
    """What the tool's flags allow off (plan_checks.INSECURE_SETTINGS' values): --no-tls, --no-client-auth."""
    return [*([] if use_tls else ["tls"]), *([] if client_auth else ["client_auth"])]


def check_flag_bounds(config: Mapping, *, collaborators: int, rounds: int) -> None:
    """--rounds and --collaborators against what the plan's data and this machine allow (src.plan.bounds), named by
    the flag; the same bounds on the plan's keys follow in check_run_plan."""
    from src.plan import bounds as plan_bounds
    from src.plan.checks import split_ratios, split_settings, task_names

    plan_bounds.check_rounds("--rounds", rounds, tasks=len(task_names(config)), collaborators=collaborators)
    data = split_settings(config)
    if data is not None:
        plan_bounds.check_collaborators("--collaborators", collaborators, dataset=data["dataset"],
                                        ratios=split_ratios(data), prefix="data_loader.settings.")
    plan_bounds.check_local_collaborators("--collaborators", collaborators)  # a process each, on this machine


def check_overrides(plan: Mapping, overrides: Mapping, path: tuple = ()) -> None:
    """`--set` keys must fit the plan's shape: a known section, a mapping stays a mapping, a value has no keys.

    Deeper checks of the values are the settings classes' (check_run_plan, `fx plan initialize`).
    """
    for key, value in overrides.items():
        where = (*path, key)
        dotted = ".".join(map(str, where))
        if where in FLAG_KEYS:  # the run's own value there came from the tool's flag: the two would contradict
            raise PlanOverrideError(f"--set {dotted}={shown(value)}: the tool sets this key; {FLAG_KEYS[where]} "
                                    f"(this run's value: {shown(plan.get(key))})")
        if not path and key not in plan:
            raise PlanOverrideError(f"--set {dotted}: {key!r} is not a section of the plan; sections: "
                                    f"{', '.join(map(str, plan))}")
        current = plan.get(key)
        if isinstance(current, Mapping):
            if not isinstance(value, Mapping):
                keys = [str(k) for k in current]
                listed = ", ".join(keys[:8]) + (", ..." if len(keys) > 8 else "") or "none yet"
                raise PlanOverrideError(f"--set {dotted}={shown(value)}: {dotted} is a mapping in the plan (keys: "
                                        f"{listed}); set its keys, e.g. --set {dotted}.KEY=VALUE")
            check_overrides(current, value, where)
        elif isinstance(value, Mapping) and current is not None:
            inner = f"{dotted}.{next(iter(value), 'KEY')}"
            raise PlanOverrideError(f"--set {inner}: {dotted} is {shown(current)} in the plan, a value with no keys; "
                                    f"set it whole, e.g. --set {dotted}=VALUE")


def check_run_plan(config: Mapping, collaborators: list[str]) -> None:
    """Fail before any folder is made on what would only fail at `fx aggregator start` or in a round: the
    aggregator's settings, the tasks, the per-collaborator names (check_settings), the rounds and the network.
    The task runner's and data loader's settings are checked by `fx plan initialize`, before any certificate."""
    check_settings(config, collaborators)
    aggregator = config["aggregator"]
    rounds = aggregator["settings"].get("rounds_to_train")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise PlanOverrideError(f"aggregator.settings.rounds_to_train: expected a whole number >= 1, got {rounds!r}")
    network = config.get("network")
    if not isinstance(network, Mapping) or not isinstance(network.get("settings"), Mapping):
        raise PlanOverrideError("network.settings: expected a mapping")
    if network["settings"].get("agg_addr") != AGG_ADDR:
        raise PlanOverrideError(f"network.settings.agg_addr: a local run uses {AGG_ADDR!r} (the certificate's name), "
                                f"got {network['settings'].get('agg_addr')!r}")
    check_data(config)


def check_data(config: Mapping) -> None:
    """A dataset read from files must be there for the collaborators, each of which runs in its own folder
    (<run>/collaboratorN/): a relative data_loader.settings.data_dir would be looked up there. Fails before any
    folder is made; a dataset name or download value of the wrong type is the data loader's to name."""
    from src.data.datasets import DatasetUnavailableError, check_available, dataset_folder, dataset_root

    settings = (config.get("data_loader") or {}).get("settings") or {}
    name, data_dir, download = settings.get("dataset", "digits"), settings.get("data_dir"), settings.get("download")
    try:
        folder = dataset_folder(name, data_dir)
    except (TypeError, ValueError):
        return
    if folder is None or download is True:  # digits; or each collaborator downloads into its own folder
        return
    if data_dir is None or not Path(data_dir).expanduser().is_absolute():
        raise PlanOverrideError(f"data_loader.settings.data_dir: {data_dir!r} is relative, but each collaborator "
                                f"runs in its own folder (<run>/collaboratorN/); give an absolute path, e.g. "
                                f"--set data_loader.settings.data_dir={dataset_root(data_dir)}")
    try:
        check_available(name, data_dir)
    except DatasetUnavailableError as err:
        raise PlanOverrideError(str(err)) from None


def rounds_to_train(config: Mapping) -> int:
    return int(config["aggregator"]["settings"]["rounds_to_train"])


def collaborator_report_dir(config: Mapping) -> str:
    return str(config.get("task_runner", {}).get("settings", {}).get("audit", {}).get("report_dir", "reports"))


def aggregator_report_dir(config: Mapping) -> str:
    from src.server.settings import DEFAULT_REPORT_DIR

    return str(config.get("aggregator", {}).get("settings", {}).get("report_dir", DEFAULT_REPORT_DIR))


def dump_plan(config: Mapping) -> str:
    return yaml.safe_dump(copy.deepcopy(dict(config)), sort_keys=False)
