"""The run's account (audit.run_account, audit.party_account): the DP total composed over a party's releases equals
opacus' own accountant driven step by step over the same mechanisms; rounds sent without DP make it "not bounded";
a run budget withholds exactly the update that would cross it; the empirical summary labels what it is."""

import math

import numpy as np
import pytest
import torch

from audit.config.audit_settings import AuditSettings
from audit.config.fields import SettingsError
from audit.config.gate import GatePolicy
from audit.config.mitigation_settings import Mitigation
from audit.config.per_collaborator import parse_per_collaborator
from audit.gate_flow import RUN_BUDGET, Retrained, run_gate
from audit.party_account import PartyAccount, final_model_limits
from audit.round_record import RoundRecord
from report_drawing import without_report_drawing  # noqa: F401  (a fixture)
from audit.run_account import (Mechanism, RoundRelease, RunBudget, compose, dp_account, dp_fedavg_mechanism,
                               dp_sgd_mechanism)

DELTA = 1e-5
# opacus' accountant: its import, and about 0.07 CPU-seconds a distinct mechanism
SLOW = pytest.mark.slow


def _stepped_opacus(mechanisms, delta):
    """opacus' RDPAccountant as its DP optimizer drives it: one `step` per DP-SGD step, in the order they ran."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    for m in mechanisms:
        for _ in range(m.steps):
            accountant.step(noise_multiplier=m.noise_multiplier, sample_rate=m.sample_rate)
    return accountant.get_epsilon(delta)


def _run(noise: float, rate: float, rounds: int, tries: int) -> list[Mechanism]:
    """A run's mechanisms: per round `tries` DP retrains with the noise doubled each try (the gate's schedule), steps
    from the sample rate (one epoch), and a dp_fedavg release at the same noise."""
    out = []
    for r in range(rounds):
        for attempt in range(1, tries + 1):
            out.append(Mechanism(noise * 2 ** (attempt - 1), rate, int(1 / rate), f"round {r} try {attempt}"))
        out.append(dp_fedavg_mechanism(2 * noise))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("noise, rate, rounds, tries", [
    (0.8, 0.25, 1, 1),   # one release
    (1.0, 0.1, 3, 2),    # the gate's default schedule over three rounds
    (2.5, 0.5, 5, 1),    # little noise per step, many rounds
    (0.6, 1.0, 2, 3),    # full-batch (Gaussian) mechanisms, three tries
])
def test_composition_equals_opacus_accountant_stepped_over_the_same_mechanisms(noise, rate, rounds, tries):
    mechanisms = _run(noise, rate, rounds, tries)
    expected = _stepped_opacus(mechanisms, DELTA)
    # The same RDP terms summed in another order (one entry per distinct mechanism, steps x one step's RDP): float64
    # rounding of a few dozen terms, far below 1e-12 of the total.
    assert compose(mechanisms, DELTA) == pytest.approx(expected, rel=1e-12)
    # ... and per round, as the account's per-round figures are composed
    releases = [RoundRelease(r, tuple(m for m in mechanisms if m.what.startswith(f"round {r} ")))
                for r in range(rounds)]
    account = dp_account(releases, DELTA)
    for r in range(rounds):
        assert account.per_round[r] == pytest.approx(_stepped_opacus(releases[r].mechanisms, DELTA), rel=1e-12)
    # composition spends more than any round alone, and never more than the rounds' sum (RDP's conversion is subadditive
    # in this sense for identical rounds)
    assert max(account.per_round.values()) <= account.epsilon <= sum(account.per_round.values()) + 1e-9


@pytest.mark.slow
def test_a_dp_retrain_reports_what_its_predicted_mechanism_composes_to():
    """The mechanism the run budget checks before a try runs (dp_sgd_mechanism, from the try's parameters) is the one
    opacus then runs: the same sample rate and steps, and the same epsilon as the round's own accountant."""
    from audit.dp_training import RoundAccountant, dp_retrain

    torch.manual_seed(0)
    x, y = np.random.default_rng(0).normal(size=(37, 5)).astype(np.float32), np.arange(37) % 3
    accountant = RoundAccountant((x, y))
    model = torch.nn.Linear(5, 3)
    runs = []
    for attempt, noise in ((1, 1.0), (2, 2.0)):
        result = dp_retrain(model, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), accountant, batch_size=8,
                            epochs=2, noise_multiplier=noise, max_grad_norm=1.0, seed=attempt)
        predicted = dp_sgd_mechanism(noise, len(y), 8, 2)
        assert (result.sample_rate, result.steps) == (predicted.sample_rate, predicted.steps)
        runs.append(predicted)
    assert accountant.epsilon(DELTA) == pytest.approx(compose(runs, DELTA), rel=1e-12)


@SLOW
def test_a_run_mixing_dp_and_non_dp_rounds_is_not_bounded_and_names_the_rounds():
    dp = Mechanism(1.0, 0.1, 10, "dp_retrain try 1")
    releases = [RoundRelease(0, (dp,)), RoundRelease(1, (), "sent as trained, without DP"), RoundRelease(2, (dp,)),
                RoundRelease(3, ()), RoundRelease(4, (), "sent with Gaussian noise but no clipping")]
    account = dp_account(releases, DELTA)
    assert account.epsilon is None and not account.bounded
    assert sorted(account.unbounded) == [1, 4]
    assert "not bounded" in account.text() and "rounds 1, 4" in account.text()
    assert account.to_json()["epsilon"] is None
    assert set(account.per_round) == {0, 2}  # each round's own figure stays beside it
    assert account.per_round[0] == pytest.approx(compose([dp], DELTA), rel=1e-12)
    # an unbounded total exceeds every budget
    assert dp_account(releases, DELTA, budget=1e6).over_budget
    # without the non-DP rounds the same releases compose to a number
    bounded = dp_account([r for r in releases if not r.unbounded], DELTA)
    assert bounded.epsilon == pytest.approx(compose([dp, dp], DELTA), rel=1e-12)


# ---------------------------------------------------------------------------------------------------- the gate

def _record(metrics, round_num=0):
    return RoundRecord(party="p", round=round_num, metrics=dict(metrics), attacks={}, leak={
        "detected": metrics.get("x", 0) > 0.6, "epsilon": {"value": 0.0, "ceiling": 3.0},
        "headline": {"attack": "local / loss", "statistic": "exact_auc", "estimate": metrics.get("x", 0),
                     "interval": [0.5, 0.9], "p_adjusted": 0.01}})


def _gate(policy, metrics, *, budget=None, release=None, tries_pass=True, retrains=None):
    """One round through audit.gate_flow.run_gate with a trained update whose audit reads `metrics`; DP tries pass
    their audit when `tries_pass`. `retrains` collects the tries actually run."""
    retrains = [] if retrains is None else retrains

    def retrain(attempt, noise):
        retrains.append(attempt)
        mech = dp_sgd_mechanism(noise, 40, 8, 1)
        return Retrained(state={}, train_loss=0.1, noise_multiplier=noise, steps=mech.steps, epsilon=0.0,
                         non_finite=False, sample_rate=mech.sample_rate)

    return run_gate(policy, {"w": np.zeros(3)}, audited=True, audit_trained=lambda: _record(metrics),
                    audit_received=lambda: _record({}), empty_record=lambda: _record({}), retrain=retrain,
                    audit_retrained=lambda r: _record({"x": 0.1 if tries_pass else 0.9}), budget=budget,
                    update_release=release, plan_try=lambda attempt, noise: dp_sgd_mechanism(noise, 40, 8, 1))


def _policy(**gate):
    return GatePolicy.from_mapping(gate, audit_settings=AuditSettings.from_mapping({"signals": ["loss"]}))


@SLOW
def test_a_run_budget_withholds_exactly_the_dp_fedavg_update_that_would_cross_it():
    release = dp_fedavg_mechanism(1.5)
    k = 3  # the budget lies between k and k + 1 releases
    budget_value = (compose([release] * k, DELTA) + compose([release] * (k + 1), DELTA)) / 2
    account = PartyAccount("p", delta=DELTA, budget=budget_value, settings={}, versions={})
    policy = _policy(action="withhold", run_epsilon_budget=budget_value)
    verdicts = []
    for r in range(k + 3):
        outcome = _gate(policy, {}, budget=account.budget, release=release)
        account.add_round(r, outcome=outcome, record=outcome.record, mitigation=Mitigation("dp_fedavg", sigma=1.5),
                          audited=True)
        verdicts.append((outcome.verdict, outcome.reason))
    assert verdicts[:k] == [("kept", None)] * k
    assert verdicts[k:] == [("withheld", RUN_BUDGET)] * 3  # the crossing update, and every later one
    run = account.run()
    assert run.dp.epsilon == pytest.approx(compose([release] * k, DELTA), rel=1e-12) and run.dp.epsilon <= budget_value
    assert run.dp.mechanisms == k and not run.dp.over_budget
    assert run.rounds[k].tripped[RUN_BUDGET]["threshold"] == budget_value
    assert run.rounds[k].release.mechanisms == ()  # refused before it was looked at: nothing of it composes


@SLOW
def test_under_a_run_budget_a_plain_update_is_retrained_and_the_try_that_would_cross_it_never_runs():
    first = dp_sgd_mechanism(1.0, 40, 8, 1)
    budget_value = (compose([first], DELTA) + compose([first, first], DELTA)) / 2  # room for one try
    account = PartyAccount("p", delta=DELTA, budget=budget_value, settings={}, versions={})
    policy = _policy(action="dp_retrain", run_epsilon_budget=budget_value, dp={"max_retries": 1})
    ran = []
    outcome = _gate(policy, {"x": 0.1}, budget=account.budget, retrains=ran)  # passes the thresholds: no DP yet
    assert outcome.verdict == "dp_retrained" and outcome.reason == RUN_BUDGET and ran == [1]
    account.add_round(0, outcome=outcome, record=outcome.record, mitigation=Mitigation(), audited=True)
    outcome = _gate(policy, {"x": 0.1}, budget=account.budget, retrains=ran)
    assert outcome.verdict == "withheld" and outcome.reason == RUN_BUDGET and ran == [1]  # the second try: not run
    account.add_round(1, outcome=outcome, record=outcome.record, mitigation=Mitigation(), audited=True)
    run = account.run()
    assert run.dp.bounded and run.dp.epsilon == pytest.approx(compose([first], DELTA), rel=1e-12)
    assert [e.verdict for e in run.rounds] == ["dp_retrained", "withheld"]


@SLOW
def test_failed_dp_tries_compose_and_a_kept_plain_round_makes_the_account_unbounded():
    account = PartyAccount("p", delta=DELTA, budget=None, settings={}, versions={})
    policy = _policy(action="dp_retrain", thresholds={"mia_local_loss_exact_auc": 0.6})
    kept = _gate(policy, {"mia_local_loss_exact_auc": 0.5, "mia_local_loss_exact_auc_upper": 0.55})
    account.add_round(0, outcome=kept, record=kept.record, mitigation=Mitigation(), audited=True)
    withheld = _gate(policy, {"mia_local_loss_exact_auc": 0.7, "mia_local_loss_exact_auc_upper": 0.8},
                     tries_pass=False)
    account.add_round(1, outcome=withheld, record=withheld.record, mitigation=Mitigation(), audited=True)
    run = account.run()
    assert run.rounds[1].verdict == "withheld" and len(run.rounds[1].release.mechanisms) == 2  # both tries ran
    assert run.rounds[1].epsilon == pytest.approx(compose(run.rounds[1].release.mechanisms, DELTA), rel=1e-12)
    assert not run.dp.bounded and list(run.dp.unbounded) == [0]


def test_a_run_budget_that_can_send_nothing_is_refused_at_start():
    audit = AuditSettings.from_mapping({"signals": ["loss"]})
    with pytest.raises(SettingsError, match=r"^task_runner.settings.gate.run_epsilon_budget: under a run budget"):
        parse_per_collaborator({}, gate={"action": "withhold", "run_epsilon_budget": 4}, audit_settings=audit)
    with pytest.raises(SettingsError, match=r"^task_runner.settings.per_collaborator.c2.gate.run_epsilon_budget"):
        parse_per_collaborator({"c2": {"gate": {"action": "report_only"}}},
                               gate={"action": "dp_retrain", "run_epsilon_budget": 4}, audit_settings=audit)
    parse_per_collaborator({}, gate={"action": "withhold", "run_epsilon_budget": 4}, audit_settings=audit,
                           mitigation={"method": "dp_fedavg", "clip": 1.0, "sigma": 1.0})
    with pytest.raises(SettingsError, match=r"run_epsilon_budget: expected"):
        parse_per_collaborator({}, gate={"action": "dp_retrain", "run_epsilon_budget": 0}, audit_settings=audit)


@SLOW
def test_the_budget_check_names_what_it_would_spend():
    budget = RunBudget(2.0, DELTA)
    assert not budget.check(None).allowed and math.isinf(budget.check(None).total)  # weights without DP
    assert "not bounded" in budget.check(None).reason()
    small = Mechanism(50.0, 0.01, 1)
    assert budget.check([small]).allowed
    budget.spend([small])
    assert budget.spent_epsilon() == pytest.approx(compose([small], DELTA))


def test_the_final_model_meets_the_gates_limits_on_its_own_figures():
    policy = _policy(action="withhold", thresholds={"mia_local_loss_exact_auc": 0.6,
                                                    "mia_update_loss_reduction_exact_auc": 0.6},
                     epsilon_budget=0.5)
    metrics = {"mia_final_loss_exact_auc": 0.62, "mia_final_loss_exact_auc_upper": 0.7,
               "mia_final_loss_exact_auc_lower": 0.55, "leak_epsilon_lb": 0.2}
    tripped, not_applicable = final_model_limits(policy, metrics)
    assert set(tripped) == {"mia_local_loss_exact_auc"}  # its upper bound 0.7 > 0.6, as the gate compares
    assert tripped["mia_local_loss_exact_auc"] == {"value": 0.7, "threshold": 0.6}
    assert not_applicable == ("mia_update_loss_reduction_exact_auc",)
    tripped, _ = final_model_limits(policy, {**metrics, "leak_epsilon_lb": 0.9})
    assert "leak_epsilon_lb" in tripped


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")  # the metrics and the accounts are read
def test_in_a_federation_the_run_budget_withholds_exactly_the_update_that_would_cross_it(tmp_path):
    """dp_fedavg updates (sigma 2: a Gaussian of noise multiplier 1 per round) under a run budget between two and
    three releases: rounds 0 and 1 are sent, round 2's update (the one that would cross it) and every later one
    withheld; the party's account says so and its total stays within the budget."""
    from audit.run_record import ACCOUNT_FILE, PartyRun
    from workspace.in_process import run_in_process

    release = dp_fedavg_mechanism(2.0)
    budget = (compose([release] * 2, DELTA) + compose([release] * 3, DELTA)) / 2
    overrides = {
        "tasks": {"train": {"kwargs": {"epochs": 1}}},
        "data_loader": {"settings": {"dataset": "digits", "train_dataset_ratio": 0.1, "test_dataset_ratio": 0.45,
                                     "audit_dataset_ratio": 0.45}},
        "task_runner": {"settings": {
            "audit": {"enabled": False, "canary": {"dp_check": False}},
            "mitigation": {"method": "dp_fedavg", "clip": 1.0, "sigma": 2.0},
            "gate": {"action": "withhold", "run_epsilon_budget": budget}}},
    }
    result = run_in_process(tmp_path, collaborators=2, rounds=4, overrides=overrides)
    for name in ("collaborator1", "collaborator2"):
        kept = [result.collaborator_metrics[r][f"{name}/train/gate_kept"] for r in range(4)]
        assert kept == [1.0, 1.0, 0.0, 0.0], name
        account = PartyRun.read(result.report_dir / name / ACCOUNT_FILE)
        assert [(e.verdict, e.reason) for e in account.rounds] == [
            ("kept", None), ("kept", None), ("withheld", RUN_BUDGET), ("withheld", RUN_BUDGET)]
        assert account.dp.epsilon == pytest.approx(compose([release] * 2, DELTA), rel=1e-12)
        assert account.dp.budget == budget and not account.dp.over_budget
        assert not account.final_model.audited and "audit is off" in account.final_model.why


@pytest.mark.slow  # the demo's checks of the plan (a new plan read, the data's shards sized)
def test_the_demos_run_budget_flag_is_checked_before_any_work(tmp_path, capsys):
    import cifar10_PM
    from shared_runs import run_demo_here

    with pytest.raises(SystemExit):
        cifar10_PM.parse_args(["--dataset", "digits", "--run_epsilon_budget", "0"])
    assert "error: --run_epsilon_budget: expected a finite number > 0" in capsys.readouterr().err
    result = run_demo_here(["--dataset", "digits", "--comm_round", "1", "--run_epsilon_budget", "5",
                            "--log_dir", tmp_path / "never"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: --run_epsilon_budget: under a run budget only DP releases are sent")
    assert not (tmp_path / "never").exists()


def test_the_empirical_summary_is_labelled_and_corrected_for_the_rounds_it_picks_from():
    """The largest per-round epsilon lower bound: of each round's bound corrected for the run's rounds (R: the round
    audits compute it at 1 - (1 - c) / R), beside the largest of the rounds' own bounds; never called a budget."""
    account = PartyAccount("p", delta=DELTA, budget=None, settings={}, versions={})
    policy = _policy()

    def leak(value, run_value, detected):
        return {"detected": detected, "epsilon": {"value": value, "attack": "local / loss", "delta": DELTA,
                                                  "confidence": 0.95, "ceiling": 3.0,
                                                  "run": {"value": run_value, "attack": "local / loss", "rounds": 3}}}

    for r, (value, run_value, detected) in enumerate([(0.5, 0.0, True), (0.3, 0.2, False), (0.1, 0.05, True)]):
        record = RoundRecord(party="p", round=r, metrics={}, leak=leak(value, run_value, detected))
        outcome = run_gate(policy, {"w": np.zeros(2)}, audited=True, audit_trained=lambda: record,
                           audit_received=None, empty_record=None, retrain=None, audit_retrained=None)
        account.add_round(r, outcome=outcome, record=record, mitigation=Mitigation(), audited=True)
    empirical = account.run().empirical
    assert (empirical.rounds_audited, empirical.leak_rounds) == (3, (0, 2))
    assert (empirical.largest["value"], empirical.largest["round"], empirical.largest["corrected_for"]) == (0.2, 1, 3)
    assert (empirical.uncorrected["value"], empirical.uncorrected["round"]) == (0.5, 0)
    text = empirical.text()
    assert "leak detected in 2 of 3 audited rounds" in text and "corrected for picking it from 3 rounds" in text
    assert "not a composed budget" in text
