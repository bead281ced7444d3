"""The other parties' combined update, derived by the party from the global model it receives next, and what the
party must know for that.

Under a weighted average (FedAvg: OpenFL's WeightedAverage, this workspace's src.aggregation.GatedWeightedAverage)
the global model after round r is

    G_{r+1} = sum_k w_k L_k        (w_k: party k's weight among the parties averaged in round r, summing to 1)

so a party that knows its own sent update L_self and its weight w gets the others' combined update

    O_r = sum_{k != self} w_k / (1 - w) L_k = (G_{r+1} - w L_self) / (1 - w).

What that needs, and where the party reads it (`average_weight`):
- the aggregator's rule is a weighted average (`cross_round.aggregation`); a robust rule (median, trimmed mean,
  Krum) has no such identity: nothing is derived;
- its weight: OpenFL weighs each party by the training-set size it reports. The party knows its own; the others'
  come from `cross_round.weights` (party -> weight) or, by default, from the plan's data split (every party computes
  the same split, so it knows every shard's size), unless a data mitigation of some party changes its size (rand_aug,
  mm_aug add samples);
- which parties the round's average kept. The gated average leaves out a withheld update (and a non-finite one) and
  renormalises the weights over the rest. The party knows its own decision (a round it withheld gives no L_self in
  G_{r+1}: skipped). Another party's it cannot see: with two parties G_{r+1} = L_self exactly when the other was left
  out (`left_out_alone` checks it); with more, the plan tells whether another party's gate can withhold at all
  (action withhold or dp_retrain with a threshold or a budget): if one can, the round's weights are unknown and the
  round is skipped. What the plan cannot rule out (another party's non-finite update, a straggler the aggregator cut
  off, a received model another party's check rejected) is assumed absent with more than two parties: then a share of
  L_self would be in the derived update, which pulls it towards the party's own and makes the attack read low.

Arithmetic: the aggregator sums float32 products term by term, so G_{r+1} carries a rounding error of at most
gamma_{K+1} sum_k w_k |L_k| per element (gamma_n = n u / (1 - n u), u = 2^-24); the derivation works in float64 and
divides by (1 - w): the derived O_r is the aggregator's combined update to within that error / (1 - w), plus one
rounding to the model's dtype (tests/test_cross_round.py checks it against the real aggregation function).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
from torch import nn

from audit.config.cross_round_settings import OTHER, CrossRoundSettings
from audit.spill import model_with_tensors

__all__ = ["Weight", "average_weight", "others_state", "others_model", "left_out_alone", "SIZE_CHANGING_MITIGATIONS",
           "can_withhold"]

# Data mitigations (audit.config.mitigation_settings) that add samples to a party's training set, so its reported
# size (its weight) is not its shard's size; bkg_repl replaces samples and keeps it.
SIZE_CHANGING_MITIGATIONS = ("rand_aug", "mm_aug")


@dataclass(frozen=True)
class Weight:
    """The party's weight in a round's average and how many parties share it; or why it is not known."""

    value: float | None
    parties: int | None
    unknown: str | None = None


def can_withhold(collaborator) -> bool:
    """Whether a party's gate (audit.config.per_collaborator.CollaboratorSettings) can leave its update out of the
    average: it withholds or retrains on a threshold or a budget."""
    gate = collaborator.gate
    return gate.action in ("withhold", "dp_retrain") and bool(gate.limits)  # limits: thresholds and the budget


def _data_split_sizes(data) -> tuple[tuple[int, ...], int] | None:
    """Every party's training-set size from the plan's data split, and this party's index; None when the party's
    data does not say (a loader other than the workspace's)."""
    sizes, shard = getattr(data, "train_sizes", None), getattr(data, "shard", None)
    if sizes is None or shard is None:
        return None
    return tuple(int(n) for n in sizes), int(shard) - 1


def average_weight(party: str, data, collaborators, settings: CrossRoundSettings) -> Weight:
    """The party's weight among the parties averaged in a round where its own update was averaged, from what it knows
    (module docstring): `data` its data (the task runner's loader: X_train, train_sizes, shard), `collaborators` the
    plan's (default, {name: per-collaborator settings}) gates and mitigations."""
    if settings.aggregation == OTHER:
        return Weight(None, None, "the aggregator's rule is not a weighted average (cross_round.aggregation: other): "
                                  "the global models do not give the others' update")
    default, named = collaborators if collaborators is not None else (None, {})
    others = [col for name, col in named.items() if name != party]
    if settings.weights:
        if party not in settings.weights:
            return Weight(None, None, f"cross_round.weights has no weight for {party} (it names "
                                      f"{', '.join(sorted(settings.weights))})")
        total = sum(settings.weights.values())
        parties = len(settings.weights)
        value = settings.weights[party] / total
    else:
        split = _data_split_sizes(data)
        if split is None:
            return Weight(None, None, "the party's data gives no sizes of the other parties' training sets: set "
                                      "cross_round.weights")
        sizes, index = split
        mitigations = [c.mitigation.method for c in (default, *named.values()) if c is not None]
        changed = sorted({m for m in mitigations if m in SIZE_CHANGING_MITIGATIONS})
        if changed:
            return Weight(None, None, f"a data mitigation ({', '.join(changed)}) changes the training-set sizes, "
                                      "the average's weights: set cross_round.weights")
        own = len(data.X_train) if getattr(data, "X_train", None) is not None else sizes[index]
        total = sum(sizes) - sizes[index] + own
        parties = len(sizes)
        value = own / total
    if parties < 2:
        return Weight(None, parties, "no other party: there is no others' update")
    if parties > 2 and default is not None:
        # The plan's default gate is every party's but those it names; a named party has its own.
        if can_withhold(default) or any(can_withhold(c) for c in others):
            return Weight(None, parties, "another party's gate can withhold its update (the plan's gate: action "
                                         "withhold or dp_retrain with a threshold or a budget), and which parties the "
                                         "average kept is not known to this party")
    return Weight(value, parties)


def _tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by name, tied ones under each of their names (as model_with_tensors asks)."""
    return {name: t for name, t in (*model.named_parameters(remove_duplicate=False),
                                    *model.named_buffers(remove_duplicate=False))}


def others_state(received: nn.Module, sent: nn.Module, weight: float) -> dict[str, torch.Tensor]:
    """(received - weight x sent) / (1 - weight) for every floating parameter and buffer, in float64 then in the
    tensor's dtype; non-floating buffers (a BatchNorm's batch count) as received. Names and shapes must agree."""
    if not 0.0 < weight < 1.0:
        raise ValueError(f"others_state: the party's weight must be in (0, 1), got {weight!r}")
    got, own = _tensors(received), _tensors(sent)
    if set(got) != set(own):
        raise ValueError(f"the received model's tensors differ from the sent ones: "
                         f"{sorted(set(got) ^ set(own))[:5]}")
    out = {}
    for name, g in got.items():
        s = own[name]
        if g.shape != s.shape:
            raise ValueError(f"{name}: received shape {tuple(g.shape)}, sent {tuple(s.shape)}")
        if g.is_floating_point():
            derived = (g.detach().double() - weight * s.detach().to(g.device).double()) / (1.0 - weight)
            out[name] = derived.to(g.dtype)
        else:
            out[name] = g.detach().clone()
    return out


def others_model(received: nn.Module, sent: nn.Module, weight: float) -> nn.Module:
    """A copy of the received model holding the others' combined update (`others_state`); the two models are only
    read."""
    state = others_state(received, sent, weight)
    return model_with_tensors(received, lambda name, tensor: state[name])


def left_out_alone(received: nn.Module, sent: nn.Module) -> bool:
    """Whether the received model is the party's own sent update, tensor for tensor: with two parties, the other's
    update was left out of the average (the gated average of one update is that update)."""
    got, own = _tensors(received), _tensors(sent)
    return set(got) == set(own) and all(
        torch.equal(got[name].detach(), own[name].detach().to(got[name].device)) for name in got
        if got[name].is_floating_point())
