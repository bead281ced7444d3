"""A tensor's bytes as OpenFL's lossless no-compression pipeline makes them, read from the array's own memory.

`NoCompressionPipeline` (one `Float32NumpyArrayToBytes`) casts a tensor to float32 and copies its C-ordered bytes
out (`tobytes`). For a C-ordered float32 array those bytes are the array's memory as it is: a model-sized copy saved
where they are only read (the aggregator's model file, the global model a party reads in one process).
"""

from __future__ import annotations

import numpy as np
from openfl.pipelines import NoCompressionPipeline
from openfl.pipelines.pipeline import Float32NumpyArrayToBytes

__all__ = ["own_float32_bytes"]


def own_float32_bytes(pipeline, array) -> memoryview | None:
    """The bytes `pipeline.forward(data=array)` would make, as a read-only view of `array`'s memory, when the pipeline
    is exactly OpenFL's no-compression one and `array` a C-ordered float32 array; else None (the pipeline's own
    forward makes them). The metadata it would make is {"int_list": list(array.shape)}."""
    if not (type(pipeline) is NoCompressionPipeline and len(pipeline.transformers) == 1
            and type(pipeline.transformers[0]) is Float32NumpyArrayToBytes
            and isinstance(array, np.ndarray) and array.dtype == np.float32 and array.flags.c_contiguous):
        return None
    flat = array.reshape(-1)  # a view of the same memory
    flat.flags.writeable = False  # read through it only, as bytes decoded from a message are
    return memoryview(flat).cast("B")
