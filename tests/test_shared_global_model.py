"""workspace/shared_global_model.py: in one process each party's received global model is the aggregator's own
arrays (read-only views, no copies), with the same metrics as when each party decodes its own copy; tensors whose
bytes are not exactly an array's (another pipeline, deltas, other dtypes) cross as NamedTensors."""

import numpy as np
import pytest
from openfl.component import Collaborator
from openfl.pipelines import NoCompressionPipeline, TensorCodec
from openfl.pipelines.stc_pipeline import STCPipeline
from openfl.protocols import utils
from openfl.utilities import TensorKey

import workspace.in_process as in_process
from report_drawing import without_report_drawing  # noqa: F401  (a fixture)
from workspace.in_process import run_in_process
from workspace.shared_global_model import SharedNamedTensor, shared_or_sent

OVERRIDES = {
    "tasks": {"train": {"kwargs": {"epochs": 1}}},
    "data_loader": {"settings": {"dataset": "digits", "seed": 2, "train_dataset_ratio": 0.1,
                                 "test_dataset_ratio": 0.45, "audit_dataset_ratio": 0.45}},
    "task_runner": {"settings": {"seed": 2, "audit": {"signals": ["loss"], "fpr_tolerance": [0.1],
                                                      "rmia": {"enabled": False}}}},
}


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")
def test_each_party_reads_the_aggregators_arrays_with_the_same_metrics(tmp_path, monkeypatch):
    given, fetched = {}, {}
    real_fetch = Collaborator.get_aggregated_tensor_from_aggregator

    def recording_share(aggregator, named_tensor):
        result = shared_or_sent(aggregator, named_tensor)
        if isinstance(result, SharedNamedTensor):
            given[(named_tensor.name, named_tensor.round_number)] = aggregator.tensor_db.get_tensor_from_cache(
                TensorKey(named_tensor.name, aggregator.uuid, named_tensor.round_number, named_tensor.report,
                          tuple(t for t in named_tensor.tags if t != "compressed")))
        return result

    def recording_fetch(self, tensor_key, require_lossless=False):
        array = real_fetch(self, tensor_key, require_lossless)
        fetched.setdefault((tensor_key.tensor_name, tensor_key.round_number), []).append(array)
        return array

    monkeypatch.setattr(Collaborator, "get_aggregated_tensor_from_aggregator", recording_fetch)
    monkeypatch.setattr(in_process, "shared_or_sent", recording_share)
    shared = run_in_process(tmp_path / "shared", collaborators=2, rounds=2, overrides=OVERRIDES)
    # every model tensor of every round, to both parties
    assert given and set(given) == set(fetched)
    assert {round_number for _, round_number in given} == {0, 1}
    for key, array in given.items():
        assert len(fetched[key]) == 2  # both parties read the same array, read-only, as OpenFL's copy would be
        for party_array in fetched[key]:
            assert np.shares_memory(party_array, array) and not party_array.flags.writeable
            assert party_array.dtype == np.float32 and party_array.shape == array.shape

    monkeypatch.setattr(in_process, "shared_or_sent", lambda aggregator, named_tensor: named_tensor)
    copied = run_in_process(tmp_path / "copied", collaborators=2, rounds=2, overrides=OVERRIDES)
    assert shared.collaborator_metrics == copied.collaborator_metrics
    assert shared.round_logs == copied.round_logs
    for name in ("collaborator1", "collaborator2"):
        mine, theirs = shared.runner(name).model.state_dict(), copied.runner(name).model.state_dict()
        assert all(np.array_equal(mine[k].numpy(), theirs[k].numpy()) for k in mine)


class Store:
    def __init__(self, arrays):
        self.arrays = arrays

    def get_tensor_from_cache(self, key):
        return self.arrays.get(key)


def aggregator_with(array, pipeline):
    from types import SimpleNamespace

    key = TensorKey("w", "agg-uuid", 4, False, ("model",))
    aggregator = SimpleNamespace(uuid="agg-uuid", tensor_codec=TensorCodec(pipeline), tensor_db=Store({key: array}))
    compressed_key, data, metadata = aggregator.tensor_codec.compress(key, array, require_lossless=True)
    return aggregator, utils.construct_named_tensor(compressed_key, data, metadata, lossless=True)


def test_the_shared_array_decodes_as_the_bytes_do():
    array = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    aggregator, named_tensor = aggregator_with(array, NoCompressionPipeline())
    shared = shared_or_sent(aggregator, named_tensor)
    assert isinstance(shared, SharedNamedTensor) and shared.name == "w" and shared.round_number == 4
    codec = TensorCodec(NoCompressionPipeline())
    key = TensorKey("w", "col", 4, False, tuple(named_tensor.tags))
    def metadata():  # a new list each time: the pipeline's backward takes its entries out
        return [{"int_list": list(named_tensor.transformer_metadata[0].int_list)}]

    _, from_bytes = codec.decompress(key, named_tensor.data_bytes, metadata(), require_lossless=True)
    _, from_array = codec.decompress(key, shared.data_bytes, metadata(), require_lossless=True)
    assert from_array.tobytes() == from_bytes.tobytes() and from_array.shape == from_bytes.shape == (5, 3)
    assert np.shares_memory(from_array, array) and not from_array.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        from_array[0, 0] = 1.0
    assert array.flags.writeable  # the aggregator's own array is left as it was


@pytest.mark.parametrize("case", ["float64", "fortran", "other pipeline", "lossy", "delta"])
def test_anything_but_an_arrays_own_bytes_crosses_as_the_named_tensor(case):
    array = np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32)
    pipeline = NoCompressionPipeline()
    if case == "float64":
        array = array.astype(np.float64)
    if case == "fortran":
        array = np.asfortranarray(array)
    if case == "other pipeline":
        pipeline = STCPipeline()  # lossy: its lossless pipeline is a NoCompressionPipeline of OpenFL's own
        pipeline_check = TensorCodec(pipeline)
        assert type(pipeline_check.lossless_pipeline) is NoCompressionPipeline
    aggregator, named_tensor = aggregator_with(array, pipeline)
    if case == "other pipeline":
        aggregator.tensor_codec.lossless_pipeline.transformers.append(object())  # not the plain float32 bytes
    if case == "lossy":
        named_tensor.lossless = False
    if case == "delta":
        named_tensor.tags.append("delta")
    assert shared_or_sent(aggregator, named_tensor) is named_tensor
