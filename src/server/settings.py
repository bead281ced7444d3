"""The settings `src.aggregator.AuditingAggregator` adds to `aggregator.settings`, checked by name.

Kept free of OpenFL and torch imports so that the local federation tooling (`python -m workspace`) can check a
plan before it spends a minute on certificates, and `fx aggregator start` fails at once on the same errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from audit import (DEANON_ATTACKS, DEANON_ATTACK_CHOICES, boolean, integer, module_name, optional, parse, path, real,
                   reject_unknown, setting, subsection, to_dict)

PREFIX = "aggregator.settings"
DEANON_PREFIX = f"{PREFIX}.deanon"
DEFAULT_POLL_INTERVAL_S = 1
DEFAULT_REPORT_DIR = "reports/aggregator"
REPORT_DIR = path("folder")  # aggregator.settings.report_dir (also checked by the callbacks that write there)


@dataclass(frozen=True)
class DeanonServerSettings:
    """`aggregator.settings.deanon`: the aggregator-side deanonymization audit (src/server/deanon_callback.py)."""

    enabled: bool = setting(False, boolean(), "run the aggregator-side deanonymization audit on the real updates")
    layer: str | None = setting(None, optional(module_name("classifier.out"), "the model's last layer"),
                                "the module whose update is attacked")
    attacks: tuple[str, ...] = setting(DEANON_ATTACKS, DEANON_ATTACK_CHOICES,
                                       "re-identification (mlp, svm, knn) and matching (siamese) attacks")
    min_history_rounds: int = setting(2, integer(min=1, note="earlier rounds to train the attacks on"),
                                      "earlier rounds the attacks train on before a round is evaluated")
    seed: int = setting(0, integer(min=0), "seed of the attacks' training")

    def to_dict(self) -> dict:
        return to_dict(self)


@dataclass(frozen=True)
class CanaryClientSettings:
    """`aggregator.settings.canary_clients`: Andrew et al.'s canary clients for a federation whose parties send
    dp_fedavg updates (audit.canary.clients): a user-level epsilon estimate of the global model each round, beside the
    accountant's. The clipping bound and noise multiplier are the plan's `task_runner.settings.mitigation`."""

    enabled: bool = setting(False, boolean(), "insert canary clients and estimate the federation's epsilon")
    count: int = setting(16, integer(min=2, note="canaries inserted per round"),
                         "k canaries inserted per round, and k more held out")
    # 1 would move the model as much as k more parties (accuracy, with 3 parties: benchmarks/README.md); the estimate
    # is scaled back to a full party.
    scale: float = setting(0.01, real(gt=0, le=1, note="of one party's update"),
                           "each inserted canary as this fraction of one party's update")
    seed: int = setting(0, integer(min=0), "seed of the canaries' directions")

    def to_dict(self) -> dict:
        return to_dict(self)



# The keys of `aggregator.settings` OpenFL's Aggregator takes from a plan (its __init__ parameters but those Plan fills
# in itself, OPENFL_FILLED); tests/test_settings_at_start.py checks both lists against its signature. Written out so
# that the tooling checks a plan without importing OpenFL: any other key reached Aggregator.__init__ and failed only
# at `fx aggregator start`, with a TypeError.
OPENFL_KEYS = ("init_state_path", "best_state_path", "last_state_path", "use_delta_updates", "rounds_to_train",
               "single_col_cert_common_name", "db_store_rounds", "log_memory_usage", "write_logs",
               "save_native_model", "persist_checkpoint", "persistent_db_path", "secure_aggregation")
OPENFL_FILLED = ("aggregator_uuid", "federation_uuid", "authorized_cols", "assigner", "connector",
                 "straggler_handling_policy", "compression_pipeline", "initial_tensor_dict")
# This workspace's own keys (src.aggregator.AuditingAggregator); `callbacks` is checked where they are built.
OWN_KEYS = ("poll_interval_s", "report_dir", "deanon", "callbacks", "save_every_round", "canary_clients",
            "final_model_audit")


@dataclass(frozen=True)
class AggregatorSettings:
    """The keys of `aggregator.settings` this workspace owns (OpenFL's own keys are passed on to it)."""

    # The value travels to the collaborators in GetTasksResponse.sleep_time, an int32: a fraction would be truncated
    # (0.5 -> 0, a busy loop), so only whole seconds are accepted; more than an hour would idle the collaborators.
    poll_interval_s: int = setting(DEFAULT_POLL_INTERVAL_S,
                                   integer(min=1, max=3600, noun="a whole number of seconds",
                                           note="OpenFL sends it as an int32"),
                                   "whole seconds the request of a collaborator with nothing to do is held open")
    report_dir: str = setting(DEFAULT_REPORT_DIR, REPORT_DIR, "where the aggregator's report goes")
    deanon: DeanonServerSettings = subsection(DeanonServerSettings, "the aggregator-side deanonymization audit")
    save_every_round: bool = setting(False, boolean(), "write last_state_path every round, not only at the end "
                                                       "(best_state_path is written whenever it improves)")
    canary_clients: CanaryClientSettings = subsection(CanaryClientSettings, "Andrew et al.'s canary clients for a "
                                                      "dp_fedavg federation (audit.canary.clients)")
    final_model_audit: bool = setting(True, boolean(), "one more round after rounds_to_train whose only task, "
                                      "tasks.final_model_audit, has every collaborator audit the final global model "
                                      "against its own members (src/server/final_round.py)")

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any] | None) -> "AggregatorSettings":
        """Check the keys this workspace owns in `aggregator.settings`, and that every other key is one OpenFL's
        Aggregator takes (their values are OpenFL's to check)."""
        settings = dict(settings or {})
        reject_unknown(PREFIX, {k: v for k, v in settings.items() if k not in OPENFL_FILLED}, OWN_KEYS + OPENFL_KEYS)
        own = {k: v for k, v in settings.items() if k in OWN_KEYS and k != "callbacks"}
        return parse(cls, own, PREFIX)
