"""A party's mitigations, for its audit (audit.party_audit.PartyAudit): the data mitigation before its first training,
the update mitigation of what it sends, and the gate's DP-SGD retrain of a round's update."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from audit.canary.dp import audit_dp_training, dp_fedavg_entry
from audit.config.gate import GatePolicy, non_finite_tensors
from audit.config.mitigation_settings import DATA_MITIGATIONS, UPDATE_MITIGATIONS, Mitigation
from audit.deanon.mitigation import mitigate_data, mitigate_update, update_norm
from audit.dp_training import DPTraining, RoundAccountant, dp_retrain
from audit.gate_flow import Retrained
from audit.model_io import load_weights
from audit.round_audit import AuditSets, round_seed

logger = logging.getLogger(__name__)

__all__ = ["PartyMitigation"]


class PartyMitigation:
    """The mitigations of one PartyAudit (`audit`): its data, settings, model and round state."""

    def __init__(self, audit) -> None:
        self.audit = audit
        self._data_record: dict | None = None  # what the data mitigation did, once per collaborator
        self._dp_fedavg_releases: dict[str, int] = {}  # per party: updates sent with dp_fedavg (their epsilons compose)

    def data(self, party: str, mitigation: Mitigation) -> None:
        """Once per collaborator, before its first training: the data mitigation (bkg_repl, rand_aug, mm_aug) of
        audit.deanon.mitigation, with the federation's whole population set as the background data.

        The membership audit keeps the original members (the private data whose leakage matters) and drops
        from its population the samples of its shard now trained on (they are no longer non-members)."""
        if self._data_record is not None or mitigation.method not in DATA_MITIGATIONS or not mitigation.active:
            return
        loader, audit = self.audit.data, self.audit
        sets = audit.audit_sets()  # fixed before the training data changes
        result = mitigate_data(mitigation, loader.X_train, loader.y_train, *loader.get_background(),
                               seed=round_seed(audit.seed, f"{party}/mitigation", 0))
        trained_on = loader.background_index[result.background_used]  # pool indices
        keep = ~np.isin(loader.population_index, trained_on)
        audit.replace_audit_sets(AuditSets(sets.members, sets.nonmembers,
                                           (sets.population[0][keep], sets.population[1][keep])))
        loader.X_train, loader.y_train = result.x, result.y
        self._data_record = {**mitigation.to_dict(), "cluster": result.cluster,
                             "background_trained_on": int(np.unique(trained_on).size),
                             "own_population_trained_on": int((~keep).sum()),
                             "training_set_size": int(len(result.y))}
        logger.info("%s: %s mitigation, training on %d samples (%d members)", party, mitigation.method,
                    len(result.y), len(sets.members[1]))

    def update(self, mitigation: Mitigation, trained: dict, received, party: str,
               round_num: int) -> tuple[dict | None, bool]:
        """The update mitigation (noise, dp_fedavg) of what is about to be sent: `trained` is updated in place and
        loaded into the model. Returns the record's "mitigation" entry (None without a mitigation) and whether the
        model's weights changed."""
        if mitigation.method in DATA_MITIGATIONS:
            return self._data_record, False
        if mitigation.method not in UPDATE_MITIGATIONS or not mitigation.active:
            return None, False
        audit = self.audit
        names = [n for n in trained if n in received]
        start = {n: received[n] for n in names}
        before = {n: trained[n] for n in names}
        sent = mitigate_update(mitigation, start, before, seed=round_seed(audit.seed, f"{party}/mitigation", round_num))
        # Both norms before the model is loaded: `trained` may hold views of the model's own tensors (the task
        # runner's results through the audit), which the load overwrites with what is sent.
        out = {**mitigation.to_dict(), "update_norm": update_norm(start, before),
               "sent_update_norm": update_norm(start, sent)}
        trained.update(sent)
        load_weights(audit.model, trained)
        if mitigation.method == "dp_fedavg" and mitigation.sigma > 0:  # its accountant, and its canary check
            releases = self._dp_fedavg_releases[party] = self._dp_fedavg_releases.get(party, 0) + 1
            out.update(dp_fedavg_entry(mitigation, start, releases=releases, audit_settings=audit.settings,
                                       seed=round_seed(audit.seed, f"{party}/mitigation/canary", round_num)))
            if "dp_audit" in out:
                logger.info("%s round %d: dp_fedavg: %s", party, round_num, out["dp_audit"]["summary"])
        return out, True

    def dp_retrainer(self, gate: GatePolicy, global_model, party: str, round_num: int, epochs: int,
                     learning_rate: float):
        """retrain(attempt, noise_multiplier) for audit.gate_flow: DP-SGD from the received weights (opacus).
        One accountant per round, so the epsilon each try reports composes every try of the round. With
        audit.canary.dp_check each try's DP training is audited with gradient canaries (a shadow run of the same
        training: audit.canary.dp.audit_dp_training), and the try's re-audit trains its shadows with DP too."""
        audit = self.audit
        accountant = None
        settings, data = audit.settings, audit.data

        def retrain(attempt: int, noise_multiplier: float) -> Retrained:
            nonlocal accountant
            audit.status(party, "DP retraining", round_num)
            if accountant is None:
                accountant = RoundAccountant((data.X_train, data.y_train))
            result = dp_retrain(
                global_model, lambda m: audit.make_optimizer(m, learning_rate), accountant,
                batch_size=data.batch_size, epochs=epochs, noise_multiplier=noise_multiplier,
                max_grad_norm=gate.dp.max_grad_norm, seed=round_seed(audit.seed, f"{party}/dp{attempt}", round_num),
            )
            epsilon = accountant.epsilon(gate.dp.delta)
            logger.info("%s round %d: DP retrain %d (noise %.3g): epsilon %.3g", party, round_num, attempt,
                        result.noise_multiplier, epsilon)
            trainer = DPTraining(lambda m: audit.make_optimizer(m, learning_rate), data.batch_size, epochs,
                                 noise_multiplier, gate.dp.max_grad_norm)
            audit._training = dataclasses.replace(audit._training, dp=trainer)  # the try's audit trains like it
            dp_audit = None
            if settings.canary.dp_check:
                dp_audit = audit_dp_training(
                    trainer, global_model, (data.X_train, data.y_train), settings.canary,
                    delta=gate.dp.delta, alpha=1 - settings.confidence,
                    seed=round_seed(audit.seed, f"{party}/dp{attempt}/canary", round_num)).to_dict()
                logger.info("%s round %d: DP retrain %d: %s", party, round_num, attempt, dp_audit["summary"])
            non_finite = bool(non_finite_tensors({k: v.cpu().numpy() for k, v in result.state_dict.items()}))
            return Retrained(state=result.state_dict, train_loss=result.loss, noise_multiplier=result.noise_multiplier,
                             steps=result.steps, epsilon=epsilon, non_finite=non_finite, dp_audit=dp_audit,
                             sample_rate=result.sample_rate)

        return retrain
