"""The gate's flow (audit.gate_flow.run_gate) without OpenFL or torch: the audits and the DP retraining are callables
that record how they were called, so each branch's order of calls and its outcome are checked."""

from __future__ import annotations

import math

import numpy as np
import pytest

from audit.config.gate import GatePolicy
from audit.config.gate_contract import (DP_VIOLATED, GATE_EPSILON, GATE_KEPT, GATE_MISSING_PREFIX, GATE_RETRIES,
                                        GATE_TRIPPED_PREFIX,
                                        NON_FINITE_UPDATE)
from audit.gate_flow import (DP_RETRAINED, KEPT, OVER_THRESHOLD, SEND_RECEIVED, SEND_RETRAINED, SEND_TRAINED,
                             WITHHELD, Retrained, run_gate)
from audit.config.audit_settings import AuditSettings
from audit.round_record import AttackKey, RoundRecord

AUDIT = AuditSettings(signals=("loss",), fpr_tolerance=(0.1,), audit_global=False, update_attack=False)
METRIC = "mia_local_loss_auc"


def policy(action: str, threshold: float = 0.7, retries: int = 3) -> GatePolicy:
    return GatePolicy.from_mapping({"action": action, "bound": "point", "thresholds": {METRIC: threshold},
                                    "dp": {"max_retries": retries}}, audit_settings=AUDIT)


def audited_record(metrics, leak=None) -> RoundRecord:
    """A round record with a membership attack (its result is not read by the gate) and these metrics."""
    return RoundRecord("p", 0, attacks={AttackKey("local", "loss"): None}, metrics=dict(metrics), leak=leak)


class Round:
    """Fake audits and retraining: the trained model audits at `trained_auc`, DP try k at `retrain_aucs[k-1]`."""

    def __init__(self, trained_auc=0.8, retrain_aucs=(0.75, 0.65, 0.6), non_finite_tries=()):
        self.calls: list = []
        self.trained_auc, self.retrain_aucs, self.non_finite_tries = trained_auc, retrain_aucs, set(non_finite_tries)

    def record(self, auc):
        return audited_record({METRIC: auc})

    def run(self, gate, tensors=None, audited=True):
        return run_gate(
            gate, tensors if tensors is not None else {"w": np.ones(3)}, audited=audited,
            audit_trained=lambda: self.calls.append("audit_trained") or self.record(self.trained_auc),
            audit_received=lambda: self.calls.append("audit_received") or self.record(0.5),
            empty_record=lambda: self.calls.append("empty") or RoundRecord("p", 0),
            retrain=self.retrain,
            audit_retrained=lambda r: self.calls.append(("audit_retrained", r.state)) or self.record(
                self.retrain_aucs[r.state - 1]),
        )

    def retrain(self, attempt, noise):
        self.calls.append(("retrain", attempt, noise))
        return Retrained(state=attempt, train_loss=1.0 / attempt, noise_multiplier=noise, steps=10 * attempt,
                         epsilon=2.0 * attempt, non_finite=attempt in self.non_finite_tries)


def test_a_passing_update_is_kept_and_sent():
    fake = Round(trained_auc=0.6)
    out = fake.run(policy("withhold"))
    assert (out.verdict, out.sends, out.reason, out.retries, out.epsilon) == (KEPT, SEND_TRAINED, None, 0, 0.0)
    assert fake.calls == ["audit_trained"]
    assert out.record.metrics == {METRIC: 0.6}


def test_withhold_sends_the_received_weights_and_names_the_metric():
    out = Round(trained_auc=0.8).run(policy("withhold"))
    assert (out.verdict, out.sends, out.reason) == (WITHHELD, SEND_RECEIVED, OVER_THRESHOLD)
    assert out.gate_verdict.tripped == {METRIC: (0.8, 0.7)}
    entry = out.record_entry(policy("withhold"))
    assert entry["tripped"] == {METRIC: {"value": 0.8, "threshold": 0.7}} and entry["delta"] is None


def test_report_only_keeps_a_leaky_update_but_records_why():
    out = Round(trained_auc=0.8).run(policy("report_only"))
    assert (out.verdict, out.sends, out.reason) == (KEPT, SEND_TRAINED, OVER_THRESHOLD)
    assert out.scalars((METRIC,))[GATE_TRIPPED_PREFIX + METRIC] == 0.8


def test_dp_retrain_doubles_the_noise_until_a_try_passes():
    fake = Round(trained_auc=0.8, retrain_aucs=(0.75, 0.65, 0.6))
    gate = policy("dp_retrain")
    out = fake.run(gate)
    assert fake.calls == ["audit_trained", ("retrain", 1, 1.0), ("audit_retrained", 1),
                          ("retrain", 2, 2.0), ("audit_retrained", 2)]
    assert (out.verdict, out.sends, out.retries, out.epsilon) == (DP_RETRAINED, SEND_RETRAINED, 2, 4.0)
    assert out.retrained.state == 2
    entry = out.record_entry(gate)
    assert [t["passed"] for t in entry["tries"]] == [False, True]
    assert entry["delta"] == gate.dp.delta and entry["dp_train_loss"] == 0.5
    # the aggregator hears that it was kept after 2 retrains, and what tripped the first audit
    assert out.scalars((METRIC,)) == {GATE_KEPT: 1.0, GATE_RETRIES: 2.0, GATE_EPSILON: 4.0,
                                      GATE_TRIPPED_PREFIX + METRIC: 0.8, GATE_TRIPPED_PREFIX + NON_FINITE_UPDATE: 0.0,
                                      GATE_TRIPPED_PREFIX + DP_VIOLATED: 0.0, GATE_MISSING_PREFIX + METRIC: 0.0}


def test_dp_retrain_withholds_when_every_try_fails_and_reports_the_composed_epsilon():
    fake = Round(trained_auc=0.8, retrain_aucs=(0.79, 0.78))
    out = fake.run(policy("dp_retrain", retries=2))
    assert (out.verdict, out.sends, out.retries, out.epsilon) == (WITHHELD, SEND_RECEIVED, 2, 4.0)
    assert out.scalars(())[GATE_KEPT] == 0.0


def test_a_non_finite_retrain_is_not_audited_and_counts_as_gated():
    fake = Round(trained_auc=0.8, retrain_aucs=(0.6, 0.6), non_finite_tries=(1,))
    out = fake.run(policy("dp_retrain"))
    assert ("audit_retrained", 1) not in fake.calls
    assert out.tries[0].verdict.tripped == {NON_FINITE_UPDATE: (1.0, 0.0)}
    assert out.verdict == DP_RETRAINED and out.retries == 2


@pytest.mark.parametrize("audited, record_call", [(True, "audit_received"), (False, "empty")])
def test_a_non_finite_update_is_withheld_whatever_the_policy(audited, record_call):
    fake = Round(trained_auc=0.1)
    out = fake.run(policy("report_only"), tensors={"w": np.array([1.0, math.nan]), "b": np.zeros(2)}, audited=audited)
    assert fake.calls == [record_call]  # the trained update is never audited
    assert (out.verdict, out.sends, out.reason, out.non_finite_tensors) == (WITHHELD, SEND_RECEIVED,
                                                                             NON_FINITE_UPDATE, ("w",))
    assert out.scalars(())[GATE_TRIPPED_PREFIX + NON_FINITE_UPDATE] == 1.0


def test_a_round_off_the_audit_schedule_is_not_gated():
    fake = Round(trained_auc=0.99)
    out = fake.run(policy("withhold"), audited=False)
    assert fake.calls == [] and out.record is None and (out.verdict, out.sends) == (KEPT, SEND_TRAINED)


def test_each_dp_try_reports_the_empirical_epsilon_its_audit_proves_beside_the_accountants():
    """The leak verdict's family-wise bound of each try, which attack gave it, and the delta, confidence and number
    of attacks it holds over; the trained update's own bound at the top."""
    class WithBounds(Round):
        def record(self, auc):
            best = 3 * (auc - 0.5)
            return audited_record({METRIC: auc},
                    leak={"epsilon": {"value": max(best, 0.1), "sources": 2, "delta": 1e-5, "confidence": 0.95,
                                         "ceiling": 4.0, "attack": "local / loss" if best > 0.1 else "update / x"}})

    gate = policy("dp_retrain")
    out = WithBounds(trained_auc=0.8, retrain_aucs=(0.75, 0.52)).run(gate)
    entry = out.record_entry(gate)
    assert entry["empirical_epsilon"] == {"value": pytest.approx(0.9), "attack": "local / loss", "delta": 1e-5,
                                          "confidence": 0.95, "bounds": 2, "ceiling": 4.0}
    first, second = entry["tries"]
    assert (first["epsilon"], first["empirical_epsilon"]["value"]) == (2.0, pytest.approx(0.75))
    assert second["empirical_epsilon"]["attack"] == "update / x"  # 0.1 > 3 * 0.02
    assert Round().run(gate).record_entry(gate)["empirical_epsilon"] is None  # an audit without the bound


@pytest.mark.parametrize("action, verdict, sends", [("withhold", WITHHELD, SEND_RECEIVED),
                                                     ("report_only", KEPT, SEND_TRAINED)])
def test_a_round_without_the_watched_metric_fails_closed(action, verdict, sends):
    """The audit ran but did not produce the gate's metric (a step skipped, a bound not computed): the update is not
    sent as if it had passed, the reason names the metric, and the aggregator hears it (gate_missing__, gate_kept)."""
    class Without(Round):
        def record(self, auc):
            return audited_record({"mia_local_loss_exact_auc": 0.5})

    gate = policy(action)
    out = Without().run(gate)
    assert (out.verdict, out.sends, out.reason) == (verdict, sends, f"missing: {METRIC}")
    assert out.gate_verdict.missing == (METRIC,)
    scalars = out.scalars((METRIC,), gate.limits)
    assert scalars[GATE_MISSING_PREFIX + METRIC] == 1.0 and scalars[GATE_KEPT] == (action != "withhold")
    assert out.record_entry(gate)["reason"] == f"missing: {METRIC}"


def test_a_dp_retrain_that_still_lacks_the_metric_is_withheld():
    class Without(Round):
        def record(self, auc):
            return audited_record({})

    out = Without().run(policy("dp_retrain", retries=2))
    assert (out.verdict, out.retries, out.reason) == (WITHHELD, 2, f"missing: {METRIC}")
    assert all(t.verdict.missing == (METRIC,) for t in out.tries)


def test_an_epsilon_budget_gates_on_the_family_wise_bound():
    gate = GatePolicy.from_mapping({"action": "withhold", "epsilon_budget": 0.5}, audit_settings=AUDIT)

    class Proven(Round):
        def record(self, auc):
            return audited_record({"leak_epsilon_lb": auc})

    assert Proven(trained_auc=0.4).run(gate).verdict == KEPT
    out = Proven(trained_auc=0.8).run(gate)
    assert (out.verdict, out.reason) == (WITHHELD, OVER_THRESHOLD)
    assert out.gate_verdict.tripped == {"leak_epsilon_lb": (0.8, 0.5)}
    entry = out.record_entry(gate)
    assert entry["epsilon_budget"] == 0.5 and entry["thresholds"] == {"leak_epsilon_lb": 0.5}
