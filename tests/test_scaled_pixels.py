"""Images held as uint8 pixels and read as float32 (audit.scaled_pixels): the same values as a one-off float32
conversion, bit for bit, through every way the audit and the task runner read them."""

import numpy as np
import pytest
import torch
from torch import nn

from audit.membership import signals as signals_mod
from audit.membership.signals import compute_signals
from audit.model_io import host_tensor
from audit.round_audit import AuditSets
from audit.scaled_pixels import ScaledPixels, read_in_chunks, take_rows
from audit.training import TrainingRecipe, train_references


def converted_once(pixels: np.ndarray, steps: str) -> np.ndarray:
    """What the loaders did before: one float32 copy of the whole set, the steps applied in place."""
    x = pixels.astype(np.float32)
    if steps == "cifar":
        x *= np.float32(2.0 / 255.0)
        x -= np.float32(1.0)
    else:
        x /= np.float32(255.0)
    return x


def scaled(pixels: np.ndarray, steps: str) -> ScaledPixels:
    if steps == "cifar":
        return ScaledPixels(pixels, multiply=2.0 / 255.0, subtract=1.0)
    return ScaledPixels(pixels, divide=255.0)


@pytest.fixture
def pixels():
    # Every byte value, in an odd (N, C, H, W): 300 x 2 x 3 x 5.
    rng = np.random.default_rng(4)
    values = np.concatenate([np.arange(256, dtype=np.uint8), rng.integers(0, 256, 300 * 30 - 256).astype(np.uint8)])
    return values.reshape(300, 2, 3, 5)


@pytest.mark.parametrize("steps", ["cifar", "mnist"])
def test_every_read_gives_the_one_off_conversion_bit_for_bit(pixels, steps):
    x, want = scaled(pixels, steps), converted_once(pixels, steps)
    assert x.shape == want.shape and x.dtype == want.dtype == np.float32 and len(x) == 300 and x.ndim == 4
    whole = np.asarray(x)
    assert whole.dtype == np.float32 and np.array_equal(whole.view(np.uint32), want.view(np.uint32))
    index = np.array([299, 0, 17, 17, 150])
    for key in (index, slice(10, 40), slice(None, None, -3), 5, (slice(2, 9), 1), np.arange(300) % 2 == 0):
        got = x[key]
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        np.testing.assert_array_equal(got, want[key])
    view = x.rows(slice(100, 250))
    assert isinstance(view, ScaledPixels) and np.shares_memory(view.pixels, pixels) and view.shape == (150, 2, 3, 5)
    np.testing.assert_array_equal(np.asarray(view), want[100:250])
    np.testing.assert_array_equal(view[[0, -1]], want[[100, 249]])
    np.testing.assert_array_equal(take_rows(x, index), want[index])
    np.testing.assert_array_equal(take_rows(want, index), want[index])
    assert torch.equal(host_tensor(x), torch.from_numpy(want))
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    if steps == "cifar":
        assert whole.min() == -1.0 and whole.max() == 1.0
    else:
        assert whole.min() == 0.0 and whole.max() == 1.0


def test_bad_pixels_and_reads_fail_clearly(pixels):
    with pytest.raises(ValueError, match="uint8"):
        ScaledPixels(pixels.astype(np.float32), divide=255.0)
    x = ScaledPixels(pixels, divide=255.0)
    with pytest.raises(TypeError, match="slice"):
        x.rows(np.arange(3))
    with pytest.raises(ValueError, match="copy"):
        np.asarray(x, copy=False)
    assert read_in_chunks(x) and not read_in_chunks(np.asarray(x))


class BatchNormNet(nn.Module):
    """A convolution with an odd kernel and stride, BatchNorm, and a Linear head: not the suite's usual nets."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, kernel_size=(2, 3), stride=(1, 2))
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).flatten(1))


def test_signals_read_in_chunks_equal_the_whole_set_s(pixels, monkeypatch):
    """compute_signals over a set held as pixels converts a chunk of whole batches at a time, and gives what the
    float32 array gives: every signal, the outputs, and timings for every signal."""
    torch.manual_seed(0)
    model = BatchNormNet().eval()
    y = np.random.default_rng(1).integers(0, 3, 300)
    x = scaled(pixels, "cifar")
    monkeypatch.setattr(signals_mod, "CHUNK_ROWS", 64)  # 300 samples in 5 chunks of 64 (batches of 32)
    converted = []
    real_getitem = ScaledPixels.__getitem__
    monkeypatch.setattr(ScaledPixels, "__getitem__", lambda self, key: converted.append(key) or real_getitem(self, key))
    names = ["loss", "gradient_norm", "logits"]
    want_out, got_out, timings = {}, {}, {}
    want = compute_signals(model, converted_once(pixels, "cifar"), y, names, batch_size=32, outputs=want_out)
    got = compute_signals(model, x, y, names, batch_size=32, outputs=got_out, timings=timings)
    assert [(k.start, k.stop) for k in converted] == [(0, 64), (64, 128), (128, 192), (192, 256), (256, 320)]
    for name in names:
        assert got[name].shape == (300,)
        np.testing.assert_array_equal(got[name], want[name])
    assert torch.equal(got_out["logits"], want_out["logits"])
    assert set(timings) == set(names) and all(t >= 0 for t in timings.values())
    with pytest.raises(ValueError, match="y shape"):
        compute_signals(model, x, y[:-1], names, batch_size=32)


def test_references_trained_on_a_pixel_pool_equal_the_float32_pool_s(pixels):
    """RMIA's references train on rows of the population picked a chunk at a time: from pixels, only those rows are
    converted, and the trained copies are the float32 pool's exactly."""
    y = np.random.default_rng(2).integers(0, 3, 300)
    subsets = np.stack([np.random.default_rng(c).choice(300, 40, replace=False) for c in range(3)])
    recipe = TrainingRecipe("SGD", 0.05, 0.9, 1, 16)
    trained = []
    for x in (converted_once(pixels, "mnist"), scaled(pixels, "mnist")):
        torch.manual_seed(3)
        model = BatchNormNet()
        copies = train_references(model, x, y, recipe, seed=5, chunk=2, subsets=subsets)
        trained.append(copies)
    for name, value in trained[0].params.items():
        assert torch.equal(value, trained[1].params[name]), name
    for name, value in trained[0].buffers.items():
        assert torch.equal(value, trained[1].buffers[name]), name


def test_a_sample_of_the_audit_sets_keeps_only_the_sampled_rows_pixels(pixels):
    """A sample of sets held as pixels holds the sampled rows' pixels (uint8, not float32 values: a quarter of the
    memory through the whole audit), and reads as the one-off conversion of those rows, bit for bit."""
    y = np.arange(300) % 3
    x = scaled(pixels, "cifar")
    sets = AuditSets(members=(x, y), nonmembers=(x.rows(slice(0, 100)), y[:100]), population=(x, y))
    sample = sets.sampled(50, seed=1)
    want = converted_once(pixels, "cifar")
    for name, source in (("members", pixels), ("nonmembers", pixels[:100]), ("population", pixels)):
        sample_x, sample_y = getattr(sample, name)
        assert isinstance(sample_x, ScaledPixels) and sample_x.pixels.dtype == np.uint8, name
        assert sample_x.shape == (50, 2, 3, 5) and sample_x.pixels.nbytes == 50 * 30, name
        assert not np.shares_memory(sample_x.pixels, pixels), name  # its own rows: the source can go
        rows = np.flatnonzero((source.reshape(len(source), -1)[:, None]
                               == sample_x.pixels.reshape(50, -1)[None]).all(-1).any(1))
        assert len(rows) == 50 and np.array_equal(sample_x.pixels, source[rows]), name
        got = np.asarray(sample_x)
        assert np.array_equal(got.view(np.uint32), want[rows].view(np.uint32)), name
        np.testing.assert_array_equal(sample_y, y[rows])
        xt, yt = sample.tensors(name)
        assert xt.dtype == torch.float32 and torch.equal(xt, torch.from_numpy(want[rows])), name
    # float32 sets give float32 samples of the same rows
    plain = AuditSets(members=(want, y), nonmembers=(want[:100], y[:100]), population=(want, y)).sampled(50, seed=1)
    for name in ("members", "nonmembers", "population"):
        assert isinstance(getattr(plain, name)[0], np.ndarray)
        np.testing.assert_array_equal(getattr(plain, name)[0], np.asarray(getattr(sample, name)[0]))
