"""The aggregator's model files (`last_state_path`, `best_state_path`: OpenFL's ModelProto) written a tensor at a time.

OpenFL's writer, `utils.dump_proto(utils.construct_model_proto(...))`, holds copies of the whole model at once: every
tensor's pipeline bytes, each NamedTensor's own copy of them, the serialised ModelProto (a peak of about four times
the model above its tensors, benchmarks/bench_model_file.py). Protobuf has no streaming writer, so the wire format is
written here by hand: a ModelProto is the concatenation of its `tensors` fields (tag, varint length, serialised
NamedTensor), and a NamedTensor is protobuf's serialisation of its fields but `data_bytes`, then data_bytes' tag,
length and bytes (its highest field number: protobuf writes it last, checked below). So at most one tensor's bytes
are held beyond the tensor dict, and none for a float32 tensor with OpenFL's no-compression pipeline (its bytes are
the array's memory); the file is byte-identical to OpenFL's (tests/test_model_file.py) and OpenFL's
loader (`utils.load_proto`) reads it.
"""

from __future__ import annotations

import io
import os

from openfl.protocols import base_pb2, utils
from openfl.utilities import TensorKey

from audit import atomic_write_stream
from src.process.float32_bytes import own_float32_bytes

_TENSORS = base_pb2.ModelProto.DESCRIPTOR.fields_by_name["tensors"]
_DATA_BYTES = base_pb2.NamedTensor.DESCRIPTOR.fields_by_name["data_bytes"]


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint, written here: protobuf's encoder for it is internal (`internal.encoder`)."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(field, length: int) -> bytes:
    """The tag (field number, wire type 2) and the length of a bytes or message field holding `length` bytes."""
    return _varint(field.number << 3 | 2) + _varint(length)


def _named_tensor(name: str, round_number: int, data: bytes, metadata) -> base_pb2.NamedTensor:
    # The NamedTensor utils.construct_model_proto makes for each tensor of the model.
    return utils.construct_named_tensor(TensorKey(name, "agg", round_number, False, ("model",)), data, metadata,
                                        lossless=True)


def _as_in_model_proto(named_tensor: base_pb2.NamedTensor) -> bytes:
    """The NamedTensor serialised as the ModelProto holding it serialises it: upb copies a message into a repeated
    field through its wire format, which reorders map entries (int_to_float) against the message alone."""
    return base_pb2.ModelProto(tensors=[named_tensor]).tensors[0].SerializeToString()


def _write_tensor(f, name: str, round_number: int, data: bytes, metadata, stream_data_bytes: bool) -> None:
    """One `tensors` field of the ModelProto."""
    if stream_data_bytes:
        head = _as_in_model_proto(_named_tensor(name, round_number, b"", metadata))
        if data:  # proto3 writes no empty bytes field
            head += _length_delimited(_DATA_BYTES, len(data))
    else:
        head, data = _as_in_model_proto(_named_tensor(name, round_number, bytes(data), metadata)), b""
    f.write(_length_delimited(_TENSORS, len(head) + len(data)))
    f.write(head)
    f.write(data)


def _data_bytes_written_last() -> bool:
    """Whether this protobuf runtime writes a ModelProto's NamedTensor as its other fields followed by data_bytes
    (fields in number order, data_bytes the highest): checked against protobuf's own serialisation of a tensor
    with every field set, not assumed."""
    metadata = [{"int_to_float": {i: i / 3 for i in range(20)}, "int_list": [2, 3]}, {"bool_list": [True, False]}]
    expected = base_pb2.ModelProto(tensors=[_named_tensor("w", 3, b"\x01\x02", metadata)]).SerializeToString()
    probe = io.BytesIO()
    _write_tensor(probe, "w", 3, b"\x01\x02", metadata, stream_data_bytes=True)
    return probe.getvalue() == expected


# Else each NamedTensor is serialised whole: still one tensor at a time, with more copies of its bytes.
STREAM_DATA_BYTES = _data_bytes_written_last()


def _pipeline_forward(pipeline, array) -> tuple[bytes | memoryview, list]:
    """`pipeline.forward(data=array)`: the tensor's bytes and the pipeline's metadata, the bytes read from the array's
    own memory where they are exactly that (own_float32_bytes): no copy of the model's largest tensor (the
    tutorial's fc2, 67 MB) while the file is written."""
    own = own_float32_bytes(pipeline, array)
    if own is not None:
        return own, [{"int_list": list(array.shape)}]
    return pipeline.forward(data=array)


def write_model_file(path: str | os.PathLike, tensor_dict: dict, round_number: int, pipeline) -> None:
    """Write the bytes `utils.dump_proto(utils.construct_model_proto(tensor_dict, round_number, pipeline), path)`
    writes, atomically (a failure leaves the previous file as it was)."""
    def write(f):
        for name, array in tensor_dict.items():
            data, metadata = _pipeline_forward(pipeline, array)
            _write_tensor(f, name, round_number, data, metadata, STREAM_DATA_BYTES)
            del data  # before the next tensor's bytes are made

    atomic_write_stream(path, write)
