"""A collaborator's audit of its own rounds, without OpenFL: what the task runner (src/taskrunner.py) calls with the
round's models and sets.

Per party and round: the checks of the received global model before it is loaded (audit.before_training); before
training the data mitigation (once per party) and the round's training recipe; the validation accuracy, read off the
round's signal cache where the audit computes the same signals; after training the update mitigation, the audit
steps (audit.round_audit), the gate (audit.gate_flow) and the party's report (audit.reporting.party). What it returns
is what may leave the party: the weights its model holds (trained, mitigated, retrained with DP or the received ones)
and scalar metrics; the round record stays in the party's own report folder.

Weights are exchanged as the model's own state-dict names (numpy arrays or torch tensors); the caller translates its
transport's names (the task runner's "model." prefix, src/runner/received_model_task.py).
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import torch

from audit.audit_cost import audit_cost_note
from audit.before_training import ReceivedVerdict, check_received
from audit.canary.dp import check_canary_settings
from audit.chance_accuracy import CHECK_ROUND, near_chance_note
from audit.config.audit_settings import AuditSettings
from audit.config.mitigation_settings import UPDATE_MITIGATIONS
from audit.config.per_collaborator import CollaboratorSettings, check_gate_resolution, parse_per_collaborator
from audit.config.steps import AFTER_TRAINING, registered
from audit.config.vocabulary import FINAL_MODEL_ACCURACY, FINAL_MODEL_PREFIX, LEAK_METRICS
from audit.gate_flow import SEND_RECEIVED, SEND_RETRAINED, WITHHELD, rejected_before_training, run_gate
from audit.config.resolution import resolution_warning
from audit.membership.signal_cache import SignalCache
from audit.membership.signals import compute_signals
from audit.membership.step import signal_names
from audit.party_account import PartyAccount, update_release
from audit.party_mitigation import PartyMitigation
from audit.party_record import (complete_record, empty_record, gate_watched, round_line, sent_metric_names,
                                sent_scalars)
from audit.reporting.party import ReportWriter
from audit.model_io import load_weights, weights_fingerprint
from audit.round_audit import (AuditSets, LocalTraining, SentUpdate, audit_final_model, audit_round, round_seed,
                               sample_seed)
from audit.round_record import RoundRecord
from audit.spill import SpilledModel
from audit.run_account import ACCOUNTANT, dp_sgd_mechanism
from audit.run_record import library_versions
from audit.training import TrainingRecipe

logger = logging.getLogger(__name__)

__all__ = ["PartyAudit", "RoundPlan", "RoundOutcome"]


@dataclass(frozen=True)
class RoundPlan:
    """How this round trains: what before_training decided."""

    epochs: int
    learning_rate: float
    seed: int  # torch's global seed for the round's training


@dataclass
class RoundOutcome:
    """What leaves the party after a round: the model's weights when `weights_changed` (else the trained ones), the
    training loss to report when the sent weights come from another training, and the scalar metrics."""

    weights_changed: bool
    train_loss: float | None
    scalars: dict[str, float]
    record: RoundRecord | None


@dataclass
class _Round:
    party: str
    round_num: int
    settings: CollaboratorSettings
    verdict: ReceivedVerdict
    received_model: torch.nn.Module | None
    audited_in_validation: float
    epochs: int
    learning_rate: float


class PartyAudit:
    """One party's audit settings, gate policies, per-collaborator overrides, caches and state across rounds.

    `data`: the party's data (the task runner's data loader: X_train, y_train, X_valid, y_valid, batch_size,
    dirichlet_alpha, get_audit_sets(); for a data mitigation get_background(), background_index, population_index).
    `optimizer`: the plan's (name, learning rate, momentum). `rounds`: the run's training rounds, when known (the
    run's empirical summary corrects its largest epsilon bound for them); `versions`: the framework's versions, for
    the party's account (audit.party_account)."""

    def __init__(self, *, audit: Mapping | None, gate: Mapping | None, per_collaborator, mitigation, prefix: str,
                 seed: int, data, optimizer: tuple[str, float, float], party: str | None = None,
                 rounds: int | None = None, versions: Mapping[str, str] | None = None):
        self.settings = AuditSettings.from_mapping(audit, prefix=f"{prefix}.audit")
        self.default_settings, self.per_collaborator = parse_per_collaborator(
            per_collaborator, gate=gate, audit_settings=self.settings, mitigation=mitigation)
        # The scalars every party sends (the same names from all: OpenFL's aggregator needs them; audit.party_record).
        self.gate_watched = gate_watched(self.default_settings, self.per_collaborator)
        self.sent_metrics, self.sent_populations = sent_metric_names(self.settings)
        # With this party's data loaded: a gate its audit population cannot resolve fails now, not as a comparison at
        # population FPR 0 every round.
        population = getattr(data, "y_population", None)
        if population is not None:
            sample = self.settings.sample_size
            check_gate_resolution(party or "this collaborator", self.default_settings, self.per_collaborator,
                                  self.settings, len(population) if sample is None else min(sample, len(population)))
        self.prefix, self.seed, self.data = prefix, seed, data
        self.rounds = rounds
        self._versions = dict(versions or {})
        self.accounts: dict[str, PartyAccount] = {}  # per party: its account of the run (audit.party_account)
        self.optimizer_name, self.learning_rate, self.momentum = optimizer
        self.model: torch.nn.Module | None = None
        self._plan_model: Callable[[], torch.nn.Module] | None = None
        self.device = torch.device("cpu")
        # The federation's starting point (round 0's received weights) waits on disk: RMIA's independent references
        # start from it, and nothing else reads it (a whole model per party otherwise, 89 MB for the tutorial's net).
        self._initial_on_disk: SpilledModel | None = None
        self._audit_store: dict = {}  # per party: the audit's state across rounds (e.g. RMIA's independent references)
        self._audit_sets: AuditSets | None = None
        self._sets_version = 0  # bumped whenever the audit sets change (the data mitigation): their label says it
        self._mia_sets: dict[str, AuditSets] = {}  # per party: the membership audits' sample of the audit sets
        self.mitigation = PartyMitigation(self)
        self._training: LocalTraining | None = None  # this round's local training, for the audits that train alike
        self._round: _Round | None = None
        self._resolution_said = False  # whether the audit sets' resolvable tolerances were logged
        self._cost_said = False  # whether an audit costing several times the training was logged (once per party)
        self._chance_checked: set[str] = set()  # parties whose global model's accuracy was held against chance
        self.last_record: RoundRecord | None = None  # the latest round record, for in-process callers
        # The checks of the received global model: per party their state across rounds, and this round's verdict.
        self._received_store: dict = {}
        self._received_verdict: tuple[tuple, ReceivedVerdict] | None = None
        # This round's signals, keyed by model state and set label: the validation and the audit share them.
        self.signal_cache = SignalCache()
        # Called as on_audit_start(party, round) when an audit starts (the demo's progress bar).
        self.on_audit_start: Callable[[str, int], None] | None = None
        # Called as on_status(party, phase, round) when the audit's phase changes (auditing, DP retraining) and as
        # on_status(party, note=text) with a note for the user: the status events the task runner writes.
        self.on_status: Callable[..., None] | None = None

    # ------------------------------------------------------------------ set-up
    def use_model(self, model: torch.nn.Module, plan_model: Callable[[], torch.nn.Module], feature_shape: tuple,
                  device) -> None:
        """The party's model (loaded in place every round) and the plan's initial model's builder (seeds torch's
        generator); each audit step checks the model against its settings (`check_model`: e.g. the layers they name)
        at start-up, not in the first audit."""
        self.model, self._plan_model, self.device = model, plan_model, torch.device(device)
        for audit_step in registered():
            check = audit_step.load("check_model")
            if check is not None:
                key = f"{self.prefix}.audit" + (f".{audit_step.section}" if audit_step.section else "")
                check(model, feature_shape, audit_step.settings_of(self.settings), key)

    def check_canaries(self, model: torch.nn.Module, num_classes: int) -> None:
        """The canary settings against the model's size and the party's population (audit.canary.dp)."""
        parties = (self.default_settings, *self.per_collaborator.values())
        dp = any(c.gate.action == "dp_retrain" or c.mitigation.method == "dp_fedavg" for c in parties)
        population = None if self.data.shard is None else len(self.data.get_audit_sets()["population"][1])
        check_canary_settings(self.settings, sum(p.numel() for p in model.parameters() if p.requires_grad),
                              population, num_classes, dp_training=dp, prefix=f"{self.prefix}.audit.canary")

    def collaborator_settings(self, party: str) -> CollaboratorSettings:
        """`per_collaborator` settings for `party`, else the plan-wide ones."""
        return self.per_collaborator.get(party) or self.default_settings

    def make_optimizer(self, model: torch.nn.Module, learning_rate: float | None = None) -> torch.optim.Optimizer:
        """The plan's optimizer for `model` (the DP retrain uses the same recipe)."""
        lr = self.learning_rate if learning_rate is None else learning_rate
        if self.optimizer_name == "SGD":
            return torch.optim.SGD(model.parameters(), lr=lr, momentum=self.momentum)
        return torch.optim.Adam(model.parameters(), lr=lr)

    # ------------------------------------------------------------------ models and sets
    def initial_model(self) -> torch.nn.Module:
        """The initial model the audit starts RMIA's independent references from, on the party's device: the round-0
        weights this party received, read back from disk, or before them the plan's model built again from the seed
        (the same values bit for bit)."""
        if self._initial_on_disk is not None:
            return self._initial_on_disk.load(self.device)
        return self.plan_initial_model()

    def plan_initial_model(self) -> torch.nn.Module:
        """The plan's model built again from the plan's seed, torch's generator left as it was: the honest reference
        of the received-model check, and what a party that rejected every model so far sends back."""
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            return self._plan_model().to(self.device)

    def audit_sets(self) -> AuditSets:
        if self._audit_sets is None:
            self._audit_sets = AuditSets.from_mapping(self.data.get_audit_sets(), label=self._sets_label())
        return self._audit_sets

    def replace_audit_sets(self, sets: AuditSets) -> None:
        """New audit sets (the data mitigation's population): a new label, and every party's sample drawn again."""
        self._sets_version += 1
        self._audit_sets = sets.labelled(self._sets_label())
        self._mia_sets.clear()

    def _sets_label(self) -> str:
        return f"audit-sets/v{self._sets_version}"

    def membership_sets(self, party: str) -> AuditSets:
        """The membership audits' sample of the audit sets (audit.sample_size), drawn once per party: the same
        samples, under the same label, every round."""
        if party not in self._mia_sets:
            self._mia_sets[party] = self.audit_sets().sampled(self.settings.sample_size, sample_seed(self.seed, party))
        return self._mia_sets[party]

    # ------------------------------------------------------------------ before training
    def check_received(self, party: str, round_num: int, received: Mapping) -> ReceivedVerdict:
        """The checks of this round's received global model (model names), run by the first task that receives it,
        before it is loaded; a later call of the round with the same weights (audit.model_io.weights_fingerprint)
        reuses the verdict, one with other weights checks again."""
        key = (party, round_num, weights_fingerprint(received.items()))
        if self._received_verdict is None or self._received_verdict[0] != key:
            verdict = check_received(
                received, self.model, self.audit_sets().members, self.data.batch_size, self.settings, party=party,
                round_num=round_num, seed=self.seed, plan_initial=self.plan_initial_model,
                store=self._received_store.setdefault(party, {}))
            self._received_verdict = (key, verdict)
        return self._received_verdict[1]

    def rejected_round(self, party: str, round_num: int, verdict: ReceivedVerdict) -> tuple[dict, dict[str, float]]:
        """A round whose received model `verdict` rejects: not trained on. Returns the weights sent back untrained (the
        last accepted global model, or the plan's initial one) and the scalars (gate_kept 0, the verdict, the gate's
        usual names, the audit metrics as NaN); the round's record goes to the party's own report."""
        gate = self.collaborator_settings(party).gate
        fallback = verdict.previous.load() if verdict.previous is not None else {
            name: t.detach().cpu().numpy() for name, t in self.plan_initial_model().state_dict().items()}
        record = self._empty_record(party, round_num)
        outcome = rejected_before_training(verdict.reason, record)
        complete_record(record, outcome=outcome, gate=gate, verdict=verdict)
        self.last_record = record
        account = self.account(party)
        account.add_rejected_round(round_num, verdict.reason)
        account.write(self.settings.report_dir)
        ReportWriter(self.settings.report_dir, party, log_scale=self.settings.log_scale).write_round_in_background(
            record)
        self._after_sending(party, round_num, None, averaged=False)
        logger.warning("%s round %d: %s; not trained, sending back the %s", party, round_num, verdict.reason,
                       "plan's initial model" if verdict.previous is None
                       else f"global model of round {verdict.previous.round_num}")
        # the audit metrics and population sizes every audited party sends this round (NaN: none was measured)
        sent = (*self.sent_metrics, *self.sent_populations) if self.settings.due(round_num) else ()
        return fallback, {**dict.fromkeys(sent, math.nan), **outcome.scalars(self.gate_watched, gate.limits),
                          **verdict.metrics()}

    def before_training(self, party: str, round_num: int, epochs: int, verdict: ReceivedVerdict,
                        received_model: Callable[[], torch.nn.Module]) -> RoundPlan:
        """Before the round's local training (`epochs`: the task's): the data mitigation (once per party), the round's
        recipe, and, in a round the audit covers, the received model (`received_model()` gives it; the audit never
        writes into it)."""
        col = self.collaborator_settings(party)
        epochs = col.epochs if col.epochs is not None else epochs
        learning_rate = col.learning_rate if col.learning_rate is not None else self.learning_rate
        settings = self.settings
        self.mitigation.data(party, col.mitigation)
        if settings.enabled and not self._resolution_said:  # once, before this party's first training
            self._resolution_said = True
            warning = resolution_warning(party, self.membership_sets(party).sizes(), settings.fpr_tolerance)
            if warning:
                logger.warning(warning)
        audit_now = settings.enabled and settings.due(round_num)
        self.signal_cache.start_round(round_num)
        audited_in_validation = self.signal_cache.computed_s  # the received model's signals, during its validation
        self._training = LocalTraining(
            recipe=TrainingRecipe(self.optimizer_name, learning_rate, self.momentum, epochs, self.data.batch_size),
            member_count=len(self.audit_sets().members[1]), federation_alpha=self.data.dirichlet_alpha,
            update_mitigation=col.mitigation if col.mitigation.method in UPDATE_MITIGATIONS else None,
        )
        global_model = received_model() if audit_now else None
        if round_num == 0 and global_model is not None:
            self._initial_on_disk = SpilledModel(global_model)  # the federation's start, for later rounds' audits
        self._round = _Round(party, round_num, col, verdict, global_model, audited_in_validation, epochs,
                             learning_rate)
        return RoundPlan(epochs, learning_rate, round_seed(self.seed, party, round_num))

    # ------------------------------------------------------------------ validation
    def validation_accuracy(self, party: str, round_num: int, apply: str | None, model: torch.nn.Module) -> float:
        """The accuracy of `model` on the validation set (which is the audit's non-member set), read off the signal
        cache where the round has it. In a round the audit covers, validating the received model (apply "global")
        computes its audit signals first: the audit after training then reuses them, and the trained model's
        validation reuses the audit's. Otherwise computed in the audit's batches (batch_size 256 by default, not the
        loader's 32): a sample whose two top outputs tie to the last bit may be counted otherwise. The received
        model's accuracy is held against chance once per party from CHECK_ROUND on."""
        settings, data = self.settings, self.data
        self.signal_cache.start_round(round_num)
        accuracy = None
        if settings.enabled:
            sets = self.membership_sets(party)
            _, global_names = signal_names(settings)
            if apply == "global" and settings.due(round_num) and global_names:
                self.signal_cache.signals(model, sets, global_names, layer=settings.gradient_layer,
                                          batch_size=settings.batch_size)
            # the audit's non-members are the whole validation set unless audit.sample_size drew a sample of them
            whole = sets.sampling()["nonmembers"]
            if whole["audited"] == whole["of"] == len(data.y_valid):
                accuracy = self.signal_cache.accuracy(model, sets, "nonmembers")
        if accuracy is None:
            outputs: dict = {}
            compute_signals(model, data.X_valid, data.y_valid, ["loss"], batch_size=settings.batch_size,
                            outputs=outputs)
            accuracy = float(np.mean(outputs["logits"].argmax(dim=1).cpu().numpy() == np.asarray(data.y_valid)))
        if apply == "global" and round_num >= CHECK_ROUND and party not in self._chance_checked:
            self._chance_checked.add(party)
            note = near_chance_note(party, round_num, accuracy, data.y_valid)
            if note:
                logger.warning(note)
        return accuracy

    # ------------------------------------------------------------------ after training
    def after_training(self, trained: dict, received: Mapping, train_loss: float, train_seconds: float) -> RoundOutcome:
        """After the local training of the round before_training planned: `trained` and `received` are the trained and
        received weights (model names, numpy); the party's model holds the trained ones (`trained` may be views of the
        model's own tensors: read before the model is written). The update mitigation, the audit, the gate and the
        report; the model ends up holding what is sent."""
        r = self._round
        party, round_num, col, verdict, global_model = r.party, r.round_num, r.settings, r.verdict, r.received_model
        account = self.account(party)
        release = update_release(col.mitigation)
        # A DP update the run budget refuses is not made: nothing of it can then decide anything (gate_flow).
        refused = account.budget is not None and release is not None and not account.budget.check([release]).allowed
        mitigation_record, changed = (None, False) if refused else self.mitigation.update(
            col.mitigation, trained, received, party, round_num)
        verdict.remember(trained)  # this party's own update: the checks' honest reference from now on
        gate = col.gate
        outcome = run_gate(
            gate, trained, audited=global_model is not None,
            audit_trained=lambda: self._audit(self.model, global_model, party, round_num),
            # what a withheld round sends is the received weights, i.e. the global model
            audit_received=lambda: self._audit(global_model, global_model, party, round_num,
                                               what="the received model (what a withheld round sends)"),
            empty_record=lambda: self._empty_record(party, round_num),
            retrain=self.mitigation.dp_retrainer(gate, global_model, party, round_num, r.epochs, r.learning_rate),
            audit_retrained=lambda retrained: self._audit(
                _with_state(global_model, retrained.state), global_model, party, round_num, what="the DP retrain"),
            dp_audit=(mitigation_record or {}).get("dp_audit"),
            budget=account.budget, update_release=release,
            plan_try=lambda attempt, noise: dp_sgd_mechanism(noise, len(self.data.y_train), self.data.batch_size,
                                                             r.epochs, f"dp_retrain try {attempt}"),
        )
        loss_sent = None
        if outcome.sends == SEND_RECEIVED:
            load_weights(self.model, received)
            changed = True
        elif outcome.sends == SEND_RETRAINED:
            load_weights(self.model, outcome.retrained.state)
            changed, loss_sent = True, outcome.retrained.train_loss  # the loss of the training whose result is sent
        self._after_sending(party, round_num, self.model, averaged=outcome.verdict != WITHHELD)
        if outcome.non_finite_tensors:
            logger.warning("%s round %d: update has NaN/Inf in %s; withheld", party, round_num,
                           list(outcome.non_finite_tensors))
        record = outcome.record
        if record is None and verdict.alarms:  # an alarm the plan only reports, in a round the audit skips: keep it
            record = self._empty_record(party, round_num)
        scalars: dict[str, float] = {}
        if record is not None:
            self._complete_record(record, outcome, gate, verdict, mitigation_record, train_loss, train_seconds)
        if global_model is not None:  # an audited round: every party sends the audit's names (a round the audit
            # skips sends none, even where a record was kept for a non-finite update or an alarm)
            scalars = sent_scalars(record, self.sent_metrics, self.sent_populations)
        scalars.update({**outcome.scalars(self.gate_watched, gate.limits), **verdict.metrics()})
        account.add_round(round_num, outcome=outcome, record=record, audited=global_model is not None,
                          mitigation=col.mitigation)
        account.write(self.settings.report_dir)
        self._round = None  # the received model goes with the round
        return RoundOutcome(changed, loss_sent, scalars, record)

    def _complete_record(self, record: RoundRecord, outcome, gate, verdict: ReceivedVerdict, mitigation_record,
                         train_loss: float, train_seconds: float) -> None:
        """The round record completed (audit.party_record), written to the party's report, and logged."""
        r = self._round
        complete_record(record, outcome=outcome, gate=gate, verdict=verdict, mitigation_record=mitigation_record,
                        train_loss=train_loss, train_seconds=train_seconds,
                        audited_in_validation=r.audited_in_validation)
        self.last_record = record
        # The round record and the private files (e.g. Fidel's images, per-sample scores: only in this party's
        # report) are written now; the plots and pages, drawn from them, are drawn by the process's report
        # worker while the results are sent and the next round trains (audit.reporting.background).
        ReportWriter(self.settings.report_dir, r.party, log_scale=self.settings.log_scale).write_round_in_background(
            record)
        if not self._cost_said and (note := audit_cost_note(record)):
            self._cost_said = True
            logger.warning(note)
            self.status(r.party, note=note)
        logger.info(round_line(record, outcome, train_seconds))

    def _after_sending(self, party: str, round_num: int, model, *, averaged: bool) -> None:
        """The steps that follow the party's updates across rounds learn what it sent (AuditStep.after_sending)."""
        if not self.settings.enabled:
            return
        sent = SentUpdate(party, round_num, model, averaged, self.data, (self.default_settings, self.per_collaborator))
        for audit_step in registered():
            hook = audit_step.load("after_sending")
            if hook is not None and audit_step.enabled(self.settings):
                hook(self._audit_store.setdefault(party, {}), sent, audit_step.settings_of(self.settings))

    def _audit(self, model, global_model, party: str, round_num: int,
               what: str = "the trained model") -> RoundRecord:
        # The audit can take longer than the training: say it started (the log, and the status the party writes).
        mia_sets = self.membership_sets(party)
        counts = ", ".join(f"{s['audited']}{'' if s['audited'] == s['of'] else ' of ' + str(s['of'])} {name}"
                           for name, s in zip(("members", "non-members", "population"), mia_sets.sampling().values()))
        logger.info("%s round %d: auditing %s (signals %s; %s) ...", party, round_num, what,
                    ", ".join(self.settings.signals), counts)
        if self.on_audit_start is not None:
            self.on_audit_start(party, round_num)
        self.status(party, "auditing", round_num)
        # Round 0's received model is the initial model, in memory already; later, loaded only if the audit needs it.
        initial = global_model if round_num == 0 and global_model is not None else self.initial_model
        return audit_round(
            model, global_model, self.audit_sets(), self.settings, party=party, round_num=round_num,
            seed=self.seed, training=self._training, initial_model=initial,
            store=self._audit_store.setdefault(party, {}), signal_cache=self.signal_cache, mia_sets=mia_sets,
            run_rounds=self.rounds,
        )

    # ------------------------------------------------------------------ the run
    def account(self, party: str) -> PartyAccount:
        """The party's account of the run (audit.party_account), made on first use with its settings."""
        if party not in self.accounts:
            col = self.collaborator_settings(party)
            settings = self.settings
            recorded = {"gate": col.gate.to_dict(), "mitigation": col.mitigation.to_dict(),
                        "audit": {key: settings.to_dict().get(key) for key in (
                            "enabled", "signals", "fpr_tolerance", "interval", "sample_size", "confidence",
                            "epsilon_delta", "audit_global", "update_attack")},
                        "steps": [s.name for s in registered(AFTER_TRAINING) if s.enabled(settings)],
                        "rounds": self.rounds, "seed": self.seed,
                        "dp_account": {"accountant": ACCOUNTANT, "delta": col.gate.dp.delta}}
            self.accounts[party] = PartyAccount(party, delta=col.gate.dp.delta, budget=col.gate.run_epsilon_budget,
                                                settings=recorded, versions=library_versions(self._versions))
        return self.accounts[party]

    def final_model(self, party: str, round_num: int, received: Mapping) -> dict[str, float]:
        """After the last round: the final global model (`received`, model names; `round_num`: the round after the
        last) audited against the party's own members (audit.round_audit.audit_final_model), its record written to
        the party's report (final_model/audit.json) and its account. Returns the scalars that may leave the party:
        the verdict's (FINAL_MODEL_PREFIX + the leak verdict's names) and the final model's accuracy on its
        non-members."""
        account = self.account(party)
        settings = self.settings
        model = copy.deepcopy(self.model)  # the party's own model keeps what it last sent
        load_weights(model, received)
        accuracy = self.validation_accuracy(party, round_num, None, model)
        scalars = {FINAL_MODEL_ACCURACY: accuracy}
        if not settings.enabled:
            account.add_final(None, policy=None, accuracy=accuracy, round_num=round_num,
                              why="the audit is off (audit.enabled: false)")
            account.write(settings.report_dir)
            return scalars
        self.status(party, "auditing", round_num)
        logger.info("%s: auditing the final model (after round %d) against its members ...", party, round_num - 1)
        self.signal_cache.start_round(round_num)
        record = audit_final_model(
            model, self.audit_sets(), settings, party=party, round_num=round_num, seed=self.seed,
            training=self._training, initial_model=self.initial_model, store=self._audit_store.setdefault(party, {}),
            signal_cache=self.signal_cache, mia_sets=self.membership_sets(party))
        record.metrics[FINAL_MODEL_ACCURACY] = accuracy
        final = account.add_final(record, policy=self.collaborator_settings(party).gate, accuracy=accuracy,
                                  round_num=round_num)
        account.write(settings.report_dir)  # before the pages and run.json are drawn from it
        ReportWriter(settings.report_dir, party, log_scale=settings.log_scale).write_final_model(record)
        logger.info("%s: %s", party, final.headline())
        scalars.update({FINAL_MODEL_PREFIX + name: value for name, value in record.metrics.items()
                        if name in LEAK_METRICS})
        return scalars

    def status(self, party: str, phase: str | None = None, round_num: int | None = None, **fields) -> None:
        if self.on_status is not None:
            self.on_status(party, phase, round_num, **fields)

    def _empty_record(self, party: str, round_num: int) -> RoundRecord:
        return empty_record(party, round_num, self.seed, self.settings, self.membership_sets(party).sizes())


def _with_state(model: torch.nn.Module, state: dict) -> torch.nn.Module:
    candidate = copy.deepcopy(model)
    candidate.load_state_dict(state)
    return candidate
