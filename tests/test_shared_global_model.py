"""workspace/shared_global_model.py: in one process each party's received global model is the aggregator's own
arrays (read-only views, no copies): the same fields and values as the NamedTensor the aggregator would send, and the
same metrics and models as when each party decodes its own copy; any other request is the aggregator's to answer."""

import numpy as np
import pytest
from openfl.component import Aggregator, Collaborator
from openfl.pipelines import NoCompressionPipeline, TensorCodec
from openfl.pipelines.stc_pipeline import STCPipeline
from openfl.utilities import TensorKey

import workspace.in_process as in_process
from report_drawing import without_report_drawing  # noqa: F401  (a fixture)
from workspace.in_process import run_in_process
from workspace.shared_global_model import shared_global_tensor

OVERRIDES = {
    "tasks": {"train": {"kwargs": {"epochs": 1}}},
    "data_loader": {"settings": {"dataset": "digits", "seed": 2, "train_dataset_ratio": 0.1,
                                 "test_dataset_ratio": 0.45, "audit_dataset_ratio": 0.45}},
    "task_runner": {"settings": {"seed": 2, "audit": {"signals": ["loss"], "fpr_tolerance": [0.1],
                                                      "rmia": {"enabled": False}}}},
}


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")
def test_each_party_reads_the_aggregators_arrays_as_the_named_tensor_would_give_them(tmp_path, monkeypatch):
    given, fetched = {}, {}
    real_fetch = Collaborator.get_aggregated_tensor_from_aggregator

    def recording_share(aggregator, requested_by, name, round_number, report, tags, require_lossless):
        shared = shared_global_tensor(aggregator, requested_by, name, round_number, report, tags, require_lossless)
        if shared is not None:  # what the aggregator itself would have sent
            sent = aggregator.get_aggregated_tensor(name, round_number, report, tags, require_lossless, requested_by)
            assert (shared.name, shared.round_number, shared.report, shared.lossless, tuple(shared.tags)) == (
                sent.name, sent.round_number, sent.report, sent.lossless, tuple(sent.tags))
            assert [list(m.int_list) for m in shared.transformer_metadata] == [
                list(m.int_list) for m in sent.transformer_metadata]
            assert [dict(m.int_to_float) for m in sent.transformer_metadata] == [{}]
            assert not any(m.bool_list for m in sent.transformer_metadata)
            assert bytes(shared.data_bytes) == sent.data_bytes
            array = aggregator.tensor_db.get_tensor_from_cache(TensorKey(name, aggregator.uuid, round_number,
                                                                         report, tags))
            given.setdefault((name, round_number), []).append(array)
        return shared

    def recording_fetch(self, tensor_key, require_lossless=False):
        array = real_fetch(self, tensor_key, require_lossless)
        fetched.setdefault((tensor_key.tensor_name, tensor_key.round_number), []).append(array)
        return array

    monkeypatch.setattr(Collaborator, "get_aggregated_tensor_from_aggregator", recording_fetch)
    monkeypatch.setattr(in_process, "shared_global_tensor", recording_share)
    shared = run_in_process(tmp_path / "shared", collaborators=2, rounds=2, overrides=OVERRIDES)
    # every model tensor of every round, to both parties, each the aggregator's array, read-only
    assert given and set(given) == set(fetched)
    assert {round_number for _, round_number in given} == {0, 1, 2}  # 2: the final model, read for its audit
    for key, arrays in given.items():
        assert len(arrays) == len(fetched[key]) == 2
        for array, party_array in zip(arrays, fetched[key]):
            assert np.shares_memory(party_array, array) and not party_array.flags.writeable
            assert party_array.dtype == np.float32 and party_array.shape == array.shape

    monkeypatch.setattr(in_process, "shared_global_tensor", lambda *args: None)
    copied = run_in_process(tmp_path / "copied", collaborators=2, rounds=2, overrides=OVERRIDES)
    assert shared.collaborator_metrics == copied.collaborator_metrics
    assert shared.round_logs == copied.round_logs
    for name in ("collaborator1", "collaborator2"):
        mine, theirs = shared.runner(name).model.state_dict(), copied.runner(name).model.state_dict()
        assert all(np.array_equal(mine[k].numpy(), theirs[k].numpy()) for k in mine)


KEY = TensorKey("w", "agg-uuid", 4, False, ("model",))


def aggregator_with(array, pipeline=None, authorized=("collaborator1", "collaborator2")):
    class Store:
        def get_tensor_from_cache(self, key):
            return array if key == KEY else None

    def check_tags(tags, allowed):  # OpenFL's Aggregator._check_tags
        return not any(tag in authorized and tag != allowed for tag in tags)

    class StandIn(Aggregator):  # OpenFL's answers (get_aggregated_tensor, _nparray_to_named_tensor), no set-up
        pass

    aggregator = object.__new__(StandIn)
    aggregator.__dict__.update(uuid="agg-uuid", tensor_codec=TensorCodec(pipeline or NoCompressionPipeline()),
                               tensor_db=Store(), _check_tags=check_tags)
    return aggregator


def test_the_shared_array_decodes_as_the_bytes_do_and_stays_the_aggregators():
    array = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    shared = shared_global_tensor(aggregator_with(array), "collaborator1", "w", 4, False, ("model",), True)
    codec = TensorCodec(NoCompressionPipeline())
    key = TensorKey("w", "collaborator1", 4, False, shared.tags)
    _, decoded = codec.decompress(key, shared.data_bytes, [{"int_list": [5, 3]}], require_lossless=True)
    assert decoded.tobytes() == array.tobytes() and decoded.shape == (5, 3) and decoded.dtype == np.float32
    assert np.shares_memory(decoded, array) and not decoded.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        decoded[0, 0] = 1.0
    assert array.flags.writeable  # the aggregator's own array is left as it was


@pytest.mark.parametrize("case", ["float64", "fortran", "lossy pipeline's own", "another request", "a metric",
                                  "lossy allowed", "another party's tag", "not held", "its own answer"])
def test_any_other_request_is_left_to_the_aggregator(case):
    array = np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32)
    args = {"requested_by": "collaborator1", "tensor_name": "w", "round_number": 4, "report": False,
            "tags": ("model",), "require_lossless": True}
    pipeline = None
    if case == "float64":
        array = array.astype(np.float64)
    if case == "fortran":
        array = np.asfortranarray(array)
    if case == "lossy pipeline's own":  # STC's lossless pipeline is a plain one: a changed one is not
        pipeline = STCPipeline()
    if case == "another request":
        args["tags"] = ("aggregated", "delta")
    if case == "a metric":
        args["report"] = True
    if case == "lossy allowed":
        args["require_lossless"] = False
    if case == "another party's tag":
        args["tags"] = ("model", "collaborator2")
    if case == "not held":
        args["round_number"] = 5
    aggregator = aggregator_with(array, pipeline)
    if case == "its own answer":  # a plan's aggregator that answers otherwise than OpenFL's (e.g. a dishonest one)
        assert shared_global_tensor(aggregator, **args) is not None
        aggregator.__class__ = type("OwnAnswer", (type(aggregator),), {"_nparray_to_named_tensor": lambda *a: None})
    if case == "lossy pipeline's own":
        assert shared_global_tensor(aggregator, **args) is not None  # plain float32 bytes: shared
        aggregator.tensor_codec.lossless_pipeline.transformers.append(object())
    assert shared_global_tensor(aggregator, **args) is None
