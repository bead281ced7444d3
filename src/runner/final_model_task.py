"""The final model's audit as an OpenFL task (`final_model_audit_task` of src.taskrunner.AuditedTaskRunner): the task
of the round after the last (src/server/final_round.py), which receives the final global model, as a validation of
the global model does, and hands it to the party's audit (audit.PartyAudit.final_model). Only the verdict's scalars
and the model's accuracy are sent back."""

from __future__ import annotations

import numpy as np
from openfl.utilities import TensorKey

from src.plan.checks import FINAL_AUDIT_FUNCTION
from src.process.freed_memory import release_freed_memory
from src.runner.received_model_task import model_names

__all__ = ["add_final_task_tensors", "final_model_results"]


def add_final_task_tensors(required: dict) -> None:
    """The final task's tensors in OpenFL's `required_tensorkeys_for_function`: the global model of its round, as the
    validation of the global model asks for it."""
    required[FINAL_AUDIT_FUNCTION] = list(required["validate_task"]["apply=global"])


def final_model_results(runner, col_name: str, round_num: int, input_tensor_dict: dict) -> tuple[dict, dict]:
    """The task's results: the party's audit of the received final model, as metric TensorKeys."""
    release_freed_memory()
    scalars = runner.audit.final_model(col_name, round_num, model_names(input_tensor_dict))
    return {TensorKey(name, col_name, round_num, True, ("metric",)): np.array(value)
            for name, value in scalars.items()}, {}
