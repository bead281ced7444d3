"""In one process, the global model's tensors a party fetches are the aggregator's own arrays, read-only, not copies.

Over gRPC each party gets the global model a tensor at a time as a NamedTensor (the aggregator's bytes of the tensor)
and keeps its own copy (`np.frombuffer` of them: a read-only array). In one process (`workspace.in_process`) that is
one copy of the model per party, held through its round, and each tensor crosses as three copies at once (the
aggregator's bytes, the NamedTensor's, the party's): the largest memory peak of the one-process run at full size
(benchmarks/README.md, "Tensors written and sent from their own memory"). Where the NamedTensor holds exactly the
array's bytes (OpenFL's lossless no-compression pipeline on a float32 array, no delta), the party reads the
aggregator's array itself: its data is a read-only view of that array, which OpenFL's decompression turns into the
same read-only float32 array, equal bit for bit, that the bytes would have given. Anything else crosses as before.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SharedNamedTensor", "shared_or_sent"]


class SharedNamedTensor:
    """A NamedTensor whose `data_bytes` is a read-only view of the aggregator's array (its other fields the proto's):
    what OpenFL's `Collaborator.named_tensor_to_nparray` reads."""

    def __init__(self, named_tensor, array: np.ndarray):
        self._named_tensor = named_tensor
        view = array.reshape(-1).view()
        view.flags.writeable = False  # as the party's own copy would be (np.frombuffer of bytes)
        self.data_bytes = memoryview(view).cast("B")

    def __getattr__(self, name):
        return getattr(self._named_tensor, name)


def _plain_float32_bytes(codec) -> bool:
    from openfl.pipelines import NoCompressionPipeline
    from openfl.pipelines.pipeline import Float32NumpyArrayToBytes

    pipeline = codec.lossless_pipeline
    return (type(pipeline) is NoCompressionPipeline and len(pipeline.transformers) == 1
            and type(pipeline.transformers[0]) is Float32NumpyArrayToBytes)


def shared_or_sent(aggregator, named_tensor):
    """`named_tensor` as the aggregator answered a party's request, or a SharedNamedTensor on the array it was made
    from when its bytes are exactly that array's."""
    from openfl.utilities import TensorKey, change_tags  # OpenFL is imported by the run, not by this module

    tags = tuple(named_tensor.tags)
    if (not named_tensor.lossless or "compressed" not in tags or "delta" in tags or "lossy_compressed" in tags
            or len(named_tensor.transformer_metadata) != 1 or not _plain_float32_bytes(aggregator.tensor_codec)):
        return named_tensor
    key = TensorKey(named_tensor.name, aggregator.uuid, named_tensor.round_number, named_tensor.report,
                    change_tags(tags, remove_field="compressed"))
    array = aggregator.tensor_db.get_tensor_from_cache(key)
    if (not isinstance(array, np.ndarray) or array.dtype != np.float32 or not array.flags.c_contiguous
            or list(array.shape) != list(named_tensor.transformer_metadata[0].int_list)):
        return named_tensor  # (data_bytes is not read to compare: reading it copies the bytes out of the proto)
    return SharedNamedTensor(named_tensor, array)
