"""The settings `src.aggregator.AuditingAggregator` adds to `aggregator.settings`, checked by name.

Kept free of OpenFL and torch imports so that the local federation tooling (`python -m workspace`) can check a
plan before it spends a minute on certificates, and `fx aggregator start` fails at once on the same errors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from audit.config.deanon_settings import ATTACKS, check_attacks  # reading a plan imports neither torch nor sklearn
from audit.config.checks import check_bool, from_checks, is_int, is_real

PREFIX = "aggregator.settings"
DEANON_PREFIX = f"{PREFIX}.deanon"
CANARY_CLIENTS_PREFIX = f"{PREFIX}.canary_clients"
DEFAULT_POLL_INTERVAL_S = 1
DEFAULT_REPORT_DIR = "reports/aggregator"


@dataclass(frozen=True)
class DeanonServerSettings:
    """`aggregator.settings.deanon`: the aggregator-side deanonymization audit (src/deanon_callback.py)."""

    enabled: bool = False
    layer: str | None = None            # module whose update is attacked; None = the module of the model's last tensor
    attacks: tuple[str, ...] = ATTACKS  # mlp, svm, knn (re-identification), siamese (matching)
    min_history_rounds: int = 2         # earlier rounds the attacks train on before a round is evaluated
    seed: int = 0

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["attacks"] = list(self.attacks)
        return out

    @classmethod
    def from_mapping(cls, value: Any, prefix: str = DEANON_PREFIX) -> "DeanonServerSettings":
        """Checked settings (None -> defaults); unknown keys and bad values fail naming `<prefix>.<key>`."""
        return from_checks(cls, _DEANON_CHECKS, value, prefix)


def _deanon_layer(key: str, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"{key}: expected a module name (e.g. classifier.out) or null (the model's last layer), "
                         f"got {value!r}")
    return None if value is None else value.strip()


def _deanon_min_history(key: str, value: Any) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(f"{key}: expected an integer >= 1 (earlier rounds to train the attacks on), got {value!r}")
    return int(value)


def _deanon_seed(key: str, value: Any) -> int:
    if not is_int(value) or value < 0:
        raise ValueError(f"{key}: expected an integer >= 0, got {value!r}")
    return int(value)


_DEANON_CHECKS = {
    "enabled": check_bool,
    "layer": _deanon_layer,
    "attacks": check_attacks,
    "min_history_rounds": _deanon_min_history,
    "seed": _deanon_seed,
}


@dataclass(frozen=True)
class CanaryClientSettings:
    """`aggregator.settings.canary_clients`: Andrew et al.'s canary clients for a federation whose parties send
    dp_fedavg updates (audit.canary.clients): a user-level epsilon estimate of the global model each round, beside the
    accountant's. The clipping bound and noise multiplier are the plan's `task_runner.settings.mitigation`."""

    enabled: bool = False
    count: int = 16      # k canaries inserted per round, and k more held out
    # Each inserted canary as this fraction of one party's update: 1 would move the model as much as k more parties
    # (accuracy, with 3 parties: benchmarks/README.md); the estimate is scaled back to a full party.
    scale: float = 0.01
    seed: int = 0

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_mapping(cls, value: Any, prefix: str = CANARY_CLIENTS_PREFIX) -> "CanaryClientSettings":
        return from_checks(cls, _CANARY_CLIENT_CHECKS, value, prefix)


def _canary_count(key: str, value: Any) -> int:
    if not is_int(value) or value < 2:
        raise ValueError(f"{key}: expected an integer >= 2 (canaries inserted per round), got {value!r}")
    return int(value)


def _canary_scale(key: str, value: Any) -> float:
    if not is_real(value) or not 0 < value <= 1:
        raise ValueError(f"{key}: expected a number in (0, 1] (of one party's update), got {value!r}")
    return float(value)


_CANARY_CLIENT_CHECKS = {"enabled": check_bool, "count": _canary_count, "scale": _canary_scale,
                         "seed": _deanon_seed}


# The keys of `aggregator.settings` OpenFL's Aggregator takes from a plan (its __init__ parameters but those Plan fills
# in itself, OPENFL_FILLED); tests/test_settings_at_start.py checks both lists against its signature. Written out so
# that the tooling checks a plan without importing OpenFL: any other key reached Aggregator.__init__ and failed only
# at `fx aggregator start`, with a TypeError.
OPENFL_KEYS = ("init_state_path", "best_state_path", "last_state_path", "use_delta_updates", "rounds_to_train",
               "single_col_cert_common_name", "db_store_rounds", "log_memory_usage", "write_logs",
               "save_native_model", "persist_checkpoint", "persistent_db_path", "secure_aggregation")
OPENFL_FILLED = ("aggregator_uuid", "federation_uuid", "authorized_cols", "assigner", "connector",
                 "straggler_handling_policy", "compression_pipeline", "initial_tensor_dict")
# This workspace's own keys (src.aggregator.AuditingAggregator).
OWN_KEYS = ("poll_interval_s", "report_dir", "deanon", "callbacks", "save_every_round", "canary_clients")


@dataclass(frozen=True)
class AggregatorSettings:
    poll_interval_s: int = DEFAULT_POLL_INTERVAL_S
    report_dir: str = DEFAULT_REPORT_DIR
    deanon: DeanonServerSettings = field(default_factory=DeanonServerSettings)
    save_every_round: bool = False  # OpenFL's model files (last/best_state_path) each round, not only at the end
    canary_clients: CanaryClientSettings = field(default_factory=CanaryClientSettings)

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any] | None) -> "AggregatorSettings":
        """Check the keys this workspace owns in `aggregator.settings`, and that every other key is one OpenFL's
        Aggregator takes (their values are OpenFL's to check)."""
        settings = dict(settings or {})
        for key in settings:
            if key not in OWN_KEYS and key not in OPENFL_KEYS and key not in OPENFL_FILLED:
                raise ValueError(f"{PREFIX}.{key}: unknown setting; known: {', '.join(OWN_KEYS + OPENFL_KEYS)}")
        return cls(
            poll_interval_s=check_poll_interval(settings.get("poll_interval_s", DEFAULT_POLL_INTERVAL_S)),
            report_dir=check_report_dir(settings.get("report_dir", DEFAULT_REPORT_DIR)),
            deanon=DeanonServerSettings.from_mapping(settings.get("deanon")),
            save_every_round=check_bool(f"{PREFIX}.save_every_round", settings.get("save_every_round", False)),
            canary_clients=CanaryClientSettings.from_mapping(settings.get("canary_clients")),
        )


def check_poll_interval(value: Any) -> int:
    # The value travels to the collaborators in GetTasksResponse.sleep_time, an int32: a fraction would be
    # truncated (0.5 -> 0, a busy loop), so only whole seconds are accepted.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{PREFIX}.poll_interval_s: expected a whole number of seconds (OpenFL sends it as an int32), "
            f"got {value!r}"
        )
    if value < 1:
        raise ValueError(f"{PREFIX}.poll_interval_s: must be >= 1 second, got {value!r}")
    if value > 3600:
        raise ValueError(f"{PREFIX}.poll_interval_s: {value} s is more than an hour; collaborators would idle that long")
    return value


def check_report_dir(value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{PREFIX}.report_dir: expected a folder path (string), got {type(value).__name__} {value!r}")
    text = os.fspath(value)
    if not text.strip():
        raise ValueError(f"{PREFIX}.report_dir: must not be empty")
    if "\0" in text:
        raise ValueError(f"{PREFIX}.report_dir: contains a NUL character: {text!r}")
    return text
