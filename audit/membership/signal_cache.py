"""A round's per-sample signals, cached by (model state, set) and shared by the party's validation and its audit.

A collaborator's round evaluates the same weights on the same samples more than once: the validation of the received
global model (before training) and of the trained model (after) run on the validation set, which is the audit's
non-member set, and the audit computes both models' signals on it again; a withheld update's audit re-audits the
received model. A forward pass on the same weights and samples gives the same outputs, so the cache keeps the signals,
the model's outputs, the predicted classes and the seconds they took under an explicit key:

- the model: a SHA-256 of every parameter's and buffer's name, shape, dtype and bytes (`state_fingerprint`, one pass
  over the weights, far less than computing a signal). The task runner loads weights into one module in place, so the module object says
  nothing of its weights; the fingerprint changes with any of them.
- the set: the `label` of the AuditSets it belongs to and its name in them (members, non-members, population). A
  label names the samples (AuditSets: the owner gives one label to one content; a sample drawn from a labelled set
  is labelled by its source, size and seed), so two AuditSets with one label share entries whatever array objects
  they hold;
- the layer and batch size the signals were computed with (the batch size changes the last bits of batched kernels).

Entries live for one round (`start_round`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from audit.membership.signals import compute_signals
from audit.model_io import weights_fingerprint
from audit.round_audit import SETS, AuditSets

__all__ = ["SignalCache", "state_fingerprint"]


def state_fingerprint(model: nn.Module) -> str:
    """The fingerprint (audit.model_io.weights_fingerprint) of the model's parameters and buffers."""
    return weights_fingerprint((*model.named_parameters(remove_duplicate=False), *model.named_buffers()))


@dataclass
class _Entry:
    signals: dict[str, np.ndarray]
    logits: np.ndarray | None  # the model's outputs (float64, (N, C)), when a forward pass gave them
    predicted: np.ndarray | None  # their argmax
    seconds: dict[str, float]


class SignalCache:
    """Signals of this round's models on labelled audit sets; `signals` computes what is missing and reuses the rest.
    Key: (state_fingerprint(model), sets.label, set name, layer, batch size)."""

    def __init__(self) -> None:
        self._round: int | None = None
        self._entries: dict[tuple, _Entry] = {}
        self.computed_s = 0.0  # seconds spent computing this round (wherever the caller was)

    def start_round(self, round_num: int) -> None:
        """Forget the previous round's entries (its models are gone)."""
        if round_num != self._round:
            self._round, self._entries, self.computed_s = round_num, {}, 0.0

    def __len__(self) -> int:
        return len(self._entries)

    def signals(self, model: nn.Module, sets: AuditSets, names: Sequence[str], *, layer: str | None,
                batch_size: int) -> tuple[dict, dict, dict]:
        """signal -> set -> values, signal -> seconds over the sets (as compute_signals counted them, reused ones
        included) and set -> whether it was reused (a hit: the same weights, set label and name, layer and batch size,
        with every asked-for signal); the sets computed now are kept for the round."""
        model_key = state_fingerprint(model)
        values: dict[str, dict[str, np.ndarray]] = {name: {} for name in names}
        seconds = {name: 0.0 for name in names}
        reused: dict[str, bool] = {}
        for set_name in SETS:
            key = (model_key, sets.label, set_name, layer, batch_size)
            entry = self._entries.get(key)
            reused[set_name] = entry is not None and all(n in entry.signals for n in names)
            if not reused[set_name]:
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
                entry = self._entries[key] = _Entry(found, logits, predicted, timings)
            for name in names:
                values[name][set_name] = entry.signals[name]
                seconds[name] += entry.seconds.get(name, 0.0)
        return values, seconds, reused

    def logits(self, model: nn.Module, sets: AuditSets, *, batch_size: int) -> dict[str, np.ndarray]:
        """set name -> `model`'s outputs (float64, (N, C)) for the sets of `sets` whose signals this round computed on
        the same weights and batch size with a forward pass (loss or logits asked for); sets without are left out.
        RMIA's Pr(x | model) then needs no forward pass of its own: the same kernels on the same batches."""
        model_key = state_fingerprint(model)
        return {set_name: entry.logits for (key, label, set_name, _, size), entry in self._entries.items()
                if key == model_key and label == sets.label and size == batch_size and entry.logits is not None}

    def accuracy(self, model: nn.Module, sets: AuditSets, set_name: str) -> float | None:
        """Share of the samples of `sets`' set `set_name` that `model`'s weights classify right, if this round's
        signals on them gave the predicted classes; else None."""
        model_key = state_fingerprint(model)
        for (key, label, name, *_), entry in self._entries.items():
            if key == model_key and label == sets.label and name == set_name and entry.predicted is not None:
                return float(np.mean(entry.predicted == np.asarray(getattr(sets, set_name)[1])))
        return None
