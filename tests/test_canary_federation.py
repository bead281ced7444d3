"""The canary audits in a real in-process federation (OpenFL's Aggregator and Collaborators, the plan's tasks):

- the canary step's canaries and their inclusion never reach the aggregator: what each party sends is bit for bit
  what the same plan sends without the step, and the aggregator holds only the step's scalar metrics;
- a party whose DP training draws 0.8x the noise it tells its accountant has its update withheld, "DP guarantee
  violated by the audit", while a correct one beside it is kept (its DP-retrained update sent);
- the aggregator's canary clients give each round a user-level epsilon estimate beside the accountant's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from opacus.optimizers import optimizer as opacus_optimizer

from audit.canary.step import CANARY_FILE
from audit.config.canary_settings import CANARY_METRICS
from audit.config.gate_contract import DP_VIOLATED, DP_VIOLATED_TEXT, tripped_name
from report_drawing import no_report_drawing, pages_drawn_at_the_end, without_report_drawing  # noqa: F401  (a fixture)
from src.aggregation import GatedWeightedAverage
from workspace.in_process import run_in_process
from workspace.plan_file import collaborator_names

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:Optimal order is the"),
              pytest.mark.filterwarnings("ignore:Secure RNG turned off")]

ROUNDS = 2
BROKEN_SIGMA = 3.0  # the noise multiplier whose DP training draws 0.8x its noise
CORRECT_SIGMA = 4.0


def overrides(canary: bool) -> dict:
    return {
        "tasks": {"train": {"kwargs": {"epochs": 2}}},
        "data_loader": {"settings": {"dataset": "digits", "seed": 5}},
        "aggregator": {"settings": {"db_store_rounds": ROUNDS + 1,
                                    "canary_clients": {"enabled": True, "count": 8, "scale": 0.01}}},
        "task_runner": {"settings": {
            "seed": 5, "mitigation": {"method": "dp_fedavg", "sigma": 0.001, "clip": 50.0},
            "audit": {"signals": ["loss"], "fpr_tolerance": [0.1], "rmia": {"enabled": False},
                      "canary": {"enabled": canary, "count": 100, "gradient_count": 200}}}},
    }


def sent(result, col: str, round_num: int) -> dict:
    db = result.aggregator.tensor_db.tensor_db
    rows = db[(db["round"] == round_num) & db["tags"].map(lambda t: set(t) == {col, "trained"})]
    return {name: np.asarray(a) for name, a in zip(rows["tensor_name"], rows["nparray"])}


@pytest.fixture(scope="module")
def with_canaries(tmp_path_factory):
    with pages_drawn_at_the_end():  # one test reads the aggregator's page, none a round's images
        return run_in_process(tmp_path_factory.mktemp("canary"), collaborators=2, rounds=ROUNDS,
                              overrides=overrides(True))


@pytest.fixture(scope="module")
def without_canaries(tmp_path_factory):
    with no_report_drawing():  # what the parties sent is read, not the reports
        return run_in_process(tmp_path_factory.mktemp("plain"), collaborators=2, rounds=ROUNDS,
                              overrides=overrides(False))


@pytest.mark.federation
def test_what_the_parties_send_is_their_canary_free_update(with_canaries, without_canaries):
    for col in collaborator_names(2):
        for round_num in range(ROUNDS):
            a, b = sent(with_canaries, col, round_num), sent(without_canaries, col, round_num)
            assert a.keys() == b.keys() and a
            for name in a:
                assert np.array_equal(a[name], b[name]), (col, round_num, name)


@pytest.mark.federation
def test_the_aggregator_holds_only_the_canary_steps_scalars(with_canaries):
    db = with_canaries.aggregator.tensor_db.tensor_db
    canary_rows = db[db["tensor_name"].str.contains("canary")]
    assert set(canary_rows["tensor_name"]) == set(CANARY_METRICS)
    assert all(np.asarray(a).size == 1 and "metric" in tags
               for a, tags in zip(canary_rows["nparray"], canary_rows["tags"]))
    # nothing of the canaries' size (100 canaries) in what any party sent, beside the model's own tensors
    model = set(with_canaries.global_weights(0))
    others = db[~db["tensor_name"].isin(model)]
    assert all(np.asarray(a).size == 1 for a in others["nparray"])
    assert not list(with_canaries.aggregator_report_dir.rglob(CANARY_FILE))
    for col in collaborator_names(2):
        round_dir = with_canaries.report_dir / col / "round_0001"
        private = np.load(round_dir / CANARY_FILE)
        assert private["included"].shape == (100,) and private["scores"].shape == (100,)
        record = json.loads((round_dir / "audit.json").read_text())
        entry = record["extra"]["canary"]
        assert entry["count"] == 100 and entry["training_set_size"] == entry["members"] + entry["included"]
        # with dp_fedavg the shadow's update goes through the party's mitigation, and the claim is its accountant's
        assert entry["mechanism"]["mechanism"] == "dp_fedavg" and entry["dp"]["violated"] is False
        assert record["metrics"]["canary_epsilon_lb"] <= record["metrics"]["canary_epsilon_ceiling"]
        # the dp_fedavg canary check and its accountant, beside each other in the party's record
        mitigation = record["extra"]["mitigation"]
        assert mitigation["dp_audit"]["violated"] is False and mitigation["releases"] == 2
        assert mitigation["epsilon_composed"] > mitigation["epsilon"] > 0


@pytest.mark.federation
def test_canary_clients_estimate_each_rounds_user_level_epsilon(with_canaries):
    for round_num in range(ROUNDS):
        record = json.loads((with_canaries.aggregator_report_dir / f"round_{round_num:04d}.json").read_text())
        clients = record["canary_clients"]
        assert clients["estimated"] and clients["parties"] == 2 and clients["rounds"] == round_num + 1
        # held-out canaries: their cosines times sqrt(d) look like N(0, 1) (8 of them)
        assert abs(clients["held_out_mean_z"]) < 1.5 and 0.3 < clients["held_out_sd_z"] < 2.5
        # sigma 0.001 hides nothing: both the estimate and the accountant are large, and the estimate is the lower
        assert clients["epsilon"] > 5 and clients["accountant_epsilon"] > clients["epsilon"]
    page = (with_canaries.aggregator_report_dir / "index.html").read_text()
    assert "User-level privacy of the global model (canary clients)" in page


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")  # the aggregator's round record is read, not its pages
def test_a_later_run_without_canary_clients_has_none(with_canaries, tmp_path):
    """OpenFL's aggregation function is one object per process: an earlier run's canary clients must not stay in it."""
    assert GatedWeightedAverage().canary_clients is not None  # the runs above left theirs
    plan = {"data_loader": {"settings": {"dataset": "digits", "seed": 5}},
            "task_runner": {"settings": {"audit": {"enabled": False}}}}
    result = run_in_process(tmp_path, collaborators=2, rounds=1, overrides=plan)
    assert GatedWeightedAverage().canary_clients is None
    assert "canary_clients" not in json.loads((result.aggregator_report_dir / "round_0000.json").read_text())


@pytest.mark.federation
def test_canary_clients_without_dp_fedavg_parties_are_refused_at_start(tmp_path):
    plan = overrides(False)
    plan["task_runner"]["settings"]["mitigation"] = {"method": "none"}
    with pytest.raises(ValueError, match=r"aggregator.settings.canary_clients: estimates the privacy of dp_fedavg "
                                         r"updates; task_runner.settings.mitigation.method is 'none'"):
        run_in_process(tmp_path, collaborators=2, rounds=1, overrides=plan)
    assert not (tmp_path / "reports" / "collaborator1").exists()


@pytest.fixture(scope="module")
def broken_dp(tmp_path_factory):
    original = opacus_optimizer.DPOptimizer.add_noise

    def add_noise(self):
        if self.noise_multiplier != BROKEN_SIGMA:
            return original(self)
        self.noise_multiplier = BROKEN_SIGMA * 0.8
        try:
            return original(self)
        finally:
            self.noise_multiplier = BROKEN_SIGMA

    # 20 epochs at a learning rate of 0.01: each party's plain update leaks past the threshold (AUC above 0.6), its DP
    # retrain does not; at confidence 0.99 each of the check's four tests runs at 0.25%.
    gate = {"action": "dp_retrain", "bound": "point", "thresholds": {"mia_local_loss_auc": 0.6},
            "dp": {"noise_multiplier": CORRECT_SIGMA, "max_retries": 1}}
    plan = {
        "tasks": {"train": {"kwargs": {"epochs": 20}}},
        "data_loader": {"settings": {"dataset": "digits", "seed": 6}},
        "task_runner": {"settings": {
            "seed": 6, "learning_rate": 0.01, "gate": gate,
            "per_collaborator": {"collaborator2": {"gate": {"dp": {"noise_multiplier": BROKEN_SIGMA}}}},
            "audit": {"signals": ["loss"], "fpr_tolerance": [0.1], "rmia": {"enabled": False}, "confidence": 0.99,
                      "canary": {"gradient_count": 1000}}}},
    }
    with pytest.MonkeyPatch.context() as patch, no_report_drawing():  # the records are read, not the pages
        patch.setattr(opacus_optimizer.DPOptimizer, "add_noise", add_noise)
        return run_in_process(tmp_path_factory.mktemp("broken_dp"), collaborators=2, rounds=1, overrides=plan)


@pytest.mark.federation
def test_a_dp_training_with_four_fifths_of_its_noise_is_withheld_and_a_correct_one_is_kept(broken_dp):
    def gate_entry(col):
        return json.loads((broken_dp.report_dir / col / "round_0000" / "audit.json").read_text())["extra"]["gate"]

    correct, broken = gate_entry("collaborator1"), gate_entry("collaborator2")
    (try1,) = correct["tries"]
    check = try1["dp_audit"]
    assert check["violated"] is False and check["epsilon_lb"] <= check["claimed_epsilon"]
    assert check["tests"] == 4 and check["alpha_each"] == pytest.approx(0.01 / 4)
    low, high = check["estimate"]["noise_interval"]
    assert low <= CORRECT_SIGMA <= high and check["noise_multiplier"] == CORRECT_SIGMA
    assert correct["verdict"] == "dp_retrained" and try1["passed"] is True  # kept: its DP-retrained update is sent
    (try2,) = broken["tries"]
    audit = try2["dp_audit"]
    assert broken["verdict"] == "withheld" and broken["reason"] == DP_VIOLATED
    assert audit["violated"] is True and audit["reason"] == DP_VIOLATED_TEXT and audit["noise_multiplier"] == BROKEN_SIGMA
    # caught by the white-box estimate: the training behaves like about 0.8 x 3 = 2.4, its upper limit below the claim
    assert audit["estimate"]["claim_rejected"] is True and audit["estimate"]["noise_interval"][1] < BROKEN_SIGMA
    assert audit["epsilon_lb"] > audit["claimed_epsilon"]
    metrics = broken_dp.collaborator_metrics[0]
    assert metrics[f"collaborator2/train/{tripped_name(DP_VIOLATED)}"] == pytest.approx(audit["epsilon_lb"])
    assert metrics[f"collaborator1/train/{tripped_name(DP_VIOLATED)}"] == 0.0
    assert metrics["collaborator1/train/gate_kept"] == 1.0 and metrics["collaborator2/train/gate_kept"] == 0.0
    report = json.loads((broken_dp.aggregator_report_dir / "round_0000.json").read_text())
    assert DP_VIOLATED_TEXT in report["collaborators"]["collaborator2"]["reason"]
