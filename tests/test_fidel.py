"""Tests of audit.fidel.attack / audit.fidel.decoder on real updates of the project's models on digits."""

import copy
import itertools
import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from matplotlib.image import imread
from scipy.stats import pearsonr
from torch import nn

from audit.config.fidel_settings import FIDEL_METRICS
from audit.fidel.attack import fidel_audit
from audit.fidel.layers import dense_update, find_first_dense_layer, reconstruct
from audit.fidel.grid import save_reveal_grid
from audit.fidel.scoring import count_revealed, pearson_matrix
from audit.fidel.decoder import train_decoder
from src.data.datasets import load_dataset
from src.runner.models import CNN, FCNN

SHAPE = (1, 8, 8)
LAYER = "classifier.fc1"


@pytest.fixture(scope="module")
def digits():
    x, y = load_dataset("digits")
    return np.asarray(x), y  # the float32 values (the loader holds uint8 pixels read as these)


def sgd_epoch(model, x, y, lr=0.01, batch_size=50):
    """The paper's local update: one epoch of plain SGD; returns the trained copy."""
    local = copy.deepcopy(model)
    local.train()
    opt = torch.optim.SGD(local.parameters(), lr=lr)
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    for start in range(0, len(x), batch_size):
        opt.zero_grad()
        F.cross_entropy(local(x[start : start + batch_size]), y[start : start + batch_size]).backward()
        opt.step()
    return local


def rounding_of_ratio(model, local, inputs, layer=LAYER) -> np.ndarray:
    """How far dW_i / db_i (rows: the neurons reconstruct uses) can be from the layer's input `inputs` (in,) after one
    float32 SGD step on one sample, by rounding alone. The step stores W - lr g_i x_j and b - lr g_i: the products
    round by a relative 2^-24 each (three in all: g_i x_j, and lr times each gradient; g_i's own rounding is common to
    both and cancels), each stored sum by at most half a float32 spacing of the result. So |dW_ij / db_i - x_j| <=
    4 * 2^-24 |x_j| + (spacing(W'_ij) + |x_j| spacing(b'_i)) / |db_i|, the spacings taken whole (twice the rounding)
    for the first-order terms left out."""
    dw, db = dense_update(model, local, layer)
    _, used = reconstruct(dw, db)
    weight, bias = (dict(local.named_parameters())[f"{layer}.{n}"].detach().numpy() for n in ("weight", "bias"))
    x = np.abs(np.asarray(inputs, np.float64).reshape(1, -1))
    u = float(np.finfo(np.float32).eps) / 2
    return 4 * u * x + (np.spacing(np.abs(weight[used])).astype(np.float64)
                        + x * np.spacing(np.abs(bias[used])).astype(np.float64)[:, None]) / np.abs(db[used])[:, None]


def training_forward(module, x) -> np.ndarray:
    """`module`'s output on `x` computed as sgd_epoch's training step computed it (a copy in train mode, autograd on):
    the same kernels on the same values, so the same float32 numbers."""
    return copy.deepcopy(module).train()(torch.as_tensor(x)).detach().numpy().astype(np.float64)


def mixed_update(model, a, b, mix, scale):
    """Global / local state dicts whose fc1 update has rows scale_i * (mix_i a + (1 - mix_i) b), db_i = scale_i."""
    g = {k: v.clone() for k, v in model.state_dict().items()}
    loc = {k: v.clone() for k, v in g.items()}
    rows = mix[:, None] * a[None] + (1 - mix[:, None]) * b[None]
    loc[f"{LAYER}.weight"] += torch.as_tensor(scale[:, None] * rows, dtype=torch.float32)
    loc[f"{LAYER}.bias"] += torch.as_tensor(scale, dtype=torch.float32)
    return g, loc


# ----------------------------------------------------------------------------- the paper's known result


@pytest.mark.numerics
def test_one_sample_fcnn_update_reveals_the_sample_exactly(digits):
    x, y = digits
    torch.manual_seed(0)
    model = FCNN(SHAPE, 10)
    local = sgd_epoch(model, x[:1], y[:1])
    result = fidel_audit(model, local, x[:1])

    assert result.layer == LAYER and result.space == "input"
    assert result.revealed == 1 and result.revealed_fraction == 1.0
    assert result.best_r[0] > 0.999
    assert result.psnr[0] > 40
    # dW_i / db_i is the sample itself (not just correlated): the learning rate and g_i cancel.
    dw, db = dense_update(model, local, LAYER)
    recs, used = reconstruct(dw, db)
    assert 0 < len(used) < 128  # dead ReLUs give nothing
    bound = rounding_of_ratio(model, local, x[0])  # the float32 step's rounding, derived per element
    assert np.all(np.abs(recs - x[0].reshape(1, -1)) <= bound)
    metrics = result.metrics()
    assert set(metrics) == set(FIDEL_METRICS)
    assert metrics["fidel_revealed_fraction"] == 1.0 and metrics["fidel_mean_best_r"] > 0.999


def test_state_dicts_of_numpy_arrays_give_the_module_result(digits):
    x, y = digits
    torch.manual_seed(1)
    model = FCNN(SHAPE, 10)
    local = sgd_epoch(model, x[:10], y[:10])
    as_np = lambda m: {k: v.numpy().copy() for k, v in m.state_dict().items()}  # noqa: E731 - as OpenFL sends them
    a = fidel_audit(model, local, x[:10])
    b = fidel_audit(as_np(model), as_np(local), x[:10], model=FCNN(SHAPE, 10))
    assert a.to_dict() == b.to_dict()
    np.testing.assert_array_equal(a.best_r, b.best_r)


# ----------------------------------------------------------------------------- scoring


def test_vectorised_scoring_equals_a_naive_per_neuron_loop(digits):
    x, y = digits
    torch.manual_seed(2)
    model = FCNN(SHAPE, 10)
    local = sgd_epoch(model, x[:6], y[:6])
    dw, db = dense_update(model, local, LAYER)
    samples = x[:6].reshape(6, -1).astype(np.float64)

    recs, used = reconstruct(dw, db)
    fast = pearson_matrix(recs, samples)
    naive = np.empty((len(used), len(samples)))
    for row, i in enumerate(used):  # the reference: one neuron and one sample at a time
        rec = dw[i] / db[i]
        for s in range(len(samples)):
            naive[row, s] = pearsonr(rec, samples[s]).statistic
    np.testing.assert_allclose(fast, naive, atol=1e-12)

    result = fidel_audit(model, local, x[:6], ica=False)
    np.testing.assert_allclose(result.best_r, naive.max(axis=0), atol=1e-12)


def test_count_is_a_maximum_one_to_one_matching():
    rng = np.random.default_rng(0)
    for _ in range(200):
        corr = rng.uniform(0.9, 1.0, size=(rng.integers(1, 5), rng.integers(1, 5)))
        rows, cols = count_revealed(corr, 0.97)
        assert len(set(rows)) == len(rows) and len(set(cols)) == len(cols)
        assert np.all(corr[rows, cols] >= 0.97)
        k, n = corr.shape
        best = max(  # brute force over every injective assignment of samples to reconstructions
            sum(corr[p[j], j] >= 0.97 for j in range(n) if p[j] is not None)
            for p in itertools.product(*[[None, *range(k)]] * n)
            if len({i for i in p if i is not None}) == sum(i is not None for i in p)
        )
        assert len(rows) == best


def test_a_sample_two_neurons_reveal_counts_once_and_near_misses_do_not_hide_a_reveal():
    two_neurons_one_sample = np.array([[0.99, 0.10], [0.995, 0.20]])
    rows, cols = count_revealed(two_neurons_one_sample, 0.98)
    assert list(cols) == [0]
    # Maximising the plain sum of r (0.97 + 0.97 > 0.99 + 0.5) would report nothing revealed here.
    rows, cols = count_revealed(np.array([[0.99, 0.97], [0.97, 0.5]]), 0.98)
    assert list(zip(rows, cols)) == [(0, 0)]


def test_one_to_one_count_in_the_audit(digits):
    x, _ = digits
    torch.manual_seed(3)
    model = FCNN(SHAPE, 10)
    # 40 neurons all move for sample 0 alone (as if it were the only one active), none for sample 1.
    mix = np.r_[np.ones(40), np.zeros(88)]
    scale = np.r_[np.linspace(1e-3, 2e-3, 40), np.zeros(88)]
    g, loc = mixed_update(model, x[0].ravel(), x[1].ravel(), mix, scale)
    result = fidel_audit(g, loc, x[:2], model=model, ica=False)
    assert result.n_neurons_used == 40
    assert result.revealed == 1 and bool(result.revealed_mask[0]) and not result.revealed_mask[1]
    assert (pearson_matrix(reconstruct(*dense_update(g, loc, LAYER))[0], x[:2].reshape(2, -1))[:, 0] > 0.999).all()


# ----------------------------------------------------------------------------- ICA


def test_ica_unmixes_two_samples_that_every_neuron_mixes(digits):
    x, _ = digits
    flat = x.reshape(len(x), -1).astype(np.float64)
    a, b = 7, 19  # a 7 and a 9 with Pearson r 0.06: FastICA's un-mixed sources come out uncorrelated
    assert abs(pearson_matrix(flat[[a]], flat[[b]])[0, 0]) < 0.1
    rng = np.random.default_rng(0)
    mix = rng.uniform(0.25, 0.75, 128)  # every neuron sees both samples, none is dominated by one
    scale = rng.choice([-1.0, 1.0], 128) * rng.uniform(0.5, 2.0, 128) * 1e-3
    torch.manual_seed(4)
    model = FCNN(SHAPE, 10)
    g, loc = mixed_update(model, flat[a], flat[b], mix, scale)

    result = fidel_audit(g, loc, x[[a, b]], model=model, seed=0)
    assert result.revealed == 0 and result.best_r.max() < 0.96
    assert result.ica_components == 2  # the numerical rank of the reconstructions
    assert result.revealed_ica == 2 and result.revealed_union == 2
    assert result.revealed_ica > result.revealed
    assert (result.best_r_ica >= 0.98).all()
    assert result.metrics()["fidel_revealed_fraction_ica"] == 1.0
    assert fidel_audit(g, loc, x[[a, b]], model=model, ica=False).revealed_ica is None


# ----------------------------------------------------------------------------- CNN


@pytest.mark.numerics
def test_cnn_partial_reconstruction_is_the_activation_map(digits):
    x, y = digits
    torch.manual_seed(5)
    model = CNN(SHAPE, 10)
    local = sgd_epoch(model, x[:1], y[:1])
    result = fidel_audit(model, local, x[:1])

    assert result.space == "activation" and result.reconstruction_shape == (32, 4, 4)
    assert result.revealed == 1 and result.best_r[0] > 0.999
    acts = training_forward(model.features, x[:1])
    recs, _ = reconstruct(*dense_update(model, local, LAYER))
    bound = rounding_of_ratio(model, local, acts)  # the float32 step's rounding, derived per element
    assert np.all(np.abs(recs - acts) <= bound)
    # the match is the least-squares affine fit of one of these rows to the activations: no farther from them (in
    # the L2 norm) than that row itself
    fitted = result.match_reconstruction.reshape(-1)
    assert np.linalg.norm(fitted - acts.reshape(-1)) <= np.linalg.norm(bound, axis=1).max()


def test_cnn_decoder_maps_the_reconstruction_back_to_pixels(digits, tmp_path):
    x, y = digits
    torch.manual_seed(6)
    model = CNN(SHAPE, 10)
    decoder = train_decoder(model, x[1000:1600])  # population data, disjoint from the private samples
    assert decoder.layer == LAYER and decoder.output_shape == SHAPE
    local = sgd_epoch(model, x[:1], y[:1])
    result = fidel_audit(model, local, x[:1], decoder=decoder)
    assert result.match_decoded.shape == (1, *SHAPE)
    assert result.best_r_decoded[0] > 0.95 and result.revealed_decoded == int(result.best_r_decoded[0] >= 0.98)
    # A decoder trained for another layer is refused.
    other = copy.deepcopy(decoder).__class__(**{**decoder.__dict__, "layer": "classifier.fc2"})
    with pytest.raises(ValueError, match="classifier.fc2"):
        fidel_audit(model, local, x[:1], decoder=other)
    path = save_reveal_grid(result, x[:1], tmp_path / "cnn.png", include_unrevealed=True)
    assert imread(path).ndim == 3


# ----------------------------------------------------------------------------- skipped neurons, errors


def test_neurons_with_negligible_db_are_skipped(digits):
    x, _ = digits
    mix = np.ones(128)
    scale = np.full(128, 1e-3)
    scale[:10] = 0.0  # dead: no update at all
    scale[10:20] = 1e-9  # 1e-6 of the largest: below min_rel_bias
    torch.manual_seed(7)
    model = FCNN(SHAPE, 10)
    g, loc = mixed_update(model, x[0].ravel(), x[1].ravel(), mix, scale)
    dw, db = dense_update(g, loc, LAYER)
    _, used = reconstruct(dw, db, min_rel_bias=1e-3)
    np.testing.assert_array_equal(used, np.arange(20, 128))
    _, used_all = reconstruct(dw, db, min_rel_bias=0.0)
    assert set(used_all) >= set(range(20, 128)) and not set(used_all) & set(range(10))
    result = fidel_audit(g, loc, x[:2], model=model)
    assert result.n_neurons_used == 108 and result.revealed == 1
    np.testing.assert_array_equal(result.neuron_index, np.arange(20, 128))


def test_first_dense_layer_is_found_in_forward_order():
    class HeadFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(16, 3)  # registered first, called last
            self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU())

        def forward(self, x):
            return self.head(self.body(x))

    assert find_first_dense_layer(HeadFirst(), torch.zeros(1, 1, 8, 8)) == "body.1"
    assert find_first_dense_layer(CNN(SHAPE, 10), torch.zeros(1, *SHAPE)) == LAYER


def test_errors_name_the_problem(digits):
    x, y = digits
    torch.manual_seed(8)
    model = FCNN(SHAPE, 10)
    local = sgd_epoch(model, x[:2], y[:2])
    no_dense = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())
    with pytest.raises(ValueError, match="no nn.Linear layer"):
        fidel_audit(no_dense, copy.deepcopy(no_dense), x[:2])
    with pytest.raises(ValueError, match=r"'features.conv1' is Conv2d, not nn.Linear"):
        fidel_audit(CNN(SHAPE, 10), CNN(SHAPE, 10), x[:2], layer="features.conv1")
    with pytest.raises(ValueError, match="'classifier.nope': no such module"):
        fidel_audit(model, local, x[:2], layer="classifier.nope")

    bad = {k: v.clone() for k, v in local.state_dict().items()}
    bad[f"{LAYER}.weight"] = bad[f"{LAYER}.weight"][:, :63]
    with pytest.raises(ValueError, match=r"classifier.fc1.weight: global shape \(128, 64\) != local shape \(128, 63\)"):
        fidel_audit(model, bad, x[:2])
    del bad[f"{LAYER}.bias"]
    with pytest.raises(ValueError, match="local_weights: has no 'classifier.fc1.bias'"):
        dense_update(model, bad, LAYER)
    with pytest.raises(ValueError, match="do not fit the model"):
        fidel_audit(model, local, np.zeros((2, 1, 7, 7), dtype=np.float32))
    with pytest.raises(ValueError, match="model: needed"):
        fidel_audit(model.state_dict(), local.state_dict(), x[:2])
    with pytest.raises(ValueError, match="threshold"):
        fidel_audit(model, local, x[:2], threshold=1.5)
    with pytest.raises(ValueError, match="min_rel_bias"):
        fidel_audit(model, local, x[:2], min_rel_bias=-1)
    with pytest.raises(ValueError, match="samples"):
        fidel_audit(model, local, x[:0])
    with pytest.raises(ValueError, match="reconstructions have 64 values each but samples have 63"):
        pearson_matrix(np.zeros((2, 64)), np.zeros((2, 63)))
    with pytest.raises(ValueError, match="population_x"):
        train_decoder(model, x[:1])


# ----------------------------------------------------------------------------- no neuron moved, token inputs


def frozen_first_layer_update(model, x, y):
    """A local epoch with the first dense layer frozen: every other layer moves, that one does not."""
    frozen = copy.deepcopy(model)
    frozen.get_submodule(LAYER).requires_grad_(False)
    return sgd_epoch(frozen, x, y)


@pytest.mark.parametrize("arch", [FCNN, CNN])
@pytest.mark.parametrize("how", ["local is global", "first dense layer frozen"])
@pytest.mark.slow
def test_an_update_that_moves_no_neuron_reveals_nothing(digits, tmp_path, arch, how):
    x, y = digits
    torch.manual_seed(10)
    model = arch(SHAPE, 10)
    local = copy.deepcopy(model) if how == "local is global" else frozen_first_layer_update(model, x[:8], y[:8])
    dw, db = dense_update(model, local, LAYER)
    assert not dw.any() and not db.any()
    if how != "local is global":  # the rest of the model did train
        assert not torch.equal(model.classifier.out.weight, local.classifier.out.weight)
    decoder = train_decoder(model, x[1000:1200]) if arch is CNN else None
    result = fidel_audit(model, local, x[:8], decoder=decoder)

    assert result.n_neurons_used == 0 and result.ica_components == 0
    assert result.revealed == result.revealed_ica == result.revealed_union == 0
    assert result.metrics() == {name: 0.0 for name in FIDEL_METRICS}
    assert not result.revealed_union_mask.any() and (result.best_r == 0).all()
    assert result.match_reconstruction.shape == (8, *result.reconstruction_shape)
    if decoder is not None:
        assert result.revealed_decoded == 0 and result.match_decoded.shape == (8, *SHAPE)
    d = result.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["revealed_fraction"] == d["revealed_fraction_union"] == 0.0 and d["n_neurons_used"] == 0
    path = save_reveal_grid(result, x[:8], tmp_path / "grid.png")
    assert imread(path).ndim == 3


class TokenBag(nn.Module):
    """Token ids -> Embedding -> mean over the sequence -> dense layers; the first dense layer sees one row per
    sample (the mean embedding), so Fidel reconstructs it: a partial reconstruction, like a CNN's activation map."""

    def __init__(self, vocab=40, dim=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, tokens):
        return self.out(torch.relu(self.hidden(self.emb(tokens).mean(dim=1))))


class PerTokenFirst(TokenBag):
    """A Linear applied per token ((B, T, D)) before the per-sample one."""

    def __init__(self):
        super().__init__()
        self.per_token = nn.Linear(12, 12)

    def forward(self, tokens):
        h = torch.tanh(self.per_token(self.emb(tokens)))  # (B, T, 12): not one row per sample
        return self.out(torch.relu(self.hidden(h.mean(dim=1))))


class FoldedFirst(TokenBag):
    """The batch folded into rows ((B * T, D)) before a Linear."""

    def __init__(self):
        super().__init__()
        self.per_token = nn.Linear(12, 12)

    def forward(self, tokens):
        b, t = tokens.shape
        h = torch.tanh(self.per_token(self.emb(tokens).reshape(b * t, -1))).reshape(b, t, -1)
        return self.out(torch.relu(self.hidden(h.mean(dim=1))))


@pytest.mark.numerics
def test_token_inputs_are_reconstructed_as_the_embedding_the_first_dense_layer_sees():
    torch.manual_seed(11)
    model = TokenBag()
    tokens = torch.randint(0, 40, (6, 9))  # int64 ids: used as they are, never cast to float
    labels = tokens[:, 0] % 4
    local = sgd_epoch(model, tokens[:1], labels[:1], lr=0.1)
    result = fidel_audit(model, local, tokens[:1].numpy())
    assert result.layer == "hidden" and result.space == "activation" and result.reconstruction_shape == (12,)
    assert result.revealed == 1 and result.best_r[0] > 0.999
    mean_embedding = training_forward(model.emb, tokens[:1]).mean(axis=1)
    recs, _ = reconstruct(*dense_update(model, local, "hidden"))
    bound = rounding_of_ratio(model, local, mean_embedding, layer="hidden")  # the float32 step's rounding
    assert np.all(np.abs(recs - mean_embedding.reshape(1, -1)) <= bound)
    # the match is the least-squares affine fit of one of those rows to the embedding: no farther from it (L2)
    assert np.linalg.norm(result.match_reconstruction.reshape(-1) - mean_embedding.reshape(-1)) <= \
        np.linalg.norm(bound, axis=1).max()
    # With the other samples as distractors, the one that trained is the one revealed.
    result6 = fidel_audit(model, local, torch.cat([tokens[:1], tokens[1:]]))
    assert result6.revealed_mask.tolist() == [True] + [False] * 5


@pytest.mark.parametrize("cls", [PerTokenFirst, FoldedFirst])
def test_a_dense_layer_not_applied_once_per_sample_is_passed_over(cls):
    torch.manual_seed(12)
    model = cls()
    tokens = torch.randint(0, 40, (5, 9))
    assert find_first_dense_layer(model, tokens) == "hidden"  # not per_token, though it runs first
    local = sgd_epoch(model, tokens[:1], tokens[:1, 0] % 4, lr=0.1)
    assert fidel_audit(model, local, tokens[:1]).layer == "hidden"
    with pytest.raises(ValueError, match=r"layer 'per_token' gets input of shape .* not one row per sample"):
        fidel_audit(model, local, tokens, layer="per_token")


# ----------------------------------------------------------------------------- report outputs


def test_result_dict_is_json_and_the_grid_png_is_written(digits, tmp_path):
    x, y = digits
    torch.manual_seed(9)
    model = FCNN(SHAPE, 10, dropout=0.2)
    local = sgd_epoch(model, x[:10], y[:10])
    result = fidel_audit(model, local, x[:10])
    d = result.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["n_samples"] == 10 and d["layer"] == LAYER and d["revealed"] >= 1
    assert d["revealed_union"] >= max(d["revealed"], d["revealed_ica"])
    assert d["fidel_revealed_fraction"] == d["revealed"] / 10
    assert all(isinstance(d[k], float) for k in FIDEL_METRICS)

    path = save_reveal_grid(result, x[:10], tmp_path / "grid" / "fcnn.png")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    img = imread(path)
    assert img.ndim == 3 and img.shape[1] > img.shape[0]  # one column per revealed sample
    assert os.listdir(tmp_path / "grid") == ["fcnn.png"]  # atomic: no temp file left
    with pytest.raises(ValueError, match="samples: 9 given"):
        save_reveal_grid(result, x[:9], tmp_path / "bad.png")
