"""Tests for src.data.datasets, src.data.split and src.dataloader (the OpenFL data loader). No network."""


import numpy as np
import pytest


from src.data import split as data_mod
from src.data import datasets as datasets_mod
from src import dataloader as dl_mod
from src.data.split import PartyData, split_federation, split_indices
from src.data.datasets import DATASETS, DatasetInfo, DatasetUnavailableError, dataset_info, load_dataset
from src.dataloader import AuditDataLoader

SETS = ("train", "test", "population")


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def ids_pool(n=1000, n_classes=10, seed=0):
    """x holds each sample's own index, so shards can be traced back to the pool."""
    x = np.arange(n, dtype=np.float32).reshape(n, 1, 1, 1)
    y = np.random.default_rng(seed).integers(0, n_classes, size=n).astype(np.int64)
    return x, y


def set_arrays(p: PartyData, s):
    return {"train": (p.train_x, p.train_y), "test": (p.test_x, p.test_y), "population": (p.population_x, p.population_y)}[s]


def hist(y, k=10):
    return np.bincount(y, minlength=k) / len(y)


def tv(a, b):
    return 0.5 * np.abs(a - b).sum()


# ----------------------------------------------------------------------------- datasets


def test_digits_shape_range_dtype(digits):
    x, y = digits
    assert x.shape == (1797, 1, 8, 8) and x.dtype == np.float32
    assert y.shape == (1797,) and y.dtype == np.int64
    x = np.asarray(x)
    assert x.dtype == np.float32
    assert x.min() == 0.0 and x.max() == 1.0
    assert set(np.unique(y)) == set(range(10))


def test_dataset_info():
    assert DATASETS == ("digits", "cifar10", "cifar100", "mnist", "fashionmnist")
    assert dataset_info("digits") == DatasetInfo("digits", (1, 8, 8), 10)
    assert dataset_info("cifar10") == DatasetInfo("cifar10", (3, 32, 32), 10)
    with pytest.raises(ValueError, match=r"'emnist'.*digits, cifar10, cifar100, mnist, fashionmnist"):
        dataset_info("emnist")
    with pytest.raises(ValueError, match="emnist"):
        load_dataset("emnist")


def test_cifar10_missing_raises_helpful_error(tmp_path, no_network):
    with pytest.raises(DatasetUnavailableError) as err:
        load_dataset("cifar10", tmp_path, download=False)
    msg = str(err.value)
    assert str(tmp_path / "cifar-10-batches-py") in msg  # where it looked
    assert "--download" in msg and "cifar-10-batches-py" in msg  # how to get it
    assert "--dataset digits" in msg  # the offline alternative
    assert isinstance(err.value, RuntimeError)


def test_cifar10_corrupt_folder_raises(tmp_path, no_network):
    (tmp_path / "cifar-10-batches-py").mkdir()
    with pytest.raises(DatasetUnavailableError, match="incomplete or corrupted"):
        load_dataset("cifar10", tmp_path)


# ----------------------------------------------------------------------------- split


@pytest.mark.parametrize("ratios", [(0.4, 0.4, 0.2), (0.5, 0.3, 0.1)])
@pytest.mark.parametrize("alpha", [None, 0.5])
def test_split_sizes_match_ratios(digits, ratios, alpha):
    x, y = digits
    n = len(y)
    parts = split_federation(x, y, 3, train_ratio=ratios[0], test_ratio=ratios[1], audit_ratio=ratios[2], dirichlet_alpha=alpha)
    assert len(parts) == 3
    for s, r in zip(SETS, ratios):
        assert sum(len(set_arrays(p, s)[1]) for p in parts) == int(np.floor(n * r + 1e-6))
        for p in parts:
            xs, ys = set_arrays(p, s)
            assert len(xs) == len(ys) >= 1
            assert xs.dtype == np.float32 and ys.dtype == np.int64 and xs.shape[1:] == (1, 8, 8)


def test_tutorial_sizes_on_60k():
    """60k pool with the tutorial ratios: 24k / 24k / 12k."""
    y = np.zeros(60000, dtype=np.int64)
    parts = split_indices(y, 2)
    assert [sum(len(p[s]) for p in parts) for s in SETS] == [24000, 24000, 12000]
    assert [len(parts[0][s]) for s in SETS] == [12000, 12000, 6000]


@pytest.mark.parametrize("alpha", [None, 0.1, 1.0])
def test_sets_disjoint_and_each_sample_used_at_most_once(alpha):
    x, y = ids_pool()
    parts = split_federation(x, y, 4, dirichlet_alpha=alpha, seed=3)
    used = np.concatenate([set_arrays(p, s)[0].ravel() for p in parts for s in SETS]).astype(np.int64)
    assert len(np.unique(used)) == len(used)  # no sample in two shards / sets / parties
    assert len(used) == 400 + 400 + 200
    for p in parts:  # labels travel with their samples
        for s in SETS:
            xs, ys = set_arrays(p, s)
            np.testing.assert_array_equal(y[xs.ravel().astype(np.int64)], ys)


@pytest.mark.parametrize("alpha", [None, 0.3])
def test_split_deterministic_per_seed_and_different_across_seeds(digits, alpha):
    x, y = digits
    a = split_federation(x, y, 3, seed=7, dirichlet_alpha=alpha)
    b = split_federation(x, y, 3, seed=7, dirichlet_alpha=alpha)
    c = split_federation(x, y, 3, seed=8, dirichlet_alpha=alpha)
    for pa, pb in zip(a, b):
        for s in SETS:
            np.testing.assert_array_equal(set_arrays(pa, s)[0], set_arrays(pb, s)[0])
            np.testing.assert_array_equal(set_arrays(pa, s)[1], set_arrays(pb, s)[1])
    assert any(
        pa.train_x.shape != pc.train_x.shape or not np.array_equal(pa.train_x, pc.train_x) for pa, pc in zip(a, c)
    )


def test_iid_shards_dealt_i_mod_n():
    x, y = ids_pool(n=1003)
    n_parties = 3
    parts = split_federation(x, y, n_parties, seed=5)
    perm = np.random.default_rng(5).permutation(1003)  # the documented seeded shuffle
    sizes = [401, 401, 200]
    bounds = np.cumsum([0] + sizes)
    for j, s in enumerate(SETS):
        whole = perm[bounds[j] : bounds[j + 1]]
        for i, p in enumerate(parts):
            np.testing.assert_array_equal(set_arrays(p, s)[0].ravel().astype(np.int64), whole[i::n_parties])


def test_dirichlet_skewed_and_same_mix_in_all_sets(digits):
    x, y = digits
    g = hist(y)
    iid_tv, skew_tv = [], []
    for seed in range(3):
        iid = split_federation(x, y, 4, seed=seed)
        skew = split_federation(x, y, 4, seed=seed, dirichlet_alpha=0.1)
        iid_tv += [tv(hist(p.train_y), g) for p in iid]
        skew_tv += [tv(hist(p.train_y), g) for p in skew]
        for p in skew:
            # the same label mix for a party's members, non-members and population
            assert tv(hist(p.train_y), hist(p.test_y)) < 0.2
            assert tv(hist(p.train_y), hist(p.population_y)) < 0.2
        # stronger: per class, each party's share of that class is the same in all three sets
        # (up to one sample of rounding per set)
        counts = {s: np.stack([np.bincount(set_arrays(p, s)[1], minlength=10) for p in skew], axis=1) for s in SETS}
        totals = {s: counts[s].sum(axis=1, keepdims=True) for s in SETS}
        share = {s: counts[s] / np.maximum(totals[s], 1) for s in SETS}
        for s in ("test", "population"):
            bound = 1.0 / np.maximum(totals["train"], 1) + 1.0 / np.maximum(totals[s], 1) + 1e-12
            assert (np.abs(share["train"] - share[s]) <= bound).all()
    assert np.mean(iid_tv) < 0.12
    assert np.mean(skew_tv) > 0.4 and np.mean(skew_tv) > 4 * np.mean(iid_tv)


def test_dirichlet_every_party_nonempty_or_error():
    x, y = ids_pool(n=1000)
    for seed in range(5):
        parts = split_federation(x, y, 5, seed=seed, dirichlet_alpha=0.05)
        assert all(len(set_arrays(p, s)[1]) >= 1 for p in parts for s in SETS)
    x, y = ids_pool(n=100, n_classes=2)  # 2 classes, very skewed shares: 20 parties cannot all be served
    with pytest.raises(ValueError, match=r"dirichlet_alpha.*no sample in the (train|test|population) set"):
        split_federation(x, y, 20, dirichlet_alpha=0.01)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(train_ratio=0.0), "train_dataset_ratio"),
        (dict(test_ratio=-0.1), "test_dataset_ratio"),
        (dict(audit_ratio=0), "audit_dataset_ratio"),
        (dict(audit_ratio=float("nan")), "audit_dataset_ratio"),
        (dict(train_ratio="0.4"), "train_dataset_ratio"),
        (dict(train_ratio=0.5, test_ratio=0.4, audit_ratio=0.2), "train_dataset_ratio \\+ test_dataset_ratio \\+ audit_dataset_ratio"),
        (dict(dirichlet_alpha=0), "dirichlet_alpha"),
        (dict(dirichlet_alpha=-1.0), "dirichlet_alpha"),
    ],
)
def test_split_ratio_errors_name_the_ratio(kwargs, name):
    x, y = ids_pool(100)
    with pytest.raises(ValueError, match=name):
        split_federation(x, y, 2, **kwargs)


def test_ratios_summing_to_one_within_tolerance():
    x, y = ids_pool(100)
    parts = split_federation(x, y, 2, train_ratio=0.7, test_ratio=0.2, audit_ratio=0.1)
    assert sum(len(p.train_y) + len(p.test_y) + len(p.population_y) for p in parts) <= 100


def test_party_count_errors():
    x, y = ids_pool(20)
    with pytest.raises(ValueError, match="n_parties"):
        split_federation(x, y, 0)
    with pytest.raises(ValueError, match="population set"):  # 4 population samples for 5 parties
        split_federation(x, y, 5)
    with pytest.raises(ValueError, match="length"):
        split_federation(x, y[:-1], 2)


# ----------------------------------------------------------------------------- data loader


def test_loader_init_mode_loads_nothing(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("init mode must not load data")

    monkeypatch.setattr(dl_mod, "load_dataset", boom)
    dl = AuditDataLoader(data_path=None, dataset="cifar10", data_dir=tmp_path / "nothing-here")
    assert dl.get_feature_shape() == [3, 32, 32]
    assert dl.get_num_classes() == 10
    assert dl.X_train is None and dl.shard is None
    with pytest.raises(RuntimeError, match="data_path=None"):
        dl.get_audit_sets()
    dl = AuditDataLoader()
    assert dl.get_feature_shape() == [1, 8, 8] and dl.get_num_classes() == 10


def test_loader_shard_mode_matches_split(digits):
    x, y = digits
    parts = split_federation(x, y, 3, seed=4, dirichlet_alpha=0.5)
    for shard in (1, 2, 3):
        dl = AuditDataLoader(data_path=str(shard), batch_size=10, collaborator_count=3, seed=4, dirichlet_alpha=0.5)
        p = dl.get_party_data()
        ref = parts[shard - 1]
        for field in ("train_x", "train_y", "test_x", "test_y", "population_x", "population_y"):
            np.testing.assert_array_equal(getattr(p, field), getattr(ref, field))
        assert dl.get_train_data_size() == len(ref.train_y)
        assert dl.get_valid_data_size() == len(ref.test_y)
        # validation = the non-member shard, in order, numpy float32 / int64 batches
        batches = list(dl.get_valid_loader())
        assert len(batches) == int(np.ceil(len(ref.test_y) / 10))
        assert all(bx.dtype == np.float32 and by.dtype == np.int64 for bx, by in batches)
        np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), ref.test_x)
        np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), ref.test_y)


def test_loader_train_batches_shuffled_cover_shard_once():
    dl = AuditDataLoader(data_path=1, batch_size=32)
    loader = dl.get_train_loader()
    batches = list(loader)
    assert len(batches) == len(loader) == int(np.ceil(dl.get_train_data_size() / 32))
    assert all(b[0].shape[1:] == (1, 8, 8) and b[0].dtype == np.float32 and b[1].dtype == np.int64 for b in batches)
    xs = np.concatenate([b[0] for b in batches])
    assert len(xs) == dl.get_train_data_size()
    assert not np.array_equal(xs, dl.X_train)  # shuffled
    shard = np.asarray(dl.X_train)
    order = np.lexsort(xs.reshape(len(xs), -1).T)
    ref = np.lexsort(shard.reshape(len(xs), -1).T)
    np.testing.assert_array_equal(xs[order], shard[ref])  # a permutation of the shard
    # num_batches beyond one epoch continues with fresh permutations, all batches full
    more = list(dl.get_train_loader(batch_size=100, num_batches=10))
    assert len(more) == 10 and all(len(b[1]) == 100 for b in more)


def test_loader_train_batches_reproducible_for_same_seed():
    def epochs(seed, shard=1, n=3):
        dl = AuditDataLoader(data_path=shard, batch_size=16, seed=seed)
        return [np.concatenate([b[1] for b in dl.get_train_loader()]) for _ in range(n)], dl

    a, dla = epochs(0)
    b, _ = epochs(0)
    for ea, eb in zip(a, b):
        np.testing.assert_array_equal(ea, eb)  # same plan + seed -> same batches
    assert not np.array_equal(a[0], a[1])  # the generator advances every epoch
    _, dlc = epochs(1)
    assert not np.array_equal(dla.X_train, dlc.X_train)  # another seed, another split

    # each loader has its own (seed, shard) generator: other loaders' epochs do not disturb it
    one = AuditDataLoader(data_path=1, batch_size=16, seed=0)
    other = AuditDataLoader(data_path=2, batch_size=16, seed=0)
    got = []
    for _ in range(3):
        list(other.get_train_loader())
        got.append(np.concatenate([b[1] for b in one.get_train_loader()]))
    for ea, eg in zip(a, got):
        np.testing.assert_array_equal(ea, eg)


def test_loader_get_audit_sets_shapes():
    dl = AuditDataLoader(data_path="2", collaborator_count=2)
    sets = dl.get_audit_sets()
    assert set(sets) == {"members", "nonmembers", "population"}
    n = 1797
    expected = {"members": 718 // 2, "nonmembers": 718 // 2, "population": 359 // 2}  # shard 2 of 2: set[1::2]
    for name, (xs, ys) in sets.items():
        assert xs.shape == (expected[name], 1, 8, 8) and ys.shape == (expected[name],)
        assert xs.dtype == np.float32 and ys.dtype == np.int64
    assert sum(len(v[1]) for v in sets.values()) < n
    np.testing.assert_array_equal(sets["members"][0], dl.X_train)
    np.testing.assert_array_equal(sets["nonmembers"][0], dl.X_valid)


@pytest.mark.parametrize("bad", ["0", "3", "abc", "1.5", -1, True, ""])
def test_loader_bad_data_path(bad):
    with pytest.raises(ValueError) as err:
        AuditDataLoader(data_path=bad, collaborator_count=2)
    msg = str(err.value)
    assert "data_path" in msg and repr(bad) in msg and "1..2" in msg


@pytest.mark.parametrize(
    "settings, name",
    [
        (dict(dataset="emnist"), "data_loader.settings.dataset"),
        (dict(batch_size=0), "data_loader.settings.batch_size"),
        (dict(collaborator_count=0), "data_loader.settings.collaborator_count"),
        (dict(train_dataset_ratio=0), "data_loader.settings.train_dataset_ratio"),
        (dict(test_dataset_ratio=0.9), "data_loader.settings.train_dataset_ratio"),
        (dict(audit_dataset_ratio=-0.2), "data_loader.settings.audit_dataset_ratio"),
        (dict(dirichlet_alpha=0), "data_loader.settings.dirichlet_alpha"),
        (dict(seed=-1), "data_loader.settings.seed"),
        (dict(download="yes"), "data_loader.settings.download"),
        (dict(dirichlet_alph=0.5), "data_loader.settings.dirichlet_alph"),
    ],
)
def test_loader_bad_settings_name_the_setting(settings, name):
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        AuditDataLoader(data_path=None, **settings)


def test_loader_cifar_missing_raises_dataset_unavailable(tmp_path, no_network):
    with pytest.raises(DatasetUnavailableError, match="--dataset digits"):
        AuditDataLoader(data_path="1", dataset="cifar10", data_dir=tmp_path)


def test_loader_caches_dataset_per_process(monkeypatch):
    dl_mod.clear_dataset_cache()
    calls = []
    real = datasets_mod.load_dataset

    def counting(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(dl_mod, "load_dataset", counting)
    a = AuditDataLoader(data_path="1")
    b = AuditDataLoader(data_path="2")
    assert len(calls) == 1
    assert not np.shares_memory(a.X_train.pixels, b.X_train.pixels)
    before = np.asarray(b.X_train)
    a.X_train.pixels[0] += 1  # the parties' sets are disjoint rows of one array
    np.testing.assert_array_equal(b.X_train, before)
    dl_mod.clear_dataset_cache()


@pytest.mark.parametrize("settings", [
    dict(collaborator_count=3, train_dataset_ratio=0.3, test_dataset_ratio=0.3, audit_dataset_ratio=0.2),
    dict(collaborator_count=4, dirichlet_alpha=0.5, devices_per_user=2, seed=3),
])
def test_loader_sets_are_views_of_one_array_with_the_split_s_samples(settings):
    """Every party's train, test and population set are row slices of one uint8 pixel array (one copy of the samples
    the split uses, a quarter of their float32 size, none of the whole dataset), holding exactly the samples
    split_indices gives, in its order; the
    background is the federation's population set, in pool order."""
    dl_mod.clear_dataset_cache()
    x, y = datasets_mod.load_dataset("digits")
    n = settings["collaborator_count"]
    parts = data_mod.split_indices(y, n, train_ratio=settings.get("train_dataset_ratio", 0.4),
                                   test_ratio=settings.get("test_dataset_ratio", 0.4),
                                   audit_ratio=settings.get("audit_dataset_ratio", 0.2), seed=settings.get("seed", 0),
                                   dirichlet_alpha=settings.get("dirichlet_alpha"),
                                   devices_per_user=settings.get("devices_per_user", 1))
    loaders = [AuditDataLoader(data_path=str(s), dataset="digits", **settings) for s in range(1, n + 1)]
    base = loaders[0].X_train.pixels.base
    used = sum(len(p[s]) for p in parts for s in ("train", "test", "population"))
    assert base is not None and base.shape == (used, 1, 8, 8) and base.dtype == np.uint8
    for loader, part in zip(loaders, parts):
        for arr, lab, name in ((loader.X_train, loader.y_train, "train"), (loader.X_valid, loader.y_valid, "test"),
                               (loader.X_population, loader.y_population, "population")):
            assert arr.pixels.base is base
            np.testing.assert_array_equal(arr, x[part[name]])
            np.testing.assert_array_equal(lab, y[part[name]])
    background = np.sort(np.concatenate([p["population"] for p in parts]))
    bx, by = loaders[-1].get_background()
    np.testing.assert_array_equal(bx, x[background])
    np.testing.assert_array_equal(by, y[background])
    dl_mod.clear_dataset_cache()


# ----------------------------------------------------------------------------- devices per user
# The deanonymization paper's shadow-device protocol: every user owns several FL devices
# (collaborators) whose data follow the same user-specific label mix.


def test_user_of_party():
    assert data_mod.user_of_party(0, 1) == (0, 0)
    assert data_mod.user_of_party(5, 1) == (5, 0)
    assert [data_mod.user_of_party(p, 2) for p in range(6)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert data_mod.user_of_party(np.int64(7), 3) == (2, 1)
    for bad_party in (-1, 1.0, True, "0"):
        with pytest.raises(ValueError, match="party_index"):
            data_mod.user_of_party(bad_party, 2)
    for bad_d in (0, -2, 2.0, True, None):
        with pytest.raises(ValueError, match="devices_per_user"):
            data_mod.user_of_party(0, bad_d)


@pytest.mark.parametrize("alpha", [None, 0.1, 0.5])
def test_devices_per_user_one_is_the_plain_split(alpha):
    x, y = ids_pool()
    for n in (1, 3, 4):
        a = split_indices(y, n, seed=2, dirichlet_alpha=alpha)
        b = split_indices(y, n, seed=2, dirichlet_alpha=alpha, devices_per_user=1)
        assert len(a) == len(b) == n
        for pa, pb in zip(a, b):
            for s in SETS:
                assert pa[s].dtype == pb[s].dtype == np.int64
                np.testing.assert_array_equal(pa[s], pb[s])


@pytest.mark.parametrize("alpha", [None, 0.1, 1.0])
@pytest.mark.parametrize("n_users, d", [(2, 2), (3, 2), (2, 3), (1, 4)])
def test_devices_deal_each_user_split(alpha, n_users, d):
    """user u's sets (the plain n_users split, same seed) dealt as set[j::d] to its devices."""
    x, y = ids_pool()
    users = split_indices(y, n_users, seed=3, dirichlet_alpha=alpha)
    parts = split_indices(y, n_users * d, seed=3, dirichlet_alpha=alpha, devices_per_user=d)
    assert len(parts) == n_users * d
    for p, part in enumerate(parts):
        u, j = data_mod.user_of_party(p, d)
        assert (u, j) == (p // d, p % d)
        for s in SETS:
            assert part[s].dtype == np.int64 and len(part[s]) >= 1
            np.testing.assert_array_equal(part[s], users[u][s][j::d])
    # disjoint, and together the devices of a user cover exactly the user's set
    for s in SETS:
        used = np.concatenate([part[s] for part in parts])
        assert len(np.unique(used)) == len(used)
        for u in range(n_users):
            mine = np.concatenate([parts[u * d + j][s] for j in range(d)])
            np.testing.assert_array_equal(np.sort(mine), np.sort(users[u][s]))
    everything = np.concatenate([part[s] for part in parts for s in SETS])
    assert len(np.unique(everything)) == len(everything) == 400 + 400 + 200


def test_devices_of_a_user_share_its_label_mix(digits):
    x, y = digits
    d, n_users = 2, 3
    same, other = [], []
    for seed in range(3):
        parts = split_federation(x, y, n_users * d, seed=seed, dirichlet_alpha=0.3, devices_per_user=d)
        h = [hist(p.train_y) for p in parts]
        same += [tv(h[u * d], h[u * d + 1]) for u in range(n_users)]
        other += [tv(h[u * d], h[v * d]) for u in range(n_users) for v in range(u + 1, n_users)]
        for p in parts:  # each device keeps the user's mix in all three sets
            assert tv(hist(p.train_y), hist(p.test_y)) < 0.3
        # sizes of a user's devices differ by at most one sample per set
        for u in range(n_users):
            for s in SETS:
                sizes = [len(set_arrays(parts[u * d + j], s)[1]) for j in range(d)]
                assert max(sizes) - min(sizes) <= 1
    assert max(same) < 0.25
    assert min(other) > 0.4
    assert np.mean(other) > 4 * np.mean(same)


def test_split_federation_devices_traceable():
    x, y = ids_pool()
    parts = split_federation(x, y, 4, seed=1, dirichlet_alpha=0.5, devices_per_user=2)
    ref = split_indices(y, 4, seed=1, dirichlet_alpha=0.5, devices_per_user=2)
    for p, r in zip(parts, ref):
        for s in SETS:
            xs, ys = set_arrays(p, s)
            np.testing.assert_array_equal(xs.ravel().astype(np.int64), r[s])
            np.testing.assert_array_equal(ys, y[r[s]])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_devices_per_user_bad_values_name_the_setting(bad):
    x, y = ids_pool(100)
    with pytest.raises(ValueError, match="devices_per_user"):
        split_federation(x, y, 2, devices_per_user=bad)
    with pytest.raises(ValueError, match="devices_per_user"):
        split_indices(y, 2, devices_per_user=bad)


def test_devices_per_user_must_divide_party_count():
    x, y = ids_pool(100)
    with pytest.raises(ValueError, match=r"devices_per_user.*n_parties=5.*multiple") as err:
        split_federation(x, y, 5, devices_per_user=2)
    assert "devices_per_user=2" in str(err.value)
    with pytest.raises(ValueError, match="devices_per_user"):
        split_indices(y, 2, devices_per_user=3)


def test_devices_per_user_every_device_needs_a_sample():
    x, y = ids_pool(20)  # 4 population samples: 2 users x 3 devices cannot all get one
    with pytest.raises(ValueError, match=r"population set.*6 parties \(2 users x devices_per_user=3\)"):
        split_federation(x, y, 6, devices_per_user=3)
    # one class, tiny alpha: one user gets (nearly) everything, its partner less than 2 samples
    y1 = np.zeros(100, dtype=np.int64)
    with pytest.raises(ValueError, match=r"dirichlet_alpha=0.001, devices_per_user=2: user \d+ got \d+ sample\(s\) in the (train|test|population) set, fewer than its 2 devices"):
        split_indices(y1, 4, seed=0, dirichlet_alpha=0.001, devices_per_user=2)


def test_loader_devices_per_user_shards_know_their_user(digits):
    x, y = digits
    parts = split_federation(x, y, 4, seed=2, dirichlet_alpha=0.5, devices_per_user=2)
    for shard, (user, device) in zip((1, 2, 3, 4), [(0, 0), (0, 1), (1, 0), (1, 1)]):
        dl = AuditDataLoader(data_path=str(shard), collaborator_count=4, devices_per_user=2, seed=2, dirichlet_alpha=0.5)
        assert (dl.user, dl.device) == (user, device)
        assert dl.devices_per_user == 2 and dl.dirichlet_alpha == 0.5
        p, ref = dl.get_party_data(), parts[shard - 1]
        for field in ("train_x", "train_y", "test_x", "test_y", "population_x", "population_y"):
            np.testing.assert_array_equal(getattr(p, field), getattr(ref, field))
    # default: one device per user, user == shard - 1; IID alpha is None; init mode has no user
    dl = AuditDataLoader(data_path="2", collaborator_count=3)
    assert (dl.devices_per_user, dl.user, dl.device, dl.dirichlet_alpha) == (1, 1, 0, None)
    dl = AuditDataLoader(data_path=None, collaborator_count=4, devices_per_user=4)
    assert dl.devices_per_user == 4 and dl.user is None and dl.device is None


@pytest.mark.parametrize(
    "settings",
    [
        dict(devices_per_user=0),
        dict(devices_per_user=1.5),
        dict(devices_per_user="2"),
        dict(devices_per_user=True),
        dict(collaborator_count=3, devices_per_user=2),
    ],
)
def test_loader_bad_devices_per_user_names_the_setting(settings):
    with pytest.raises(ValueError, match=r"data_loader\.settings\.devices_per_user"):
        AuditDataLoader(data_path=None, **settings)


def test_loader_devices_per_user_not_dividing_names_collaborator_count():
    with pytest.raises(ValueError, match=r"data_loader\.settings\.collaborator_count=3") as err:
        AuditDataLoader(data_path="1", collaborator_count=3, devices_per_user=2)
    assert "data_loader.settings.devices_per_user=2" in str(err.value)


def test_loader_unknown_setting_lists_devices_per_user():
    with pytest.raises(ValueError, match="devices_per_user") as err:
        AuditDataLoader(data_path=None, device_per_user=2)
    assert "data_loader.settings.device_per_user: unknown setting" in str(err.value)
