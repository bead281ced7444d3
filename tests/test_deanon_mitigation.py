"""Tests for audit.deanon.mitigation: settings parsing, the data mitigations (bkg_repl, rand_aug, mm_aug) and the
update mitigations (noise, dp_fedavg)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.cluster import KMeans

from audit.deanon import mitigation as dm
from audit.config.fields import parse
from audit.config.mitigation_settings import UPDATE_MITIGATIONS, Mitigation
from audit.deanon.mitigation import mitigate_data, mitigate_update, update_norm

PREFIX = "task_runner.settings.mitigation"


def mitigation(mapping):
    return parse(Mitigation, mapping, "mitigation")


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize("mapping", [None, {}])
def test_defaults(mapping):
    m = mitigation(mapping)
    assert m == Mitigation()
    assert m.to_dict() == {"method": "none", "alpha": 0.0, "sigma": 0.0, "clip": 50.0, "clusters": 10}
    assert not m.active


def test_good_values_round_trip():
    m = parse(Mitigation, {"method": "mm_aug", "alpha": 2, "clusters": 100}, PREFIX)
    assert (m.method, m.alpha, m.clusters) == ("mm_aug", 2.0, 100)
    assert isinstance(m.alpha, float)
    assert m.active
    assert mitigation(json.loads(json.dumps(m.to_dict()))) == m
    assert mitigation({"method": "bkg_repl", "alpha": 1.0}).alpha == 1.0
    assert mitigation({"method": "dp_fedavg", "sigma": 1e-3, "clip": 50}).clip == 50.0


@pytest.mark.parametrize(
    "mitigation, active",
    [
        (Mitigation("none", alpha=1.0, sigma=1.0), False),
        (Mitigation("noise", sigma=0.0), False),
        (Mitigation("noise", sigma=0.1), True),
        (Mitigation("dp_fedavg", sigma=0.0), True),  # still clips
        (Mitigation("bkg_repl", alpha=0.0), False),
        (Mitigation("rand_aug", alpha=0.5), True),
        (Mitigation("mm_aug", alpha=0.0), False),
    ],
)
def test_active(mitigation, active):
    assert mitigation.active is active


@pytest.mark.parametrize(
    "mapping, key",
    [
        ({"methd": "noise"}, "methd"),
        ({"method": "gauss"}, "method"),
        ({"method": "bkg-repl"}, "method"),
        ({"method": 3}, "method"),
        ({"alpha": "0.5"}, "alpha"),
        ({"alpha": True}, "alpha"),
        ({"alpha": -0.1}, "alpha"),
        ({"alpha": float("nan")}, "alpha"),
        ({"method": "bkg_repl", "alpha": 1.5}, "alpha"),
        ({"sigma": -1}, "sigma"),
        ({"sigma": float("inf")}, "sigma"),
        ({"clip": 0}, "clip"),
        ({"clip": None}, "clip"),
        ({"clusters": 0}, "clusters"),
        ({"clusters": 2.0}, "clusters"),
        ({"clusters": True}, "clusters"),
    ],
)
def test_bad_values_name_their_key(mapping, key):
    with pytest.raises(ValueError) as err:
        parse(Mitigation, mapping, PREFIX)
    assert str(err.value).startswith(f"{PREFIX}.{key}: ")


def test_not_a_mapping_and_direct_construction():
    with pytest.raises(ValueError, match=rf"^{PREFIX}: "):
        parse(Mitigation, ["noise"], PREFIX)
    with pytest.raises(ValueError, match=r"^mitigation\.alpha: "):
        Mitigation("rand_aug", alpha=-1)


# ---------------------------------------------------------------- data mitigations


def _data(n=40, n_bkg=300, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 100, size=(n, 2, 3, 3)).astype(np.uint8)  # "user" pixels < 100
    y = np.zeros(n, dtype=np.int64)
    bx = rng.integers(150, 256, size=(n_bkg, 2, 3, 3)).astype(np.uint8)  # background pixels >= 150
    by = np.arange(n_bkg, dtype=np.int64) % 10 + 1
    return x, y, bx, by


@pytest.mark.parametrize("method", ["none", "noise", "dp_fedavg", "bkg_repl", "rand_aug", "mm_aug"])
def test_data_identity(method):
    x, y, bx, by = _data()
    m = Mitigation(method, sigma=1.0) if method in UPDATE_MITIGATIONS else Mitigation(method)  # alpha = 0
    result = mitigate_data(m, x, y, bx, by, seed=0)
    assert np.array_equal(result.x, x) and np.array_equal(result.y, y)
    assert result.background_used.dtype == np.int64 and result.background_used.size == 0
    assert result.cluster is None


@pytest.mark.parametrize("alpha, n", [(0.25, 40), (0.5, 40), (0.3, 7), (1.0, 40)])
def test_bkg_repl(alpha, n):
    x, y, bx, by = _data(n=n)
    result = mitigate_data(Mitigation("bkg_repl", alpha=alpha), x, y, bx, by, seed=3)
    k = round(alpha * n)
    assert result.x.shape == x.shape and result.y.shape == y.shape
    assert result.x.dtype == x.dtype and result.y.dtype == y.dtype
    from_bkg = result.y != 0  # user labels are 0, background labels >= 1
    assert from_bkg.sum() == k == len(result.background_used)
    assert np.array_equal(result.x[from_bkg], bx[result.background_used])
    assert np.array_equal(result.y[from_bkg], by[result.background_used])
    # the kept samples are user samples, in place
    assert np.array_equal(result.x[~from_bkg], x[~from_bkg])
    assert len(np.unique(result.background_used)) == k  # no repeats: the background is large enough
    if alpha == 1.0:
        assert (result.x >= 150).all()


@pytest.mark.parametrize("method", ["rand_aug", "mm_aug"])
@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0, 0.3])
def test_augmentation_sizes(method, alpha):
    n = 30
    x, y, bx, by = _data(n=n)
    result = mitigate_data(Mitigation(method, alpha=alpha, clusters=3), x, y, bx, by, seed=1)
    k = round(alpha * n)
    assert len(result.x) == len(result.y) == n + k == n + len(result.background_used)
    assert result.x.dtype == x.dtype and result.y.dtype == y.dtype
    assert np.array_equal(result.x[:n], x) and np.array_equal(result.y[:n], y)
    assert np.array_equal(result.x[n:], bx[result.background_used])
    assert np.array_equal(result.y[n:], by[result.background_used])
    assert (result.cluster is None) == (method == "rand_aug")


def test_rand_aug_samples_more_than_background_with_replacement():
    x, y, bx, by = _data(n=40, n_bkg=10)
    result = mitigate_data(Mitigation("rand_aug", alpha=2.0), x, y, bx, by, seed=0)
    assert len(result.background_used) == 80
    assert set(result.background_used.tolist()) <= set(range(10))


def _blobs(seed=0):
    """Three well-separated blobs of background images; the blob is the label."""
    rng = np.random.default_rng(seed)
    centres = np.array([-100.0, 0.0, 100.0])
    by = np.repeat(np.arange(3), 50)
    bx = (centres[by][:, None, None] + rng.normal(size=(150, 4, 4))).astype(np.float32)
    return bx, by


def test_mm_aug_samples_from_one_kmeans_cluster():
    bx, by = _blobs()
    x = np.zeros((20, 4, 4), dtype=np.float32)
    y = np.zeros(20, dtype=np.int64)
    m = Mitigation("mm_aug", alpha=2.0, clusters=3)
    seen = set()
    for seed in range(6):
        result = mitigate_data(m, x, y, bx, by, seed=seed)
        labels = KMeans(n_clusters=3, n_init=dm._KMEANS_N_INIT, random_state=seed).fit(bx.reshape(150, -1)).labels_
        assert (labels[result.background_used] == result.cluster).all()
        # on well-separated blobs the k-means cluster is exactly one blob
        assert len(set(by[result.background_used].tolist())) == 1
        assert len(np.unique(result.background_used)) == 40  # the cluster (50) is big enough: no repeats
        seen.add(int(by[result.background_used[0]]))
    assert len(seen) > 1  # the cluster is picked at random


def test_mm_aug_small_cluster_samples_with_replacement():
    bx, by = _blobs()
    x = np.zeros((40, 4, 4), dtype=np.float32)
    result = mitigate_data(Mitigation("mm_aug", alpha=2.0, clusters=3), x, np.zeros(40, np.int64), bx, by, seed=0)
    assert len(result.background_used) == 80  # more than the 50 samples of a blob
    assert len(set(by[result.background_used].tolist())) == 1


def test_mm_aug_too_many_clusters():
    x, y, bx, by = _data(n=5, n_bkg=8)
    with pytest.raises(ValueError, match="clusters"):
        mitigate_data(Mitigation("mm_aug", alpha=1.0, clusters=9), x, y, bx, by, seed=0)


@pytest.mark.parametrize("method, alpha", [("bkg_repl", 0.5), ("rand_aug", 1.0), ("mm_aug", 1.0)])
def test_data_determinism(method, alpha):
    x, y, bx, by = _data()
    m = Mitigation(method, alpha=alpha, clusters=5)
    a = mitigate_data(m, x, y, bx, by, seed=7)
    b = mitigate_data(m, x, y, bx, by, seed=7)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert np.array_equal(a.background_used, b.background_used) and a.cluster == b.cluster
    others = [mitigate_data(m, x, y, bx, by, seed=s) for s in (8, 9)]
    assert any(not np.array_equal(a.x, o.x) for o in others)


def test_data_input_errors():
    x, y, bx, by = _data()
    m = Mitigation("rand_aug", alpha=1.0)
    with pytest.raises(ValueError, match="feature shape"):
        mitigate_data(m, x, y, bx[:, :1], by, seed=0)
    with pytest.raises(ValueError, match="cannot be cast"):
        mitigate_data(m, x, y, bx.astype(np.float32), by, seed=0)
    with pytest.raises(ValueError, match="background"):
        mitigate_data(m, x, y, bx[:0], by[:0], seed=0)
    with pytest.raises(ValueError, match="seed"):
        mitigate_data(m, x, y, bx, by, seed=-1)


# ---------------------------------------------------------------- update mitigations


def _update(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    received = {
        "conv.weight": rng.normal(size=(64, 3, 3, 3)).astype(np.float32),
        "fc.weight": rng.normal(size=(200, 100)).astype(np.float32),
        "bn.num_batches_tracked": np.array(5, dtype=np.int64),
    }
    trained = {
        "conv.weight": received["conv.weight"] + scale * rng.normal(size=(64, 3, 3, 3)).astype(np.float32),
        "fc.weight": received["fc.weight"] + scale * rng.normal(size=(200, 100)).astype(np.float32),
        "bn.num_batches_tracked": np.array(9, dtype=np.int64),
    }
    return received, trained


def _delta(received, sent):
    return np.concatenate([(sent[k].astype(np.float64) - received[k]).ravel() for k in ("conv.weight", "fc.weight")])


def test_update_norm():
    received, trained = _update()
    assert update_norm(received, trained) == pytest.approx(np.linalg.norm(_delta(received, trained)))
    assert update_norm(received, received) == 0.0


@pytest.mark.parametrize("method", ["none", "bkg_repl", "rand_aug", "mm_aug"])
def test_update_unchanged(method):
    received, trained = _update()
    sent = mitigate_update(Mitigation(method, alpha=0.5), received, trained, seed=0)
    assert sent.keys() == trained.keys()
    assert all(np.array_equal(sent[k], trained[k]) and sent[k].dtype == trained[k].dtype for k in trained)
    assert all(np.array_equal(a, b) for a, b in zip(
        mitigate_update(Mitigation("noise", sigma=0.0), received, trained, seed=0).values(), trained.values()))


@pytest.mark.parametrize("sigma", [0.01, 0.3, 2.0])
def test_noise_std(sigma):
    received, trained = _update()
    sent = mitigate_update(Mitigation("noise", sigma=sigma), received, trained, seed=1)
    for key in trained:
        assert sent[key].dtype == trained[key].dtype and sent[key].shape == trained[key].shape
    noise = np.concatenate([(sent[k].astype(np.float64) - trained[k]).ravel() for k in ("conv.weight", "fc.weight")])
    assert noise.size > 20000
    assert abs(noise.mean()) < 5 * sigma / np.sqrt(noise.size)
    assert noise.std() == pytest.approx(sigma, rel=0.03)
    assert sent["bn.num_batches_tracked"] == 9


@pytest.mark.parametrize("scale, clip", [(1.0, 50.0), (1.0, 500.0), (1e-3, 0.01)])
def test_dp_fedavg_clipping_without_noise(scale, clip):
    received, trained = _update(scale=scale)
    norm = update_norm(received, trained)
    sent = mitigate_update(Mitigation("dp_fedavg", sigma=0.0, clip=clip), received, trained, seed=0)
    assert update_norm(received, sent) == pytest.approx(min(norm, clip), rel=1e-5)
    before, after = _delta(received, trained), _delta(received, sent)
    cosine = before @ after / (np.linalg.norm(before) * np.linalg.norm(after))
    assert cosine == pytest.approx(1.0, abs=1e-6)  # direction unchanged
    assert sent["bn.num_batches_tracked"] == 9 and sent["bn.num_batches_tracked"].dtype == np.int64
    if clip > norm:  # not clipped: the update is sent as trained (up to float32 rounding)
        assert all(np.allclose(sent[k], trained[k], atol=1e-5) for k in trained)


def test_dp_fedavg_noise_std():
    received, trained = _update()
    clip, sigma = 5.0, 0.02
    norm = update_norm(received, trained)
    sent = mitigate_update(Mitigation("dp_fedavg", sigma=sigma, clip=clip), received, trained, seed=2)
    noise = _delta(received, sent) - _delta(received, trained) * (clip / norm)  # minus the clipped update
    assert noise.std() == pytest.approx(sigma * clip, rel=0.03)
    assert sent["bn.num_batches_tracked"] == 9


@pytest.mark.parametrize("mitigation", [Mitigation("noise", sigma=0.1), Mitigation("dp_fedavg", sigma=0.01)])
def test_update_determinism(mitigation):
    received, trained = _update()
    a = mitigate_update(mitigation, received, trained, seed=5)
    b = mitigate_update(mitigation, received, dict(reversed(list(trained.items()))), seed=5)  # order-independent
    c = mitigate_update(mitigation, received, trained, seed=6)
    assert all(np.array_equal(a[k], b[k]) for k in trained)
    assert not np.array_equal(a["fc.weight"], c["fc.weight"])


def test_update_key_and_shape_mismatch():
    received, trained = _update()
    m = Mitigation("noise", sigma=0.1)
    with pytest.raises(ValueError, match="fc.weight"):
        mitigate_update(m, {k: v for k, v in received.items() if k != "fc.weight"}, trained, seed=0)
    with pytest.raises(ValueError, match="extra"):
        mitigate_update(m, {**received, "extra": np.zeros(2)}, trained, seed=0)
    with pytest.raises(ValueError, match="fc.weight"):
        update_norm(received, {**trained, "fc.weight": trained["fc.weight"][:3]})
