"""Settings of the RMIA audit (`task_runner.settings.audit.rmia` in the plan). Torch-free.

    rmia:
      enabled: true
      interval: 1                  # rounds where round % interval == 0 (on audited rounds)
      references: [global, independent]   # one attack per kind of reference models (also: fine_tuned)
      reference_models: 4          # K models per trained kind (fine_tuned, independent)
      temperature: 2.0             # of the true-class probability softmax(z / T)[y]
      offline_a: tune              # a in [0, 1], or tune: Privacy Meter v2's tuning on the party's own references
      gamma: 1.0                   # LR(x, z) >= gamma counts z as dominated by x

Kinds of reference (what a party has without anyone's private data but its own; README "RMIA"):
- global: the round's received global model (free). It has seen this party's members in earlier rounds, so the
  attack measures what this round's local training adds.
- fine_tuned: K models trained from the received global model with the party's recipe, each on a subset of its
  population shard of the member count: what this round adds, with the difficulty of each sample calibrated.
- independent: K models that never saw the party's data: started from the plan's initial model and trained each
  audited round by one more local training on their population subset, as the party's own model was (one local
  training per reference per round): the cumulative leakage of the local model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from audit.config.checks import SettingsError, check_bool, check_positive_int, from_checks, is_real
from audit.config.vocabulary import attack_statistics, rmia_metric

__all__ = ["RMIASettings", "rmia_settings", "REFERENCE_KINDS", "TRAINED_KINDS", "GLOBAL", "FINE_TUNED", "INDEPENDENT",
           "TUNE", "GLOBAL_A"]

GLOBAL, FINE_TUNED, INDEPENDENT = "global", "fine_tuned", "independent"
REFERENCE_KINDS = (GLOBAL, FINE_TUNED, INDEPENDENT)
TRAINED_KINDS = (FINE_TUNED, INDEPENDENT)
TUNE = "tune"
# The global model alone gives no reference whose training set is known, so `a` cannot be tuned for it (whom the
# global model trained on is the very question asked): with offline_a: tune it uses the RMIA paper's offline value.
GLOBAL_A = 0.3


@dataclass(frozen=True)
class RMIASettings:
    enabled: bool = True
    interval: int = 1
    # The strongest attack at its cost (benchmarks/bench_attacks.py, README "RMIA"): the free global reference and 4
    # that never saw the party's data, 4 local trainings a round; fine_tuned (4 more) answers a narrower question.
    references: tuple[str, ...] = (GLOBAL, INDEPENDENT)
    reference_models: int = 4
    temperature: float = 2.0
    offline_a: float | str = TUNE
    gamma: float = 1.0

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["references"] = list(self.references)
        return out

    def due(self, round_num: int) -> bool:
        return self.enabled and round_num % self.interval == 0

    def metric_names(self, fpr_tolerance) -> list[str]:
        """The scalars audit.membership.rmia_step reports: rmia_<kind>_<statistic> per kind of reference."""
        statistics = attack_statistics(fpr_tolerance)
        return [rmia_metric(kind, statistic) for kind in self.references for statistic in statistics]


def _references(key, value) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise SettingsError(f"{key}: expected a non-empty list from {', '.join(REFERENCE_KINDS)}, got {value!r}")
    for item in value:
        if item not in REFERENCE_KINDS:
            raise SettingsError(f"{key}: unknown kind of reference {item!r}; known: {', '.join(REFERENCE_KINDS)}")
    if len(set(value)) != len(value):
        raise SettingsError(f"{key}: a kind is listed twice: {list(value)}")
    return tuple(value)


def _positive(key, value) -> float:
    if not is_real(value) or not (math.isfinite(value) and value > 0):
        raise SettingsError(f"{key}: expected a finite number > 0, got {value!r}")
    return float(value)


def _offline_a(key, value) -> float | str:
    if value == TUNE:
        return TUNE
    if not is_real(value) or not 0 <= value <= 1:
        raise SettingsError(f"{key}: expected a number in [0, 1] or {TUNE!r}, got {value!r}")
    return float(value)


_CHECKS = {
    "enabled": check_bool,
    "interval": check_positive_int,
    "references": _references,
    "reference_models": check_positive_int,
    "temperature": _positive,
    "offline_a": _offline_a,
    "gamma": _positive,
}


def rmia_settings(key: str, value) -> RMIASettings:
    """RMIASettings from a plan mapping (None -> defaults); unknown keys and bad values name their dotted key."""
    return from_checks(RMIASettings, _CHECKS, value, key)
