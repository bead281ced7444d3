"""The task runner OpenFL loads (`task_runner.template: src.taskrunner.AuditedTaskRunner`).

`train_task` trains locally, then audits the trained model (and the received global model) before it
returns: OpenFL sends a task's results as soon as the task returns, so the gate (audit.config.gate) decides here
what is sent: the local update, a DP-SGD retrain of it, or the received global weights (withheld).
Only scalar metrics leave the collaborator; the full round record, with per-sample-derived ROC curves and
the gate's verdict, stays in its own report folder.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import sys
import time
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from openfl.federated import PyTorchTaskRunner
from openfl.utilities import Metric, TensorKey

from audit.config.audit_settings import AuditSettings
from audit.config.fields import SettingsError, parse
from audit.config.gate import GatePolicy, audit_metric_names, non_finite_tensors
from audit.config.gate_contract import sent_to_aggregator
from audit.config.steps import registered
from audit.config.mitigation_settings import DATA_MITIGATIONS, UPDATE_MITIGATIONS, Mitigation
from audit.before_training import ReceivedVerdict, check_received
from audit.canary.dp import audit_dp_training, check_canary_settings, dp_fedavg_entry
from audit.deanon.mitigation import mitigate_data, mitigate_update, update_norm
from audit.gate_flow import SEND_RECEIVED, SEND_RETRAINED, Retrained, run_gate
from audit.membership.resolution import resolution_warning
from audit.membership.signal_memo import SignalMemo
from audit.membership.signals import compute_signals
from audit.membership.step import signal_names
from audit.config.vocabulary import EXACT_AUC, population_name
from audit.reporting.party import ReportWriter
from audit.reporting.readings import population_sizes
from audit.round_audit import AuditSets, LocalTraining, audit_round, record_to_json, sample_seed
from audit.spill import SpilledModel
from audit.training import TrainingRecipe
from src.audit_cost import audit_cost_note
from src.chance_accuracy import CHECK_ROUND, near_chance_note
from src.collaborator_overrides import CollaboratorSettings, check_gate_resolution, parse_per_collaborator
from src.cuda_pages import release_cuda_library_pages
from src.dp_training import DPTraining, RoundAccountant, dp_retrain
from src.freed_memory import release_freed_memory
from src.models import build_model
from src.plan_checks import check_built_plan, plan_being_built
from src.runner_settings import PREFIX as SETTINGS_PREFIX, RunnerSettings
from src.received_model_task import model_names, rejected_round, rejected_validation

logger = logging.getLogger(__name__)

# What OpenFL itself passes a task runner besides the plan's task_runner.settings (Plan.get_task_runner, TaskRunner).
OPENFL_ARGUMENTS = ("data_loader", "tensor_dict_split_fn_kwargs")


def cross_entropy(output, target):
    """Mean cross-entropy; OpenFL's train_ calls loss_fn(output=..., target=...) and names the metric after it."""
    return F.cross_entropy(output, target)


def round_seed(seed: int, party: str, round_num: int) -> int:
    """A seed per (plan seed, party, round): runs are reproducible whatever order parties run in."""
    return zlib.crc32(f"{seed}/{party}/{round_num}".encode()) & 0x7FFFFFFF


class AuditedTaskRunner(PyTorchTaskRunner):
    """PyTorch task runner that audits each update for membership leakage before sending it."""

    def __init__(self, **kwargs):
        openfl_arguments = {k: kwargs.pop(k) for k in OPENFL_ARGUMENTS if k in kwargs}
        # task_runner.settings, each key checked by name (`learnig_rate` would pass through **kwargs and do nothing).
        settings = parse(RunnerSettings, kwargs, SETTINGS_PREFIX)
        # Built by OpenFL's Plan (`fx plan initialize`, before any certificate; `fx collaborator start`, before it
        # writes anything): the rest of the plan too, which no constructor sees whole (tasks, network, collaborator,
        # straggler policy, the files it includes, the collaborators' names).
        built = plan_being_built()
        if built is not None:
            check_built_plan(built)
        super().__init__(device=None if settings.device is None else torch.device(settings.device), **openfl_arguments)
        self.audit_settings = AuditSettings.from_mapping(settings.audit, prefix=f"{SETTINGS_PREFIX}.audit")
        self.default_settings, self.per_collaborator = parse_per_collaborator(
            settings.per_collaborator, gate=settings.gate, audit_settings=self.audit_settings,
            mitigation=settings.mitigation)
        self.gate_policy = self.default_settings.gate
        # OpenFL's aggregator fails at the end of a round when a reported metric is missing from some
        # collaborators: every collaborator parses the same plan, so all send gate_tripped__<name> for
        # every metric any gate in the plan watches (0.0 when not tripped).
        watched = set(self.gate_policy.limits)
        for col in self.per_collaborator.values():
            watched |= set(col.gate.limits)
        self.gate_watched = tuple(sorted(watched))
        # For the same reason every audited round sends every audit metric the plan's audit declares (NaN where a
        # round lacks one, e.g. a step that failed): the scalars that may leave the party (gate_contract).
        self._sent_metrics = tuple(n for n in audit_metric_names(self.audit_settings) if sent_to_aggregator(n))
        # and each membership attack's population size (its name: what its exact AUC's metric name starts with), so
        # that the aggregator marks the TPR figures a population cannot resolve as this party's report marks them
        self._sent_populations = tuple(population_name(n[:-len(EXACT_AUC) - 1]) for n in self._sent_metrics
                                       if n.endswith("_" + EXACT_AUC))
        # With this party's data loaded (`fx collaborator start`, in-process runs): a gate its audit population cannot
        # resolve fails now, not as a comparison at population FPR 0 every round.
        population = getattr(self.data_loader, "y_population", None)
        if population is not None:
            sample = self.audit_settings.sample_size
            check_gate_resolution(getattr(built, "collaborator", None) or "this collaborator", self.default_settings,
                                  self.per_collaborator, self.audit_settings,
                                  len(population) if sample is None else min(sample, len(population)))
        self.seed = settings.seed
        self.optimizer_name, self.learning_rate, self.momentum = (settings.optimizer, settings.learning_rate,
                                                                  settings.momentum)

        data_loader = self.data_loader
        self._model_spec = (settings.model, tuple(data_loader.get_feature_shape()), data_loader.get_num_classes(),
                            dict(settings.model_settings))
        try:
            self.model = self._plan_model()
        except ValueError as err:  # the model's keyword arguments are the model's to check
            raise SettingsError(f"{SETTINGS_PREFIX}.model_settings: {err}") from None
        self._check_layers(tuple(data_loader.get_feature_shape()))
        release_cuda_library_pages()  # torch and torchvision are loaded: without a GPU their CUDA pages are dead weight
        parties = (self.default_settings, *self.per_collaborator.values())
        dp = any(c.gate.action == "dp_retrain" or c.mitigation.method == "dp_fedavg" for c in parties)
        population = None if data_loader.shard is None else len(data_loader.get_audit_sets()["population"][1])
        check_canary_settings(self.audit_settings, sum(p.numel() for p in self.model.parameters() if p.requires_grad),
                              population, data_loader.get_num_classes(), dp_training=dp,
                              prefix=f"{SETTINGS_PREFIX}.audit.canary")
        self.to(self.device)
        # The plan's initial model (what `fx plan initialize` saves: this model, built with the plan's seed), which
        # every party has without anyone's data: RMIA's independent references start from it, and nothing else
        # reads it. Not kept in memory (a whole model per runner, 89 MB for the tutorial's net, read once per party):
        # built again from the seed when needed, and once this party receives round 0's weights (the federation's
        # actual starting point), those wait on disk (`initial_model`).
        self._initial_on_disk: SpilledModel | None = None
        self._audit_store: dict = {}  # the audit's state kept across rounds (e.g. RMIA's independent references)
        self.optimizer = self.make_optimizer(self.model)
        self.loss_fn = cross_entropy
        self._audit_sets: AuditSets | None = None
        self._mia_sets: dict[str, AuditSets] = {}  # per party: the membership audits' sample of the audit sets
        self._training: LocalTraining | None = None  # this round's local training, for the audits that train alike
        self._data_mitigation: dict | None = None  # what the data mitigation did, once per collaborator
        self._dp_fedavg_releases: dict[str, int] = {}  # per party: updates sent with dp_fedavg (their epsilons compose)
        self._resolution_said = False  # whether the audit sets' resolvable tolerances were logged
        self._cost_said = False  # whether an audit costing several times the training was logged (once per party)
        self._chance_checked: set[str] = set()  # parties whose global model's accuracy was held against chance
        self.last_record: dict | None = None  # the latest round record, for in-process callers
        # The checks of the received global model (audit.before_training): per party their state across rounds, and
        # this round's verdict ((party, round, the arrays' ids), verdict), by the first task that sees the model.
        self._received_store: dict = {}
        self._received_verdict: tuple[tuple, ReceivedVerdict] | None = None
        # This round's signals by model weights and set: the validation tasks and the audit share them.
        self._signal_memo = SignalMemo()
        self._validating: tuple[int, str] | None = None  # (round, apply) while a validation task runs
        # Called as on_audit_start(collaborator, round) when an audit starts (the demo's progress bar): the audit runs
        # inside the train task, which OpenFL sees only as a whole.
        self.on_audit_start = None

    def _plan_model(self) -> torch.nn.Module:
        """The plan's model with its initial weights: the initial model `fx plan initialize` saves depends only on
        the seed. Seeds torch's global generator, as the constructor always did."""
        name, feature_shape, num_classes, model_settings = self._model_spec
        torch.manual_seed(self.seed)
        return build_model(name, feature_shape, num_classes, **model_settings)

    def initial_model(self) -> torch.nn.Module:
        """The initial model the audit starts RMIA's independent references from (audit_round's `initial_model`,
        called only when they start), on this runner's device: the round-0 weights this party received, read back
        from disk, or before them the plan's model built again from the seed (the same values bit for bit: build_model
        under torch.manual_seed; every other draw of the process goes on as if it had not been built)."""
        if self._initial_on_disk is not None:
            return self._initial_on_disk.load(self.device)
        return self.plan_initial_model()

    def plan_initial_model(self) -> torch.nn.Module:
        """The plan's model built again from the plan's seed (whatever this party received), torch's generator left
        as it was: the honest reference of the received-model check, and what a party that rejected every model so
        far sends back."""
        device = torch.device(self.device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            return self._plan_model().to(device)

    def received_verdict(self, col_name: str, round_num: int, input_tensor_dict: dict) -> ReceivedVerdict:
        """The checks of this round's received global model (audit.before_training), run by the first task that
        receives it (the validation of the aggregated model, else the training), before it is loaded; a later task
        of the round handed the same arrays (OpenFL's collaborator serves them from its cache) reuses the verdict,
        one handed other arrays is checked again."""
        key = (col_name, round_num, tuple(map(id, input_tensor_dict.values())))
        if self._received_verdict is None or self._received_verdict[0] != key:
            verdict = check_received(
                model_names(input_tensor_dict), self.model, self.audit_sets().members, self.data_loader.batch_size,
                self.audit_settings, party=col_name, round_num=round_num, seed=self.seed,
                plan_initial=self.plan_initial_model, store=self._received_store.setdefault(col_name, {}))
            self._received_verdict = (key, verdict)
        return self._received_verdict[1]

    def _check_layers(self, feature_shape: tuple) -> None:
        """Each audit step checks the plan's model against its settings (audit.config.steps `check_model`: e.g. the
        layers the settings name): fail at start-up, not in the first audit."""
        settings = self.audit_settings
        for audit_step in registered():
            check = audit_step.load("check_model")
            if check is not None:
                key = f"{SETTINGS_PREFIX}.audit" + (f".{audit_step.section}" if audit_step.section else "")
                check(self.model, feature_shape, audit_step.settings_of(settings), key)

    def make_optimizer(self, model: torch.nn.Module, learning_rate: float | None = None) -> torch.optim.Optimizer:
        """The plan's optimizer for `model` (the DP retrain uses the same recipe)."""
        lr = self.learning_rate if learning_rate is None else learning_rate
        if self.optimizer_name == "SGD":
            return torch.optim.SGD(model.parameters(), lr=lr, momentum=self.momentum)
        return torch.optim.Adam(model.parameters(), lr=lr)

    def collaborator_settings(self, col_name: str) -> CollaboratorSettings:
        """`per_collaborator` settings for `col_name`, else the plan-wide ones."""
        return self.per_collaborator.get(col_name) or self.default_settings

    def forward(self, x):
        return self.model(x)

    def reset_opt_vars(self) -> None:
        """`collaborator.settings.opt_treatment: RESET`: every round's training starts from a fresh optimizer state
        (momentum, Adam's moments and step). OpenFL 1.9's PyTorchTaskRunner leaves this method empty, so under RESET
        the previous round's momentum carried over into the next round's training; the audit's reference models and
        shadow updates, which train like the party, start fresh every local training."""
        self.optimizer.state.clear()

    def audit_sets(self) -> AuditSets:
        if self._audit_sets is None:
            self._audit_sets = AuditSets.from_mapping(self.data_loader.get_audit_sets())
        return self._audit_sets

    def membership_sets(self, col_name: str) -> AuditSets:
        """The membership audits' sample of the audit sets (audit.sample_size), drawn once per party: the same arrays
        every round, which the signal memo matches by identity."""
        if col_name not in self._mia_sets:
            self._mia_sets[col_name] = self.audit_sets().sampled(self.audit_settings.sample_size,
                                                                 sample_seed(self.seed, col_name))
        return self._mia_sets[col_name]

    def received_model(self, round_num: int, input_tensor_dict: dict) -> torch.nn.Module:
        """A copy of the model holding the weights received from the aggregator this round."""
        # rebuild_model pops the tensors it loads: give it a copy so train_task still gets them.
        self.rebuild_model(round_num, dict(input_tensor_dict))
        return copy.deepcopy(self.model)

    # ------------------------------------------------------------ validation
    def validate_task(self, col_name, round_num, input_tensor_dict, **kwargs):
        """OpenFL's validation task (accuracy on the validation set, which is the audit's non-member set); a received
        model the checks rejected is not loaded (accuracy NaN)."""
        if kwargs.get("apply") == "global" and self.received_verdict(col_name, round_num, input_tensor_dict).rejected:
            return rejected_validation(col_name, round_num, kwargs.get("apply"))
        self._signal_memo.start_round(round_num)
        self._validating = (col_name, round_num, kwargs.get("apply"))
        try:
            return super().validate_task(col_name, round_num, input_tensor_dict, **_tqdm_on_terminal_only(kwargs))
        finally:
            self._validating = None

    def validate_(self, validation_dataloader) -> Metric:
        """The accuracy on the validation set (see _validation_accuracy); the received model's, once per party from
        src.chance_accuracy.CHECK_ROUND on, held against chance (a warning when the model has not learnt)."""
        metric = self._validation_accuracy(validation_dataloader)
        if self._validating is not None and self._validating[2] == "global":
            col_name, round_num, _ = self._validating
            if round_num >= CHECK_ROUND and col_name not in self._chance_checked:
                self._chance_checked.add(col_name)
                note = near_chance_note(col_name, round_num, float(metric.value), self.data_loader.y_valid)
                if note:
                    logger.warning(note)
        return metric

    def _validation_accuracy(self, validation_dataloader) -> Metric:
        """The accuracy on the validation set, read off the audit's signals of the same weights where the round has
        them, else OpenFL's own loop. In a round the audit covers, validating the received model computes its audit
        signals (all three sets, the audit's settings) first: the audit after training then reuses them, and the
        trained model's validation reuses the audit's. Predictions come from the audit's batches (batch_size 256 by
        default, not the loader's 32): a sample whose two top outputs tie to the last bit may be counted otherwise."""
        loader, settings = self.data_loader, self.audit_settings
        if self._validating is not None and settings.enabled:
            col_name, round_num, apply = self._validating
            _, global_names = signal_names(settings)
            if apply == "global" and settings.due(round_num) and global_names:
                self._signal_memo.signals(self.model, self.membership_sets(col_name), global_names,
                                          layer=settings.gradient_layer, batch_size=settings.batch_size)
            accuracy = self._signal_memo.accuracy(self.model, loader.X_valid, loader.y_valid)
            if accuracy is not None:
                return Metric(name="accuracy", value=np.array(accuracy))
        # Not read off the audit (no audit this round, or the audit's non-members are a sample of the validation
        # set, audit.sample_size): OpenFL's accuracy, in the audit's batches (batch_size 256 by default: 1.4x faster
        # per sample than the loader's 32 for the tutorial's net, no per-batch copy of the inputs).
        return Metric(name="accuracy", value=np.array(self._accuracy(loader.X_valid, loader.y_valid)))

    def _accuracy(self, x, y) -> float:
        """Share of the samples x that the model classifies as y: the outputs of the forward pass the audit's signals
        run (audit.membership.signals.compute_signals: eval mode, no autograd), as the memo's accuracy reads them."""
        outputs: dict = {}
        compute_signals(self.model, x, y, ["loss"], batch_size=self.audit_settings.batch_size, outputs=outputs)
        return float(np.mean(outputs["logits"].argmax(dim=1).cpu().numpy() == np.asarray(y)))

    def train_task(self, col_name, round_num, input_tensor_dict, epochs=1, **kwargs):
        kwargs = _tqdm_on_terminal_only(kwargs)
        col = self.collaborator_settings(col_name)
        verdict = self.received_verdict(col_name, round_num, input_tensor_dict)
        if verdict.rejected:  # not trained on: nothing new is sent (src/received_model_task.py)
            return rejected_round(self, col_name, round_num, verdict, col.gate, cross_entropy.__name__)
        epochs = col.epochs if col.epochs is not None else epochs
        learning_rate = col.learning_rate if col.learning_rate is not None else self.learning_rate
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        settings = self.audit_settings
        self._mitigate_data(col_name, col.mitigation)
        if settings.enabled and not self._resolution_said:  # once, before this party's first training
            self._resolution_said = True
            warning = resolution_warning(col_name, self.membership_sets(col_name).sizes(), settings.fpr_tolerance)
            if warning:
                logger.warning(warning)
        audit_now = settings.enabled and settings.due(round_num)
        self._signal_memo.start_round(round_num)
        audited_in_validation = self._signal_memo.computed_s  # the received model's signals, during its validation
        self._training = LocalTraining(
            recipe=TrainingRecipe(self.optimizer_name, learning_rate, self.momentum, epochs, self.data_loader.batch_size),
            member_count=len(self.audit_sets().members[1]), federation_alpha=self.data_loader.dirichlet_alpha,
            update_mitigation=col.mitigation if col.mitigation.method in UPDATE_MITIGATIONS else None,
        )
        # What withholding sends back. rebuild_model pops from input_tensor_dict: keep the dict, not copies of the
        # arrays (the TensorDB's own; loading them into the model copies, and nothing writes into them).
        received = dict(input_tensor_dict)
        global_model = self.received_model(round_num, input_tensor_dict) if audit_now else None
        if round_num == 0 and global_model is not None:
            self._initial_on_disk = SpilledModel(global_model)  # the federation's start, for later rounds' audits

        torch.manual_seed(round_seed(self.seed, col_name, round_num))
        start = time.perf_counter()
        global_out, local_out = super().train_task(col_name, round_num, input_tensor_dict, epochs=epochs, **kwargs)
        train_seconds = time.perf_counter() - start
        # The last batch's gradients (a model's size) would stay until the next round's first step sets them to None,
        # and under RESET the optimizer state (another model's size with momentum, two with Adam) until the reset.
        self.optimizer.zero_grad(set_to_none=True)
        if self.opt_treatment == "RESET":
            self.reset_opt_vars()
        release_freed_memory()  # what the training freed, before the audit allocates (src/freed_memory.py)
        train_loss = float(next(v for k, v in global_out.items() if k.tensor_name == cross_entropy.__name__))
        trained = {k.tensor_name: v for k, v in {**global_out, **local_out}.items() if "trained" in k.tags}
        mitigation_record = self._mitigate_update(col.mitigation, trained, received, global_out, local_out,
                                                  col_name, round_num)
        verdict.remember(model_names(trained))  # this party's own update: the checks' honest reference from now on

        gate = col.gate
        outcome = run_gate(
            gate, trained, audited=global_model is not None,
            audit_trained=lambda: self._audit(self.model, global_model, col_name, round_num),
            # what a withheld round sends is the received weights, i.e. the global model
            audit_received=lambda: self._audit(global_model, global_model, col_name, round_num,
                                               what="the received model (what a withheld round sends)"),
            empty_record=lambda: self._empty_record(col_name, round_num),
            retrain=self._dp_retrainer(gate, global_model, col_name, round_num, epochs, learning_rate),
            audit_retrained=lambda retrained: self._audit(
                self._with_state(global_model, retrained.state), global_model, col_name, round_num,
                what="the DP retrain"),
            dp_audit=(mitigation_record or {}).get("dp_audit"),
        )
        release_freed_memory()  # and what the audit freed
        if outcome.sends == SEND_RECEIVED:
            self._send(global_out, local_out, received)
        elif outcome.sends == SEND_RETRAINED:
            self._send(global_out, local_out, outcome.retrained.state)
            # the loss reported is the one of the training whose result is sent
            self._set_metric(global_out, cross_entropy.__name__, outcome.retrained.train_loss)
        if outcome.non_finite_tensors:
            logger.warning("%s round %d: update has NaN/Inf in %s; withheld", col_name, round_num,
                           list(outcome.non_finite_tensors))
        record = outcome.record
        if record is None and verdict.alarms:  # an alarm the plan only reports, in a round the audit skips: keep it
            record = self._empty_record(col_name, round_num)
        if record is not None:
            record["timings"]["train_s"] = train_seconds
            if audited_in_validation and "audit_s" in record["timings"]:
                # The audit's cost wherever it ran: its signals of the received model were computed in validation.
                record["timings"]["audit_s"] += audited_in_validation
                record["timings"]["audit_in_validation_s"] = audited_in_validation
            if math.isfinite(train_loss):  # report metrics are finite numbers
                record["metrics"]["train_loss"] = train_loss
            record["extra"]["gate"] = outcome.record_entry(gate)
            record["extra"]["received_model"] = verdict.details()
            record["metrics"].update(verdict.metrics())
            record["timings"].update(verdict.timings)
            if mitigation_record is not None:
                record["extra"]["mitigation"] = mitigation_record
            self.last_record = record
            # The round record and the private files (e.g. Fidel's images, per-sample scores: only in this party's
            # report) are written now; the plots and pages, drawn from them, are drawn by the process's report
            # worker while the results are sent and the next round trains (audit.reporting.background).
            ReportWriter(settings.report_dir, col_name, log_scale=settings.log_scale).write_round_in_background(
                record_to_json(record), private=record.get("_private", ())
            )
            if not self._cost_said and (note := audit_cost_note(record)):
                self._cost_said = True
                logger.warning(note)
            tripped = outcome.gate_verdict.tripped
            logger.info(
                "%s round %d audit: %s (audit %.2fs, train %.2fs); gate: %s%s",
                col_name, round_num,
                ", ".join(f"{k}={v:.3f}" for k, v in record["metrics"].items() if k.endswith("_auc")),
                record["timings"].get("audit_s", 0.0), train_seconds, outcome.verdict,
                f" (tripped {', '.join(tripped)})" if tripped else "",
            )
        if audit_now:  # every party sends the same names in a round (OpenFL's averaging needs each from all)
            measured = {} if record is None else record["metrics"]
            sizes = {} if record is None else {population_name(a): float(n)
                                               for a, n in population_sizes(record).items()}
            for name in self._sent_metrics:
                value = measured.get(name, math.nan)
                global_out[TensorKey(name, col_name, round_num, True, ("metric",))] = np.array(value)
            for name in self._sent_populations:
                size = sizes.get(name, math.nan)
                global_out[TensorKey(name, col_name, round_num, True, ("metric",))] = np.array(size)
        for name, value in {**outcome.scalars(self.gate_watched, gate.limits), **verdict.metrics()}.items():
            global_out[TensorKey(name, col_name, round_num, True, ("metric",))] = np.array(value)
        return global_out, local_out

    # ------------------------------------------------------------ mitigation
    def _mitigate_data(self, col_name: str, mitigation: Mitigation) -> None:
        """Once per collaborator, before its first training: the data mitigation (bkg_repl, rand_aug, mm_aug) of
        audit.deanon.mitigation, with the federation's whole population set as the background data.

        The membership audit keeps the original members (the private data whose leakage matters) and drops
        from its population the samples of its shard now trained on (they are no longer non-members)."""
        if self._data_mitigation is not None or mitigation.method not in DATA_MITIGATIONS or not mitigation.active:
            return
        loader = self.data_loader
        sets = self.audit_sets()  # fixed before the training data changes
        result = mitigate_data(mitigation, loader.X_train, loader.y_train, *loader.get_background(),
                               seed=round_seed(self.seed, f"{col_name}/mitigation", 0))
        trained_on = loader.background_index[result.background_used]  # pool indices
        keep = ~np.isin(loader.population_index, trained_on)
        self._audit_sets = AuditSets(sets.members, sets.nonmembers,
                                     (sets.population[0][keep], sets.population[1][keep]))
        self._mia_sets.clear()  # drawn again from the new population
        loader.X_train, loader.y_train = result.x, result.y
        self._data_mitigation = {**mitigation.to_dict(), "cluster": result.cluster,
                                 "background_trained_on": int(np.unique(trained_on).size),
                                 "own_population_trained_on": int((~keep).sum()),
                                 "training_set_size": int(len(result.y))}
        logger.info("%s: %s mitigation, training on %d samples (%d members)", col_name, mitigation.method,
                    len(result.y), len(sets.members[1]))

    def _mitigate_update(self, mitigation: Mitigation, trained: dict, received: dict, global_out: dict,
                         local_out: dict, col_name: str, round_num: int) -> dict | None:
        """The update mitigation (noise, dp_fedavg) of what is about to be sent; `trained` is updated in place.
        Returns the record's "mitigation" entry (None without a mitigation)."""
        if mitigation.method in DATA_MITIGATIONS:
            return self._data_mitigation
        if mitigation.method not in UPDATE_MITIGATIONS or not mitigation.active:
            return None
        names = [n for n in trained if n in received]
        start = {n: received[n] for n in names}
        before = {n: trained[n] for n in names}
        seed = round_seed(self.seed, f"{col_name}/mitigation", round_num)
        sent = mitigate_update(mitigation, start, before, seed=seed)
        self._send(global_out, local_out, sent)
        trained.update(sent)
        out = {**mitigation.to_dict(), "update_norm": update_norm(start, before),
               "sent_update_norm": update_norm(start, sent)}
        if mitigation.method == "dp_fedavg" and mitigation.sigma > 0:  # its accountant, and its canary check
            releases = self._dp_fedavg_releases[col_name] = self._dp_fedavg_releases.get(col_name, 0) + 1
            out.update(dp_fedavg_entry(mitigation, start, releases=releases, audit_settings=self.audit_settings,
                                       seed=round_seed(self.seed, f"{col_name}/mitigation/canary", round_num)))
            if "dp_audit" in out:
                logger.info("%s round %d: dp_fedavg: %s", col_name, round_num, out["dp_audit"]["summary"])
        return out

    # ------------------------------------------------------------------ gate
    def _audit(self, model, global_model, col_name: str, round_num: int, what: str = "the trained model") -> dict:
        # The audit can take longer than the training, inside the train task: say it started (the multi-process
        # tool's status line reads this line: workspace.party_status).
        mia_sets = self.membership_sets(col_name)
        counts = ", ".join(f"{s['audited']}{'' if s['audited'] == s['of'] else ' of ' + str(s['of'])} {name}"
                           for name, s in zip(("members", "non-members", "population"), mia_sets.sampling().values()))
        logger.info("%s round %d: auditing %s (signals %s; %s) ...", col_name, round_num, what,
                    ", ".join(self.audit_settings.signals), counts)
        if self.on_audit_start is not None:
            self.on_audit_start(col_name, round_num)
        # Round 0's received model is the initial model, in memory already; later, loaded only if the audit needs it.
        initial = global_model if round_num == 0 and global_model is not None else self.initial_model
        return audit_round(
            model, global_model, self.audit_sets(), self.audit_settings, party=col_name, round_num=round_num,
            seed=self.seed, training=self._training, initial_model=initial,
            store=self._audit_store.setdefault(col_name, {}), memo=self._signal_memo, mia_sets=mia_sets,
        )

    def _empty_record(self, col_name: str, round_num: int) -> dict:
        return {
            "party": col_name, "round": int(round_num), "seed": self.seed, "settings": self.audit_settings.to_dict(),
            "timings": {}, "attacks": {}, "metrics": {},
            "sizes": self.membership_sets(col_name).sizes(), "extra": {},
        }

    def _send(self, global_out: dict, local_out: dict, weights: dict) -> None:
        """Replace this round's trained tensors with `weights` (tensor name -> numpy array, or a model state
        dict of torch tensors) and load them into the model, so the model holds what is sent."""
        if any(isinstance(v, torch.Tensor) for v in weights.values()):
            self.model.load_state_dict(weights)
        else:
            self.set_tensor_dict(dict(weights), with_opt_vars=False)
        sent = self.get_tensor_dict(with_opt_vars=False)
        for out in (global_out, local_out):
            for key in list(out):
                if "metric" in key.tags:
                    continue
                if key.tensor_name not in sent:
                    raise RuntimeError(f"gate: no value to send for trained tensor {key.tensor_name!r}")
                out[key] = sent[key.tensor_name]

    @staticmethod
    def _set_metric(global_out: dict, name: str, value: float) -> None:
        for key in global_out:
            if key.tensor_name == name and "metric" in key.tags:
                global_out[key] = np.array(value)

    @staticmethod
    def _with_state(model: torch.nn.Module, state: dict) -> torch.nn.Module:
        candidate = copy.deepcopy(model)
        candidate.load_state_dict(state)
        return candidate

    def _dp_retrainer(self, gate: GatePolicy, global_model, col_name: str, round_num: int, epochs: int,
                      learning_rate: float):
        """retrain(attempt, noise_multiplier) for audit.gate_flow: DP-SGD from the received weights (opacus).
        One accountant per round, so the epsilon each try reports composes every try of the round. With
        audit.canary.dp_check each try's DP training is audited with gradient canaries (a shadow run of the same
        training: audit.canary.dp.audit_dp_training), and the try's re-audit trains its shadows with DP too."""
        accountant = None
        settings = self.audit_settings

        def retrain(attempt: int, noise_multiplier: float) -> Retrained:
            nonlocal accountant
            if accountant is None:
                accountant = RoundAccountant((self.data_loader.X_train, self.data_loader.y_train))
            result = dp_retrain(
                global_model, lambda m: self.make_optimizer(m, learning_rate), accountant,
                batch_size=self.data_loader.batch_size, epochs=epochs, noise_multiplier=noise_multiplier,
                max_grad_norm=gate.dp.max_grad_norm, seed=round_seed(self.seed, f"{col_name}/dp{attempt}", round_num),
            )
            epsilon = accountant.epsilon(gate.dp.delta)
            logger.info("%s round %d: DP retrain %d (noise %.3g): epsilon %.3g", col_name, round_num, attempt,
                        result.noise_multiplier, epsilon)
            trainer = DPTraining(lambda m: self.make_optimizer(m, learning_rate), self.data_loader.batch_size, epochs,
                                 noise_multiplier, gate.dp.max_grad_norm)
            self._training = dataclasses.replace(self._training, dp=trainer)  # the try's audit trains like it
            dp_audit = None
            if settings.canary.dp_check:
                dp_audit = audit_dp_training(
                    trainer, global_model, (self.data_loader.X_train, self.data_loader.y_train), settings.canary,
                    delta=gate.dp.delta, alpha=1 - settings.confidence,
                    seed=round_seed(self.seed, f"{col_name}/dp{attempt}/canary", round_num)).to_dict()
                logger.info("%s round %d: DP retrain %d: %s", col_name, round_num, attempt, dp_audit["summary"])
            non_finite = bool(non_finite_tensors({k: v.cpu().numpy() for k, v in result.state_dict.items()}))
            return Retrained(state=result.state_dict, train_loss=result.loss, noise_multiplier=result.noise_multiplier,
                             steps=result.steps, epsilon=epsilon, non_finite=non_finite, dp_audit=dp_audit)

        return retrain


def _tqdm_on_terminal_only(kwargs: dict) -> dict:
    """OpenFL's task loops draw a tqdm bar when the task's `use_tqdm` is true: only where stderr (tqdm's stream) is
    a terminal. Elsewhere (a participant's log file, CI) each redraw would be one more line of the log."""
    if kwargs.get("use_tqdm") and not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return {**kwargs, "use_tqdm": False}
    return kwargs
