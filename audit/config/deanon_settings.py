"""Settings of the deanonymization self-audit (`task_runner.settings.audit.deanon` in the plan)."""

from __future__ import annotations

from dataclasses import dataclass

from audit.config.fields import (boolean, choices, either, integer, literal, module_name, optional, parse, real,
                                 setting, to_dict)

__all__ = ["DeanonSettings", "deanon_settings", "ATTACK_CHOICES", "FEDERATION", "ATTACKS", "REID_ATTACKS"]

# The attacks audit.deanon.attacks runs (named here so that reading a plan does not import torch).
REID_ATTACKS = ("mlp", "svm", "knn")
ATTACKS = REID_ATTACKS + ("siamese",)
FEDERATION = "federation"  # crowd_alpha: as skewed as the federation's own partition
#: A non-empty list of distinct attack names (also `aggregator.settings.deanon.attacks`).
ATTACK_CHOICES = choices(ATTACKS, "attack")


@dataclass(frozen=True)
class DeanonSettings:
    """Deanonymization self-audit: could a server that knows some of this party's data tell its update from a crowd
    of synthetic users' (docs/deanonymization.md)?"""

    enabled: bool = setting(False, boolean(), "run the deanonymization self-audit")
    interval: int = setting(1, integer(min=1), "in audited rounds where round % interval == 0")
    crowd_users: int = setting(10, integer(min=2, note="the crowd to hide in"),
                               "K synthetic users drawn from the population data")
    shadows_per_user: int = setting(8, integer(min=2, note="attacks learn a user from several updates"),
                                    "S shadow updates per user (and for this collaborator)")
    shadow_size: int | None = setting(None, optional(integer(min=1), "this collaborator's member count"),
                                      "samples per shadow update")
    layer: str | None = setting(None, optional(module_name(), "the last layer"), "the module whose update is compared")
    attacks: tuple[str, ...] = setting(ATTACKS, ATTACK_CHOICES, "the attacks run (re-identification: mlp, svm, knn; "
                                                                "matching: siamese)")
    crowd_alpha: float | str | None = setting(
        FEDERATION, either(literal(FEDERATION), real(gt=0, noun="a Dirichlet alpha"), literal(None, "IID")),
        "the crowd's label skew: federation (data_loader.settings.dirichlet_alpha), a Dirichlet alpha, or IID")

    def to_dict(self) -> dict:
        return to_dict(self)

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


def deanon_settings(key: str, value) -> DeanonSettings:
    """DeanonSettings from a plan mapping (None -> defaults); unknown keys and bad values name their dotted key."""
    return parse(DeanonSettings, value, key)
