"""Settings of the deanonymization self-audit (`task_runner.settings.audit.deanon` in the plan)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from audit.config.checks import (SettingsError, check_bool, check_optional_module, check_positive_int, from_checks,
                                  is_int, is_real)

__all__ = ["DeanonSettings", "deanon_settings", "check_attacks", "FEDERATION", "ATTACKS", "REID_ATTACKS"]

# The attacks audit.deanon.attacks runs (named here so that reading a plan does not import torch).
REID_ATTACKS = ("mlp", "svm", "knn")
ATTACKS = REID_ATTACKS + ("siamese",)
FEDERATION = "federation"  # crowd_alpha: as skewed as the federation's own partition


@dataclass(frozen=True)
class DeanonSettings:
    enabled: bool = False
    interval: int = 1                  # rounds where round % interval == 0 (and the audit itself is due)
    crowd_users: int = 10              # K synthetic users drawn from the population data
    shadows_per_user: int = 8          # S shadow updates per user (and for this collaborator)
    shadow_size: int | None = None     # samples per shadow update; None = this collaborator's member count
    layer: str | None = None           # the module whose update is compared; None = the last layer
    attacks: tuple[str, ...] = ATTACKS
    crowd_alpha: float | str | None = FEDERATION  # crowd label skew: "federation", a Dirichlet alpha, or None (IID)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["attacks"] = list(self.attacks)
        return out

    def due(self, round_num: int) -> bool:
        return self.enabled and round_num % self.interval == 0

    def metric_names(self) -> list[str]:
        """The scalar metrics audit.deanon.self_audit.deanon_self_audit reports under these settings."""
        names = []
        for attack in self.attacks:
            if attack in REID_ATTACKS:
                names += [f"deanon_{attack}_{m}"
                          for m in ("ap", "ap_over_chance", "top1", "top5", "own_rank", "own_ap_over_chance")]
            else:
                names += [f"deanon_{attack}_ap", f"deanon_{attack}_ap_over_chance"]
        if any(a in REID_ATTACKS for a in self.attacks):
            names.append("deanon_ap_over_chance")  # the strongest re-identification attack's: the gate's metric
        return names

    def crowd_skew(self, federation_alpha: float | None) -> float | None:
        return federation_alpha if self.crowd_alpha == FEDERATION else self.crowd_alpha


def check_attacks(key, value) -> tuple[str, ...]:
    """A non-empty list of distinct attack names (also `aggregator.settings.deanon.attacks`)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise SettingsError(f"{key}: expected a non-empty list of attacks from {', '.join(ATTACKS)}, got {value!r}")
    for item in value:
        if item not in ATTACKS:
            raise SettingsError(f"{key}: unknown attack {item!r}; known: {', '.join(ATTACKS)}")
    if len(set(value)) != len(value):
        raise SettingsError(f"{key}: an attack is listed twice: {list(value)}")
    return tuple(value)


def _optional_positive_int(key, value):
    return None if value is None else check_positive_int(key, value)


def _crowd_alpha(key, value):
    if value is None or value == FEDERATION:
        return value
    if not is_real(value) or not (math.isfinite(value) and value > 0):
        raise SettingsError(f"{key}: expected {FEDERATION!r}, a Dirichlet alpha > 0 or null (IID), got {value!r}")
    return float(value)


def _crowd_users(key, value):
    if not is_int(value) or value < 2:
        raise SettingsError(f"{key}: expected an integer >= 2 (the crowd to hide in), got {value!r}")
    return int(value)


def _shadows(key, value):
    if not is_int(value) or value < 2:
        raise SettingsError(f"{key}: expected an integer >= 2 (attacks learn a user from several updates), "
                            f"got {value!r}")
    return int(value)


_CHECKS = {
    "enabled": check_bool,
    "interval": check_positive_int,
    "crowd_users": _crowd_users,
    "shadows_per_user": _shadows,
    "shadow_size": _optional_positive_int,
    "layer": check_optional_module,
    "attacks": check_attacks,
    "crowd_alpha": _crowd_alpha,
}


def deanon_settings(key: str, value) -> DeanonSettings:
    """DeanonSettings from a plan mapping (None -> defaults); unknown keys and bad values name their dotted key."""
    return from_checks(DeanonSettings, _CHECKS, value, key)
