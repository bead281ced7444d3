"""The aggregator side of gating (`tasks.train.aggregation_type: {template: src.aggregation.GatedWeightedAverage}`).

A collaborator whose gate withheld its update sends the received global weights back; averaged in with its
full weight, they would pull the new model towards the old one. So the average takes, for every model tensor
of the round, only the collaborators `audit.config.gate_contract.decide` keeps:

- a collaborator whose `gate_kept` metric of this round is 0, or not a finite number (fail closed), is left
  out; one that sends no `gate_kept` (e.g. a runner without the gate) is averaged;
- a collaborator with NaN/Inf in this tensor or in any other tensor it trained this round is left out, so a
  broken collaborator is left out of every tensor, not only of the broken ones.

The aggregator's report (audit/aggregator_report/record.py) reads the same decisions from the same TensorDB rows
(`round_decisions`). The remaining weights (normalised data sizes) are re-normalised. If nobody is left, the
tensor is the round's starting global tensor: the model does not change.

With `aggregator.settings.canary_clients` the aggregator sets `canary_clients` (audit.canary.clients.CanaryClients)
on this function: each averaged tensor then gets the round's inserted canary clients, and every canary's inner
product with the tensor's change is recorded for the round's user-level epsilon estimate.
"""

from __future__ import annotations

import logging
import weakref
from typing import Callable, Iterable, Mapping

import numpy as np
from openfl.interface.aggregation_functions import AggregationFunction

from audit import Decision, GATE_KEPT, decide

logger = logging.getLogger(__name__)


def _finite(value) -> bool:
    array = np.asarray(value)
    return array.dtype.kind not in "fc" or bool(np.isfinite(array).all())


def round_decisions(rows: Iterable[Mapping], fl_round: int, collaborators: Iterable[str], *,
                    finite_row: Callable[[Mapping], bool] | None = None) -> dict[str, Decision]:
    """Each collaborator's averaging decision for `fl_round`, from the aggregator's TensorDB rows.

    A row is a mapping with `round`, `tensor_name`, `tags` and `nparray`. A collaborator's results carry its name
    among their tags (OpenFL sorts tags, so they are matched as a set): its `gate_kept` metric is tagged
    {col, 'metric'}, its trained tensors {col, 'trained', ...} without 'metric'. `finite_row(row)`: whether a trained
    row's values are all finite (default: read them).
    """
    finite_row = finite_row or (lambda row: _finite(row["nparray"]))
    names = set(collaborators)
    gate_kept: dict[str, object] = {}
    finite = dict.fromkeys(names, True)
    for row in rows:
        if int(row["round"]) != int(fl_round):
            continue
        tags = set(row["tags"] or ())
        owners = tags & names
        if len(owners) != 1:
            continue
        (col,) = owners
        if "metric" in tags:
            if row["tensor_name"] == GATE_KEPT and tags == {col, "metric"}:
                gate_kept[col] = row["nparray"]
        elif "trained" in tags and not finite_row(row):
            finite[col] = False
    return {col: decide(gate_kept.get(col), finite_update=finite[col]) for col in sorted(names)}


def _float_values(rows: list, fl_round: int) -> int:
    """How many floating values the round's starting global model holds (its tensors tagged ('model',))."""
    return sum(np.asarray(row["nparray"]).size for row in rows if int(row["round"]) == int(fl_round)
               and set(row["tags"]) == {"model"} and np.asarray(row["nparray"]).dtype.kind == "f")


def _weighted_sum(terms: list) -> np.ndarray:
    """sum(tensor * weight for ...) as Python's sum gives it, bit for bit (0 + the first term, then each next term
    added in order), accumulated in place: one running array and one term at a time, not a new sum per term (for the
    tutorial's fc2, two 67 MB arrays at the end of round instead of three)."""
    averaged = None
    for tensor, weight in terms:
        term = tensor * weight
        if averaged is None:
            term += 0  # a new array of its own: a -0.0 becomes 0.0, as sum()'s 0 + term makes it
            averaged = term
        elif np.result_type(averaged, term) == averaged.dtype and averaged.shape == np.broadcast_shapes(
                averaged.shape, term.shape):
            averaged += term
        else:
            averaged = averaged + term
    return averaged


class GatedWeightedAverage(AggregationFunction):
    """Weighted average of the updates `audit.config.gate_contract.decide` keeps (and the canary clients, if set)."""

    canary_clients = None  # audit.canary.clients.CanaryClients, set by the aggregator when its settings ask

    def _finite_row(self, row: Mapping) -> bool:
        """_finite of a trained row's array, read once per array: OpenFL calls the function once per tensor with every
        row of the round, so reading each array each time reads the whole round's updates once per tensor (resnet18:
        122 tensors, 244 trained rows). Keyed by the array itself (a weak reference, so no update is kept alive)."""
        seen = self.__dict__.setdefault("_finite_seen", {})
        array = row["nparray"]
        key = (int(row["round"]), row["tensor_name"], tuple(sorted(row["tags"] or ())))
        known = seen.get(key)
        if known is not None and known[0]() is array:
            return known[1]
        result = _finite(array)
        try:
            seen[key] = (weakref.ref(array), result)
        except TypeError:  # not an array a weak reference can point to: read it each time
            pass
        return result

    def call(self, local_tensors, db_iterator, tensor_name, fl_round, tags):
        rows = list(db_iterator)
        start = next((row["nparray"] for row in rows if int(row["round"]) == int(fl_round)
                      and row["tensor_name"] == tensor_name and set(row["tags"]) == {"model"}), None)
        local = {lt.col_name: lt for lt in local_tensors}
        seen = self.__dict__.setdefault("_finite_seen", {})
        for key in [k for k in seen if k[0] < int(fl_round)]:  # earlier rounds' arrays are not asked again
            del seen[key]
        decisions = round_decisions(rows, fl_round, local, finite_row=self._finite_row)
        for name, lt in local.items():  # the tensor being averaged, even if it were missing from the rows
            if not _finite(lt.tensor):
                decisions[name] = decide(None, finite_update=False)
        # In collaborator-name order: OpenFL's RandomGroupedAssigner lists the round's collaborators in an unseeded random
        # order, and with three or more float32 terms the order of a sum changes its last bits, so the same plan and
        # seed would not give the same model (and metrics) run to run.
        kept = sorted((lt for lt in local_tensors if decisions[lt.col_name].averaged), key=lambda lt: lt.col_name)
        self._log(fl_round, {c: d.status for c, d in decisions.items() if not d.averaged})
        clients = self.canary_clients
        if clients is not None and not clients.started(fl_round):
            clients.start_round(fl_round, dimension=_float_values(rows, fl_round), weights=[lt.weight for lt in kept])
        if not kept:
            if start is None:
                raise RuntimeError(
                    f"GatedWeightedAverage: every collaborator is excluded in round {fl_round} and the round's "
                    f"starting tensor {tensor_name!r} (tags ('model',)) is not in the aggregator's tensor DB"
                )
            return np.array(start, copy=True)
        total = sum(lt.weight for lt in kept)
        averaged = _weighted_sum([(lt.tensor, lt.weight / total) for lt in kept])
        return averaged if clients is None else clients.add(fl_round, tensor_name, start, averaged)

    def _log(self, fl_round, excluded: dict) -> None:
        # Called once per tensor: log each round's exclusions once (the function is a singleton).
        seen = self.__dict__.setdefault("_logged", set())
        key = (int(fl_round), tuple(sorted(excluded.items())))
        if excluded and key not in seen:
            seen.add(key)
            logger.info("round %s: left out of the average: %s", fl_round,
                        ", ".join(f"{c} ({why})" for c, why in sorted(excluded.items())))
