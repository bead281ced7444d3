"""src.server.tensordb.IndexedTensorDB against OpenFL's TensorDB (the reference): the same operations, the same
answers, on random histories with duplicates, metric rows, the round placeholder and unhashable tags."""

import random

import numpy as np
import pytest
from openfl.databases import TensorDB
from openfl.databases.utilities import ROUND_PLACEHOLDER
from openfl.interface.aggregation_functions import AggregationFunction, Median, WeightedAverage
from openfl.utilities import TensorKey

from src.aggregation import GatedWeightedAverage
from src.server.tensordb import IndexedTensorDB

NAMES = ["conv.weight", "fc.bias", "accuracy", "gate_kept"]
ORIGINS = ["agg-uuid", "c1", "c2"]
TAGS = [("model",), ("trained",), ("metric",), ("aggregated",), ("c1", "trained"), ("c2", "trained"),
        ("c1", "metric"), ("c2", "metric"), ("trained", "c1"), ()]


class RecordingAverage(AggregationFunction):
    """WeightedAverage that also records the history it is given (round, name, tags, array) per round."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def call(self, local_tensors, db_iterator, tensor_name, fl_round, tags):
        rows = [(int(r["round"]), r["tensor_name"], tuple(r["tags"]), np.asarray(r["nparray"]).tolist())
                for r in db_iterator]
        rounds = [r[0] for r in rows]
        assert rounds == sorted(rounds, reverse=True)  # newest round first, as OpenFL's _iterate
        self.seen.append(sorted(rows, key=repr))  # the order inside a round is unspecified in OpenFL's
        return WeightedAverage()(local_tensors, iter(()), tensor_name, fl_round, tags)


def random_key(rng):
    round_number = rng.choice([0, 1, 2, 3, 4, ROUND_PLACEHOLDER]) if rng.random() < 0.05 else rng.randint(0, 4)
    return TensorKey(rng.choice(NAMES), rng.choice(ORIGINS), round_number, rng.random() < 0.3, rng.choice(TAGS))


def random_array(rng, shape):
    return np.array([rng.uniform(-2, 2) for _ in range(int(np.prod(shape)))], dtype=np.float32).reshape(shape)


def assert_same_frame(ours, reference):
    a, b = ours.tensor_db, reference.tensor_db
    assert list(a.columns) == list(b.columns)
    assert len(a) == len(b)
    for column in ["tensor_name", "origin", "round", "report", "tags"]:
        assert a[column].tolist() == b[column].tolist(), column
        assert a[column].dtype == b[column].dtype, column
    for x, y in zip(a["nparray"], b["nparray"]):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def same(x, y):
    if x is None or y is None:
        return x is None and y is None
    if isinstance(x, tuple):  # OpenFL returns (array, {}) for a tensor already aggregated
        return isinstance(y, tuple) and same(x[0], y[0]) and x[1] == y[1]
    return np.array_equal(np.asarray(x), np.asarray(y)) and np.asarray(x).dtype == np.asarray(y).dtype


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.slow
def test_every_answer_matches_openfls_tensordb(seed):
    rng = random.Random(seed)
    ours, reference = IndexedTensorDB(), TensorDB()
    shape = rng.choice([(3,), (2, 2), ()])  # scalars too: metrics are 0-d arrays
    for step in range(400):
        op = rng.random()
        if op < 0.45:
            batch = {random_key(rng): random_array(rng, shape) for _ in range(rng.randint(1, 4))}
            ours.cache_tensor(batch)
            reference.cache_tensor(batch)
        elif op < 0.7:
            key = random_key(rng)
            assert same(ours.get_tensor_from_cache(key), reference.get_tensor_from_cache(key)), key
        elif op < 0.85:
            key = random_key(rng)
            weights = {"c1": 0.25, "c2": 0.75} if rng.random() < 0.8 else {"c1": 1.0}
            function = rng.choice([WeightedAverage(), Median(), "recording"])
            if function == "recording":
                mine, theirs = RecordingAverage(), RecordingAverage()
            else:
                mine = theirs = function
            got = ours.get_aggregated_tensor(key, weights, mine)
            want = reference.get_aggregated_tensor(key, weights, theirs)
            assert same(got, want), (key, got, want)
            if function == "recording":
                assert mine.seen == theirs.seen
        elif op < 0.9:
            round_number, tags = rng.randint(0, 4), rng.choice(TAGS)
            got = ours.get_tensors_by_round_and_tags(round_number, tags)
            want = reference.get_tensors_by_round_and_tags(round_number, tags)
            assert list(got) == list(want)
            assert all(np.array_equal(got[k], want[k]) for k in got)
        elif op < 0.97:
            keep = rng.choice([-1, 1, 2, 3])
            ours.clean_up(keep)
            reference.clean_up(keep)
        else:
            assert_same_frame(ours, reference)
    assert_same_frame(ours, reference)
    assert len(ours.tensor_db) > 0  # the history was not emptied along the way: the comparisons saw rows


def test_keys_match_as_pandas_compares_them():
    """1 == 1.0 == np.int64(1), False == 0 and np.bool_(False) match, as in pandas' masks. (Tags given as a list
    make OpenFL's pandas comparison fail or compare element-wise: not a key OpenFL supports, not tested.)"""
    ours, reference = IndexedTensorDB(), TensorDB()
    stored = {TensorKey("w", "c1", 1, False, ("model",)): np.ones(2), TensorKey("v", "c1", 2, True, ("x", "y")): np.zeros(1)}
    ours.cache_tensor(stored)
    reference.cache_tensor(stored)
    for key in [TensorKey("w", "c1", 1.0, 0, ("model",)), TensorKey("w", "c1", np.int64(1), np.bool_(False), ("model",)),
                TensorKey("v", "c1", 2, True, ("x", "y")), TensorKey("v", "c1", 2, 1, ("x", "y")),
                TensorKey("w", "c2", 1, False, ("model",))]:
        assert same(ours.get_tensor_from_cache(key), reference.get_tensor_from_cache(key)), key


def test_gated_average_and_the_frame_callbacks_read_are_openfls():
    """The workspace's own aggregation (which reads the whole history) and the frame the aggregator's report reads."""
    ours, reference = IndexedTensorDB(), TensorDB()
    rng = random.Random(7)
    for round_number in range(3):
        rows = {TensorKey("w", "agg", round_number, False, ("model",)): random_array(rng, (4,))}
        for col, kept in (("c1", 1.0), ("c2", 0.0 if round_number == 1 else 1.0)):
            rows[TensorKey("w", "agg", round_number, False, (col, "trained"))] = random_array(rng, (4,))
            rows[TensorKey("gate_kept", "agg", round_number, True, (col, "metric"))] = np.array(kept)
        ours.cache_tensor(rows)
        reference.cache_tensor(rows)
        key = TensorKey("w", "agg", round_number, False, ("trained",))
        got = ours.get_aggregated_tensor(key, {"c1": 0.5, "c2": 0.5}, GatedWeightedAverage())
        want = reference.get_aggregated_tensor(key, {"c1": 0.5, "c2": 0.5}, GatedWeightedAverage())
        np.testing.assert_array_equal(got, want)
        ours.clean_up(2)
        reference.clean_up(2)
        assert_same_frame(ours, reference)


def test_convert_keeps_the_object_and_its_rows():
    db = TensorDB()
    db.cache_tensor({TensorKey("w", "agg", 0, False, ("model",)): np.arange(3.0)})
    holder = [db]  # e.g. OpenFL's callbacks, given the aggregator's TensorDB when it is built
    converted = IndexedTensorDB.convert(db)
    assert converted is db and isinstance(holder[0], IndexedTensorDB)
    np.testing.assert_array_equal(holder[0].get_tensor_from_cache(TensorKey("w", "agg", 0, False, ("model",))),
                                  np.arange(3.0))


def test_a_frame_read_is_a_snapshot_and_assigning_one_replaces_the_rows():
    db = IndexedTensorDB()
    db.cache_tensor({TensorKey("w", "agg", 0, False, ("model",)): np.arange(3.0)})
    frame = db.tensor_db
    db.cache_tensor({TensorKey("w", "agg", 1, False, ("model",)): np.ones(3)})
    assert len(frame) == 1 and len(db.tensor_db) == 2
    db.tensor_db = frame
    assert db.get_tensor_from_cache(TensorKey("w", "agg", 1, False, ("model",))) is None
    assert len(db.tensor_db) == 1


class PrivilegedSum(AggregationFunction):
    """A privileged function (OpenFL's experimental kind): it is handed the frame itself, and writes into it."""

    def __init__(self):
        super().__init__()
        self._privileged = True

    def call(self, local_tensors, tensor_db, tensor_name, fl_round, tags):
        total = sum(lt.tensor for lt in local_tensors)
        tensor_db.loc[len(tensor_db)] = ["written", "agg", fl_round, False, ("by_function",), total]
        return total


def test_a_privileged_function_gets_openfls_own_frame_path():
    ours, reference = IndexedTensorDB(), TensorDB()
    rows = {TensorKey("w", "agg", 0, False, (col, "trained")): np.full(2, i + 1.0) for i, col in enumerate(["c1", "c2"])}
    ours.cache_tensor(rows)
    reference.cache_tensor(rows)
    key = TensorKey("w", "agg", 0, False, ("trained",))
    got = ours.get_aggregated_tensor(key, {"c1": 0.5, "c2": 0.5}, PrivilegedSum())
    want = reference.get_aggregated_tensor(key, {"c1": 0.5, "c2": 0.5}, PrivilegedSum())
    np.testing.assert_array_equal(got, want)
    written = TensorKey("written", "agg", 0, False, ("by_function",))
    np.testing.assert_array_equal(ours.get_tensor_from_cache(written), reference.get_tensor_from_cache(written))
    assert_same_frame(ours, reference)



def test_dropping_the_next_models_copies_keeps_everything_else():
    """drop_model_copies: the ('aggregated',) and ('aggregated', 'delta') rows of the round from the origin go; the
    model, other rounds, other origins and metric rows stay, and every answer about them is the same."""
    db = IndexedTensorDB()
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    gone = [TensorKey("w", "agg", 2, False, ("aggregated",)), TensorKey("w", "agg", 2, False, ("aggregated", "delta"))]
    kept = [TensorKey("w", "agg", 2, False, ("model",)), TensorKey("w", "agg", 1, False, ("aggregated",)),
            TensorKey("w", "c1", 2, False, ("aggregated",)), TensorKey("w", "agg", 2, True, ("aggregated",)),
            TensorKey("w", "agg", 2, False, ("trained",))]
    db.cache_tensor({key: w + i for i, key in enumerate(gone + kept)})
    before = {k: db.get_tensor_from_cache(k).copy() for k in kept}
    assert db.drop_model_copies(2, "agg") == 2 * w.nbytes
    assert all(db.get_tensor_from_cache(k) is None for k in gone)
    assert all(db.get_tensor_from_cache(k).tobytes() == v.tobytes() for k, v in before.items())
    assert len(db.tensor_db) == len(kept)
    assert db.drop_model_copies(2, "agg") == 0


def test_dropping_earlier_rounds_reports_keeps_everything_else():
    """drop_reports_before: the metric rows of rounds before the given one go (OpenFL's clean_up keeps them for the
    whole run, so the store grew with the rounds); tensors of any round and later metrics stay, with their answers."""
    db = IndexedTensorDB()
    w = np.arange(6, dtype=np.float32)
    for r in range(4):
        db.cache_tensor({TensorKey("acc", "c1", r, True, ("metric", "c1")): np.array(0.1 * r),
                         TensorKey("acc", "agg", r, True, ("metric",)): np.array(0.2 * r),
                         TensorKey("w", "agg", r, False, ("model",)): w + r})
    assert db.drop_reports_before(2) == 4
    left = {(k.tensor_name, k.origin, k.round_number) for k in db.get_tensors_by_filter()}
    assert left == {("acc", "c1", 2), ("acc", "agg", 2), ("acc", "c1", 3), ("acc", "agg", 3),
                    *(("w", "agg", r) for r in range(4))}
    assert db.get_tensor_from_cache(TensorKey("w", "agg", 0, False, ("model",))).tobytes() == w.tobytes()
    assert float(db.get_tensor_from_cache(TensorKey("acc", "agg", 3, True, ("metric",)))) == pytest.approx(0.6)
    assert db.drop_reports_before(2) == 0
