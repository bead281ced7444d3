"""Settings of the RMIA audit (`task_runner.settings.audit.rmia` in the plan). Torch-free.

    rmia:
      enabled: true
      interval: 1                  # rounds where round % interval == 0 (on audited rounds)
      references: [global, independent]   # one attack per kind of reference models (also: fine_tuned)
      reference_models: 1          # K models per trained kind (fine_tuned, independent)
      reference_budget: null       # null: each reference on the member count; b: the K together on b x it
      temperature: 2.0             # of the true-class probability softmax(z / T)[y]
      offline_a: tune              # a in [0, 1], or tune: Privacy Meter v2's tuning on the party's own references
                                   # (K >= 2; with one reference the paper's offline 0.3)
      gamma: 1.0                   # LR(x, z) >= gamma counts z as dominated by x

Kinds of reference (what a party has without anyone's private data but its own; docs/membership.md, "RMIA"):
- global: the round's received global model (free). It has seen this party's members in earlier rounds, so the
  attack measures what this round's local training adds.
- fine_tuned: K models trained from the received global model with the party's recipe, each on a subset of its
  population shard of the member count: what this round adds, with the difficulty of each sample calibrated.
- independent: K models that never saw the party's data: started from the plan's initial model and trained each
  audited round by one more local training on their population subset, as the party's own model was (one local
  training per reference per round): the cumulative leakage of the local model.
"""

from __future__ import annotations

from dataclasses import dataclass

from audit.config.attack_key import AttackKey
from audit.config.fields import (boolean, choices, either, integer, literal, optional, parse, real, setting,
                                 to_dict)
from audit.config.vocabulary import RMIA, attack_statistics

__all__ = ["RMIASettings", "rmia_settings", "REFERENCE_KINDS", "TRAINED_KINDS", "GLOBAL", "FINE_TUNED", "INDEPENDENT",
           "TUNE", "GLOBAL_A"]

GLOBAL, FINE_TUNED, INDEPENDENT = "global", "fine_tuned", "independent"
REFERENCE_KINDS = (GLOBAL, FINE_TUNED, INDEPENDENT)
TRAINED_KINDS = (FINE_TUNED, INDEPENDENT)
TUNE = "tune"
# The global model alone gives no reference whose training set is known, so `a` cannot be tuned for it (whom the
# global model trained on is the very question asked): with offline_a: tune it uses the RMIA paper's offline value.
GLOBAL_A = 0.3


# The share of the temporary folder's free space RMIA's references kept across rounds may take (the rest: the spilled
# initial model, the other steps' files, the system's): audit.membership.rmia_step.check_references.
REFERENCE_DISK_SHARE = 0.5


@dataclass(frozen=True)
class RMIASettings:
    """RMIA on the local model, one attack per kind of reference model (docs/membership.md, "RMIA")."""

    enabled: bool = setting(True, boolean(), "run RMIA on the local model")
    interval: int = setting(1, integer(min=1), "RMIA in audited rounds where round % interval == 0")
    # The strongest attack at its cost (docs/membership.md, "RMIA"): the free global reference and one that never saw
    # the party's data, one local training a round; fine_tuned answers a narrower question. One reference model holds
    # the TPR at a low FPR of four at a fraction of the audit's cost (benchmarks/README.md, "RMIA's reference cost").
    references: tuple[str, ...] = setting((GLOBAL, INDEPENDENT), choices(REFERENCE_KINDS, "kind of reference"),
                                          "one attack per kind of reference model")
    reference_models: int = setting(1, integer(min=1), "K reference models per trained kind (fine_tuned, "
                                                       "independent); each costs about one local training a round")
    # The K references of a kind share b local trainings a round: each trains on b x the member count / K samples
    # (at least 1, at most half the population). null: each on the member count, K local trainings a round.
    reference_budget: float | None = setting(None, optional(real(gt=0), "each reference on the member count"),
                                             "local trainings a round the K references of a trained kind share: "
                                             "each trains on reference_budget x the member count / K samples")
    temperature: float = setting(2.0, real(gt=0), "Pr(x | model) = softmax(logits / temperature)[label]")
    offline_a: float | str = setting(TUNE, either(real(ge=0, le=1), literal(TUNE)),
                                     "the offline approximation's a, or tune (Privacy Meter v2's tuning on the "
                                     "party's own references; it needs K >= 2: with one, the paper's offline 0.3)")
    gamma: float = setting(1.0, real(gt=0), "a population sample z counts against x when LR(x, z) >= gamma")

    def to_dict(self) -> dict:
        return to_dict(self)

    def due(self, round_num: int) -> bool:
        return self.enabled and round_num % self.interval == 0

    def reference_size(self, member_count: int) -> int:
        """Samples each trained reference learns from a round (before the population's cap of half its size)."""
        if self.reference_budget is None:
            return int(member_count)
        return max(1, int(self.reference_budget * member_count / self.reference_models))

    def metric_names(self, fpr_tolerance) -> list[str]:
        """The scalars audit.membership.rmia_step reports: rmia_<kind>_<statistic> per kind of reference."""
        statistics = attack_statistics(fpr_tolerance)
        return [AttackKey(RMIA, kind).metric(statistic) for kind in self.references for statistic in statistics]


def rmia_settings(key: str, value) -> RMIASettings:
    """RMIASettings from a plan mapping (None -> defaults); unknown keys and bad values name their dotted key."""
    return parse(RMIASettings, value, key)
