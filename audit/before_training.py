"""The BEFORE_TRAINING phase of a round: every enabled check of the received global model (audit.config.steps), run
before the party trains on it, and their joint verdict.

A check is a registered step with `phase=BEFORE_TRAINING` whose run is `run(context: ReceivedContext, settings) ->
ReceivedCheck`. The party trains only if no check rejects (an alarm under a `reject` action); otherwise it sends
nothing new this round (the caller's withheld path, with `verdict.reason`). Whatever the verdict, the aggregator is told
only the two scalars of `verdict.metrics()` (audit.config.gate_contract); the figures stay in the party's report.

The phase keeps the last global model the party accepted (`ReceivedContext.previous`: the checks compare with it, and a
rejected round sends it back), in memory or, for large models, on disk. After the round the caller hands what it sent
to `verdict.remember(sent)`, so that the checks can keep what they learn from the party's own update.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from audit.config.gate_contract import (RECEIVED_MODEL_ALARM, RECEIVED_MODEL_REJECTED,
                                        RECEIVED_MODEL_REJECTED_REASON)
from audit.config.steps import BEFORE_TRAINING, registered

__all__ = ["ReceivedContext", "ReceivedCheck", "ReceivedVerdict", "check_received", "KeptWeights"]

# Received models above this size wait on disk between rounds (audit.spill); below, a copy in memory costs less time.
_SPILL_BYTES = 32 * 2**20
_PHASE_KEY = "_before_training"


class KeptWeights:
    """A state dict (name -> numpy array) kept across rounds: in memory when small, else on disk (audit.spill)."""

    def __init__(self, weights: Mapping[str, Any], round_num: int):
        self.round_num = int(round_num)
        arrays = {name: np.asarray(value) for name, value in weights.items()}  # views: the caller's arrays
        if sum(a.nbytes for a in arrays.values()) <= _SPILL_BYTES:
            self._arrays, self._folder = {name: a.copy() for name, a in arrays.items()}, None
        else:
            import torch

            from audit.spill import SpillFolder

            self._arrays, self._folder = None, SpillFolder("kept_weights_")
            # Written from the caller's arrays, without a copy of the model in memory first. torch.save only reads
            # them, so a read-only array (a received protobuf's buffer) is no concern for torch's warning.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                self._folder.save("weights", {n: torch.from_numpy(np.ascontiguousarray(a)) for n, a in arrays.items()})

    def load(self) -> dict[str, np.ndarray]:
        if self._arrays is not None:
            return self._arrays
        return {name: t.numpy() for name, t in self._folder.load("weights").items()}


@dataclass(frozen=True)
class ReceivedContext:
    """What a check of the received model may use."""

    received: Mapping[str, Any]         # tensor name (the template's state-dict names) -> array, as received
    template: Any                       # the plan's model (nn.Module): names, shapes, dtypes, modules; never written
    members: tuple                      # (x, y): the party's training samples
    batch_size: int                     # the party's training batch size
    settings: Any                       # the AuditSettings
    party: str
    round_num: int
    seed: int | None
    # The plan's initial model as the plan's seed builds it (never the one received): an nn.Module or a zero-argument
    # callable giving it (audit.spill.ModelSource); an honest reference every party has without anyone's data.
    plan_initial: Any = None
    previous: KeptWeights | None = None  # the last global model this party accepted (None before the first)
    store: dict = field(default_factory=dict)  # the party's state across rounds; each check under its own name


@dataclass
class ReceivedCheck:
    """What a check returns: an alarm ("<check>: <figure>") or None, and its figures for the party's own report."""

    alarm: str | None
    reject: bool                        # the alarm stops the training (its action is `reject`)
    details: dict                       # JSON-able
    # Called after the round with (received, sent): the check keeps what it learns from the party's own update.
    remember: Callable[[Mapping, Mapping], None] | None = None


@dataclass
class ReceivedVerdict:
    """The phase's verdict on one round's received model."""

    round_num: int
    checks: dict[str, ReceivedCheck]    # step name -> its result
    timings: dict[str, float]
    previous: KeptWeights | None        # the last global model accepted before this round
    _received: Mapping[str, Any] | None = None

    @property
    def alarms(self) -> list[str]:
        return [c.alarm for c in self.checks.values() if c.alarm]

    @property
    def rejected(self) -> bool:
        return any(c.alarm and c.reject for c in self.checks.values())

    @property
    def reason(self) -> str | None:
        """"received model rejected: <check>: <figure>" (the first rejecting check), None when not rejected."""
        first = next((c.alarm for c in self.checks.values() if c.alarm and c.reject), None)
        return None if first is None else f"{RECEIVED_MODEL_REJECTED_REASON}: {first}"

    def metrics(self) -> dict[str, float]:
        """The verdict, the only scalars sent to the aggregator ({} when no check ran)."""
        if not self.checks:
            return {}
        return {RECEIVED_MODEL_ALARM: float(bool(self.alarms)), RECEIVED_MODEL_REJECTED: float(self.rejected)}

    def details(self) -> dict:
        """JSON-able: each check's figures, the verdict and its cost (for the party's round record); {} when no check
        ran."""
        if not self.checks:
            return {}
        return {"round": self.round_num, "alarms": self.alarms, "rejected": self.rejected, "reason": self.reason,
                "previous_round": None if self.previous is None else self.previous.round_num,
                "timings": dict(self.timings), **{name: c.details for name, c in self.checks.items()}}

    def remember(self, sent: Mapping[str, Any]) -> None:
        """After the round: what the party sent (its trained update, or what a withheld round sent back). The
        received weights are let go then: the party keeps its verdict until its next round's check (a later task of
        the round reuses it), and they would be a whole model held through the other parties' rounds."""
        received, self._received = self._received, None
        for check in self.checks.values():
            if check.remember is not None and received is not None:
                check.remember(received, sent)


def check_received(
    received: Mapping[str, Any],
    template,
    members: tuple,
    batch_size: int,
    settings,
    *,
    party: str,
    round_num: int,
    seed: int | None = None,
    plan_initial=None,
    store: dict | None = None,
) -> ReceivedVerdict:
    """Run every enabled BEFORE_TRAINING step on the received model (tensor name -> array, the template's names);
    `store` is the party's state across rounds (the same dict every round). An accepted model (no check rejects it)
    becomes the `previous` of the next round."""
    store = {} if store is None else store
    phase = store.setdefault(_PHASE_KEY, {})
    context = ReceivedContext(received, template, members, int(batch_size), settings, party, int(round_num), seed,
                              plan_initial, phase.get("accepted"), store)
    checks: dict[str, ReceivedCheck] = {}
    timings: dict[str, float] = {}
    for step in registered(BEFORE_TRAINING):
        if not step.due(settings, round_num):
            continue
        start = time.perf_counter()
        checks[step.name] = step.load_run()(context, step.settings_of(settings))
        timings[f"{step.name}_s"] = time.perf_counter() - start
    verdict = ReceivedVerdict(int(round_num), checks, timings, context.previous, received)
    if checks and not verdict.rejected:
        phase["accepted"] = KeptWeights(received, round_num)
    return verdict
