"""A round's per-sample signals, computed once per model weights and sample set and then reused.

A collaborator's round evaluates the same weights on the same samples more than once: OpenFL's validation tasks run
the received global model (before training) and the trained model (after) on the validation set, which is the audit's
non-member set, and the audit computes both models' signals on it again; a withheld update's audit re-audits the
received model. A forward pass on the same weights and samples gives the same outputs, so the memo keeps, per model
state and set, the signals, the model's outputs, the predicted classes and the seconds they took. A model state is identified by a SHA-256
of every parameter's and buffer's name, shape, dtype and bytes (0.1 s for the tutorial's 23M-parameter net), never by
object identity: the task runner loads weights into one module in place. Entries live for one round.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from audit.membership.signals import compute_signals
from audit.round_audit import SETS, AuditSets

__all__ = ["SignalMemo", "state_fingerprint"]


def state_fingerprint(model: nn.Module) -> str:
    """SHA-256 over the model's parameters and buffers: names, shapes, dtypes and values (bytes)."""
    digest = hashlib.sha256()
    for name, tensor in (*model.named_parameters(remove_duplicate=False), *model.named_buffers()):
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}".encode())
        values = tensor.detach().contiguous().cpu()
        if values.numel():
            digest.update(values.view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


@dataclass
class _Entry:
    x: object  # the set's sample and label arrays themselves: the entry matches only these objects, and holding
    y: object  # them keeps their ids from being reused while it lives
    signals: dict[str, np.ndarray]
    logits: np.ndarray | None  # the model's outputs (float64, (N, C)), when a forward pass gave them
    predicted: np.ndarray | None  # their argmax
    seconds: dict[str, float]


class SignalMemo:
    """Signals of this round's models on the audit's sets; `signals` computes what is missing and reuses the rest."""

    def __init__(self) -> None:
        self._round: int | None = None
        self._entries: dict[tuple, _Entry] = {}
        self.computed_s = 0.0  # seconds spent computing this round (wherever the caller was)

    def start_round(self, round_num: int) -> None:
        """Forget the previous round's entries (its models are gone)."""
        if round_num != self._round:
            self._round, self._entries, self.computed_s = round_num, {}, 0.0

    def signals(self, model: nn.Module, sets: AuditSets, names: Sequence[str], *, layer: str | None,
                batch_size: int) -> tuple[dict, dict, dict]:
        """signal -> set -> values, signal -> seconds over the sets (as compute_signals counted them, reused ones
        included) and set -> whether it was reused; the sets computed now are kept for the round.

        A set is reused only for the same weights, the same sample and label arrays (objects, not copies), the same
        layer and batch size (the batch size changes the last bits of batched kernels) and every asked-for signal."""
        fingerprint = state_fingerprint(model)
        values: dict[str, dict[str, np.ndarray]] = {name: {} for name in names}
        seconds = {name: 0.0 for name in names}
        reused: dict[str, bool] = {}
        for set_name in SETS:
            x, y = getattr(sets, set_name)
            key = (fingerprint, set_name, layer, batch_size)
            entry = self._entries.get(key)
            if entry is None or entry.x is not x or entry.y is not y or not all(n in entry.signals for n in names):
                timings: dict[str, float] = {}
                outputs: dict[str, torch.Tensor] = {}
                xt, yt = sets.tensors(set_name)
                start = time.perf_counter()
                found = compute_signals(model, xt, yt, list(names), layer=layer, batch_size=batch_size,
                                        timings=timings, outputs=outputs)
                self.computed_s += time.perf_counter() - start
                logits = outputs.get("logits")
                logits = None if logits is None else logits.cpu().numpy()
                predicted = None if logits is None else logits.argmax(axis=1)
                entry = self._entries[key] = _Entry(x, y, found, logits, predicted, timings)
                reused[set_name] = False
            else:
                reused[set_name] = True
            for name in names:
                values[name][set_name] = entry.signals[name]
                seconds[name] += entry.seconds.get(name, 0.0)
        return values, seconds, reused

    def logits(self, model: nn.Module, sets: AuditSets, *, batch_size: int) -> dict[str, np.ndarray]:
        """set name -> `model`'s outputs (float64, (N, C)) for the sets whose signals this round computed on the same
        weights, arrays and batch size with a forward pass (loss or logits asked for); sets without are left out.
        RMIA's Pr(x | model) then needs no forward pass of its own: the same kernels on the same batches."""
        fingerprint = state_fingerprint(model)
        found = {}
        for (print_, set_name, _, size), entry in self._entries.items():
            x, y = getattr(sets, set_name)
            if (print_ == fingerprint and size == batch_size and entry.x is x and entry.y is y
                    and entry.logits is not None):
                found[set_name] = entry.logits
        return found

    def accuracy(self, model: nn.Module, x, y) -> float | None:
        """Share of the samples x (labels y: the same array objects as an audit set's) that `model`'s weights
        classify right, if this round's signals on them gave the predicted classes; else None."""
        fingerprint = state_fingerprint(model)
        for (print_, *_), entry in self._entries.items():
            if print_ == fingerprint and entry.x is x and entry.y is y and entry.predicted is not None:
                return float(np.mean(entry.predicted == np.asarray(y)))
        return None
