"""audit.shadow_training.train_references: K reference models trained at once with the party's recipe, kept stacked,
and every copy's logits under vmap in eval mode; checked against K models trained one by one with torch.optim.

Models the rest of the suite does not train this way: a conv net with BatchNorm2d, a strided 5x5 and a grouped
convolution on synthetic images; a tabular MLP with BatchNorm1d and Dropout; an Embedding bag on token ids; a forward
with data-dependent control flow (vmap cannot batch it)."""

import copy
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import make_classification
from torch import nn

import audit.training as shadow_training
from audit.training import TrainedCopies, TrainingRecipe, train_copies, train_references
from audit.model_io import module_mode
from rounding import assert_same_float64

SIZE = 36


def images(n=240, seed=0):
    """Synthetic 3x12x12 images whose class (of 4) is where a bright blob sits, plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    x = rng.normal(0, 0.5, (n, 3, 12, 12)).astype(np.float32)
    for i, c in enumerate(y):
        r, s = divmod(int(c), 2)
        x[i, :, 6 * r:6 * r + 6, 6 * s:6 * s + 6] += 1.0
    return x, y.astype(np.int64)


def conv_bn_net(seed=0) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 5, stride=2, padding=2), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=4), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 4),
    )
    with torch.no_grad():  # running statistics of a model that has trained before
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
    return net


def tabular():
    x, y = make_classification(n_samples=300, n_features=7, n_informative=4, n_classes=3, random_state=2)
    return x.astype(np.float32), y.astype(np.int64)


def tabular_net(dropout=0.0, momentum=0.1, seed=0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(7, 12), nn.BatchNorm1d(12, momentum=momentum), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(12, 3))


class TokenBag(nn.Module):
    def __init__(self, vocab=25):
        super().__init__()
        torch.manual_seed(3)
        self.emb = nn.Embedding(vocab, 5)
        self.out = nn.Linear(5, 3)

    def forward(self, tokens):
        return self.out(self.emb(tokens).mean(dim=1))


class Branchy(nn.Module):
    """A forward that reads a parameter's value (data-dependent control flow): vmap cannot batch it over copies."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.a, self.b = nn.Linear(7, 3), nn.Linear(7, 3)

    def forward(self, x):
        return self.a(x) if float(self.a.bias.detach().sum()) > -100 else self.b(x)


def picks(n, copies, seed=0):
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(n, SIZE, replace=False) for _ in range(copies)])


def chunked_orders(seed, recipe, copies, chunk):
    """The shuffles the training draws: per chunk of copies, per epoch one (copies in the chunk, SIZE) draw.
    Returns orders[c][epoch] for every copy c."""
    generator = torch.Generator().manual_seed(seed)
    orders = []
    for start in range(0, copies, chunk):
        n = min(chunk, copies - start)
        draws = [torch.argsort(torch.rand(n, SIZE, generator=generator), dim=1) for _ in range(recipe.epochs)]
        orders += [[d[c] for d in draws] for c in range(n)]
    return orders


def train_one(model, x, y, recipe, orders):
    local = copy.deepcopy(model).train()
    optimizer = recipe.make_optimizer(list(local.parameters()))
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    for order in orders:
        for start in range(0, SIZE, recipe.batch_size):
            idx = order[start:start + recipe.batch_size]
            optimizer.zero_grad()
            F.cross_entropy(local(x[idx]), y[idx]).backward()
            optimizer.step()
    return local.eval()


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, [m.training for m in model.modules()]


def assert_unchanged(model, before):
    state, flags = before
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert [m.training for m in model.modules()] == flags


def check_against_separate(model, x, y, p, recipe, seed, chunk, probe, copies_trained=None):
    """train_references == separate trainings: parameters, buffers and eval-mode logits on `probe`, for a float64
    model, where the two paths differ by rounding alone (tests/rounding.py)."""
    refs = copies_trained or train_references(model, x[p], y[p], recipe, seed=seed, chunk=chunk)
    assert isinstance(refs, TrainedCopies) and len(refs) == len(p)
    logits = refs.logits(probe, batch_size=50)
    assert logits.shape == (len(p), len(probe), logits.shape[2]) and logits.dtype == np.float64
    for c, orders in enumerate(chunked_orders(seed, recipe, len(p), chunk or len(p))):
        local = train_one(model, x[p[c]], y[p[c]], recipe, orders)
        for name, value in local.named_parameters():
            assert_same_float64(refs.params[name][c], value.detach(), err_msg=name)
        for name, value in local.named_buffers():
            assert_same_float64(refs.buffers[name][c], value, err_msg=name)
        with torch.no_grad():
            expected = local(torch.as_tensor(probe)).double().numpy()
        assert_same_float64(logits[c], expected)
    return refs, logits


@pytest.mark.numerics
def test_conv_batchnorm_references_equal_separate_trainings():
    x, y = images()
    x, model = x.astype(np.float64), conv_bn_net().double()
    before = snapshot(model)
    p = picks(len(y), 3)
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=2, batch_size=10)  # 10, 10, 10, 6: four batches per epoch
    refs, logits = check_against_separate(model, x, y, p, recipe, seed=5, chunk=None, probe=x[200:240])
    assert_unchanged(model, before)
    assert not np.allclose(logits[0], logits[1])  # each copy its own training
    # Eval mode uses each copy's own running statistics, not the batch's: one sample alone gives the same logits.
    assert_same_float64(refs.logits(x[200:201])[:, 0], logits[:, 0])
    assert not torch.equal(refs.buffers["1.running_mean"][0], refs.buffers["1.running_mean"][1])


@pytest.mark.numerics
def test_references_continue_each_from_its_own_weights_with_a_fresh_optimiser():
    """`start`: copy c continues from start's copy c (parameters and BatchNorm statistics), as a separate training of
    that copy with a new optimiser would; the copies handed in are left as they were. In float64, where the two paths
    differ by rounding alone (tests/rounding.py)."""
    x, y = images(seed=2)
    x, model = x.astype(np.float64), conv_bn_net(seed=2).double()
    p = picks(len(y), 3, seed=2)
    # SGD: Adam turns the conv biases' round-off gradients (BatchNorm cancels them) into full steps of either sign
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=1, batch_size=12)
    first = train_references(model, x[p], y[p], recipe, seed=3)
    kept = {n: t.clone() for n, t in first.params.items()}
    q = picks(len(y), 3, seed=4)  # the second training on other samples
    second = train_references(model, x[q], y[q], recipe, seed=6, start=first)
    assert all(torch.equal(first.params[n], kept[n]) for n in kept)
    probe = x[200:240]
    logits = second.logits(probe)
    for c, orders in enumerate(chunked_orders(6, recipe, 3, 3)):
        start = copy.deepcopy(model)
        start.load_state_dict({**{n: t[c] for n, t in first.params.items()}, **{n: t[c] for n, t in first.buffers.items()}})
        local = train_one(start, x[q[c]], y[q[c]], recipe, orders)
        for name, value in local.state_dict().items():
            got = (second.params if name in second.params else second.buffers)[name][c]
            assert_same_float64(got, value, err_msg=name)
        with torch.no_grad():
            assert_same_float64(logits[c], local(torch.as_tensor(probe)))
    with pytest.raises(ValueError, match="start holds 3 copies, the data 2"):
        train_references(model, x[q[:2]], y[q[:2]], recipe, start=first)


def test_references_update_exactly_what_train_copies_returns():
    """Same seed, same recipe: the kept parameters minus the start are train_copies' updates, bit for bit."""
    x, y = images(seed=1)
    model = conv_bn_net(seed=1)
    p = picks(len(y), 4, seed=1)
    recipe = TrainingRecipe("Adam", 0.01, 0.9, epochs=2, batch_size=12)
    names = [n for n, _ in model.named_parameters()]
    refs = train_references(model, x[p], y[p], recipe, seed=9)
    start = dict(model.named_parameters())
    kept = torch.cat([(refs.params[n] - start[n].detach()).flatten(1) for n in names], dim=1).double().numpy()
    np.testing.assert_array_equal(kept, train_copies(model, x[p], y[p], recipe, names=names, seed=9))


@pytest.mark.numerics
def test_dropout_references_one_per_chunk_equal_separate_trainings_and_logits_have_no_dropout():
    x, y = tabular()
    x, model = x.astype(np.float64), tabular_net(dropout=0.4).double()  # float64: tests/rounding.py
    p = picks(len(y), 3, seed=2)
    recipe = TrainingRecipe("SGD", 0.1, 0.9, epochs=2, batch_size=8)
    refs = train_references(model, x[p], y[p], recipe, seed=3, chunk=1)
    # Separate trainings one after another from the same seed draw the same masks as one copy per chunk.
    torch.manual_seed(3)
    for c, orders in enumerate(chunked_orders(3, recipe, 3, 1)):
        local = train_one(model, x[p[c]], y[p[c]], recipe, orders)
        with torch.no_grad():
            assert_same_float64(refs.logits(x[250:])[c], local(torch.as_tensor(x[250:])))
    np.testing.assert_array_equal(refs.logits(x[250:]), refs.logits(x[250:]))  # eval mode: deterministic


@pytest.mark.numerics
def test_token_references_keep_integer_inputs():
    vocab = 25
    tokens = torch.randint(0, vocab, (200, 4), generator=torch.Generator().manual_seed(0)).numpy()
    labels = tokens[:, 0] % 3
    model = TokenBag(vocab).double()  # float64: tests/rounding.py
    p = picks(len(labels), 3, seed=3)
    recipe = TrainingRecipe("SGD", 0.2, 0.9, epochs=2, batch_size=12)
    refs, logits = check_against_separate(model, tokens, labels, p, recipe, seed=6, chunk=None, probe=tokens[150:])
    np.testing.assert_array_equal(refs.logits(tokens[150:].astype(np.int32)), logits)


@pytest.mark.numerics
def test_cumulative_batchnorm_trains_one_at_a_time_and_evaluates_under_vmap():
    """BatchNorm(momentum=None) cannot be vmapped in training (one copy at a time, with a warning); in eval mode it
    does not read num_batches_tracked, so the logits still come from one vmap'd call, without a warning."""
    x, y = tabular()
    x, model = x.astype(np.float64), tabular_net(momentum=None).double()  # float64: tests/rounding.py
    p = picks(len(y), 3, seed=4)
    recipe = TrainingRecipe("SGD", 0.05, 0.0, epochs=1, batch_size=9)
    with pytest.warns(RuntimeWarning, match="train_references: .*one at a time"):
        refs = train_references(model, x[p], y[p], recipe, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_against_separate(model, x, y, p, recipe, seed=2, chunk=None, probe=x[260:], copies_trained=refs)


@pytest.mark.numerics
def test_a_forward_vmap_cannot_batch_is_evaluated_one_copy_at_a_time():
    x, y = tabular()
    x, model = x.astype(np.float64), Branchy().double()  # float64: tests/rounding.py
    p = picks(len(y), 2, seed=5)
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=1, batch_size=12)
    with pytest.warns(RuntimeWarning, match="one at a time"):
        refs = train_references(model, x[p], y[p], recipe, seed=1)
    with pytest.warns(RuntimeWarning, match="TrainedCopies.logits: .*one at a time"):
        check_against_separate(model, x, y, p, recipe, seed=1, chunk=None, probe=x[280:], copies_trained=refs)


@pytest.mark.numerics
def test_memory_is_bounded_by_chunks_of_copies_and_batches(monkeypatch):
    """With the chunk budget shrunk to two copies of the net, training and evaluation never stack more than two
    copies, evaluation never runs more than batch_size samples at once, and the result is still K separate
    trainings; the kept result is K copies' parameters and buffers, as many bytes per value as the model's (float64
    here: tests/rounding.py)."""
    x, y = images(seed=2)
    x, model = x.astype(np.float64), conv_bn_net(seed=2).double()
    n_params = sum(t.numel() for t in model.parameters())
    monkeypatch.setattr(shadow_training, "_CHUNK_BUDGET_BYTES", 2 * 16 * n_params)
    assert shadow_training.copies_per_chunk(model) == 2
    trained_sizes, eval_sizes = [], []
    train_chunk, eval_chunk = shadow_training._train_chunk, shadow_training._eval_chunk

    def spy_train(model, params, buffers, xs, ys, *args, **kwargs):
        trained_sizes.append(len(ys))
        return train_chunk(model, params, buffers, xs, ys, *args, **kwargs)

    def spy_eval(model, params, buffers, xb, batched):
        eval_sizes.append((next(iter(params.values())).shape[0], xb.shape[0]))
        return eval_chunk(model, params, buffers, xb, batched)

    monkeypatch.setattr(shadow_training, "_train_chunk", spy_train)
    monkeypatch.setattr(shadow_training, "_eval_chunk", spy_eval)
    p = picks(len(y), 5, seed=6)
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=1, batch_size=12)
    refs, _ = check_against_separate(model, x, y, p, recipe, seed=4, chunk=2, probe=x[180:240])
    assert trained_sizes == [2, 2, 1]
    assert eval_sizes == [(2, 50), (2, 10), (2, 50), (2, 10), (1, 50), (1, 10)]
    kept = sum(t.numel() * t.element_size() for t in [*refs.params.values(), *refs.buffers.values()])
    one = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    assert kept == 5 * one
    # The default chunk is copies_per_chunk: the same chunks without passing it.
    trained_sizes.clear()
    default = train_references(model, x[p], y[p], recipe, seed=4)
    assert trained_sizes == [2, 2, 1]
    assert all(torch.equal(default.params[n], refs.params[n]) for n in refs.params)


def test_template_model_is_left_alone_and_bad_input_is_named():
    x, y = tabular()
    model = tabular_net(dropout=0.2).train()
    model[1].eval()  # a frozen BatchNorm inside a model in train mode
    before = snapshot(model)
    p = picks(len(y), 2, seed=7)
    refs = train_references(model, x[p], y[p], TrainingRecipe(batch_size=10), seed=0)
    refs.logits(x[:20])
    assert_unchanged(model, before)
    with pytest.raises(ValueError, match="batch_size"):
        refs.logits(x[:20], batch_size=0)
    with pytest.raises(ValueError, match="N >= 1"):
        refs.logits(x[:0])
    with pytest.raises(ValueError, match="train_references: x"):
        train_references(model, x[p], y[p][:, :5], TrainingRecipe(), seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a wrong input is not a vmap failure: its own error, no warning
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            refs.logits(x[:20, :5])
    with module_mode(model, training=False):  # the copies' outputs are not the template's
        assert not np.allclose(refs.logits(x[:20])[0], model(torch.as_tensor(x[:20])).detach().numpy())


@pytest.mark.slow
def test_copies_over_the_spill_size_wait_on_disk_and_give_the_same_values(monkeypatch):
    """Copies larger than _SPILL_BYTES (RMIA's references of a large model) are written chunk by chunk as they are
    trained and read back when used: the same parameters, buffers and logits as in memory, bit for bit, also when a
    later training continues from them; nothing of them stays in memory, and their folder goes with them."""
    import gc
    import os

    x, y = images(seed=3)
    model = conv_bn_net(seed=3)
    p, q = picks(len(y), 5, seed=8), picks(len(y), 5, seed=9)
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=1, batch_size=12)
    in_memory = train_references(model, x[p], y[p], recipe, seed=4, chunk=2)
    later = train_references(model, x[q], y[q], recipe, seed=5, chunk=3, start=in_memory)
    assert not in_memory.on_disk and not later.on_disk
    monkeypatch.setattr(shadow_training, "_SPILL_BYTES", 0)
    spilled = train_references(model, x[p], y[p], recipe, seed=4, chunk=2)
    assert spilled.on_disk and spilled._params is None and len(spilled) == 5
    folder = spilled._spilled.folder
    assert sorted(os.listdir(folder)) == ["0.pt", "1.pt", "2.pt"]  # chunks of 2, 2 and 1 copies
    for name in in_memory.params:
        assert torch.equal(spilled.params[name], in_memory.params[name]), name
    for name in in_memory.buffers:
        assert torch.equal(spilled.buffers[name], in_memory.buffers[name]), name
    # A range across files, and logits in chunks that are not the files' (3 copies: files 0 and 1).
    params, buffers = spilled.copies(1, 4)
    assert all(torch.equal(params[n], in_memory.params[n][1:4]) for n in params)
    np.testing.assert_array_equal(spilled.logits(x[200:], chunk=3), in_memory.logits(x[200:], chunk=3))
    continued = train_references(model, x[q], y[q], recipe, seed=5, chunk=3, start=spilled)
    assert continued.on_disk
    for name, value in later.params.items():
        assert torch.equal(continued.params[name], value), name
    del spilled
    gc.collect()
    assert not os.path.exists(folder)
    with pytest.raises(ValueError, match="one of them"):
        TrainedCopies(model)


def test_references_on_subsets_of_one_pool_are_the_stacked_ones_bit_for_bit():
    """`subsets`: copy c trains on the rows subsets[c] of one pool, picked a chunk at a time: the same trainings as on
    the stacked x[subsets] (parameters, buffers, and a continued training), without that (K, samples, ...) copy;
    subsets outside the pool are named."""
    x, y = images(seed=4)
    model = conv_bn_net(seed=4)
    p, q = picks(len(y), 5, seed=10), picks(len(y), 5, seed=11)
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=1, batch_size=12)
    stacked = train_references(model, x[p], y[p], recipe, seed=2, chunk=2)
    pooled = train_references(model, x, y, recipe, seed=2, chunk=2, subsets=p)
    for name in stacked.params:
        assert torch.equal(pooled.params[name], stacked.params[name]), name
    for name in stacked.buffers:
        assert torch.equal(pooled.buffers[name], stacked.buffers[name]), name
    later = train_references(model, x[q], y[q], recipe, seed=3, chunk=1, start=stacked)
    pooled_later = train_references(model, x, y, recipe, seed=3, chunk=1, start=pooled, subsets=q)
    assert all(torch.equal(pooled_later.params[n], later.params[n]) for n in later.params)
    with pytest.raises(ValueError, match="subsets"):
        train_references(model, x, y, recipe, subsets=np.array([[0, len(y)]]))
    with pytest.raises(ValueError, match="start holds 5 copies, the data 2"):
        train_references(model, x, y, recipe, start=pooled, subsets=q[:2])


@pytest.mark.parametrize("chunk", [1, 2])
def test_each_chunk_s_gradients_and_optimizer_state_go_when_it_is_trained(monkeypatch, chunk):
    """A chunk's last gradients and its optimizer's momentum (a chunk's size each) are freed when the chunk is trained,
    not left on an optimizer a garbage collection may reach later, while the next chunk trains; the copies are the
    same."""
    optimizers = []
    real = TrainingRecipe.make_optimizer

    def recording(self, tensors):
        optimizers.append(real(self, tensors))
        return optimizers[-1]

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, kernel_size=3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                          nn.Linear(3 * 4 * 4, 4))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 2, 4, 4)).astype(np.float32)
    y = rng.integers(0, 4, 60)
    subsets = np.stack([rng.choice(60, 20, replace=False) for _ in range(4)])
    recipe = TrainingRecipe("SGD", 0.05, 0.9, 2, 8)
    plain = train_references(model, x, y, recipe, seed=3, chunk=chunk, subsets=subsets)
    monkeypatch.setattr(TrainingRecipe, "make_optimizer", recording)
    watched = train_references(model, x, y, recipe, seed=3, chunk=chunk, subsets=subsets)
    assert len(optimizers) == 4 // chunk
    for optimizer in optimizers:
        assert not optimizer.state
        assert all(p.grad is None for group in optimizer.param_groups for p in group["params"])
    for name, value in plain.params.items():
        assert torch.equal(value, watched.params[name]), name


@pytest.mark.parametrize("chunk", [1, 2])  # one copy at a time (plain autograd), two under vmap
def test_copies_read_from_disk_are_trained_in_place_and_in_memory_ones_are_left_alone(monkeypatch, chunk):
    """Continuing from copies on disk trains the chunk just read in place (no second copy of its parameters and
    buffers while it trains), with the same result, bit for bit, as continuing from the same copies in memory, which
    are copied first and stay as they were."""
    x, y = tabular()
    model = tabular_net(seed=4)
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=1, batch_size=12)
    p, q = picks(len(y), 3, seed=10), picks(len(y), 3, seed=11)
    in_memory = train_references(model, x[p], y[p], recipe, seed=1, chunk=chunk)
    kept = {n: t.clone() for n, t in {**in_memory.params, **in_memory.buffers}.items()}
    monkeypatch.setattr(shadow_training, "_SPILL_BYTES", 0)
    spilled = train_references(model, x[p], y[p], recipe, seed=1, chunk=chunk)
    assert spilled.on_disk
    handed, returned = [], []
    copies, train_chunk = TrainedCopies.copies, shadow_training._train_chunk

    def spy_copies(self, first, stop):
        found = copies(self, first, stop)
        handed.append({n: t.data_ptr() for part in found for n, t in part.items()})
        return found

    def spy_train(*args, **kwargs):
        trained = train_chunk(*args, **kwargs)
        returned.append({n: t.data_ptr() for part in trained for n, t in part.items()})
        return trained

    monkeypatch.setattr(TrainedCopies, "copies", spy_copies)
    monkeypatch.setattr(shadow_training, "_train_chunk", spy_train)
    from_disk = train_references(model, x[q], y[q], recipe, seed=2, chunk=chunk, start=spilled)
    assert len(handed) == len(returned) == -(-3 // chunk)
    assert handed == returned  # the tensors read are the ones trained: no copy
    handed.clear(), returned.clear()
    from_memory = train_references(model, x[q], y[q], recipe, seed=2, chunk=chunk, start=in_memory)
    assert all(set(h.values()).isdisjoint(r.values()) for h, r in zip(handed, returned))  # copied first
    for name, value in {**in_memory.params, **in_memory.buffers}.items():
        assert torch.equal(value, kept[name]), name  # the copies in memory are left alone
    for name, value in {**from_memory.params, **from_memory.buffers}.items():
        assert torch.equal({**from_disk.params, **from_disk.buffers}[name], value), name
    assert not torch.equal(from_memory.params["0.weight"], in_memory.params["0.weight"])  # it did train
