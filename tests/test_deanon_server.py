"""The aggregator-side deanonymization audit: evaluate_round on synthetic updates, settings, a real federation."""

import csv
import json
import math

import numpy as np
import pytest

from audit.deanon.server import (BUILDING_HISTORY, EVALUATED, SKIPPED, WITHHELD, UpdateHistory, evaluate_round,
                                 open_world_split)
from audit.deanon.server_report import DeanonReportWriter
from src.server.settings import AggregatorSettings, DeanonServerSettings
from src.server.deanon_callback import DeanonymizationCallback, default_layer, resolve_layer
from report_drawing import no_report_drawing
from workspace.in_process import run_in_process
from workspace.plan_file import collaborator_names

DIM = 64


def synthetic_history(users: int, rounds: int, *, distinct: bool, seed: int, noise: float = 0.5) -> UpdateHistory:
    """Each user's update = its own fixed direction + noise (distinct), or a fresh draw from one distribution."""
    rng = np.random.default_rng(seed)
    directions = rng.normal(size=(users, DIM))
    history = UpdateHistory()
    for r in range(rounds):
        for u in range(users):
            base = directions[u] if distinct else rng.normal(size=DIM)
            assert history.add_vector(r, f"col{u}", base + noise * rng.normal(size=DIM))
    return history


def reid_ratios(record: dict, world: str = "closed_world") -> dict:
    return {a: r["ap_over_chance"] for a, r in record[world]["reidentification"].items()}


# ------------------------------------------------------------------------------------------------ history
def test_history_stores_normalised_float64_vectors_and_skips_withheld_updates():
    received = {"out.weight": np.ones((2, 3), np.float32), "out.bias": np.zeros(2, np.float32)}
    trained = {"out.weight": np.full((2, 3), 1.5, np.float32), "out.bias": np.array([0.5, -0.5], np.float32)}
    history = UpdateHistory()
    assert history.add(0, "a", received, trained, ["out.weight", "out.bias"])
    assert not history.add(0, "b", received, dict(received), ["out.weight", "out.bias"])  # withheld: zero delta
    nan = {**trained, "out.bias": np.array([np.nan, 0.0], np.float32)}
    assert not history.add(0, "c", received, nan, ["out.weight", "out.bias"])
    assert not history.add_vector(0, "d", np.zeros(8))
    stored = history.round_updates(0)
    assert list(stored) == ["a"]  # no zero vector stored for b or d
    vector = stored["a"]
    assert vector.dtype == np.float64 and vector.shape == (8,)
    assert np.linalg.norm(vector) == pytest.approx(1.0)
    assert history.skipped(0)["b"] == WITHHELD
    assert "non-finite" in history.skipped(0)["c"] and history.skipped(0)["d"] == WITHHELD
    assert history.nbytes == 8 * 8
    with pytest.raises(ValueError, match="length"):
        history.add_vector(1, "a", np.ones(5))


def test_withheld_updates_are_left_out_of_the_evaluation():
    history = synthetic_history(4, 3, distinct=True, seed=0)
    history.skip(2, "col3", WITHHELD)  # the collaborator withheld this round's update
    record = evaluate_round(history, 2, attacks=("mlp",), seed=0)
    assert record["status"] == EVALUATED
    assert record["collaborators"] == ["col0", "col1", "col2"] and record["test_updates"] == 3
    assert record["skipped_updates"] == {"col3": WITHHELD}
    assert set(record["closed_world"]["reidentification"]["mlp"]["per_user_ap"]) == {"col0", "col1", "col2"}


# ------------------------------------------------------------------------------------------------ evaluate_round
def test_distinct_users_are_reidentified_well_above_chance():
    history = synthetic_history(5, 6, distinct=True, seed=1)
    record = evaluate_round(history, 5, seed=1)
    assert record["status"] == EVALUATED and record["history_rounds"] == [0, 1, 2, 3, 4]
    assert record["train_updates"] == 25 and record["test_updates"] == 5 and record["dimension"] == DIM
    closed = record["closed_world"]
    assert closed["errors"] == {}
    for attack, result in closed["reidentification"].items():
        # one update per user among 5: chance AP = H_5 / 5 = 0.457, so the best possible ratio is 2.19
        assert result["chance_ap"] == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5) / 5)
        # kNN (k = 10 among 5 updates per user) gives tied scores, which average_precision_score ranks pessimistically
        # (over seeds 0-19: mlp and svm 2.19 and top-1 1.0 every time, knn >= 1.53 and top-1 >= 0.6)
        assert result["ap_over_chance"] > (1.3 if attack == "knn" else 1.8), attack
        assert result["top1"] >= (0.5 if attack == "knn" else 0.8), attack
    assert closed["reidentification"]["mlp"]["top1"] == 1.0
    assert closed["matching"]["siamese"]["ap_over_chance"] > 1.4


@pytest.mark.slow
def test_users_from_one_distribution_are_reidentified_at_chance():
    ratios = {}
    for seed in range(6):
        record = evaluate_round(synthetic_history(5, 5, distinct=False, seed=seed), 4, seed=seed)
        for attack, ratio in reid_ratios(record).items():
            ratios.setdefault(attack, []).append(ratio)
        ratios.setdefault("siamese", []).append(record["closed_world"]["matching"]["siamese"]["ap_over_chance"])
    for attack, values in ratios.items():
        # kNN's scores are vote fractions, full of ties, and average_precision_score counts a tie as if every
        # negative in it came first: below chance on average (measured: about 0.6-0.8), never above.
        low = 0.3 if attack == "knn" else 0.6
        assert low <= np.mean(values) <= 1.6, (attack, values)


def test_the_first_rounds_only_build_history():
    history = synthetic_history(3, 3, distinct=True, seed=0)
    for round_num, stored in ((0, 0), (1, 1)):
        record = evaluate_round(history, round_num)
        assert record["status"] == BUILDING_HISTORY and record["closed_world"] is None
        assert f"{stored} earlier round(s)" in record["reason"]
    assert evaluate_round(history, 2)["status"] == EVALUATED
    assert evaluate_round(history, 2, min_history_rounds=3)["status"] == BUILDING_HISTORY


def test_a_round_with_one_update_is_skipped_with_a_reason():
    history = synthetic_history(3, 3, distinct=True, seed=0)
    history.skip(2, "col0", WITHHELD)
    history.skip(2, "col1", WITHHELD)
    record = evaluate_round(history, 2)
    assert record["status"] == SKIPPED and "1 update(s) this round" in record["reason"]


def test_open_world_with_six_collaborators():
    history = synthetic_history(6, 5, distinct=True, seed=2)
    record = evaluate_round(history, 4, seed=2)
    open_world = record["open_world"]
    assert open_world["status"] == EVALUATED and open_world["errors"] == {}
    split = open_world["split"]
    assert {k: len(v) for k, v in split.items()} == {"seen": 2, "holdout": 2, "unseen": 2}
    assert sorted(split["seen"] + split["holdout"] + split["unseen"]) == [f"col{u}" for u in range(6)]
    mlp = open_world["reidentification"]["mlp"]
    assert set(mlp["per_user_ap"]) == set(split["seen"]) | {"unseen"}  # holdout users only train
    assert mlp["test_updates"] == 4 and mlp["train_updates"] == 4 * 4  # 4 earlier rounds of seen + holdout
    assert mlp["ap_over_chance"] > 1.0 and 0.0 <= mlp["top1"] <= 1.0
    siamese = open_world["matching"]["siamese"]
    assert siamese["test_updates"] == 2 and math.isfinite(siamese["ap_over_chance"])
    assert list(open_world["reidentification"]) == ["mlp"]  # the paper's open-world attack
    # the split is seeded and the same in every round
    assert evaluate_round(history, 3, attacks=("mlp",), seed=2)["open_world"]["split"] == split
    assert open_world_split([f"col{u}" for u in range(6)], 2) == split


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 10, 30])
def test_open_world_split_sizes(n):
    split = open_world_split([f"c{i}" for i in range(n)], seed=0)
    assert all(len(v) >= 1 for v in split.values())
    assert sum(len(v) for v in split.values()) == n
    assert abs(len(split["holdout"]) - n / 3) <= 1


def test_fewer_than_three_collaborators_skip_the_open_world_with_a_reason():
    record = evaluate_round(synthetic_history(2, 4, distinct=True, seed=0), 3, seed=0)
    assert record["status"] == EVALUATED and record["closed_world"]["reidentification"]
    assert record["open_world"]["status"] == SKIPPED
    assert "at least 3" in record["open_world"]["reason"]


@pytest.mark.slow
def test_the_record_is_strict_json_without_update_vectors(tmp_path):
    record = evaluate_round(synthetic_history(4, 4, distinct=True, seed=0), 3, seed=0)
    text = json.dumps(record, allow_nan=False)
    assert not _long_number_lists(json.loads(text))
    writer = DeanonReportWriter(tmp_path)
    for round_num in range(4):
        writer.write_round(evaluate_round(synthetic_history(4, 4, distinct=True, seed=0), round_num, seed=0))
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [r["status"] for r in rows] == [BUILDING_HISTORY, BUILDING_HISTORY, EVALUATED, EVALUATED]
    assert float(rows[-1]["closed_mlp_ap_over_chance"]) > 1 and rows[0]["closed_mlp_ap_over_chance"] == ""
    assert (tmp_path / "ap_over_chance.png").stat().st_size > 0
    assert not list(tmp_path.glob(".*.tmp"))


def _long_number_lists(value) -> list:
    """Lists of more than 16 numbers anywhere in a JSON value (an update vector would be one)."""
    found = []
    if isinstance(value, dict):
        for v in value.values():
            found += _long_number_lists(v)
    elif isinstance(value, list):
        if len(value) > 16 and all(isinstance(v, (int, float)) for v in value):
            found.append(value)
        for v in value:
            found += _long_number_lists(v)
    return found


# ------------------------------------------------------------------------------------------------ settings, layer
def test_deanon_settings_default_to_disabled_and_are_checked_by_dotted_key():
    assert AggregatorSettings.from_mapping({}).deanon == DeanonServerSettings()
    assert not DeanonServerSettings().enabled
    settings = AggregatorSettings.from_mapping({"deanon": {"enabled": True, "attacks": ["mlp", "siamese"],
                                                           "layer": "classifier.out", "seed": 3}}).deanon
    assert settings.attacks == ("mlp", "siamese") and settings.layer == "classifier.out" and settings.seed == 3


@pytest.mark.parametrize("deanon, key, expected", [
    ("yes", "deanon", "expected a mapping"),
    ({"enabled": "true"}, "deanon.enabled", "true or false"),
    ({"layer": ""}, "deanon.layer", "module name"),
    ({"attacks": []}, "deanon.attacks", "non-empty list"),
    ({"attacks": "mlp"}, "deanon.attacks", "non-empty list"),
    ({"attacks": ["mlp", "forest"]}, "deanon.attacks", "unknown attack 'forest'"),
    ({"attacks": ["mlp", "mlp"]}, "deanon.attacks", "listed twice"),
    ({"min_history_rounds": 0}, "deanon.min_history_rounds", ">= 1"),
    ({"min_history_rounds": 2.0}, "deanon.min_history_rounds", ">= 1"),
    ({"seed": -1}, "deanon.seed", ">= 0"),
    ({"interval": 2}, "deanon.interval", "unknown setting"),
])
def test_bad_deanon_settings_name_their_key(deanon, key, expected):
    with pytest.raises(ValueError) as err:
        AggregatorSettings.from_mapping({"deanon": deanon})
    assert str(err.value).startswith(f"aggregator.settings.{key}:") and expected in str(err.value)


def test_the_callback_checks_its_settings_the_same_way(tmp_path):
    with pytest.raises(ValueError, match=r"^aggregator\.settings\.deanon\.min_history_rounds:"):
        DeanonymizationCallback(tmp_path, min_history_rounds=0)
    assert DeanonymizationCallback(tmp_path).root == tmp_path / "deanon"


def test_default_and_configured_layers_resolve_to_the_runner_tensor_names():
    names = ["model.features.conv1.weight", "model.features.conv1.bias", "model.classifier.fc1.weight",
             "model.classifier.fc1.bias", "model.classifier.out.weight", "model.classifier.out.bias",
             "__opt_state_0_step"]
    assert default_layer(names) == "model.classifier.out"
    out = ("model.classifier.out", ["model.classifier.out.weight", "model.classifier.out.bias"])
    assert resolve_layer(names, "model.classifier.out") == out
    assert resolve_layer(names, "classifier.out") == out  # as named inside the network
    assert resolve_layer(names, "fc1") == ("model.classifier.fc1", names[2:4])
    with pytest.raises(ValueError, match="no tensor of module 'classifier.nope'"):
        resolve_layer(names, "classifier.nope")


# ------------------------------------------------------------------------------------------------ federation
FEDERATION_ROUNDS = 4
FEDERATION_OVERRIDES = {
    "aggregator": {"settings": {"deanon": {"enabled": True}}},
    "tasks": {"train": {"kwargs": {"epochs": 1}}},
    "data_loader": {"settings": {"dataset": "digits", "dirichlet_alpha": 0.1}},
    "task_runner": {"settings": {"model": "cnn", "audit": {"enabled": False}}},
}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    # The deanonymization report (written by its callback as the rounds end) is read, not the aggregator's pages.
    with no_report_drawing():
        return run_in_process(tmp_path_factory.mktemp("deanon_fed"), collaborators=4, rounds=FEDERATION_ROUNDS,
                              overrides=FEDERATION_OVERRIDES)


@pytest.mark.federation
def test_federation_writes_the_deanonymization_report(federation):
    callback = federation.aggregator.deanon
    assert isinstance(callback, DeanonymizationCallback)
    assert callback.errors == [] and federation.aggregator.report.errors == []
    assert callback.module == "model.classifier.out"
    assert callback.tensor_names == ["model.classifier.out.weight", "model.classifier.out.bias"]
    folder = federation.aggregator_report_dir / "deanon"
    assert callback.root == folder
    records = {r: json.loads((folder / f"round_{r:04d}.json").read_text()) for r in range(FEDERATION_ROUNDS)}
    # on_round_end(r) counts rounds from 0: rounds 0 and 1 build the history, 2 and 3 are attacked
    assert [records[r]["status"] for r in range(FEDERATION_ROUNDS)] == [
        BUILDING_HISTORY, BUILDING_HISTORY, EVALUATED, EVALUATED]
    names = collaborator_names(4)
    for r in (2, 3):
        record = records[r]
        assert record["collaborators"] == names and record["skipped_updates"] == {}
        assert record["history_rounds"] == list(range(r)) and record["train_updates"] == 4 * r
        assert record["dimension"] == 10 * 64 + 10  # classifier.out: weight (10, 64) + bias (10,)
        closed = record["closed_world"]
        assert closed["errors"] == {} and set(closed["reidentification"]) == {"mlp", "svm", "knn"}
        for result in [*closed["reidentification"].values(), *closed["matching"].values()]:
            assert math.isfinite(result["ap_over_chance"]) and result["ap_over_chance"] > 0
        # strongly non-IID collaborators: their last-layer updates give them away
        assert max(reid_ratios(record).values()) > 1.0
        open_world = record["open_world"]
        assert open_world["status"] == EVALUATED and open_world["errors"] == {}
        assert math.isfinite(open_world["reidentification"]["mlp"]["ap_over_chance"])
        assert math.isfinite(open_world["matching"]["siamese"]["ap_over_chance"])
        assert not _long_number_lists(record)
    rows = list(csv.DictReader((folder / "summary.csv").open()))
    assert [int(row["round"]) for row in rows] == list(range(FEDERATION_ROUNDS))
    assert float(rows[3]["closed_mlp_ap_over_chance"]) == pytest.approx(
        records[3]["closed_world"]["reidentification"]["mlp"]["ap_over_chance"])
    assert (folder / "ap_over_chance.png").stat().st_size > 0
    # the history keeps a few KB per collaborator and round
    assert callback.history.nbytes == FEDERATION_ROUNDS * 4 * (10 * 64 + 10) * 8


def test_the_audit_is_off_unless_enabled(tmp_path):
    from workspace.in_process import parse_plan
    from workspace.plan_file import write_run_plan

    plan = parse_plan(write_run_plan(tmp_path, collaborators=2, rounds=1))
    aggregator = plan.get_aggregator(tensor_dict={"w": np.zeros(3, np.float32)})
    assert aggregator.deanon is None
    assert not any(isinstance(c, DeanonymizationCallback) for c in aggregator.callbacks.callbacks)


def test_the_callback_reads_the_round_from_the_tensor_db_and_skips_withheld_updates(tmp_path):
    """The TensorDB rows an OpenFL 1.9 aggregator holds at on_round_end(r) (see src/server/deanon_callback.py)."""
    from openfl.databases import TensorDB
    from openfl.utilities import TensorKey

    rng = np.random.default_rng(0)
    names = {"model.features.conv1.weight": (4, 2), "model.classifier.out.weight": (3, 4),
             "model.classifier.out.bias": (3,)}
    cols = ["collaborator1", "collaborator2", "collaborator3"]
    directions = {c: {n: rng.normal(size=shape) for n, shape in names.items()} for c in cols}
    db = TensorDB()
    model = {n: rng.normal(size=shape).astype(np.float32) for n, shape in names.items()}
    callback = DeanonymizationCallback(tmp_path, attacks=["mlp", "svm"], seed=1)
    callback.set_tensor_db(db)
    for r in range(3):
        rows = {TensorKey(n, "agg", r, False, ("model",)): a for n, a in model.items()}
        for c in cols:
            withheld = r == 2 and c == "collaborator3"
            for n, a in model.items():
                trained = a if withheld else (a + 0.1 * directions[c][n] + 0.01 * rng.normal(size=a.shape))
                rows[TensorKey(n, "agg", r, False, (c, "trained"))] = np.asarray(trained, np.float32)
        nxt = {n: (a + 0.05).astype(np.float32) for n, a in model.items()}
        for n, a in nxt.items():  # the aggregated result and the next round's model: not updates
            rows[TensorKey(n, "agg", r, False, ("trained",))] = a
            rows[TensorKey(n, "agg", r + 1, False, ("model",))] = a
        rows[TensorKey("gate_kept", "agg", r, True, ("collaborator1", "metric"))] = np.array(1.0)
        db.cache_tensor(rows)
        callback.on_round_end(r, {})
        model = nxt
    assert callback.errors == []
    assert callback.module == "model.classifier.out"
    assert callback.tensor_names == ["model.classifier.out.weight", "model.classifier.out.bias"]
    record = json.loads((tmp_path / "deanon" / "round_0002.json").read_text())
    assert record["status"] == EVALUATED
    assert record["updates_received"] == cols  # collaborator3 sent its (unchanged) weights ...
    assert record["collaborators"] == cols[:2] and record["skipped_updates"] == {"collaborator3": WITHHELD}  # ... skipped
    assert record["dimension"] == 3 * 4 + 3 and record["history_rounds"] == [0, 1]
    assert set(callback.history.round_updates(2)) == set(cols[:2])
    assert record["closed_world"]["reidentification"]["mlp"]["top1"] == 1.0
    assert record["layer"]["rule"] == "module of the model's last tensor"


class _BrokenDB:
    tensor_db = None  # anything the callback reads from it fails


def test_a_failing_audit_is_recorded_and_never_raised(tmp_path):
    callback = DeanonymizationCallback(tmp_path)
    callback.set_tensor_db(_BrokenDB())
    callback.on_round_end(0, {})  # must not raise
    assert len(callback.errors) == 1 and callback.errors[0].startswith("round 0:")
    record = json.loads((tmp_path / "deanon" / "round_0000.json").read_text())
    assert record["status"] == "error"
