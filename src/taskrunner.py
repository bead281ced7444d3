"""The task runner OpenFL loads (`task_runner.template: src.taskrunner.AuditedTaskRunner`): OpenFL's side only.

`train_task` trains locally, then hands the round's models to the party's audit (audit.party_audit.PartyAudit, which
knows nothing of OpenFL) before it returns: OpenFL sends a task's results as soon as the task returns, so the audit's
gate decides here what is sent: the local update, a DP-SGD retrain of it, or the received global weights (withheld).
Only scalar metrics leave the collaborator; the round record stays in its own report folder. This module keeps
OpenFL's plumbing: the task signatures, TensorKeys, tensor names (src/runner/received_model_task.py), the task's
results (src/runner/sent_tensors.py) and rebuilding the model from OpenFL's tensor dicts.
"""

from __future__ import annotations

import importlib.metadata
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from openfl.federated import PyTorchTaskRunner
from openfl.utilities import Metric, TensorKey

from audit import PartyAudit, RoundRecord, SettingsError, parse
from src.process.cuda_pages import release_cuda_library_pages
from src.process.freed_memory import release_freed_memory
from src.runner.models import build_model
from src.process.party_events import emit as status_event
from src.plan.checks import check_built_plan, plan_being_built, planned_rounds
from src.runner.final_model_task import add_final_task_tensors, final_model_results
from src.runner.received_model_task import model_names, rejected_validation, runner_names, untrained_results
from src.runner.shared_received_model import SharedReceivedModel
from src.runner.sent_tensors import replace_with_sent, results_as_views
from src.runner.settings import PREFIX as SETTINGS_PREFIX, RunnerSettings

# What OpenFL itself passes a task runner besides the plan's task_runner.settings (Plan.get_task_runner, TaskRunner).
OPENFL_ARGUMENTS = ("data_loader", "tensor_dict_split_fn_kwargs")


def cross_entropy(output, target):
    """Mean cross-entropy; OpenFL's train_ calls loss_fn(output=..., target=...) and names the metric after it."""
    return F.cross_entropy(output, target)


class AuditedTaskRunner(PyTorchTaskRunner):
    """PyTorch task runner that audits each update for membership leakage before sending it."""

    def __init__(self, **kwargs):
        openfl_arguments = {k: kwargs.pop(k) for k in OPENFL_ARGUMENTS if k in kwargs}
        # task_runner.settings, each key checked by name (`learnig_rate` would pass through **kwargs and do nothing).
        settings = parse(RunnerSettings, kwargs, SETTINGS_PREFIX)
        # Built by OpenFL's Plan (`fx plan initialize`, `fx collaborator start`): the rest of the plan too, which no
        # constructor sees whole (tasks, network, collaborator, straggler policy, included files, collaborators).
        built = plan_being_built()
        if built is not None:
            check_built_plan(built)
        super().__init__(device=None if settings.device is None else torch.device(settings.device), **openfl_arguments)
        loader = self.data_loader
        self.audit = PartyAudit(audit=settings.audit, gate=settings.gate, per_collaborator=settings.per_collaborator,
                                mitigation=settings.mitigation, prefix=SETTINGS_PREFIX, seed=settings.seed,
                                data=loader, optimizer=(settings.optimizer, settings.learning_rate, settings.momentum),
                                party=getattr(built, "collaborator", None), rounds=planned_rounds(built),
                                versions={"openfl": importlib.metadata.version("openfl")})
        self.seed = settings.seed
        feature_shape = tuple(loader.get_feature_shape())
        self._model_spec = (settings.model, feature_shape, loader.get_num_classes(), dict(settings.model_settings))
        try:
            self.model = self._plan_model()
        except ValueError as err:  # the model's keyword arguments are the model's to check
            raise SettingsError(f"{SETTINGS_PREFIX}.model_settings: {err}") from None
        self.audit.use_model(self.model, self._plan_model, feature_shape, self.device)
        self.audit.on_status = status_event  # the phases the tooling shows (workspace.party_status)
        release_cuda_library_pages()  # torch and torchvision are loaded: without a GPU their CUDA pages are dead weight
        self.audit.check_canaries(self.model, loader.get_num_classes())
        self.to(self.device)
        self.optimizer = self.audit.make_optimizer(self.model)
        self.loss_fn = cross_entropy
        self._validating: tuple[str, int, str | None] | None = None  # (party, round, apply) while validating

    def _plan_model(self) -> torch.nn.Module:
        """The plan's model with its initial weights (what `fx plan initialize` saves depends only on the seed).
        Seeds torch's global generator, as the constructor always did."""
        name, feature_shape, num_classes, model_settings = self._model_spec
        torch.manual_seed(self.seed)
        return build_model(name, feature_shape, num_classes, **model_settings)

    @property
    def last_record(self) -> RoundRecord | None:
        """The latest round record (src.process.metric_writer reads its figures' bounds)."""
        return self.audit.last_record

    @property
    def audit_settings(self):
        return self.audit.settings

    def forward(self, x):
        return self.model(x)

    def set_tensor_dict(self, tensor_dict, with_opt_vars=False):
        """OpenFL's loading of the received (or read-back) arrays into the model, without its model-sized copy:
        OpenFL makes a tensor of every array (torch.tensor copies), which load_state_dict then copies into the model;
        here load_state_dict reads the arrays in place (the same values). OpenFL's own with the optimizer's state."""
        if with_opt_vars:
            return super().set_tensor_dict(tensor_dict, with_opt_vars)
        with warnings.catch_warnings():  # arrays decoded from a message are read-only; load_state_dict only reads them
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            state = {k: torch.as_tensor(tensor_dict.pop(k)).to(self.device) for k in self.state_dict()}
        self.load_state_dict(state)

    def reset_opt_vars(self) -> None:
        """`collaborator.settings.opt_treatment: RESET`: every round's training starts from a fresh optimizer state.
        OpenFL 1.9's PyTorchTaskRunner leaves this method empty, so momentum carried over into the next round."""
        self.optimizer.state.clear()

    def _check_received(self, col_name: str, round_num: int, input_tensor_dict: dict):
        """The received model's checks, once per round for the same weights (OpenFL's collaborator serves later tasks
        of the round from its cache; other weights are checked again)."""
        return self.audit.check_received(col_name, round_num, model_names(input_tensor_dict))

    def validate_task(self, col_name, round_num, input_tensor_dict, **kwargs):
        """OpenFL's validation task; a received model the checks rejected is not loaded (accuracy NaN)."""
        apply = kwargs.get("apply")
        # What the tasks before freed (the aggregator's end of round in one process), before the checks and signals.
        release_freed_memory()
        if apply == "global" and self._check_received(col_name, round_num, input_tensor_dict).rejected:
            return rejected_validation(col_name, round_num, apply)
        self._validating = (col_name, round_num, apply)
        status_event(col_name, "validating", round_num)
        try:
            return super().validate_task(col_name, round_num, input_tensor_dict, **_tqdm_on_terminal_only(kwargs))
        finally:
            self._validating = None

    def validate_(self, validation_dataloader) -> Metric:
        """The accuracy on the validation set, as the party's audit reads it (PartyAudit.validation_accuracy)."""
        col_name, round_num, apply = self._validating or ("", -1, None)
        return Metric(name="accuracy", value=np.array(self.audit.validation_accuracy(col_name, round_num, apply,
                                                                                     self.model)))

    def train_task(self, col_name, round_num, input_tensor_dict, epochs=1, **kwargs):
        verdict = self._check_received(col_name, round_num, input_tensor_dict)
        if verdict.rejected:  # not trained on: nothing new is sent
            weights, scalars = self.audit.rejected_round(col_name, round_num, verdict)
            return untrained_results(self, col_name, round_num, runner_names(weights), cross_entropy.__name__, scalars)
        # What withholding sends back. rebuild_model pops from input_tensor_dict: keep the dict, not copies of the
        # arrays (the TensorDB's own; loading them into the model copies, and nothing writes into them).
        received = dict(input_tensor_dict)
        shared = []  # the received model, on OpenFL's own arrays of the received weights, if the round is audited

        def received_model() -> torch.nn.Module:
            shared.append(SharedReceivedModel(self.model, model_names(received)))
            return shared[-1].model

        plan = self.audit.before_training(col_name, round_num, epochs, verdict, received_model=received_model)
        for group in self.optimizer.param_groups:
            group["lr"] = plan.learning_rate
        torch.manual_seed(plan.seed)
        status_event(col_name, "training", round_num)
        start = time.perf_counter()
        global_out, local_out = super().train_task(col_name, round_num, input_tensor_dict, epochs=plan.epochs,
                                                   **_tqdm_on_terminal_only(kwargs))
        train_seconds = time.perf_counter() - start
        viewed = results_as_views(self.state_dict(), global_out, local_out)  # until the audit is done
        # The last batch's gradients (a model's size) would stay until the next round's first step sets them to None,
        # and under RESET the optimizer state (another model's size with momentum, two with Adam) until the reset.
        self.optimizer.zero_grad(set_to_none=True)
        if self.opt_treatment == "RESET":
            self.reset_opt_vars()
        release_freed_memory()  # what the training freed, before the audit allocates (src/process/freed_memory.py)
        train_loss = float(next(v for k, v in global_out.items() if k.tensor_name == cross_entropy.__name__))
        trained = {k.tensor_name: v for k, v in {**global_out, **local_out}.items() if "trained" in k.tags}
        outcome = self.audit.after_training(model_names(trained), model_names(received), train_loss, train_seconds)
        for model in shared:  # fails the round if the audit wrote into what a withheld round sends
            model.check_unchanged()
        shared.clear()
        release_freed_memory()  # and what the audit freed
        replace_with_sent(self.get_tensor_dict(with_opt_vars=False), global_out, local_out,
                          names=None if outcome.weights_changed else viewed)
        for key in global_out:
            if outcome.train_loss is not None and key.tensor_name == cross_entropy.__name__ and "metric" in key.tags:
                global_out[key] = np.array(outcome.train_loss)
        for name, value in outcome.scalars.items():
            global_out[TensorKey(name, col_name, round_num, True, ("metric",))] = np.array(value)
        return global_out, local_out

    def initialize_tensorkeys_for_functions(self, with_opt_vars=False):
        super().initialize_tensorkeys_for_functions(with_opt_vars)
        add_final_task_tensors(self.required_tensorkeys_for_function)

    def final_model_audit_task(self, col_name, round_num, input_tensor_dict, **kwargs):
        """The round after the last: the final global model audited by the party (src/runner/final_model_task.py)."""
        return final_model_results(self, col_name, round_num, input_tensor_dict)


def _tqdm_on_terminal_only(kwargs: dict) -> dict:
    """OpenFL's task loops draw a tqdm bar when the task's `use_tqdm` is true: only where stderr (tqdm's stream) is
    a terminal. Elsewhere (a participant's log file, CI) each redraw would be one more line of the log."""
    if kwargs.get("use_tqdm") and not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return {**kwargs, "use_tqdm": False}
    return kwargs
