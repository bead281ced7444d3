"""The task runner's side of the received-model check (audit.before_training, docs/received-model.md): OpenFL's names
for the tensors, and the task results of a round whose received global model was rejected (audit.party_audit
decides what is sent back and the scalars).

The runner's tensors are its state dict: its model sits at `runner.model`, so OpenFL names a tensor "model.<name>"
where the check (which knows only the model) names it "<name>". A rejected round trains nothing and sends nothing new:
the global model this party last accepted (the plan's initial model before any), with gate_kept 0 and the verdict, in
the shape OpenFL's PyTorchTaskRunner.train_task gives its results (OpenFL 1.9); its validation reports no accuracy
(NaN) rather than running the rejected model on the party's data.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
from openfl.utilities import TensorKey, change_tags
from openfl.utilities.split import split_tensor_dict_for_holdouts

__all__ = ["MODEL_PREFIX", "model_names", "runner_names", "rejected_validation", "untrained_results"]

MODEL_PREFIX = "model."
OPTIMIZER_PREFIX = "__opt_"  # OpenFL's names of the optimizer's state (runner_pt._derive_opt_state_dict)


def model_names(tensors: Mapping) -> dict:
    """OpenFL's tensor names -> the model's ("model.classifier.fc1.weight" -> "classifier.fc1.weight"); a name
    without the prefix is kept as it is (the check then reports it as a tensor the plan does not have). The optimizer's
    state OpenFL sends under `opt_treatment: CONTINUE_GLOBAL` ("__opt_*") is no part of the model: left out."""
    return {name[len(MODEL_PREFIX):] if name.startswith(MODEL_PREFIX) else name: value
            for name, value in tensors.items() if not name.startswith(OPTIMIZER_PREFIX)}


def runner_names(tensors: Mapping) -> dict:
    return {MODEL_PREFIX + name: value for name, value in tensors.items()}


def rejected_validation(col_name: str, round_num: int, apply: str | None) -> tuple[dict, dict]:
    """validate_task's results for a model that was not loaded: accuracy NaN, with OpenFL's tags."""
    tags = change_tags(("metric",), add_field="validate_local" if apply == "local" else "validate_agg")
    return {TensorKey("accuracy", col_name, round_num, True, tags): np.array(math.nan)}, {}


def untrained_results(runner, col_name: str, round_num: int, weights: Mapping, loss_name: str,
                      scalars: Mapping[str, float]) -> tuple[dict, dict]:
    """train_task's results (OpenFL 1.9's PyTorchTaskRunner.train_task) for `weights` (runner names) loaded without
    training: the loss NaN, and `scalars` as the round's metrics."""
    runner.set_tensor_dict(dict(weights), with_opt_vars=False)
    tensors = runner.get_tensor_dict(with_opt_vars=runner.opt_treatment == "CONTINUE_GLOBAL")
    global_tensors, local_tensors = split_tensor_dict_for_holdouts(tensors, **runner.tensor_dict_split_fn_kwargs)
    global_out = {TensorKey(loss_name, col_name, round_num, True, ("metric",)): np.array(math.nan)}
    global_out.update({TensorKey(n, col_name, round_num, False, ("trained",)): v for n, v in global_tensors.items()})
    local_out = {TensorKey(n, col_name, round_num, False, ("trained",)): v for n, v in local_tensors.items()}
    local_out.update({TensorKey(n, col_name, round_num + 1, False, ("model",)): v for n, v in local_tensors.items()})
    for name, value in scalars.items():
        global_out[TensorKey(name, col_name, round_num, True, ("metric",))] = np.array(value)
    return global_out, local_out
