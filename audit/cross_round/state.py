"""The cross-round attack's private state, kept in the party's audit store between rounds (never sent).

What is kept, and its bound:
- `Pending`: the update the party sent in the round that just ended and its weight, until the next round's global
  model (which averages it) arrives. One model, on disk in a private temporary folder (audit.spill.SpilledModel),
  replaced every round: the others' update cannot be derived from scores, it needs the sent weights once.
- `History`: per attacked round, the per-sample signals of the audit's samples (members, non-members, population) under
  the party's own update and under the others' combined update, float32, and the round's evidence per sample computed
  once from them (float64), for the `rounds_kept` most recent rounds. Its size is at most rounds_kept x (members +
  non-members + population) x (2 models x signals x 4 + 8) bytes (`bound_bytes`), whatever the number of rounds.
  The signals in float32 because the signals are computed in float32 by the model's forward pass
  (each carries rounding errors of many float32 operations): storing them in float32 adds at most half a unit in the
  last place, below what they already carry; float16 (11 significant bits, 5e-4 relative) would add more than the
  computation's own error and tie distinct values, which moves the ranks the AUC and the thresholds are read from.
- `log`: what became of each of the `rounds_kept` most recent rounds (attacked, or skipped and why).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from audit.cross_round.attack import SETS
from audit.spill import SpilledModel

__all__ = ["Pending", "RoundSignals", "History", "CrossRoundState", "STORE_KEY", "DTYPE"]

STORE_KEY = "cross_round"  # the step's entry in the party's audit store (audit.round_audit.AuditContext.store)
DTYPE = np.float32


@dataclass
class Pending:
    """The update a party sent in `round_num` and its weight in that round's average; or why it cannot be attacked
    (`why`: not averaged, weights unknown)."""

    round_num: int
    model: SpilledModel | None = None
    weight: float | None = None
    parties: int | None = None
    why: str | None = None


@dataclass
class RoundSignals:
    """One attacked round: per set, the signals (rows, in `History.signals` order) of every audited sample under the
    party's own update and under the others' combined update; and, computed once from them, the round's evidence
    c_r per sample (float64: a strong member's is within 1e-10 of 1, where float32 would tie it with the rest;
    audit.cross_round.attack.round_evidence) and that round's exact AUC alone."""

    round_num: int
    weight: float
    parties: int
    own: dict[str, np.ndarray]
    others: dict[str, np.ndarray]
    evidence: dict[str, np.ndarray] = field(default_factory=dict)
    exact_auc: float = float("nan")

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for part in (self.own, self.others, self.evidence) for a in part.values())


class History:
    """The `rounds_kept` most recent attacked rounds of one sample of the audit sets (`label`)."""

    def __init__(self, rounds_kept: int, label: str, signals: tuple[str, ...], sizes: dict[str, int]):
        self.rounds: deque[RoundSignals] = deque(maxlen=rounds_kept)
        self.label, self.signals, self.sizes = label, tuple(signals), dict(sizes)

    def add(self, entry: RoundSignals) -> None:
        for part in (entry.own, entry.others):
            for name in SETS:
                if part[name].dtype != DTYPE or part[name].shape != (len(self.signals), self.sizes[name]):
                    raise ValueError(f"round {entry.round_num}: {name} signals of shape {part[name].shape} and dtype "
                                     f"{part[name].dtype}; the history holds {len(self.signals)} x {self.sizes[name]} "
                                     f"{np.dtype(DTYPE).name}")
            if entry.evidence and any(entry.evidence[n].shape != (self.sizes[n],) for n in SETS):
                raise ValueError(f"round {entry.round_num}: evidence of another shape than the sets'")
        self.rounds.append(entry)

    def signal(self, which: str, name: str, signal: str) -> np.ndarray:
        """(rounds, samples) of one signal of one set under the own ("own") or the others' ("others") updates."""
        row = self.signals.index(signal)
        return np.stack([getattr(entry, which)[name][row] for entry in self.rounds])

    @property
    def nbytes(self) -> int:
        return sum(entry.nbytes for entry in self.rounds)

    def bound_bytes(self) -> int:
        """The most the history can hold: rounds_kept x samples x (2 x signals x 4 + 8) bytes."""
        per_sample = 2 * len(self.signals) * np.dtype(DTYPE).itemsize + np.dtype(np.float64).itemsize
        return self.rounds.maxlen * per_sample * sum(self.sizes.values())


@dataclass
class CrossRoundState:
    rounds_kept: int
    pending: Pending | None = None
    history: History | None = None
    log: deque = field(default=None)
    # This round's result (round, sample label) -> StepResult: a second audit in the round (a DP retrain's, the
    # received weights' of a withheld update) reports the same attack on the same earlier updates.
    result: tuple | None = None

    def __post_init__(self):
        if self.log is None:
            self.log = deque(maxlen=self.rounds_kept)

    def note(self, round_num: int, status: str, **fields) -> None:
        self.log.append({"round": int(round_num), "status": status, **fields})
