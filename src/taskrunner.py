"""The task runner OpenFL loads (`task_runner.template: src.taskrunner.AuditedTaskRunner`).

`train_task` trains locally, then audits the trained model (and the received global model) before it
returns: OpenFL sends a task's results as soon as the task returns, so any later decision about the update
(gating) has to be taken here. Only scalar metrics leave the collaborator; the full round record, with
per-sample-derived ROC curves, stays in its own report folder.
"""

from __future__ import annotations

import copy
import logging
import time
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from openfl.federated import PyTorchTaskRunner
from openfl.utilities import TensorKey

from audit.report import ReportWriter
from audit.round_audit import AuditSets, audit_round, record_to_json
from audit.settings import AuditSettings
from audit.signals import gradient_parameter_names
from src.models import build_model

logger = logging.getLogger(__name__)

OPTIMIZERS = ("SGD", "Adam")
SETTINGS_PREFIX = "task_runner.settings"


def cross_entropy(output, target):
    """Mean cross-entropy; OpenFL's train_ calls loss_fn(output=..., target=...) and names the metric after it."""
    return F.cross_entropy(output, target)


def round_seed(seed: int, party: str, round_num: int) -> int:
    """A seed per (plan seed, party, round): runs are reproducible whatever order parties run in."""
    return zlib.crc32(f"{seed}/{party}/{round_num}".encode()) & 0x7FFFFFFF


def _check_number(name: str, value, *, minimum=None, exclusive=False, integer=False):
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{SETTINGS_PREFIX}.{name}: expected a {'integer' if integer else 'number'}, got {value!r}")
    if minimum is not None and (value <= minimum if exclusive else value < minimum):
        raise ValueError(f"{SETTINGS_PREFIX}.{name}: must be {'>' if exclusive else '>='} {minimum}, got {value!r}")


class AuditedTaskRunner(PyTorchTaskRunner):
    """PyTorch task runner that audits each update for membership leakage before sending it."""

    def __init__(
        self,
        device: str = "cpu",
        model: str = "cnn",
        model_settings: dict | None = None,
        optimizer: str = "SGD",
        learning_rate: float = 0.05,
        momentum: float = 0.9,
        seed: int = 0,
        audit: dict | None = None,
        **kwargs,
    ):
        super().__init__(device=device, **kwargs)
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"{SETTINGS_PREFIX}.optimizer: unknown optimizer {optimizer!r}; choose one of {list(OPTIMIZERS)}")
        _check_number("learning_rate", learning_rate, minimum=0, exclusive=True)
        _check_number("momentum", momentum, minimum=0)
        _check_number("seed", seed, minimum=0, integer=True)
        if model_settings is not None and not isinstance(model_settings, dict):
            raise ValueError(f"{SETTINGS_PREFIX}.model_settings: expected a mapping, got {model_settings!r}")
        self.audit_settings = AuditSettings.from_mapping(audit, prefix=f"{SETTINGS_PREFIX}.audit")
        self.seed = seed

        data_loader = self.data_loader
        torch.manual_seed(seed)  # the initial model `fx plan initialize` saves depends only on the seed
        try:
            self.model = build_model(
                model, tuple(data_loader.get_feature_shape()), data_loader.get_num_classes(), **(model_settings or {})
            )
        except ValueError as err:
            key = "model" if model_settings is None or str(err).startswith("unknown model") else "model_settings"
            raise ValueError(f"{SETTINGS_PREFIX}.{key}: {err}") from None
        if self.audit_settings.gradient_layer is not None:
            try:  # fail at start-up, not in the first audit
                gradient_parameter_names(self.model, self.audit_settings.gradient_layer)
            except ValueError as err:
                raise ValueError(f"{SETTINGS_PREFIX}.audit.gradient_layer: {err}") from None
        self.to(self.device)
        if optimizer == "SGD":
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=learning_rate, momentum=momentum)
        else:
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=learning_rate)
        self.loss_fn = cross_entropy
        self._audit_sets: AuditSets | None = None
        self.last_record: dict | None = None  # the latest round record, for in-process callers

    def forward(self, x):
        return self.model(x)

    def audit_sets(self) -> AuditSets:
        if self._audit_sets is None:
            self._audit_sets = AuditSets.from_mapping(self.data_loader.get_audit_sets())
        return self._audit_sets

    def received_model(self, round_num: int, input_tensor_dict: dict) -> torch.nn.Module:
        """A copy of the model holding the weights received from the aggregator this round."""
        # rebuild_model pops the tensors it loads: give it a copy so train_task still gets them.
        self.rebuild_model(round_num, dict(input_tensor_dict))
        return copy.deepcopy(self.model)

    def train_task(self, col_name, round_num, input_tensor_dict, epochs=1, **kwargs):
        settings = self.audit_settings
        audit_now = settings.enabled and settings.due(round_num)
        global_model = self.received_model(round_num, input_tensor_dict) if audit_now else None

        torch.manual_seed(round_seed(self.seed, col_name, round_num))
        start = time.perf_counter()
        global_out, local_out = super().train_task(col_name, round_num, input_tensor_dict, epochs=epochs, **kwargs)
        train_seconds = time.perf_counter() - start
        if not audit_now:
            return global_out, local_out

        record = audit_round(
            self.model, global_model, self.audit_sets(), settings, party=col_name, round_num=round_num, seed=self.seed
        )
        record["timings"]["train_s"] = train_seconds
        record["metrics"]["train_loss"] = float(
            next(v for k, v in global_out.items() if k.tensor_name == cross_entropy.__name__)
        )
        self.last_record = record
        ReportWriter(settings.report_dir, col_name, log_scale=settings.log_scale).write_round(record_to_json(record))
        logger.info(
            "%s round %d audit: %s (audit %.2fs, train %.2fs)",
            col_name, round_num,
            ", ".join(f"{k}={v:.3f}" for k, v in record["metrics"].items() if k.endswith("_auc")),
            record["timings"]["audit_s"], train_seconds,
        )
        for name, value in record["metrics"].items():
            if name == "train_loss":
                continue
            global_out[TensorKey(name, col_name, round_num, True, ("metric",))] = np.array(value)
        return global_out, local_out
