"""Each tensor's change since the previous global model, against what honest rounds have shown.

An honest FedAvg model moves by the weighted average of its parties' updates, whose norm is at most the largest of
theirs (the triangle inequality). The party knows one of them, its own last update, and the changes of the earlier
global models it accepted; a tensor that moved far more than all of these was set, not averaged. Figure, per floating
tensor: ||G_t - G_prev|| over the envelope max(||own last update||, the largest earlier change); the largest ratio
decides. A tensor with no honest reference yet (nothing moved it) is not judged.

Limits (docs/received-model.md): the other parties may train more (more data, epochs), so the ratio allows a wide
factor; a construction set in small steps over many rounds stays inside the envelope it widens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

__all__ = ["HistoryState", "change_norms", "judge_changes"]


@dataclass
class HistoryState:
    """What the party keeps across rounds (per floating tensor)."""

    own_update: dict[str, float] = field(default_factory=dict)  # ||sent - received|| of its last trained round
    own_round: int | None = None
    largest_change: dict[str, float] = field(default_factory=dict)  # of the global models it trained on

    def remember(self, received: Mapping[str, Any], sent: Mapping[str, Any], round_num: int,
                 change: Mapping[str, float] | None) -> None:
        self.own_update = change_norms(sent, received)
        self.own_round = int(round_num)
        for name, value in (change or {}).items():
            self.largest_change[name] = max(value, self.largest_change.get(name, 0.0))


# Rows of a tensor's difference taken at a time (8 MB in float64) on the way to its float64 copy.
_DIFF_CHUNK = 2**20


def change_norms(new: Mapping[str, Any], old: Mapping[str, Any]) -> dict[str, float]:
    """||new - old|| per floating tensor both hold with the same shape (the difference in the tensors' float32 or wider;
    the sum of squares in float64)."""
    out = {}
    for name, value in new.items():
        a = np.asarray(value)
        if name not in old or a.dtype.kind != "f":
            continue
        b = np.asarray(old[name])
        if a.shape == b.shape:
            d = _float64_difference(a.ravel(), b.ravel(), np.result_type(a, b, np.float32))
            out[name] = float(np.sqrt(np.dot(d, d)))
    return out


def _float64_difference(a: np.ndarray, b: np.ndarray, dtype) -> np.ndarray:
    """a - b computed in `dtype`, held in float64: the values of `np.subtract(a, b, dtype=dtype).astype(float64)`,
    filled a chunk at a time, so a large tensor (the tutorial's 64 MB layer) costs its float64 copy alone, not that
    and the difference in `dtype` and a second float64 copy for the dot product, as one expression would."""
    d = np.empty(a.size, dtype=np.float64)
    for start in range(0, a.size, _DIFF_CHUNK):
        part = slice(start, start + _DIFF_CHUNK)
        d[part] = np.subtract(a[part], b[part], dtype=dtype)
    return d


def judge_changes(change: Mapping[str, float], state: HistoryState) -> dict:
    """Each tensor's change over its envelope; the largest ratio and its tensor (ratio None: no tensor judged)."""
    ratios = {}
    for name, value in change.items():
        envelope = max(state.own_update.get(name, 0.0), state.largest_change.get(name, 0.0))
        if envelope > 0:  # else nothing honest ever moved it: no reference to compare with
            ratios[name] = value / envelope
    if not ratios:
        return {"ratio": None, "tensor": None, "judged": 0, "own_round": state.own_round}
    worst = max(ratios, key=lambda k: (ratios[k], k))
    envelope = max(state.own_update.get(worst, 0.0), state.largest_change.get(worst, 0.0))
    return {"ratio": ratios[worst] if math.isfinite(ratios[worst]) else None, "tensor": worst,
            "change": change[worst], "envelope": envelope, "judged": len(ratios), "own_round": state.own_round}
