"""`AttackKey`: one membership attack of a round, by its model kind and signal (for RMIA: its kind of reference
models). Every name of the attack (its metric names, its report name, its population size's name) derives from the key
through audit.config.vocabulary.

It lives in the settings layer so that a step's declaration (audit.config.builtin_steps, a plug-in) names the metrics
of its attacks without importing the round record; the record (audit.round_record) keys its attacks by it.
"""

from __future__ import annotations

from dataclasses import dataclass

from audit.config.vocabulary import attack_metric, attack_name, population_name

__all__ = ["AttackKey"]


@dataclass(frozen=True, order=True)
class AttackKey:
    """One membership attack of a round: its model kind ("local", "global", "update", or RMIA) and its signal (for
    RMIA: its kind of reference models). Every name of the attack is derived from it (audit.config.vocabulary)."""

    model: str
    signal: str

    def metric(self, statistic: str) -> str:
        """The metric name of one of its statistics, e.g. mia_local_loss_exact_auc, rmia_global_auc."""
        return attack_metric(self.model, self.signal, statistic)

    @property
    def name(self) -> str:
        """What every one of its metric names starts with: mia_<model>_<signal> or rmia_<references>."""
        return attack_name(self.model, self.signal)

    @property
    def population_metric(self) -> str:
        """The name under which its population size is sent (population__<name>)."""
        return population_name(self.name)

    def label(self) -> str:
        return f"{self.model} / {self.signal}"

    def __iter__(self):  # model, signal = key
        return iter((self.model, self.signal))
