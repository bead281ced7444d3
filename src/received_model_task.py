"""The task runner's side of the received-model check (audit.before_training, docs/received-model.md): OpenFL's names
for the tensors, and the task results of a round whose received global model was rejected.

The runner's tensors are its state dict: its model sits at `runner.model`, so OpenFL names a tensor "model.<name>"
where the check (which knows only the model) names it "<name>". A rejected round trains nothing and sends nothing new:
the global model this party last accepted (the plan's initial model before any), with gate_kept 0 and the verdict, in
the shape OpenFL's PyTorchTaskRunner.train_task gives its results (OpenFL 1.9); its validation reports no accuracy
(NaN) rather than running the rejected model on the party's data.
"""

from __future__ import annotations

import logging
import math
from typing import Mapping

import numpy as np
from openfl.utilities import TensorKey, change_tags
from openfl.utilities.split import split_tensor_dict_for_holdouts

from audit.gate_flow import rejected_before_training
from audit.reporting.party import ReportWriter
from audit.round_audit import record_to_json

logger = logging.getLogger(__name__)

__all__ = ["MODEL_PREFIX", "model_names", "runner_names", "rejected_validation", "rejected_round"]

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


def _untrained_results(runner, col_name: str, round_num: int, weights: Mapping, loss_name: str) -> tuple[dict, dict]:
    """train_task's results (OpenFL 1.9's PyTorchTaskRunner.train_task) for `weights` loaded without training."""
    runner.set_tensor_dict(dict(weights), with_opt_vars=False)
    tensors = runner.get_tensor_dict(with_opt_vars=runner.opt_treatment == "CONTINUE_GLOBAL")
    global_tensors, local_tensors = split_tensor_dict_for_holdouts(tensors, **runner.tensor_dict_split_fn_kwargs)
    global_out = {TensorKey(loss_name, col_name, round_num, True, ("metric",)): np.array(math.nan)}
    global_out.update({TensorKey(n, col_name, round_num, False, ("trained",)): v for n, v in global_tensors.items()})
    local_out = {TensorKey(n, col_name, round_num, False, ("trained",)): v for n, v in local_tensors.items()}
    local_out.update({TensorKey(n, col_name, round_num + 1, False, ("model",)): v for n, v in local_tensors.items()})
    return global_out, local_out


def rejected_round(runner, col_name: str, round_num: int, verdict, gate, loss_name: str) -> tuple[dict, dict]:
    """The train task of a round whose received model `verdict` (audit.before_training.ReceivedVerdict) rejects: the
    last accepted global model (or the plan's initial one) sent back untrained, the round's record in the party's own
    report, and only scalars (gate_kept 0, the verdict, the gate's usual names) for the aggregator."""
    fallback = verdict.previous.load() if verdict.previous is not None else {
        name: t.detach().cpu().numpy() for name, t in runner.plan_initial_model().state_dict().items()}
    global_out, local_out = _untrained_results(runner, col_name, round_num, runner_names(fallback), loss_name)
    record = runner._empty_record(col_name, round_num)
    outcome = rejected_before_training(verdict.reason, record)
    record["extra"]["gate"] = outcome.record_entry(gate)
    record["extra"]["received_model"] = verdict.details()
    record["metrics"].update(verdict.metrics())
    record["timings"].update(verdict.timings)
    runner.last_record = record
    settings = runner.audit_settings
    ReportWriter(settings.report_dir, col_name, log_scale=settings.log_scale).write_round_in_background(
        record_to_json(record), private=())
    logger.warning("%s round %d: %s; not trained, sending back the %s", col_name, round_num, verdict.reason,
                   "plan's initial model" if verdict.previous is None
                   else f"global model of round {verdict.previous.round_num}")
    # the audit metrics every audited party sends this round (NaN: none was measured), the gate's usual names
    sent = (*runner._sent_metrics, *runner._sent_populations) if settings.due(round_num) else ()
    scalars = {**dict.fromkeys(sent, math.nan), **outcome.scalars(runner.gate_watched, gate.limits),
               **verdict.metrics()}
    for name, value in scalars.items():
        global_out[TensorKey(name, col_name, round_num, True, ("metric",))] = np.array(value)
    return global_out, local_out
