"""In one process, the global model's tensors a party fetches are the aggregator's own arrays, read-only, not copies.

Over gRPC each party gets the global model a tensor at a time: the aggregator copies the tensor's bytes out of its
array into a NamedTensor, and the party copies them out again and keeps that copy (`np.frombuffer` of them: a
read-only array). In one process (`workspace.in_process`) that is one copy of the model per party, held through its
round, and the largest tensor crossed as three copies at once: the largest memory peak of the one-process run at
full size (benchmarks/README.md, "Tensors written, sent and received from their own memory"). The request every
party makes at the start of a round is a tensor of the round's global model (`("model",)`, lossless). Where the
aggregator answers it as OpenFL's does, the plan's pipeline is OpenFL's no-compression one, and the aggregator holds
the tensor as a C-ordered float32 array (whose NamedTensor bytes would be exactly that array's), the party gets a
SharedNamedTensor on that array: OpenFL's decompression turns it into a read-only float32 array, equal bit for bit
to what the bytes give, that is the aggregator's memory. Every other request is the aggregator's own answer.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SharedNamedTensor", "shared_global_tensor"]


@dataclass(frozen=True)
class _Metadata:
    """A transformer's metadata as a NamedTensor holds it (what `Collaborator.named_tensor_to_nparray` reads)."""

    int_list: tuple = ()
    int_to_float: tuple = ()
    bool_list: tuple = ()


class SharedNamedTensor:
    """The fields of the NamedTensor the aggregator would send for an array (OpenFL's `construct_named_tensor` of its
    lossless no-compression bytes), with `data_bytes` a read-only view of the array itself (own_float32_bytes)."""

    def __init__(self, name: str, round_number: int, tags: tuple, shape: tuple, data_bytes: memoryview):
        self.name, self.round_number, self.report, self.lossless, self.tags = name, round_number, False, True, tags
        self.transformer_metadata = [_Metadata(int_list=tuple(shape))]
        self.data_bytes = data_bytes  # read-only: decoded, it is read-only as the party's own copy would be


def shared_global_tensor(aggregator, requested_by: str, tensor_name: str, round_number: int, report: bool,
                         tags: tuple, require_lossless: bool) -> SharedNamedTensor | None:
    """For `Aggregator.get_aggregated_tensor`'s arguments: a SharedNamedTensor on the aggregator's array where the
    request is a party's fetch of a global model tensor the aggregator holds as plain float32 bytes; else None (the
    aggregator answers)."""
    from openfl.component import Aggregator
    from openfl.utilities import TensorKey, change_tags  # OpenFL is imported by the run, not by this module

    from src.process.float32_bytes import own_float32_bytes

    # Only where the aggregator answers as OpenFL's does: a plan's aggregator (or a test's stand-in for a dishonest
    # one) that answers otherwise is asked.
    answers = getattr(type(aggregator), "get_aggregated_tensor", None), getattr(type(aggregator),
                                                                                "_nparray_to_named_tensor", None)
    if answers != (Aggregator.get_aggregated_tensor, Aggregator._nparray_to_named_tensor):
        return None
    if (tuple(tags) != ("model",) or report or not require_lossless
            or not aggregator._check_tags(tuple(tags), requested_by)):
        return None
    array = aggregator.tensor_db.get_tensor_from_cache(
        TensorKey(tensor_name, aggregator.uuid, round_number, report, tuple(tags)))
    data_bytes = own_float32_bytes(aggregator.tensor_codec.lossless_pipeline, array)
    if data_bytes is None:
        return None
    # tagged as TensorCodec.compress tags a losslessly compressed tensor
    return SharedNamedTensor(tensor_name, round_number, change_tags(tuple(tags), add_field="compressed"),
                             array.shape, data_bytes)
