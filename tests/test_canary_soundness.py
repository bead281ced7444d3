"""The canary bounds against opacus' accountant on models and data the rest of the suite does not use (a tabular MLP,
an Embedding bag-of-tokens model): never above it over many seeds, with power where the accountant's epsilon is
large; DP trainings broken on purpose (clipping skipped, noise scaled down 10x) are caught and their update withheld;
the dp_fedavg mitigation's check catches a mitigation that skips its clipping."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from opacus.optimizers import optimizer as opacus_optimizer
from sklearn.datasets import make_classification
from torch import nn

from audit.canary.dp import (VIOLATION, audit_dp_training, audit_update_mechanism, check_canary_settings,
                             update_mechanism_epsilon)
from audit.config.audit_settings import AuditSettings
from audit.config.builtin_steps import CANARY
from audit.config.canary_settings import CanarySettings
from audit.config.fields import SettingsError
from audit.config.gate import GatePolicy
from audit.config.gate_contract import DP_VIOLATED, GATE_KEPT, tripped_name
from audit.config.mitigation_settings import Mitigation
from audit.deanon.mitigation import mitigate_update
from audit.gate_flow import SEND_RECEIVED, WITHHELD, Retrained, run_gate
from audit.reporting.verdicts import round_verdict
from audit.round_audit import AuditSets, LocalTraining, audit_round
from audit.round_record import RoundRecord
from audit.training import TrainingRecipe
from audit.aggregator_report.record import collaborator_entry
from audit.dp_training import DPTraining

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:Optimal order is the"),
              pytest.mark.filterwarnings("ignore:Secure RNG turned off")]

DELTA, ALPHA = 1e-5, 0.05


def tabular(seed: int, n: int = 96):
    x, y = make_classification(n_samples=n, n_features=10, n_informative=6, n_classes=3, random_state=seed)
    return ((x - x.mean(0)) / x.std(0)).astype(np.float32), y.astype(np.int64)


def tokens(seed: int, n: int = 96):
    """Bags of 5 token ids out of 40, labelled by a rule the model can learn."""
    x = np.random.default_rng(seed).integers(0, 40, size=(n, 5))
    return x.astype(np.int64), (x.sum(axis=1) % 3).astype(np.int64)


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(40, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.embed(x).mean(dim=1))


def model(kind: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "embedding":
        return Bag()
    return nn.Sequential(nn.Linear(10, 24), nn.ReLU(), nn.Linear(24, 3))


def data(kind: str, seed: int):
    return tokens(seed) if kind == "embedding" else tabular(seed)


def trainer(sigma: float, epochs: int = 2) -> DPTraining:
    return DPTraining(lambda m: torch.optim.SGD(m.parameters(), lr=0.1), batch_size=16, epochs=epochs,
                      noise_multiplier=sigma, max_grad_norm=1.0)


@pytest.mark.parametrize("kind", ["mlp", "embedding"])
@pytest.mark.slow
def test_gradient_canary_check_of_correct_dp_trainings_rarely_alarms(kind):
    """3 seeds x 2 noise levels with Dirac canaries, one with random directions: each of the check's four tests runs
    at alpha / 4, so a correct DP training trips the check in at most alpha of the runs; of these 7, at most 2 may
    (P[Binomial(7, 0.05) >= 3] = 0.004). Every figure at most its ceiling, the estimate's interval around the
    claimed noise multiplier in most runs, and with little noise (an accountant's epsilon in the tens) the canaries
    prove something."""
    runs = [(sigma, seed, "dirac") for sigma in (0.5, 1.5) for seed in range(3)] + [(1.5, 3, "random")]
    alarms, inside, bounds = 0, 0, {}
    for sigma, seed, gradient_kind in runs:
        audit = audit_dp_training(trainer(sigma), model(kind, seed), data(kind, seed),
                                  CanarySettings(gradient_kind=gradient_kind), delta=DELTA, alpha=ALPHA, seed=seed)
        assert audit.tests == 4 and audit.bound.alpha == ALPHA / 4 and audit.estimate.alpha == ALPHA / 4
        assert audit.details["canaries"] == sum(p.numel() for p in model(kind, seed).parameters())  # one per value
        alarms += audit.violated
        assert audit.bound.epsilon <= audit.bound.ceiling
        for family_bound in (audit.fdp, audit.independent):
            assert family_bound.epsilon <= family_bound.ceiling * 1.0001
            assert family_bound.claim_rejected == (family_bound.noise is not None
                                                   and family_bound.noise <= trainer(sigma).noise_multiplier)
        low, high = audit.estimate.noise_interval
        inside += low <= sigma <= high
        bounds.setdefault(sigma, []).append(audit.epsilon_lb)
    assert alarms <= 2 and inside >= len(runs) - 2
    assert max(bounds[0.5]) > 1.0 and max(bounds[1.5]) < max(bounds[0.5])


@pytest.mark.slow
def test_input_canary_step_under_dp_is_never_above_its_shadows_accountant():
    """The canary step, in a round whose update was trained with DP, trains its shadow with the party's DP training
    (an Embedding model on token ids: noise canaries are token ids too) and reports the shadow's accountant."""
    for seed in range(4):
        x, y = tokens(seed, n=300)
        sets = AuditSets((x[:60], y[:60]), (x[60:120], y[60:120]), (x[120:], y[120:]))
        dp = trainer(0.6, epochs=4)
        settings = AuditSettings.from_mapping({"canary": {"enabled": True, "count": 150}})
        training = LocalTraining(TrainingRecipe("SGD", 0.1, 0.0, 4, 16), 60, None, dp=dp)
        received = model("embedding", seed)
        record = audit_round(received, received, sets, settings, party="p", round_num=0, seed=seed,
                             training=training, steps=(CANARY,))
        dp_entry = record.extra["canary"]["dp"]
        assert record.extra["canary"]["mechanism"]["mechanism"] == "dp_sgd"
        assert dp_entry["epsilon_lb"] == record.metrics["canary_epsilon_lb"] <= dp_entry["claimed_epsilon"]
        assert dp_entry["violated"] is False and math.isfinite(dp_entry["claimed_epsilon"])


def _skip_clipping(self):
    """A DP-SGD bug: the per-sample gradients summed as they are, never clipped."""
    for p in self.params:
        summed = self._get_flat_grad_sample(p).to(p.dtype).sum(dim=0)
        p.summed_grad = summed if p.summed_grad is None else p.summed_grad + summed
        opacus_optimizer._mark_as_processed(p.grad_sample)


def _tenth_of_the_noise(original):
    def add_noise(self):
        """A DP-SGD bug: the noise drawn with a tenth of the noise multiplier the accountant is told."""
        claimed = self.noise_multiplier
        self.noise_multiplier = claimed / 10
        try:
            original(self)
        finally:
            self.noise_multiplier = claimed
    return add_noise


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["clipping skipped", "noise / 10"])
def test_a_broken_dp_training_is_caught_and_its_update_withheld(bug, monkeypatch):
    sigma = 3.0  # an accountant's epsilon near 1 for this training
    x, y = tabular(0)
    start = model("mlp", 0)
    correct = audit_dp_training(trainer(sigma, epochs=4), start, (x, y), CanarySettings(), delta=DELTA, alpha=ALPHA,
                                seed=1)
    assert not correct.violated and correct.claimed_epsilon < 1.5
    if bug == "clipping skipped":
        monkeypatch.setattr(opacus_optimizer.DPOptimizer, "clip_and_accumulate", _skip_clipping)
    else:
        monkeypatch.setattr(opacus_optimizer.DPOptimizer, "add_noise",
                            _tenth_of_the_noise(opacus_optimizer.DPOptimizer.add_noise))
    broken = audit_dp_training(trainer(sigma, epochs=4), start, (x, y), CanarySettings(), delta=DELTA, alpha=ALPHA,
                               seed=1)
    # the same claim (the accountant is told the same), the worst-case bound above it too, and the estimate far below
    assert broken.claimed_epsilon == pytest.approx(correct.claimed_epsilon)
    assert broken.violated and broken.bound.epsilon > broken.claimed_epsilon
    assert broken.epsilon_lb >= broken.bound.epsilon
    assert broken.estimate.claim_rejected and broken.estimate.noise_interval[1] < sigma / 3

    # The gate: a dp_retrain whose DP training is proved broken is withheld at once (no further try, no re-audit).
    calls = []

    def retrain(attempt, noise):
        calls.append(attempt)
        return Retrained(state={}, train_loss=0.5, noise_multiplier=noise, steps=24, epsilon=broken.claimed_epsilon,
                         non_finite=False, dp_audit=broken.to_dict())

    policy = GatePolicy.from_mapping({"action": "dp_retrain", "bound": "point",
                                      "thresholds": {"mia_local_loss_auc": 0.5}, "dp": {"noise_multiplier": sigma}},
                                     audit_settings=AuditSettings())
    outcome = run_gate(policy, {"w": np.zeros(3)}, audited=True,
                       audit_trained=lambda: RoundRecord("p", 0, metrics={"mia_local_loss_auc": 0.9}),
                       audit_received=lambda: pytest.fail("not audited"), empty_record=lambda: pytest.fail("no"),
                       retrain=retrain, audit_retrained=lambda r: pytest.fail("a broken DP training is not re-audited"))
    assert (outcome.verdict, outcome.sends, outcome.reason, calls) == (WITHHELD, SEND_RECEIVED, DP_VIOLATED, [1])
    entry = outcome.record_entry(policy)
    assert entry["tries"][0]["dp_audit"]["reason"] == VIOLATION
    assert entry["tripped"][DP_VIOLATED]["value"] == broken.epsilon_lb
    scalars = outcome.scalars(("mia_local_loss_auc",), policy.thresholds)
    assert scalars[GATE_KEPT] == 0.0 and scalars[tripped_name(DP_VIOLATED)] == broken.epsilon_lb
    # what the aggregator's report and the party's page say of it
    reason = collaborator_entry(scalars, straggler=False)["reason"]
    assert reason.startswith("update withheld: " + VIOLATION)
    verdict = round_verdict(RoundRecord("p", 0, extra={"gate": entry}))
    assert verdict.status.startswith(f"withheld: {VIOLATION} (canary ε ≥ ")
    assert "canary check ε ≥" in verdict.epsilon and "it behaves like noise multiplier σ = " in verdict.epsilon


def test_dp_fedavg_check_catches_a_mitigation_that_skips_its_clipping():
    received = {"a.weight": np.zeros((40, 50), dtype=np.float32), "a.bias": np.zeros(50, dtype=np.float32),
                "steps": np.array(3)}
    sigma, clip = 9.0, 1.0
    settings = CanarySettings(gradient_count=1000, gradient_norm=30.0)
    claimed = update_mechanism_epsilon(sigma, DELTA)
    assert 0.5 < claimed < 1.5
    good = Mitigation("dp_fedavg", sigma=sigma, clip=clip)

    def unclipped(r, t):  # the noise of dp_fedavg, without its clipping
        return mitigate_update(Mitigation("noise", sigma=sigma * clip), r, t, seed=4)

    for seed in range(3):
        correct = audit_update_mechanism(lambda r, t: mitigate_update(good, r, t, seed=seed), received, sigma=sigma,
                                         clip=clip, settings=settings, delta=DELTA, alpha=ALPHA, seed=seed)
        assert correct.claimed_epsilon == claimed and not correct.violated
    broken = audit_update_mechanism(unclipped, received, sigma=sigma, clip=clip, settings=settings, delta=DELTA,
                                    alpha=ALPHA, seed=0)
    assert broken.violated and broken.bound.epsilon > claimed
    assert run_gate(GatePolicy(), {"w": np.zeros(2)}, audited=False, audit_trained=dict, audit_received=dict,
                    empty_record=lambda: {"metrics": {}, "attacks": {}}, retrain=None, audit_retrained=None,
                    dp_audit=broken.to_dict()).reason == DP_VIOLATED


def test_canary_settings_the_model_and_data_cannot_serve_are_refused_naming_the_key():
    """Checked when a collaborator starts (its population shard is known then): not in the first audit."""
    settings = AuditSettings.from_mapping({"canary": {"enabled": True, "construction": "natural", "count": 500}})
    with pytest.raises(SettingsError, match=r"^p\.count: 500 natural canaries cannot be built from a population shard "
                                            r"of 404 samples and 10 classes \(at most 404; construction noise"):
        check_canary_settings(settings, 74890, 404, 10, dp_training=False, prefix="p")
    # no data yet (fx plan initialize): not checked
    check_canary_settings(settings, 74890, None, 10, dp_training=False, prefix="p")
    mislabelled = AuditSettings.from_mapping({"canary": {"enabled": True, "construction": "mislabelled"}})
    check_canary_settings(mislabelled, 74890, 404, 10, dp_training=False, prefix="p")  # 404 x 9 wrong labels
    explicit = AuditSettings.from_mapping({"canary": {"gradient_count": 1000}})
    with pytest.raises(SettingsError, match=r"^p\.gradient_count: 1000 canaries need as many"):
        check_canary_settings(explicit, 300, 404, 10, dp_training=True, prefix="p")
    check_canary_settings(explicit, 300, 404, 10, dp_training=False, prefix="p")  # no DP: no gradient canary
    check_canary_settings(AuditSettings(), 300, 404, 10, dp_training=True, prefix="p")  # auto: one per value
