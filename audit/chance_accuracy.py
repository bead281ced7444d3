"""Whether the global model has learnt anything by the time the audit's figures start to matter: its accuracy on a
party's validation set against chance, the share of the most frequent class there (what always guessing that class
scores). An audit of a model that has learnt nothing says little: its members and non-members look alike to it
whatever the data. The party's audit (audit.party_audit) asks once per party, at its first validation of a received
model from CHECK_ROUND on, and logs the note at most once per process (every party of the demo shares one)."""

from __future__ import annotations

import numpy as np

__all__ = ["CHECK_ROUND", "NEAR", "near_chance_note"]

CHECK_ROUND = 2  # the model received in round 2 has been trained and averaged twice
# "Near chance": less than this share of the way from chance to perfect accuracy (0.19 for 10 balanced classes).
NEAR = 0.1
_SAID: set[str] = set()


def near_chance_note(party: str, round_num: int, accuracy: float, labels, *, once: bool = True) -> str | None:
    """One line when `accuracy` (the received global model's, on this party's validation `labels`) is near chance,
    naming the settings that train more; None otherwise. `once`: None after the first note of the process."""
    labels = np.asarray(labels)
    if labels.size == 0 or not np.isfinite(accuracy) or (once and _SAID):
        return None
    counts = np.unique(labels, return_counts=True)[1]
    chance = float(counts.max()) / labels.size
    if accuracy >= chance + NEAR * (1.0 - chance):
        return None
    if once:
        _SAID.add(party)
    correct = int(round(accuracy * labels.size))
    return (f"{party} round {round_num}: the global model's validation accuracy is {accuracy:.3f} ({correct}/"
            f"{labels.size}) after {round_num} rounds, near chance ({chance:.3f}: always its most frequent class of "
            f"{len(counts)}). The audit of a model that has not learnt says little about what a trained one leaks. "
            "To train more (keys under task_runner.settings, tasks.train.kwargs): a larger learning_rate, optimizer "
            "Adam, more epochs (cifar10_PM.py --learning_rate, --optimizer_type Adam, --local_epochs), or more "
            "rounds; where gates withheld the updates, the global model has not changed at all. Said once.")
