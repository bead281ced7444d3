"""The aggregator side of gating (`tasks.train.aggregation_type: {template: src.aggregation.GatedWeightedAverage}`).

A collaborator whose gate withheld its update sends the received global weights back; averaged in with its
full weight, they would pull the new model towards the old one. So the average leaves out, for every model
tensor of the round:

- collaborators whose `gate_kept` metric of this round is 0 (a collaborator that sends no `gate_kept`,
  e.g. a runner without the gate, counts as kept);
- collaborators with NaN/Inf in this tensor or in any other tensor they trained this round, so a broken
  collaborator is left out of every tensor, not only of the broken ones.

The remaining weights (normalised data sizes) are re-normalised. If nobody is left, the tensor is the
round's starting global tensor: the model does not change.
"""

from __future__ import annotations

import logging

import numpy as np
from openfl.interface.aggregation_functions import AggregationFunction

logger = logging.getLogger(__name__)

GATE_KEPT = "gate_kept"


class GatedWeightedAverage(AggregationFunction):
    """Weighted average of the updates the collaborators' gates kept and that are finite."""

    def call(self, local_tensors, db_iterator, tensor_name, fl_round, tags):
        cols = {lt.col_name for lt in local_tensors}
        excluded: dict[str, str] = {}
        start = None
        # Rows of the aggregator's TensorDB; a collaborator's results carry its name among their tags
        # (OpenFL sorts tags, so match them as a set: ('collaborator1', 'metric'), ('collaborator1', 'trained')).
        for row in db_iterator:
            if int(row["round"]) != int(fl_round):
                continue
            row_tags = set(row["tags"])
            if row["tensor_name"] == tensor_name and row_tags == {"model"}:
                start = row["nparray"]
                continue
            owners = row_tags & cols
            if len(owners) != 1:
                continue
            col = owners.pop()
            if row["tensor_name"] == GATE_KEPT and "metric" in row_tags:
                if not float(np.asarray(row["nparray"])) >= 0.5:  # 0.0 = withheld (NaN also fails closed)
                    excluded.setdefault(col, "gated")
            elif "trained" in row_tags and "metric" not in row_tags and not _finite(row["nparray"]):
                excluded[col] = "non_finite_update"
        for lt in local_tensors:
            if not _finite(lt.tensor):
                excluded[lt.col_name] = "non_finite_update"

        kept = [lt for lt in local_tensors if lt.col_name not in excluded]
        self._log(fl_round, excluded)
        if not kept:
            if start is None:
                raise RuntimeError(
                    f"GatedWeightedAverage: every collaborator is excluded in round {fl_round} and the round's "
                    f"starting tensor {tensor_name!r} (tags ('model',)) is not in the aggregator's tensor DB"
                )
            return np.array(start, copy=True)
        total = sum(lt.weight for lt in kept)
        return sum(lt.tensor * (lt.weight / total) for lt in kept)

    def _log(self, fl_round, excluded: dict) -> None:
        # Called once per tensor: log each round's exclusions once (the function is a singleton).
        seen = self.__dict__.setdefault("_logged", set())
        key = (int(fl_round), tuple(sorted(excluded.items())))
        if excluded and key not in seen:
            seen.add(key)
            logger.info("round %s: left out of the average: %s", fl_round,
                        ", ".join(f"{c} ({why})" for c, why in sorted(excluded.items())))


def _finite(value) -> bool:
    array = np.asarray(value)
    return array.dtype.kind not in "fc" or bool(np.isfinite(array).all())
