"""src/server/model_file.py: the aggregator's model file written a tensor at a time is the file OpenFL's writer
(`utils.dump_proto(utils.construct_model_proto(...))`) writes, byte for byte, OpenFL's loader reads it back, a failure
mid-write leaves the previous file, and the write needs at most one tensor's bytes (none for float32 tensors), not
several copies of the model."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.internal.encoder import _VarintBytes
from openfl.pipelines import (EdenPipeline, KCPipeline, NoCompressionPipeline, RandomShiftPipeline, SKCPipeline,
                              STCPipeline)
from openfl.protocols import utils

from src.server import model_file
from src.server.model_file import write_model_file

ROOT = Path(__file__).resolve().parent.parent


def odd_tensors() -> dict:
    rng = np.random.default_rng(3)
    return {
        "scalar": np.array(2.5, dtype=np.float32),  # 0-d
        "empty": np.zeros((0, 4), dtype=np.float32),  # no bytes: proto3 writes no data_bytes field
        "float64": rng.normal(size=(3, 5)),  # cast to float32 by the pipeline
        "int64": np.arange(-6, 6, dtype=np.int64).reshape(2, 2, 3),
        "fortran": np.asfortranarray(rng.normal(size=(7, 3)).astype(np.float32)),
        "strided": rng.normal(size=(10, 10)).astype(np.float32)[::3, 1::2],
        "embedding.weight": rng.normal(size=(50, 8)).astype(np.float32),
        "bn.num_batches_tracked": np.array(17, dtype=np.int64),
        "naïve/ünïcode name": np.ones(3, dtype=np.float32),
        # > 2**21 bytes: its NamedTensor's and data_bytes' lengths are 4-byte varints
        "large": rng.normal(size=(3, 200_001)).astype(np.float32),
    }


def openfl_file(path, tensors, round_number, pipeline) -> bytes:
    utils.dump_proto(utils.construct_model_proto(tensors, round_number, pipeline), str(path))
    return Path(path).read_bytes()


def streamed_file(path, tensors, round_number, pipeline) -> bytes:
    write_model_file(path, tensors, round_number, pipeline)
    return Path(path).read_bytes()


class Replayed:
    """A pipeline whose forward gives the same bytes for the same array every time: the lossy pipelines are random
    (RandomShift, Eden, k-means) or stamp the time (gzip), and both writers must see the same bytes."""

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.seen = {}

    def forward(self, data, **kwargs):
        if id(data) not in self.seen:
            self.seen[id(data)] = self.pipeline.forward(data=data, **kwargs)
        return self.seen[id(data)]

    def backward(self, data, transformer_metadata, **kwargs):
        return self.pipeline.backward(data=data, transformer_metadata=transformer_metadata, **kwargs)


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16383, 16384, 2**21 - 1, 2**21, 2**28 + 5, 2**35 + 1])
def test_varint_is_protobufs(value):
    assert model_file._varint(value) == _VarintBytes(value)


def test_this_protobuf_runtime_writes_data_bytes_last():
    """The streamed path (data_bytes not copied into the NamedTensor) is the one in use here: data_bytes is the
    NamedTensor's highest field number and the runtime writes fields in number order."""
    fields = {f.name: f.number for f in utils.base_pb2.NamedTensor.DESCRIPTOR.fields}
    assert fields["data_bytes"] == max(fields.values())
    assert model_file.STREAM_DATA_BYTES


@pytest.mark.parametrize("round_number", [0, 9, 1000])
def test_byte_identical_to_openfl_and_read_back_by_openfl(tmp_path, round_number):
    tensors, pipeline = odd_tensors(), NoCompressionPipeline()
    expected = openfl_file(tmp_path / "openfl.pbuf", tensors, round_number, pipeline)
    got = streamed_file(tmp_path / "streamed.pbuf", tensors, round_number, pipeline)
    assert got == expected
    read, read_round = utils.deconstruct_model_proto(utils.load_proto(str(tmp_path / "streamed.pbuf")), pipeline)
    assert read_round == round_number and list(read) == list(tensors)
    for name, array in tensors.items():
        assert read[name].dtype == np.float32 and read[name].shape == array.shape, name
        np.testing.assert_array_equal(read[name], array.astype(np.float32), err_msg=name)


def test_an_empty_model_and_one_empty_tensor(tmp_path):
    pipeline = NoCompressionPipeline()
    for tensors in ({}, {"e": np.zeros(0, dtype=np.float32)}):
        assert (streamed_file(tmp_path / "s.pbuf", tensors, 1, pipeline)
                == openfl_file(tmp_path / "o.pbuf", tensors, 1, pipeline))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # k-means on few distinct values
@pytest.mark.parametrize("make", [STCPipeline, SKCPipeline, KCPipeline, RandomShiftPipeline, EdenPipeline])
def test_byte_identical_with_openfls_other_pipelines(tmp_path, make):
    """Lossy and metadata-heavy pipelines: int_to_float maps (RandomShift: one entry per element), gzip bytes."""
    rng = np.random.default_rng(5)
    tensors = {"w": rng.normal(size=(30, 40)).astype(np.float32), "b": rng.normal(size=7),
               "s": np.array(1.5, dtype=np.float32), "big": rng.normal(size=(200, 101)).astype(np.float32)}
    pipeline = Replayed(make())
    expected = openfl_file(tmp_path / "openfl.pbuf", tensors, 4, pipeline)
    assert streamed_file(tmp_path / "streamed.pbuf", tensors, 4, pipeline) == expected
    read = {name: utils.deconstruct_model_proto(utils.load_proto(str(tmp_path / name)), pipeline)[0]
            for name in ("streamed.pbuf", "openfl.pbuf")}
    assert list(read["streamed.pbuf"]) == list(tensors)
    for name, array in tensors.items():  # OpenFL's loader restores the same arrays as from OpenFL's own file
        assert read["streamed.pbuf"][name].shape == array.shape, name
        np.testing.assert_array_equal(read["streamed.pbuf"][name], read["openfl.pbuf"][name], err_msg=name)


def test_byte_identical_when_each_named_tensor_is_serialised_whole(tmp_path, monkeypatch):
    """The path taken on a protobuf runtime that would not write data_bytes last."""
    monkeypatch.setattr(model_file, "STREAM_DATA_BYTES", False)
    tensors, pipeline = odd_tensors(), NoCompressionPipeline()
    assert (streamed_file(tmp_path / "s.pbuf", tensors, 2, pipeline)
            == openfl_file(tmp_path / "o.pbuf", tensors, 2, pipeline))


class FailsAt:
    """NoCompressionPipeline that raises on the n-th tensor, after the earlier ones were written."""

    def __init__(self, n):
        self.pipeline, self.n, self.calls = NoCompressionPipeline(), n, 0

    def forward(self, data, **kwargs):
        self.calls += 1
        if self.calls == self.n:
            raise MemoryError("simulated failure mid-write")
        return self.pipeline.forward(data=data, **kwargs)


def test_a_failure_mid_write_leaves_the_previous_file(tmp_path):
    path = tmp_path / "last.pbuf"
    tensors = odd_tensors()
    previous = streamed_file(path, {"w": np.arange(4, dtype=np.float32)}, 0, NoCompressionPipeline())
    failing = FailsAt(len(tensors))  # the last tensor, after a 2.4 MB one was written
    with pytest.raises(MemoryError, match="mid-write"):
        write_model_file(path, tensors, 1, failing)
    assert failing.calls == len(tensors)
    assert path.read_bytes() == previous and os.listdir(path.parent) == ["last.pbuf"]  # no temp file left
    with pytest.raises(MemoryError):  # no previous file: none is left behind
        write_model_file(tmp_path / "new.pbuf", tensors, 1, FailsAt(2))
    assert not (tmp_path / "new.pbuf").exists()


@pytest.mark.federation  # child processes
def test_byte_identical_on_protobufs_pure_python_runtime(tmp_path):
    code = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[1])\n"
        "from google.protobuf.internal import api_implementation; assert api_implementation.Type() == 'python'\n"
        "from openfl.pipelines import NoCompressionPipeline; from openfl.protocols import utils\n"
        "from src.server import model_file\n"
        "t = {'a': np.arange(6, dtype=np.float32).reshape(2, 3), 'e': np.zeros(0, np.float32), 's': np.float32(1)}\n"
        "model_file.write_model_file(sys.argv[2] + '/s.pbuf', t, 3, NoCompressionPipeline())\n"
        "utils.dump_proto(utils.construct_model_proto(t, 3, NoCompressionPipeline()), sys.argv[2] + '/o.pbuf')\n"
        "print(model_file.STREAM_DATA_BYTES)\n"
    )
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    done = subprocess.run([sys.executable, "-c", code, str(ROOT), str(tmp_path)], capture_output=True, text=True,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]
    assert (tmp_path / "s.pbuf").read_bytes() == (tmp_path / "o.pbuf").read_bytes()


@pytest.mark.federation  # child processes
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs")
def test_the_write_needs_no_copy_of_a_float32_tensor(tmp_path):
    """Peak RSS above the tensor dict while writing 8 float32 tensors of 12.5 MB with OpenFL's no-compression
    pipeline (benchmarks/bench_model_file.py's child mode, each writer in a fresh process): OpenFL's writer holds
    several copies of the model, the streamed one writes each tensor from its own memory."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_model_file import measure
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    openfl = measure("openfl", str(tmp_path / "o.pbuf"), synthetic=(8, 12.5))
    streamed = measure("streamed", str(tmp_path / "s.pbuf"), synthetic=(8, 12.5))
    assert openfl["extra_mb"] > 2 * openfl["model_mb"]  # the measurement sees the copies it must see
    assert streamed["extra_mb"] < 0.25 * streamed["largest_mb"]
    assert (tmp_path / "o.pbuf").read_bytes() == (tmp_path / "s.pbuf").read_bytes()
