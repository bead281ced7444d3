"""src.collaborator.AuditingCollaborator.send_task_results: what OpenFL 1.9's Collaborator sends (the same
NamedTensors, byte for byte, the same data size) and returns (the same metrics), with each NamedTensor made when the
client reads it (src.process.named_tensors), so that no list of them is held while the aggregator processes them."""

from types import SimpleNamespace

import numpy as np
import pytest
from openfl.component import Collaborator
from openfl.databases import TensorDB
from openfl.pipelines import NoCompressionPipeline, TensorCodec
from openfl.protocols import aggregator_pb2, base_pb2
from openfl.utilities import TensorKey

from src.collaborator import AuditingCollaborator
from src.process.named_tensors import NamedTensorsOnRead


class RecordingClient:
    """Reads the results as OpenFL's aggregator does (once, in order), noting how many NamedTensors had been made
    when each was read."""

    def __init__(self, party):
        self.party = party
        self.sent = []

    def send_local_task_results(self, round_number, task_name, data_size, named_tensors):
        read = []
        for named_tensor in named_tensors:
            read.append((named_tensor.SerializeToString(), self.party.made))
        self.sent.append({"round": round_number, "task": task_name, "data_size": data_size, "read": read,
                          "tensors": named_tensors})


def party(use_delta_updates=False):
    rng = np.random.default_rng(0)
    state = SimpleNamespace(collaborator_name="collaborator1", use_delta_updates=use_delta_updates,
                            tensor_codec=TensorCodec(NoCompressionPipeline()), tensor_db=TensorDB(), made=0,
                            task_runner=SimpleNamespace(get_train_data_size=lambda: 120,
                                                        get_valid_data_size=lambda: 45))
    state.client = RecordingClient(state)

    def to_named_tensor(key, array):
        state.made += 1
        return Collaborator.nparray_to_named_tensor(state, key, array)

    state.nparray_to_named_tensor = to_named_tensor
    tensors = {
        TensorKey("conv.weight", "collaborator1", 3, False, ("trained",)): rng.normal(size=(4, 3, 3, 3)).astype("f4"),
        TensorKey("conv.bias", "collaborator1", 3, False, ("trained",)): rng.normal(size=4).astype("f4"),
        TensorKey("bn.num_batches_tracked", "collaborator1", 3, False, ("trained",)): np.array(7.0),
        TensorKey("loss", "collaborator1", 3, True, ("metric",)): np.array(0.625),
        TensorKey("acc", "collaborator1", 3, True, ("metric",)): np.array(0.75, dtype="f4"),
    }
    return state, tensors


@pytest.mark.parametrize("task", ["train", "locally_tuned_model_validation", "aggregated_model_validation",
                                  "custom_task"])
def test_the_same_results_and_metrics_as_openfls_each_made_when_read(task):
    ours, tensors = party()
    openfl, _ = party()
    got = AuditingCollaborator.send_task_results(ours, tensors, 3, task)
    expected = Collaborator.send_task_results(openfl, tensors, 3, task)
    assert got == expected and set(got) == {f"collaborator1/{task}/loss", f"collaborator1/{task}/acc"}
    (mine,), (theirs,) = ours.client.sent, openfl.client.sent
    assert mine["data_size"] == theirs["data_size"] == {"train": 120, "custom_task": -1}.get(task, 45)
    assert [b for b, _ in mine["read"]] == [b for b, _ in theirs["read"]]
    # OpenFL made all five before the client read one; here the i-th was made when it was read
    assert [made for _, made in theirs["read"]] == [5] * 5
    assert [made for _, made in mine["read"]] == [1, 2, 3, 4, 5]


def test_read_again_the_results_are_made_again_the_same():
    """OpenFL's gRPC client sends the same results again after a lost connection; the persistent store reads them
    before they are processed."""
    state, tensors = party()
    results = NamedTensorsOnRead(state.nparray_to_named_tensor, tensors)
    first = [t.SerializeToString() for t in results]
    assert len(results) == 5 and [t.SerializeToString() for t in results] == first and state.made == 10


def test_a_grpc_request_holds_the_same_tensors_as_from_a_list():
    state, tensors = party()
    results = NamedTensorsOnRead(state.nparray_to_named_tensor, tensors)
    from_list = aggregator_pb2.TaskResults(round_number=3, task_name="train", data_size=120, tensors=list(results))
    on_read = aggregator_pb2.TaskResults(round_number=3, task_name="train", data_size=120, tensors=results)
    assert on_read.SerializeToString() == from_list.SerializeToString() and len(on_read.tensors) == 5


def test_delta_updates_are_sent_as_openfl_sends_them():
    ours, tensors = party(use_delta_updates=True)
    openfl, _ = party(use_delta_updates=True)
    for state in (ours, openfl):  # the received model, which a delta is taken against
        state.tensor_db.cache_tensor({TensorKey(k.tensor_name, k.origin, k.round_number, False, ("model",)): v * 0.5
                                      for k, v in tensors.items() if not k.report})
    AuditingCollaborator.send_task_results(ours, tensors, 3, "train")
    Collaborator.send_task_results(openfl, tensors, 3, "train")
    sent = [b for b, _ in ours.client.sent[0]["read"]]
    assert sent == [b for b, _ in openfl.client.sent[0]["read"]]
    tags = [tuple(base_pb2.NamedTensor.FromString(b).tags) for b in sent]
    assert tags == [("compressed", "delta", "trained")] * 3 + [("compressed", "metric")] * 2
