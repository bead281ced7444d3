"""The Fidel audit inside the federation: metrics, gate, and images kept in the collaborator's own report."""

import json

import numpy as np
import pytest

from report_drawing import no_report_drawing
from workspace.in_process import run_in_process
from workspace.plan_file import collaborator_names

# Few members and one plain SGD step per round on the FCNN: the setting in which Fidel reveals samples.
OVERRIDES = {
    "tasks": {"train": {"kwargs": {"epochs": 1}}},
    "data_loader": {"settings": {"train_dataset_ratio": 0.02, "test_dataset_ratio": 0.49,
                                 "audit_dataset_ratio": 0.49, "batch_size": 64}},
    "task_runner": {"settings": {
        "model": "fcnn", "optimizer": "SGD", "learning_rate": 0.01, "momentum": 0.0,
        "audit": {"fidel": {"enabled": True}},
        "gate": {"action": "withhold", "bound": "point", "thresholds": {"fidel_revealed_fraction": 0.2}},
    }},
}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    # The records and the private fidel_grid.png (written with the round's record) are read, not the pages.
    with no_report_drawing():
        return run_in_process(tmp_path_factory.mktemp("fidel"), collaborators=2, rounds=1, overrides=OVERRIDES)


@pytest.mark.federation
def test_fidel_metrics_reach_the_aggregator_and_gate_the_update(federation):
    metrics = federation.collaborator_metrics[0]
    for name in collaborator_names(2):
        record = json.loads((federation.report_dir / name / "round_0000" / "audit.json").read_text())
        fidel = record["extra"]["fidel"]
        # The collaborator's report and the scalar sent to the aggregator agree.
        assert metrics[f"{name}/train/fidel_revealed_fraction"] == pytest.approx(fidel["revealed"] / fidel["n_samples"])
        assert fidel["revealed"] >= 1 and fidel["layer"] == "classifier.fc1"
        gate = record["extra"]["gate"]
        if fidel["revealed_fraction"] > 0.2:
            assert gate["verdict"] == "withheld" and "fidel_revealed_fraction" in gate["tripped"]
            assert metrics[f"{name}/train/gate_kept"] == 0.0
        else:
            assert gate["verdict"] == "kept"


@pytest.mark.federation
def test_reconstruction_images_stay_with_the_collaborator(federation):
    for name in collaborator_names(2):
        assert (federation.report_dir / name / "round_0000" / "fidel_grid.png").stat().st_size > 0
    # Only scalars went to the aggregator.
    db = federation.aggregator.tensor_db.tensor_db
    fidel_rows = db[db["tensor_name"].str.startswith("fidel_")]
    assert all(np.asarray(a).size == 1 for a in fidel_rows["nparray"])
    for name in collaborator_names(2):  # three scalars from each collaborator (the rest are the averages)
        assert sum(name in tags for tags in fidel_rows["tags"]) == 3


def test_fidel_threshold_setting_is_validated(tmp_path):
    from workspace.in_process import initial_tensor_dict, parse_plan
    from workspace.plan_file import write_run_plan

    overrides = {"task_runner": {"settings": {"audit": {"fidel": {"enabled": True, "threshold": 1.5}}}}}
    with pytest.raises(ValueError, match=r"task_runner\.settings\.audit\.fidel\.threshold"):
        initial_tensor_dict(parse_plan(write_run_plan(tmp_path, collaborators=2, rounds=1, overrides=overrides)))
