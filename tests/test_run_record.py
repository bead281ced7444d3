"""run.json (audit.run_record, audit.reporting.run_file): it round-trips, refuses other schema versions naming the
file, is gathered from the parties' accounts with the run's state, and `python -m workspace verdict` reads it with
the exit codes workspace/run_verdict.py documents."""

import json

import numpy as np
import pytest

from audit.config.audit_settings import AuditSettings
from audit.config.gate import GatePolicy
from audit.config.mitigation_settings import Mitigation
from audit.gate_flow import Retrained, run_gate
from audit.party_account import PartyAccount
from audit.reporting.run_file import write_run_file
from audit.round_record import RoundRecord
from audit.run_account import dp_sgd_mechanism
from audit.run_record import (ACCOUNT_FILE, RUN_FILE, SCHEMA_VERSION, PartyRun, RunInfo, RunRecord,
                              RunRecordSchemaError)
from audit.run_states import FINISHED, INTERRUPTED, RUNNING
from shared_runs import workspace_here

# Every account is made through the gate's flow and composed with opacus' accountant (its import; 0.07 CPU-seconds a
# distinct mechanism).
pytestmark = pytest.mark.slow
DELTA = 1e-5
LEAK = {"detected": True, "epsilon": {"value": 0.3, "ceiling": 3.3, "run": {"value": 0.2, "rounds": 3}},
        "headline": {"attack": "local / loss", "statistic": "exact_auc", "estimate": 0.7, "interval": [0.6, 0.8],
                     "p_adjusted": 0.002}, "tests": 4, "confidence": 0.95}
NO_LEAK = {"detected": False, "epsilon": {"value": 0.0, "ceiling": 3.3},
           "headline": {"attack": "local / loss", "statistic": "exact_auc", "estimate": 0.52,
                        "interval": [0.45, 0.6], "p_adjusted": 0.6}, "tests": 4, "confidence": 0.95}


def _record(metrics, leak=LEAK, round_num=0):
    return RoundRecord(party="c1", round=round_num, metrics=dict(metrics), leak=leak)


def _policy(**gate):
    return GatePolicy.from_mapping(gate, audit_settings=AuditSettings.from_mapping({"signals": ["loss"]}))


def _account(policy, rounds, *, final_metrics=None, final_leak=NO_LEAK, name="c1") -> PartyAccount:
    """A party's account through the real gate flow: each round's trained update audited as `rounds[r]` says."""
    account = PartyAccount(name, delta=DELTA, budget=policy.run_epsilon_budget, settings={"gate": policy.to_dict()},
                           versions={"python": "3"})

    def retrain(attempt, noise):
        mech = dp_sgd_mechanism(noise, 40, 8, 1)
        return Retrained({}, 0.1, noise, mech.steps, 0.0, False, sample_rate=mech.sample_rate)

    for r, metrics in enumerate(rounds):
        outcome = run_gate(policy, {"w": np.zeros(2)}, audited=True, audit_trained=lambda: _record(metrics, round_num=r),
                           audit_received=lambda: _record({}), empty_record=lambda: _record({}), retrain=retrain,
                           audit_retrained=lambda _: _record({"mia_local_loss_exact_auc": 0.5,
                                                              "mia_local_loss_exact_auc_upper": 0.55}, NO_LEAK, r),
                           budget=account.budget,
                           plan_try=lambda attempt, noise: dp_sgd_mechanism(noise, 40, 8, 1))
        account.add_round(r, outcome=outcome, record=outcome.record, mitigation=Mitigation(), audited=True)
    if final_metrics is not None:
        final = RoundRecord(party=name, round=len(rounds), metrics=dict(final_metrics), leak=final_leak)
        account.add_final(final, policy=policy, accuracy=0.8, round_num=len(rounds))
    return account


def _write(root, accounts, state=FINISHED):
    for account in accounts:
        account.write(root)
    return write_run_file(root, info=RunInfo(state, 2, {"rounds": 2}, {"python": "3"}))


GATED = dict(action="dp_retrain", thresholds={"mia_local_loss_exact_auc": 0.6})
OVER = {"mia_local_loss_exact_auc": 0.7, "mia_local_loss_exact_auc_upper": 0.8}
UNDER = {"mia_local_loss_exact_auc": 0.5, "mia_local_loss_exact_auc_upper": 0.55}
FINAL_UNDER = {"mia_final_loss_exact_auc": 0.5, "mia_final_loss_exact_auc_upper": 0.55, "leak_epsilon_lb": 0.0}


def test_run_json_round_trips_and_names_every_party(tmp_path):
    accounts = [_account(_policy(**GATED), [OVER, UNDER], final_metrics=FINAL_UNDER),
                _account(_policy(), [UNDER, UNDER], final_metrics=FINAL_UNDER, final_leak=LEAK, name="c2")]
    written = _write(tmp_path, accounts)
    data = json.loads((tmp_path / RUN_FILE).read_text())
    assert data["schema_version"] == SCHEMA_VERSION and data["state"] == FINISHED and set(data["parties"]) == {"c1", "c2"}
    read = RunRecord.read(tmp_path / RUN_FILE)
    assert read == written
    assert RunRecord.from_json(read.to_json()) == read
    c1 = read.parties["c1"]
    assert [e.verdict for e in c1.rounds] == ["dp_retrained", "kept"]
    assert c1.rounds[0].sent == "DP retrain try 1" and c1.rounds[0].reason == "over_threshold"
    assert c1.rounds[0].tripped["mia_local_loss_exact_auc"]["value"] == 0.8  # the upper bound, as the gate compared
    assert not c1.dp.bounded and list(c1.dp.unbounded) == [1]  # round 1 sent as trained
    assert c1.dp.per_round[0] > 0
    assert c1.empirical.largest["corrected_for"] == 3  # the run-corrected bound, labelled
    assert c1.final_model.audited and c1.final_model.accuracy == 0.8
    assert read.parties["c2"].final_model.headline().startswith("the final model: leak detected: local / loss")
    assert PartyRun.read(tmp_path / "c1" / ACCOUNT_FILE) == c1  # the party's own file, the same account


@pytest.mark.parametrize("found", [None, 0, SCHEMA_VERSION - 1, SCHEMA_VERSION + 1, str(SCHEMA_VERSION)])
def test_another_schema_version_is_refused_naming_the_file(tmp_path, found):
    _write(tmp_path, [_account(_policy(), [UNDER], final_metrics=FINAL_UNDER)])
    for path, read in ((tmp_path / RUN_FILE, RunRecord.read), (tmp_path / "c1" / ACCOUNT_FILE, PartyRun.read)):
        data = json.loads(path.read_text())
        if found is None:
            del data["schema_version"]
        else:
            data["schema_version"] = found
        path.write_text(json.dumps(data))
        with pytest.raises(RunRecordSchemaError) as caught:
            read(path)
        assert str(caught.value).startswith(f"{path}: has ") and f"this code reads schema version {SCHEMA_VERSION}" in str(caught.value)
    # the run's file gathers no account it cannot read, and says so in the log, never with figures missing
    assert write_run_file(tmp_path).parties == {}


def test_the_run_state_is_kept_between_writes_and_read_off_the_parties_without_a_driver(tmp_path):
    account = _account(_policy(), [UNDER])
    account.write(tmp_path)
    assert write_run_file(tmp_path).state == RUNNING  # no final model yet, no driver
    account.add_final(_record(FINAL_UNDER, NO_LEAK, 1), policy=_policy(), accuracy=0.5, round_num=1)
    account.write(tmp_path)
    assert write_run_file(tmp_path).state == FINISHED  # every party audited its final model
    write_run_file(tmp_path, info=RunInfo(INTERRUPTED, 3))
    again = write_run_file(tmp_path)  # a later round's write keeps what the driver said
    assert (again.state, again.rounds) == (INTERRUPTED, 3)



def test_the_records_run_fields_are_the_drivers(tmp_path):
    """run.json's run-level fields are RunInfo's, read back as the driver wrote them; a bad state or count is refused
    by RunInfo itself, before any write."""
    info = RunInfo(RUNNING, 4, {"rounds": 4}, {"python": "3"}).round_written(2).ended(INTERRUPTED, "SIGTERM")
    record = write_run_file(tmp_path, info=info)
    assert record.info == info == RunRecord.read(tmp_path / RUN_FILE).info
    assert (record.parties, record.describe()) == ({}, info.describe())
    for bad in (dict(state="paused"), dict(state=RUNNING, rounds=3, rounds_done=4)):
        with pytest.raises(ValueError, match="run state"):
            RunInfo(**bad)

def _verdict(tmp_path, *flags):
    result = workspace_here("verdict", tmp_path, *flags)
    return result.returncode, result.stdout + result.stderr


def test_verdict_exit_codes(tmp_path):
    # 0: finished, every party within the plan's limits (a detected leak of a final model fails only when asked)
    ok = tmp_path / "ok"
    _write(ok, [_account(_policy(**GATED), [OVER, UNDER], final_metrics=FINAL_UNDER, final_leak=LEAK)])
    code, out = _verdict(ok)
    assert code == 0, out
    assert out.count("c1: the final model: leak detected") == 1 and "within the plan's limits" in out
    code, out = _verdict(ok, "--fail-on-leak")
    assert code == 1 and "LEAK (--fail-on-leak): c1" in out
    # 1: a sent update over the gate's limits (report_only sends it)
    over = tmp_path / "over"
    _write(over, [_account(_policy(action="report_only", thresholds={"mia_local_loss_exact_auc": 0.6}), [OVER],
                           final_metrics=FINAL_UNDER)])
    code, out = _verdict(over)
    assert code == 1 and "BEYOND THE PLAN'S LIMITS: c1: update sent over the gate's limits in round 0" in out
    # 1: the final model over the gate's limits
    final_over = tmp_path / "final_over"
    _write(final_over, [_account(_policy(**GATED), [UNDER], final_metrics={**FINAL_UNDER,
                                                                            "mia_final_loss_exact_auc_upper": 0.7})])
    code, out = _verdict(final_over)
    assert code == 1 and "the final model is over the gate's limits (mia_local_loss_exact_auc)" in out
    # 2: no run.json, another schema version
    code, out = _verdict(tmp_path / "none")
    assert code == 2 and "no run record" in out
    (ok / RUN_FILE).write_text(json.dumps({**json.loads((ok / RUN_FILE).read_text()), "schema_version": 7}))
    code, out = _verdict(ok)
    assert code == 2 and f"{ok / RUN_FILE}: has schema version 7" in out
    # 3: incomplete: interrupted, or a party without its final model's audit
    cut = tmp_path / "cut"
    _write(cut, [_account(_policy(), [UNDER], final_metrics=FINAL_UNDER)], state=INTERRUPTED)
    code, out = _verdict(cut)
    assert code == 3 and "the run is interrupted" in out
    unaudited = tmp_path / "unaudited"
    _write(unaudited, [_account(_policy(), [UNDER])])
    code, out = _verdict(unaudited)
    assert code == 3 and "no final model audit for c1" in out
