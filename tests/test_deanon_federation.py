"""The deanonymization self-audit, its gate metric and the mitigations inside a real in-process federation."""

import json
import math

import numpy as np
import pytest

from report_drawing import no_report_drawing
from workspace.in_process import run_in_process

ROUNDS = 2
OVERRIDES = {
    "tasks": {"train": {"kwargs": {"epochs": 2}}},
    "data_loader": {"settings": {"dataset": "digits", "seed": 1, "dirichlet_alpha": 0.2, "train_dataset_ratio": 0.1,
                                 "test_dataset_ratio": 0.45, "audit_dataset_ratio": 0.45}},
    "task_runner": {"settings": {
        "seed": 1,
        "audit": {"signals": ["loss"], "audit_global": False, "update_attack": False,
                  "deanon": {"enabled": True, "crowd_users": 6, "shadows_per_user": 4, "attacks": ["mlp", "knn"]}},
        "per_collaborator": {
            "collaborator1": {"mitigation": {"method": "noise", "sigma": 0.001},
                              "gate": {"action": "withhold", "bound": "point",
                                                       "thresholds": {"deanon_ap_over_chance": 0.0}}},
            "collaborator2": {"mitigation": {"method": "mm_aug", "alpha": 0.5, "clusters": 5}},
        },
    }},
}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    with no_report_drawing():  # the records, metrics and runners are read, not the pages
        return run_in_process(tmp_path_factory.mktemp("deanon"), collaborators=2, rounds=ROUNDS, overrides=OVERRIDES)


def _record(federation, name, round_num):
    return json.loads((federation.report_dir / name / f"round_{round_num:04d}" / "audit.json").read_text())


@pytest.mark.federation
def test_every_audited_round_has_the_self_audit_and_only_scalars_leave(federation):
    for name in ("collaborator1", "collaborator2"):
        for round_num in range(ROUNDS):
            record = _record(federation, name, round_num)
            deanon = record["extra"]["deanon"]
            assert deanon["crowd_users_requested"] == 6 and deanon["shadows_per_user"] == 4
            assert deanon["crowd_alpha"] == 0.2
            # Every user alike: the members' count as private data, and a crowd of distinct population samples
            # (about 400 here: 2 users of 90 + 90 fit, not 6).
            sizes = record["sizes"]
            assert deanon["private_size"] == sizes["members"] and deanon["prior_size"] <= sizes["nonmembers"]
            assert 2 <= deanon["crowd_users"] < 6
            assert deanon["crowd_users"] * (deanon["prior_size"] + deanon["private_size"]) <= sizes["population"]
            assert deanon["layer"] == "classifier.out"
            assert record["metrics"]["deanon_ap_over_chance"] == max(
                record["metrics"]["deanon_mlp_ap_over_chance"], record["metrics"]["deanon_knn_ap_over_chance"])
        sent = federation.collaborator_metrics[-1]
        value = sent[f"{name}/train/deanon_ap_over_chance"]
        assert math.isfinite(value) and value > 0
    db = federation.aggregator.tensor_db.tensor_db
    rows = db[db["tensor_name"].str.startswith("deanon_")]
    assert len(rows) > 0 and all(np.asarray(a).size == 1 for a in rows["nparray"])


@pytest.mark.federation
def test_the_deanonymization_metric_gates_an_update(federation):
    gate = _record(federation, "collaborator1", ROUNDS - 1)["extra"]["gate"]
    assert gate["verdict"] == "withheld" and "deanon_ap_over_chance" in gate["tripped"]
    assert _record(federation, "collaborator2", ROUNDS - 1)["extra"]["gate"]["verdict"] == "kept"
    assert federation.collaborator_metrics[-1]["collaborator1/train/gate_kept"] == 0.0


@pytest.mark.federation
def test_mitigations_are_applied_and_recorded(federation):
    noise = _record(federation, "collaborator1", 0)["extra"]["mitigation"]
    assert noise["method"] == "noise" and noise["sent_update_norm"] != noise["update_norm"]
    mm = _record(federation, "collaborator2", 0)["extra"]["mitigation"]
    members = _record(federation, "collaborator2", 0)["sizes"]["members"]
    assert mm["method"] == "mm_aug" and mm["training_set_size"] == members + round(0.5 * members)
    assert 0 <= mm["cluster"] < 5
    # the background samples trained on are no longer in the membership audit's population
    sizes = _record(federation, "collaborator2", 0)["sizes"]
    assert sizes["population"] == _record(federation, "collaborator2", 1)["sizes"]["population"]
    runner = federation.runner("collaborator2")
    assert len(runner.data_loader.y_population) - sizes["population"] == mm["own_population_trained_on"]
    assert mm["background_trained_on"] > mm["own_population_trained_on"]  # drawn from the whole population set


@pytest.mark.federation
def test_the_tutorials_ratios_get_a_self_audit_sized_to_the_shard(tmp_path):
    """`cifar10_PM.py --dataset digits --collaborators 3 --deanon` with the tutorial's default ratios (a population
    shard of half the member count): the run is not refused; it notes how the audit was sized, and every
    collaborator's round records that crowd and its metrics."""
    from shared_runs import run_demo_here

    log_dir = tmp_path / "logs"
    with no_report_drawing():
        proc = run_demo_here(["--dataset", "digits", "--comm_round", "1", "--collaborators", "3", "--deanon",
                              "--signals", "loss", "--rmia", "False", "--fpr_tolerance", "0.1", "--no_progress",
                              "--log_dir", log_dir], tmp_path)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: --deanon (")]
    assert notes and all("self-audit is sized to the population shard: 2 crowd users (not 10)" in n for n in notes)
    for name in ("collaborator1", "collaborator2", "collaborator3"):
        record = json.loads((log_dir / name / "round_0000" / "audit.json").read_text())
        deanon = record["extra"]["deanon"]
        assert deanon["crowd_users"] == 2 and deanon["crowd_note"].startswith("sized to the population shard")
        assert 2 * (deanon["private_size"] + deanon["prior_size"]) <= record["sizes"]["population"]
        assert deanon["private_size"] < record["sizes"]["members"]
        assert math.isfinite(record["metrics"]["deanon_ap_over_chance"])
