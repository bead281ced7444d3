"""Gating of leaky updates, end to end: real OpenFL Aggregator and Collaborators in one process, the real
train_task and GatedWeightedAverage, real audits on digits.

Values measured with these seeded settings (seed 0, 3 collaborators, 1 epoch, Adam 0.003, round 0):
mia_local_loss_auc is 0.56 (collaborator1) and 0.61 (collaborator2); collaborator3 made leaky with 40 epochs
at learning rate 0.01 reaches 0.80 (collaborator2 with the same: 0.68). The thresholds below sit between.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from openfl.databases import TensorDB
from openfl.interface.aggregation_functions import WeightedAverage
from openfl.utilities import LocalTensor, TensorKey, change_tags
from opacus.accountants import RDPAccountant

from audit.run_record import ACCOUNT_FILE, PartyRun
from report_drawing import no_report_drawing, pages_drawn_at_the_end
from src.aggregation import GatedWeightedAverage
from workspace.in_process import initial_tensor_dict, parse_plan, run_in_process
from workspace.plan_file import write_run_plan
from rounding import weighted_average_rounding

AUC = "mia_local_loss_auc"
LEAKY = {"epochs": 40, "learning_rate": 0.01}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def overrides(gate: dict, per_collaborator: dict | None = None, *, epochs: int = 1, rmia: bool = False,
              **settings) -> dict:
    """RMIA only where a test reads it (its references train like the local model: 40 epochs for a leaky one)."""
    return {
        "tasks": {"train": {"kwargs": {"epochs": epochs}}},
        "data_loader": {"settings": {"seed": 0}},
        "task_runner": {"settings": {
            "seed": 0,
            "audit": {"fpr_tolerance": [0.1], "signals": ["loss"], "rmia": {"enabled": rmia},
                      **settings.pop("audit", {})},
            # the grid AUC has no interval: its estimate is what the gate compares
            "gate": {"bound": "point", **gate},
            "per_collaborator": per_collaborator or {},
            **settings,
        }},
    }


# ---------------------------------------------------------------------------------------------- helpers


def db_rows(result):
    return result.aggregator.tensor_db.tensor_db


def sent(result, col: str, round_num: int) -> dict:
    """The model tensors `col` sent the aggregator in `round_num`."""
    db = db_rows(result)
    rows = db[(db["round"] == round_num) & db["tags"].map(lambda t: set(t) == {col, "trained"})]
    return {name: np.asarray(a) for name, a in zip(rows["tensor_name"], rows["nparray"])}


def global_model(result, round_num: int) -> dict:
    """The global model the aggregator holds at the start of `round_num`."""
    db = db_rows(result)
    rows = db[(db["round"] == round_num) & db["tags"].map(lambda t: tuple(t) == ("model",))]
    return {name: np.asarray(a) for name, a in zip(rows["tensor_name"], rows["nparray"])}


def average(result, cols, round_num: int) -> dict:
    """Data-size weighted average of what `cols` sent, computed here from the aggregator's tensor DB."""
    sizes = {c: result.runner(c).get_train_data_size() for c in cols}
    updates = {c: sent(result, c, round_num) for c in cols}
    total = sum(sizes.values())
    return {name: sum(updates[c][name] * (sizes[c] / total) for c in cols) for name in updates[cols[0]]}


def metric(result, col: str, name: str, round_num: int = 0) -> float:
    return result.collaborator_metrics[round_num][f"{col}/train/{name}"]


def record(result, col: str, round_num: int = 0) -> dict:
    return json.loads((result.report_dir / col / f"round_{round_num:04d}" / "audit.json").read_text())


def assert_same(a: dict, b: dict, exact=False):
    assert a.keys() == b.keys() and a
    for name in a:
        if exact:
            assert np.array_equal(a[name], b[name]), name
        else:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-7, err_msg=name)


def differs(a: dict, b: dict) -> bool:
    return any(not np.allclose(a[n], b[n], rtol=1e-5, atol=1e-7) for n in a)


# ---------------------------------------------------------------------------------------------- withhold


@pytest.fixture(scope="module")
def withheld(tmp_path_factory):
    """collaborator3 is leaky and withheld; collaborator2 trips its own report-only gate and is kept."""
    with pages_drawn_at_the_end(images=False):  # one test reads a page, none an image
        return run_in_process(
            tmp_path_factory.mktemp("withhold"), collaborators=3, rounds=1,
            overrides=overrides(
                {"action": "withhold", "thresholds": {AUC: 0.7}},
                {"collaborator2": {"gate": {"action": "report_only", "thresholds": {AUC: 0.5}}},
                 "collaborator3": LEAKY},
            ),
        )


@pytest.mark.federation
def test_plan_loads_the_gated_average_for_train(withheld):
    assert isinstance(withheld.aggregator.assigner.get_aggregation_type_for_task("train"), GatedWeightedAverage)


@pytest.mark.federation
def test_leaky_update_is_measured_above_the_threshold_and_gated(withheld):
    leaky = metric(withheld, "collaborator3", AUC)
    assert leaky > 0.7
    assert metric(withheld, "collaborator3", "gate_kept") == 0.0
    assert metric(withheld, "collaborator3", f"gate_tripped__{AUC}") == leaky
    assert metric(withheld, "collaborator1", AUC) <= 0.7
    assert metric(withheld, "collaborator1", "gate_kept") == 1.0
    assert metric(withheld, "collaborator1", f"gate_tripped__{AUC}") == 0.0
    # 40 epochs (per_collaborator) fit the members far better than the plan's 1 epoch
    assert metric(withheld, "collaborator3", "cross_entropy") < 0.5 * metric(withheld, "collaborator1", "cross_entropy")
    for col in ("collaborator1", "collaborator2", "collaborator3"):
        assert metric(withheld, col, "gate_retries") == 0.0 and metric(withheld, col, "gate_epsilon") == 0.0


@pytest.mark.federation
def test_report_only_trips_but_keeps_the_update(withheld):
    value = metric(withheld, "collaborator2", AUC)
    assert value > 0.5
    assert metric(withheld, "collaborator2", f"gate_tripped__{AUC}") == value
    assert metric(withheld, "collaborator2", "gate_kept") == 1.0
    gate = record(withheld, "collaborator2")["extra"]["gate"]
    assert gate["verdict"] == "kept" and gate["action"] == "report_only" and gate["passed"] is False
    assert gate["tripped"] == {AUC: {"value": value, "threshold": 0.5}}


@pytest.mark.federation
def test_withheld_update_is_the_received_global_model(withheld):
    assert_same(sent(withheld, "collaborator3", 0), global_model(withheld, 0), exact=True)
    assert differs(sent(withheld, "collaborator1", 0), global_model(withheld, 0))


@pytest.mark.federation
def test_new_global_model_averages_only_the_kept_updates(withheld):
    new = global_model(withheld, 1)
    assert_same(new, average(withheld, ["collaborator1", "collaborator2"], 0))
    # Averaging the withheld (global) weights in would have given a different model.
    assert differs(new, average(withheld, ["collaborator1", "collaborator2", "collaborator3"], 0))


@pytest.mark.federation
def test_aggregator_logs_the_kept_share_of_the_data(withheld):
    sizes = {c: withheld.runner(c).get_train_data_size() for c in ("collaborator1", "collaborator2", "collaborator3")}
    kept = (sizes["collaborator1"] + sizes["collaborator2"]) / sum(sizes.values())
    assert withheld.round_logs[0]["aggregator/train/gate_kept"] == pytest.approx(kept, rel=1e-6)


@pytest.mark.federation
def test_reports_record_verdict_tripped_metric_and_threshold(withheld):
    leaky = record(withheld, "collaborator3")
    gate = leaky["extra"]["gate"]
    assert gate["verdict"] == "withheld" and gate["action"] == "withhold" and gate["reason"] == "over_threshold"
    assert gate["passed"] is False and gate["audited"] is True
    assert gate["tripped"] == {AUC: {"value": leaky["metrics"][AUC], "threshold": 0.7}}
    assert gate["thresholds"] == {AUC: 0.7} and gate["retries"] == 0 and gate["epsilon"] == 0.0
    normal = record(withheld, "collaborator1")["extra"]["gate"]
    assert normal["verdict"] == "kept" and normal["passed"] is True and normal["tripped"] == {}
    assert normal["reason"] is None
    assert "withheld" in (withheld.report_dir / "collaborator3" / "index.html").read_text()


# ---------------------------------------------------------------------------------------------- all gated


@pytest.mark.federation
def test_when_every_update_is_gated_the_global_model_is_unchanged(tmp_path):
    with no_report_drawing():  # the metrics and the models are read
        result = run_in_process(
            tmp_path, collaborators=2, rounds=1,
            overrides=overrides({"action": "withhold", "thresholds": {AUC: 0.55}}, epochs=LEAKY["epochs"],
                                learning_rate=LEAKY["learning_rate"]),
        )
    for col in ("collaborator1", "collaborator2"):
        assert metric(result, col, AUC) > 0.55 and metric(result, col, "gate_kept") == 0.0
    start = initial_tensor_dict(parse_plan(result.plan_dir))
    assert_same(global_model(result, 0), start, exact=True)
    assert_same(global_model(result, 1), start, exact=True)  # what the next round would receive


# ---------------------------------------------------------------------------------------------- dp_retrain


@pytest.fixture(scope="module")
def retrained(tmp_path_factory):
    """collaborator3 (leaky) is retrained with DP-SGD and passes; collaborator2 (leaky, a stricter threshold
    and next to no noise) still fails after its retries and is withheld."""
    with no_report_drawing():  # the records and the metrics are read
        return run_in_process(
            tmp_path_factory.mktemp("dp"), collaborators=3, rounds=1,
            overrides=overrides(
                {"action": "dp_retrain", "thresholds": {AUC: 0.7}, "dp": {"noise_multiplier": 4.0, "max_retries": 2}},
                {"collaborator2": {**LEAKY, "gate": {"thresholds": {AUC: 0.6},
                                                     "dp": {"noise_multiplier": 0.01, "max_grad_norm": 100.0}}},
                 "collaborator3": LEAKY},
                rmia=True,  # the tries' empirical epsilon takes RMIA's bounds too
                audit={"canary": {"gradient_count": 200}},  # each try's canary check: fewer canaries, a faster test
            ),
        )


@pytest.mark.federation
def test_dp_retrained_update_passes_the_threshold_the_plain_one_failed(retrained):
    plain = metric(retrained, "collaborator3", AUC)
    gate = record(retrained, "collaborator3")["extra"]["gate"]
    assert plain > 0.7 and gate["tripped"] == {AUC: {"value": plain, "threshold": 0.7}}
    assert gate["verdict"] == "dp_retrained" and gate["retries"] == 1
    (attempt,) = gate["tries"]
    assert attempt["passed"] is True and attempt["metrics"][AUC] <= 0.7 and attempt["noise_multiplier"] == 4.0
    assert metric(retrained, "collaborator3", "gate_kept") == 1.0
    assert metric(retrained, "collaborator3", "gate_retries") == 1.0
    # the loss reported is the DP training's, whose update was sent
    assert metric(retrained, "collaborator3", "cross_entropy") == pytest.approx(attempt["train_loss"], rel=1e-6)


@pytest.mark.federation
def test_dp_epsilon_is_the_accountants_at_the_plans_delta(retrained):
    gate = record(retrained, "collaborator3")["extra"]["gate"]
    (attempt,) = gate["tries"]
    members = retrained.runner("collaborator3").get_train_data_size()
    accountant = RDPAccountant()
    accountant.history = [(4.0, 1 / math.ceil(members / 32), attempt["steps"])]  # Poisson rate: batch 32
    epsilon = accountant.get_epsilon(1e-5)
    assert 0 < epsilon < 100
    assert metric(retrained, "collaborator3", "gate_epsilon") == pytest.approx(epsilon, rel=1e-9)
    assert gate["epsilon"] == pytest.approx(epsilon, rel=1e-9) and gate["delta"] == 1e-5
    assert attempt["steps"] == 40 * math.ceil(members / 32)
    # Beside it, the family-wise epsilon lower bound the try's audit proves (every attack, RMIA's too, each at a level
    # corrected for their number): never above the largest single bound, nor above the accountant's epsilon.
    proven = attempt["empirical_epsilon"]
    bounds = {k: v for k, v in attempt["metrics"].items() if k.endswith("_epsilon_lb") and not k.startswith("leak_")}
    assert proven["value"] == attempt["metrics"]["leak_epsilon_lb"] <= max(bounds.values())
    assert proven["bounds"] == len(bounds) == 5  # 3 + 2 RMIA
    assert proven["delta"] == 1e-5 and proven["confidence"] == 0.95 and 0 <= proven["value"] <= epsilon
    assert gate["empirical_epsilon"]["value"] >= 0  # and the plain update's, at the top
    # The canary check of the same DP training: the accountant's epsilon of this one try, never below its bound.
    check = attempt["dp_audit"]
    assert check["claimed_epsilon"] == pytest.approx(epsilon, rel=1e-9) and 0 <= check["epsilon_lb"] <= epsilon
    assert check["violated"] is False and check["canaries"] == 200


@pytest.mark.federation
def test_dp_retrained_update_is_sent_and_averaged_in(retrained):
    update = sent(retrained, "collaborator3", 0)
    assert differs(update, global_model(retrained, 0))
    assert_same(update, retrained.runner("collaborator3").get_tensor_dict(), exact=True)  # the model holds it
    assert_same(global_model(retrained, 1), average(retrained, ["collaborator1", "collaborator3"], 0))


@pytest.mark.federation
def test_update_still_leaky_after_the_retries_is_withheld(retrained):
    gate = record(retrained, "collaborator2")["extra"]["gate"]
    assert gate["verdict"] == "withheld" and gate["retries"] == 2
    assert [t["noise_multiplier"] for t in gate["tries"]] == [0.01, 0.02]  # doubled
    for attempt in gate["tries"]:
        assert attempt["passed"] is False and attempt["metrics"][AUC] > 0.6
    assert gate["tries"][1]["epsilon"] > gate["tries"][0]["epsilon"] > 0  # the round's tries compose
    assert metric(retrained, "collaborator2", "gate_kept") == 0.0
    assert metric(retrained, "collaborator2", "gate_retries") == 2.0
    assert metric(retrained, "collaborator2", "gate_epsilon") == pytest.approx(gate["epsilon"])
    assert_same(sent(retrained, "collaborator2", 0), global_model(retrained, 0), exact=True)


@pytest.mark.federation
def test_each_partys_run_account_composes_what_it_released(retrained):
    """Each party's account (account.json): its round's own epsilon is the round's accountant's (every try run, sent
    or not); a party that sent its plain update has no bound; every party audited the final model."""
    for name, bounded in (("collaborator1", False), ("collaborator2", True), ("collaborator3", True)):
        account = PartyRun.read(retrained.report_dir / name / ACCOUNT_FILE)
        gate = record(retrained, name)["extra"]["gate"]
        (entry,) = account.rounds
        assert entry.verdict == gate["verdict"] and account.dp.bounded is bounded, name
        assert len(entry.release.mechanisms) == gate["retries"]
        if bounded:
            assert entry.epsilon == account.dp.epsilon == pytest.approx(gate["epsilon"], rel=1e-12)
            assert [m.noise_multiplier for m in entry.release.mechanisms] == [t["noise_multiplier"]
                                                                           for t in gate["tries"]]
        else:
            assert account.dp.epsilon is None and list(account.dp.unbounded) == [0]
        assert account.final_model.audited and account.final_model.round == 1
    sent_by = {name: PartyRun.read(retrained.report_dir / name / ACCOUNT_FILE).rounds[0].sent
               for name in ("collaborator2", "collaborator3")}
    assert sent_by == {"collaborator2": "the received global weights (nothing of the party's data)",
                       "collaborator3": "DP retrain try 1"}


@pytest.mark.federation
def test_the_summary_says_what_was_trained_what_was_sent_and_why(retrained):
    """The end-of-run lines of a gated DP run: each gate's verdict names the compared value and the rule that tripped
    it, the DP tries' epsilon says what it composes, the trained update's verdict says it was not sent, and the
    closing lines tell the trained updates' leaks apart from what was sent."""
    from workspace.run_summary import summary_lines

    names = ("collaborator1", "collaborator2", "collaborator3")
    lines = summary_lines({n: retrained.report_dir / n for n in names}, retrained.aggregator_report_dir, 1)
    text = "\n".join(lines)
    (round_line,) = [ln for ln in lines if ln.startswith("round 0: ")]
    auc3 = record(retrained, "collaborator3")["extra"]["gate"]["tripped"][AUC]["value"]
    # the bound is point here (the grid AUC has no interval): the value compared is the metric itself
    assert f"collaborator3 dp_retrained ({AUC} {auc3:.4g} > 0.7; the DP retrain (try 1) passed); ε = " in round_line
    assert "of the round's DP try" in round_line
    assert ("collaborator2 withheld (" in round_line and "2 DP tries did not bring it below" in round_line
            and "composed over the round's 2 DP tries (the last one alone: " in round_line
            and "none of them sent" in round_line)
    assert "collaborator1 kept" in round_line
    assert "  collaborator3 (the trained update, not sent): " in text and "  collaborator1: " in text
    (sent,) = [ln for ln in lines if ln.startswith("what was sent: ")]
    assert "collaborator2: nothing (withheld) in round 0" in sent
    assert "collaborator3: DP retrain (" in sent and "collaborator1: as trained (" in sent


# ---------------------------------------------------------------------------------------------- non-finite


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """collaborator2 diverges (learning rate 1e30: its weights become NaN) under a report-only gate without
    thresholds; round 1 is not audited (interval 2)."""
    with pages_drawn_at_the_end(images=False):  # one test reads metrics.csv, none an image
        return run_in_process(
            tmp_path_factory.mktemp("nan"), collaborators=3, rounds=2,
            overrides=overrides({}, {"collaborator2": {"learning_rate": 1e30}}, audit={"interval": 2}),
        )


@pytest.mark.federation
def test_non_finite_update_is_gated_whatever_the_action(diverged):
    for round_num in (0, 1):
        assert metric(diverged, "collaborator2", "gate_kept", round_num) == 0.0
        assert metric(diverged, "collaborator2", "gate_tripped__non_finite_update", round_num) == 1.0
        assert math.isnan(metric(diverged, "collaborator2", "cross_entropy", round_num))  # it did diverge
        for col in ("collaborator1", "collaborator3"):
            assert metric(diverged, col, "gate_kept", round_num) == 1.0
            assert metric(diverged, col, "gate_tripped__non_finite_update", round_num) == 0.0


@pytest.mark.federation
def test_non_finite_update_never_reaches_the_global_model(diverged):
    update = sent(diverged, "collaborator2", 1)
    assert all(np.isfinite(a).all() for a in update.values())
    assert_same(update, global_model(diverged, 1), exact=True)
    new = global_model(diverged, 2)
    assert_same(new, average(diverged, ["collaborator1", "collaborator3"], 1))
    assert all(np.isfinite(a).all() for a in new.values())


@pytest.mark.federation
def test_non_finite_update_is_recorded_in_the_report(diverged):
    audited = record(diverged, "collaborator2", 0)
    gate = audited["extra"]["gate"]
    assert gate["verdict"] == "withheld" and gate["reason"] == "non_finite_update" and gate["audited"] is True
    assert gate["tripped"] == {"non_finite_update": {"value": 1.0, "threshold": 0.0}}
    assert gate["non_finite_tensors"]
    # The audit is of what was sent, the received global model, so "local" equals "global".
    assert audited["metrics"]["mia_local_loss_auc"] == audited["metrics"]["mia_global_loss_auc"]
    assert "train_loss" not in audited["metrics"]  # NaN: report metrics are finite
    unaudited = record(diverged, "collaborator2", 1)
    # no audit metric: only the verdict of the received-model check, which runs every round
    assert unaudited["attacks"] == {} and set(unaudited["metrics"]) == {"received_model_alarm", "received_model_rejected"}
    assert unaudited["extra"]["gate"]["verdict"] == "withheld" and unaudited["extra"]["gate"]["audited"] is False
    assert not (diverged.report_dir / "collaborator1" / "round_0001").exists()  # kept rounds off-schedule: no record
    csv_rounds = (diverged.report_dir / "collaborator2" / "metrics.csv").read_text().splitlines()[1:]
    assert [line.split(",")[0] for line in csv_rounds] == ["0", "1"]


# ---------------------------------------------------------------------------------------------- aggregation


ORIGIN = "aggregator_test"


def _store(db: TensorDB, round_num: int, col: str, tensors: dict, gate_kept: float | None) -> None:
    """Cache `col`'s results the way the aggregator does (tags sorted by OpenFL's change_tags)."""
    entries = {TensorKey(n, ORIGIN, round_num, False, change_tags(("trained",), add_field=col)): v
               for n, v in tensors.items()}
    if gate_kept is not None:
        entries[TensorKey("gate_kept", ORIGIN, round_num, True, change_tags(("metric",), add_field=col))] = (
            np.array(gate_kept))
    db.cache_tensor(entries)


def _aggregate(db: TensorDB, name: str, round_num: int, weights: dict, function) -> np.ndarray:
    return db.get_aggregated_tensor(TensorKey(name, ORIGIN, round_num, False, ("trained",)), weights, function)


def test_gated_average_in_a_real_tensor_db():
    rng = np.random.default_rng(0)
    tensor = lambda: {"w": rng.normal(size=(3, 2)).astype(np.float32), "b": rng.normal(size=2).astype(np.float32)}  # noqa: E731
    db = TensorDB()
    start = tensor()
    db.cache_tensor({TensorKey(n, ORIGIN, 4, False, ("model",)): v for n, v in start.items()})
    a, d, withheld, no_metric = tensor(), tensor(), dict(start), tensor()
    broken = tensor()
    broken["b"][1] = np.nan  # bypassed the collaborator's check; its "w" is finite
    _store(db, 4, "alice", a, 1.0)
    _store(db, 4, "dave", d, 1.0)
    _store(db, 4, "bob", broken, 1.0)
    _store(db, 4, "carol", withheld, 0.0)
    _store(db, 4, "erin", no_metric, None)  # sends no gate_kept: counted as kept
    weights = {"alice": 0.3, "dave": 0.2, "bob": 0.2, "carol": 0.2, "erin": 0.1}
    for name in ("w", "b"):
        got = _aggregate(db, name, 4, weights, GatedWeightedAverage())
        kept = [(a[name], 0.3), (d[name], 0.2), (no_metric[name], 0.1)]
        want = sum(t.astype(np.float64) * w for t, w in kept) / 0.6
        # float32 sums of float32 products: their rounding, derived (tests/rounding.py)
        assert np.all(np.abs(got - want) <= weighted_average_rounding(*zip(*kept)))
        assert np.isfinite(got).all()


def test_gated_average_equals_openfl_average_when_nobody_is_gated():
    rng = np.random.default_rng(1)
    db = TensorDB()
    db.cache_tensor({TensorKey("w", ORIGIN, 0, False, ("model",)): np.zeros(4, np.float32)})
    updates = {c: rng.normal(size=4).astype(np.float32) for c in ("x", "y")}
    for col, value in updates.items():
        _store(db, 0, col, {"w": value}, 1.0)
    weights = {"x": 0.75, "y": 0.25}
    local = [LocalTensor(col_name=c, tensor=updates[c], weight=w) for c, w in weights.items()]
    expected = WeightedAverage()(local, None, "w", 0, ("trained",))
    # two float32 averages of the same terms, each within its rounding of the exact one (tests/rounding.py)
    bound = weighted_average_rounding([updates[c] for c in weights], list(weights.values()))
    assert np.all(np.abs(_aggregate(db, "w", 0, weights, GatedWeightedAverage()) - expected) <= 2 * bound)


@pytest.mark.parametrize("dtypes", [("float32",) * 3, ("float64",) * 2, ("float32", "float64", "float32")])
def test_the_average_is_pythons_sum_of_the_weighted_terms_bit_for_bit(dtypes):
    """The kept updates are summed in place (one running array, not a new one per term), with the bits, dtype and
    shape of sum(tensor * weight for ...) in the same order: signed zeros included, float64 terms among float32."""
    from src.aggregation import _weighted_sum

    rng = np.random.default_rng(7)
    for shape in [(), (5,), (3, 4), (2, 1, 6)]:
        terms = []
        for i, dtype in enumerate(dtypes):
            tensor = rng.normal(size=shape).astype(dtype)
            if i == 0:  # signed zeros: sum()'s 0 + term makes each -0.0 a 0.0
                tensor = np.where(rng.random(shape) < 0.5, -0.0, tensor).astype(dtype)
            terms.append((tensor, float(rng.random())))
        expected = sum(tensor * weight for tensor, weight in terms)
        got = _weighted_sum(terms)
        assert np.asarray(got).dtype == np.asarray(expected).dtype and np.shape(got) == np.shape(expected)
        assert np.asarray(got).tobytes() == np.asarray(expected).tobytes()


def test_gated_average_keeps_the_starting_tensor_when_everybody_is_gated():
    rng = np.random.default_rng(2)
    db = TensorDB()
    start = rng.normal(size=(2, 2)).astype(np.float32)
    db.cache_tensor({TensorKey("w", ORIGIN, 1, False, ("model",)): start,
                     TensorKey("w", ORIGIN, 0, False, ("model",)): start + 1})  # another round: not this one
    _store(db, 1, "x", {"w": start}, 0.0)
    nan = np.full((2, 2), np.nan, np.float32)
    _store(db, 1, "y", {"w": nan}, 1.0)
    got = _aggregate(db, "w", 1, {"x": 0.5, "y": 0.5}, GatedWeightedAverage())
    assert np.array_equal(got, start)


def test_gated_average_without_a_starting_tensor_fails_clearly():
    db = TensorDB()
    _store(db, 2, "x", {"w": np.ones(2, np.float32)}, 0.0)
    with pytest.raises(RuntimeError, match="every collaborator is excluded in round 2"):
        _aggregate(db, "w", 2, {"x": 1.0}, GatedWeightedAverage())


# ---------------------------------------------------------------------------------------------- bad plans


def build_runner(tmp_path, settings):
    plan = parse_plan(write_run_plan(tmp_path, collaborators=2, rounds=1,
                                     overrides={"task_runner": {"settings": settings}}))
    return initial_tensor_dict(plan)


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"gate": {"thresholds": {"mia_local_foo_auc": 0.5}}}, "task_runner.settings.gate.thresholds.mia_local_foo_auc"),
        ({"gate": {"thresholds": {"mia_local_loss_auc": 1.5}}}, "task_runner.settings.gate.thresholds.mia_local_loss_auc"),
        ({"gate": {"action": "quarantine"}}, "task_runner.settings.gate.action"),
        ({"gate": {"dp": {"noise_multiplier": -1}}}, "task_runner.settings.gate.dp.noise_multiplier"),
        ({"per_collaborator": {"collaborator2": {"epohcs": 20}}},
         "task_runner.settings.per_collaborator.collaborator2.epohcs"),
        ({"per_collaborator": {"collaborator2": {"gate": {"thresholds": {"mia_update_loss_auc": 0.6}}}}},
         "task_runner.settings.per_collaborator.collaborator2.gate.thresholds.mia_update_loss_auc"),
    ],
)
def test_bad_gate_plan_fails_at_start_naming_the_key(tmp_path, settings, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.") + ":"):
        build_runner(tmp_path, settings)


def test_gated_metric_the_audit_settings_do_not_produce_fails_at_start(tmp_path):
    with pytest.raises(ValueError, match=r"gate\.thresholds\.mia_global_loss_auc: unknown metric"):
        build_runner(tmp_path, {"audit": {"audit_global": False}, "gate": {"thresholds": {"mia_global_loss_auc": 0.6}}})


def test_the_gated_average_does_not_depend_on_the_order_collaborators_arrive_in():
    """OpenFL's assigner orders a round's collaborators at random; float32 sums of three or more terms change with the
    order, so the average must sum in a fixed order for the same plan and seed to give the same model."""
    rng = np.random.default_rng(0)
    cols = [f"collaborator{i}" for i in range(1, 6)]
    tensors = {c: rng.normal(size=1000).astype(np.float32) for c in cols}
    weights = dict(zip(cols, rng.dirichlet(np.ones(len(cols)))))
    results = []
    for order in (cols, cols[::-1], [cols[i] for i in (2, 0, 4, 1, 3)]):
        local = [LocalTensor(col_name=c, tensor=tensors[c], weight=weights[c]) for c in order]
        results.append(GatedWeightedAverage().call(local, iter([]), "w", 0, ("trained",)))
    assert all(np.array_equal(results[0], r) for r in results[1:])
    naive = [sum(tensors[c] * np.float32(weights[c]) for c in order) for order in (cols, cols[::-1])]
    assert not np.array_equal(naive[0], naive[1])  # the order does matter to an unsorted float32 sum
