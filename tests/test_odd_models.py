"""Shadow training and the whole round audit on models and data the project's CNN/FCNN on digits do not cover:
BatchNorm (running statistics per copy), Dropout, BatchNorm with a cumulative average (vmap cannot batch it),
Embedding with token inputs, synthetic tabular data.

audit.training.train_copies is checked against copies trained one by one with torch.optim;
audit.round_audit.audit_round end to end (membership signals, Fidel, deanonymization self-audit)."""

import copy
import json
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import make_classification
from torch import nn

from audit.deanon.self_audit import deanon_self_audit
from audit.config.deanon_settings import DeanonSettings
from audit.config.gate import audit_metric_names
from audit.round_audit import AuditSets, LocalTraining, audit_round
from audit.config.audit_settings import AuditSettings
from audit.training import TrainingRecipe, _train_chunk, train_copies
from audit.model_io import module_mode
from rounding import assert_same_float64

COPIES, SIZE = 3, 40


@pytest.fixture(scope="module")
def tabular():
    """A synthetic tabular task: 8 features (5 informative), 3 classes."""
    x, y = make_classification(n_samples=400, n_features=8, n_informative=5, n_classes=3, random_state=0)
    return x.astype(np.float32), y.astype(np.int64)


def tabular_net(dropout: float = 0.0, momentum: float | None = 0.1, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(8, 16), nn.BatchNorm1d(16, momentum=momentum), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(16, 16), nn.BatchNorm1d(16, momentum=momentum), nn.ReLU(), nn.Linear(16, 3),
    )
    for module in net:
        if isinstance(module, nn.BatchNorm1d):  # running statistics of a model that has trained before
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            module.num_batches_tracked.fill_(7)
    return net


class TokenBag(nn.Module):
    def __init__(self, vocab: int = 30):
        super().__init__()
        torch.manual_seed(1)
        self.emb = nn.Embedding(vocab, 6)
        self.hidden = nn.Linear(6, 12)
        self.out = nn.Linear(12, 3)

    def forward(self, tokens):
        return self.out(torch.relu(self.hidden(self.emb(tokens).mean(dim=1))))


def picks(n: int, copies: int = COPIES, size: int = SIZE, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(n, size, replace=False) for _ in range(copies)])


def train_one(model, x, y, recipe: TrainingRecipe, orders) -> nn.Module:
    """One local training as a collaborator runs it: a copy of the model in train mode, torch.optim, the batches
    in the given per-epoch orders."""
    local = copy.deepcopy(model).train()
    optimizer = recipe.make_optimizer(list(local.parameters()))
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    for order in orders:
        for start in range(0, len(y), recipe.batch_size):
            idx = order[start:start + recipe.batch_size]
            optimizer.zero_grad()
            F.cross_entropy(local(x[idx]), y[idx]).backward()
            optimizer.step()
    return local


def delta(model, trained, names) -> np.ndarray:
    start, end = dict(model.named_parameters()), dict(trained.named_parameters())
    return torch.cat([(end[n] - start[n]).flatten() for n in names]).detach().double().numpy()


def all_at_once_orders(seed: int, recipe: TrainingRecipe, copies: int = COPIES, size: int = SIZE):
    """The shuffles train_copies draws for one chunk of all copies: per epoch one (copies, size) draw."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.argsort(torch.rand(copies, size, generator=generator), dim=1) for _ in range(recipe.epochs)]


def state_of(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, [m.training for m in model.modules()]


def assert_unchanged(model, before):
    state, flags = before
    now = model.state_dict()
    assert list(now) == list(state)
    changed = [k for k, v in now.items() if not (v.dtype == state[k].dtype and torch.equal(v, state[k]))]
    assert not changed, f"the received model changed: {changed}"
    assert [m.training for m in model.modules()] == flags


# ------------------------------------------------------------------------------------------ BatchNorm


@pytest.mark.numerics
def test_batchnorm_copies_train_like_separate_local_trainings(tabular):
    """Parameters and each copy's own running statistics (and num_batches_tracked) equal separate training's (in
    float64, where the two paths differ by rounding alone: tests/rounding.py)."""
    x, y = tabular
    x = x.astype(np.float64)
    model = tabular_net().double()
    before = state_of(model)
    p = picks(len(y))
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=2, batch_size=16)  # batches 16, 16, 8: three per epoch
    names = [n for n, _ in model.named_parameters()]
    stacked = train_copies(model, x[p], y[p], recipe, names=names, seed=5)
    assert_unchanged(model, before)

    with module_mode(model, training=True):
        _, buffers = _train_chunk(model, dict(model.named_parameters()), dict(model.named_buffers()),
                                  torch.as_tensor(x[p]), torch.as_tensor(y[p]), recipe,
                                  torch.Generator().manual_seed(5))
    assert_unchanged(model, before)
    orders = all_at_once_orders(5, recipe)
    for c in range(COPIES):
        local = train_one(model, x[p[c]], y[p[c]], recipe, [order[c] for order in orders])
        assert_same_float64(stacked[c], delta(model, local, names))
        for name, value in local.named_buffers():
            assert_same_float64(buffers[name][c], value, err_msg=name)
        assert int(local[1].num_batches_tracked) == 7 + 2 * 3
    assert np.abs(stacked).max() > 0
    assert not torch.equal(buffers["1.running_mean"][0], buffers["1.running_mean"][1])  # each copy its own


@pytest.mark.numerics
def test_batchnorm_and_dropout_copies_train_like_separate_local_trainings(tabular):
    """With Dropout the masks are random: one copy per chunk draws them in the order separate trainings do, so the
    copies must equal separate trainings run one after another from the same seed (in float64: tests/rounding.py)."""
    x, y = tabular
    x = x.astype(np.float64)
    model = tabular_net(dropout=0.3).double()
    before = state_of(model)
    p = picks(len(y), seed=1)
    recipe = TrainingRecipe("Adam", 0.01, 0.9, epochs=2, batch_size=16)
    names = ["0.weight", "1.weight", "1.bias", "7.weight"]
    stacked = train_copies(model, x[p], y[p], recipe, names=names, seed=3, chunk=1)
    assert_unchanged(model, before)

    generator = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    for c in range(COPIES):
        orders = [torch.argsort(torch.rand(1, SIZE, generator=generator), dim=1)[0] for _ in range(recipe.epochs)]
        local = train_one(model, x[p[c]], y[p[c]], recipe, orders)
        assert_same_float64(stacked[c], delta(model, local, names))
    # Several copies per chunk: each copy its own dropout masks, seeded.
    together = train_copies(model, x[p], y[p], recipe, names=names, seed=3)
    np.testing.assert_array_equal(together, train_copies(model, x[p], y[p], recipe, names=names, seed=3))
    assert not np.allclose(together, stacked)  # other masks than one copy per chunk (same shuffles, same model)
    assert_unchanged(model, before)


@pytest.mark.numerics
def test_batchnorm_with_a_cumulative_average_trains_one_copy_at_a_time(tabular):
    """BatchNorm(momentum=None) reads float(num_batches_tracked), which vmap cannot batch: the copies are trained
    one at a time (with a warning), with the same result as separate trainings (in float64: tests/rounding.py)."""
    x, y = tabular
    x = x.astype(np.float64)
    model = tabular_net(momentum=None).double()
    before = state_of(model)
    p = picks(len(y), seed=2)
    recipe = TrainingRecipe("SGD", 0.05, 0.0, epochs=1, batch_size=16)
    names = [n for n, _ in model.named_parameters()]
    with pytest.warns(RuntimeWarning, match="one at a time"):
        stacked = train_copies(model, x[p], y[p], recipe, names=names, seed=4)
    assert_unchanged(model, before)
    orders = all_at_once_orders(4, recipe)
    for c in range(COPIES):
        local = train_one(model, x[p[c]], y[p[c]], recipe, [order[c] for order in orders])
        assert_same_float64(stacked[c], delta(model, local, names))


def test_received_model_is_left_bit_for_bit_unchanged(tabular):
    """Parameters, buffers (num_batches_tracked too) and every submodule's train/eval flag, after training copies
    of a model in eval mode and of one in train mode with a frozen BatchNorm kept in eval mode."""
    x, y = tabular
    p = picks(len(y), seed=3)
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=1, batch_size=8)
    for training in (False, True):
        model = tabular_net(dropout=0.5).train(training)
        model[5].eval()  # a frozen BatchNorm
        before = state_of(model)
        train_copies(model, x[p], y[p], recipe, names=["7.weight", "7.bias"], seed=0)
        assert_unchanged(model, before)


# ------------------------------------------------------------------------------------------ inputs


@pytest.mark.numerics
def test_token_inputs_stay_integer_and_train_like_separate_models():
    """int64 and int32 token ids train alike, as separate models do (in float64: tests/rounding.py)."""
    vocab = 30
    tokens = torch.randint(0, vocab, (200, 5), generator=torch.Generator().manual_seed(0))
    labels = tokens[:, 0] % 3
    model = TokenBag(vocab).double()
    p = picks(len(labels))
    recipe = TrainingRecipe("SGD", 0.1, 0.9, epochs=2, batch_size=16)
    names = [n for n, _ in model.named_parameters()]
    stacked = train_copies(model, tokens.numpy()[p], labels.numpy()[p], recipe, names=names, seed=6)
    int32 = train_copies(model, tokens.int().numpy()[p], labels.numpy()[p], recipe, names=names, seed=6)
    assert_same_float64(int32, stacked)
    orders = all_at_once_orders(6, recipe)
    for c in range(COPIES):
        local = train_one(model, tokens[p[c]], labels[p[c]], recipe, [order[c] for order in orders])
        assert_same_float64(stacked[c], delta(model, local, names))


@pytest.mark.numerics
def test_float64_inputs_take_the_model_dtype(tabular):
    x, y = tabular
    p = picks(len(y), seed=4)
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=1, batch_size=16)
    model = tabular_net()
    names = ["7.bias"]
    as32 = train_copies(model, x[p], y[p], recipe, names=names, seed=1)
    # float64 copies of float32 values, cast back to the model's float32: the same numbers, the same training
    np.testing.assert_array_equal(train_copies(model, x[p].astype(np.float64), y[p], recipe, names=names, seed=1),
                                  as32)
    model64 = tabular_net().double()
    as64 = train_copies(model64, x[p], y[p], recipe, names=names, seed=1)
    assert not np.array_equal(as64, as32)  # trained in float64, not cast to float32
    # the same training: float32's rounding over these 3 steps moves the update by ~1e-6 of it on every kernel set
    # tried (tests/rounding.py); a training that differs (another shuffle or sample) moves it by more than 1e-1
    np.testing.assert_allclose(as64, as32, rtol=1e-3, atol=1e-6)


def test_a_wrong_input_raises_its_own_error_without_a_vmap_warning(tabular):
    x, y = tabular
    p = picks(len(y))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            train_copies(tabular_net(), x[p][..., :6], y[p], TrainingRecipe(), names=["7.bias"])


# ------------------------------------------------------------------------------------------ the round audit end to end

DEANON = {"enabled": True, "crowd_users": 3, "shadows_per_user": 3}


def token_task(n: int = 120, vocab: int = 30, seed: int = 0):
    """Token sequences with random labels: nothing to generalise, so an overfit model gives its members away."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, (n, 5)), rng.integers(0, 3, n)


def overfit(model, x, y, steps: int = 300, lr: float = 0.05) -> nn.Module:
    local = copy.deepcopy(model).train()
    optimizer = torch.optim.Adam(local.parameters(), lr=lr)
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(local(x), y).backward()
        optimizer.step()
    return local


def check_record(record, settings, models_before):
    assert set(record.metrics) == set(audit_metric_names(settings))
    assert all(math.isfinite(v) for v in record.metrics.values())
    json.dumps(record.to_json(), allow_nan=False)
    for model, before in models_before:
        assert_unchanged(model, before)


@pytest.mark.parametrize(
    "settings",
    [
        AuditSettings(batch_size=16, sections={"rmia": {"reference_models": 2}}),
        AuditSettings(batch_size=16, gradient_layer="emb", sections={"fidel": {"enabled": True},
                                                                     "rmia": {"reference_models": 2}}),
        AuditSettings(batch_size=16, sections={"fidel": {"enabled": True}, "deanon": DEANON,
                                               "rmia": {"reference_models": 2}}),
    ],
    ids=["signals", "fidel", "fidel+deanon"],
)
@pytest.mark.slow
def test_audit_round_on_token_inputs(settings):
    x, y = token_task(n=260)  # population 180: room for 2 disjoint crowd users of 40 + a 40-sample prior
    sets = AuditSets(members=(x[:40], y[:40]), nonmembers=(x[40:80], y[40:80]), population=(x[80:], y[80:]))
    received = TokenBag()
    local = overfit(received, *sets.members)
    before = [(received, state_of(received)), (local, state_of(local))]
    training = LocalTraining(TrainingRecipe("Adam", 0.05, 0.9, epochs=2, batch_size=16), 40, None)
    # Round 0: the received model is the initial one, where RMIA's independent references start.
    record = audit_round(local, received, sets, settings, party="p", round_num=0, seed=1, training=training,
                         initial_model=received)
    check_record(record, settings, before)
    # The trained model memorised its 40 members (random labels): the loss attack sees it, the received one not.
    assert record.metrics["mia_local_loss_auc"] > 0.8
    assert abs(record.metrics["mia_global_loss_auc"] - 0.5) < 0.25
    # So does RMIA, with references trained on the integer token inputs (population subsets of the member count, 40:
    # the 180 population samples leave room for 2 disjoint ones).
    assert record.metrics["rmia_independent_exact_auc"] > 0.8
    assert record.extra["rmia"]["independent"]["subset_size"] == 40
    if settings.fidel.enabled:  # the first dense layer that sees one row per sample: after the Embedding's mean
        assert record.extra["fidel"]["layer"] == "hidden" and record.extra["fidel"]["space"] == "activation"


def test_audit_round_on_tabular_batchnorm_dropout_model(tabular):
    """A frozen first dense layer: Fidel reports 0 revealed; the deanon self-audit runs on BatchNorm and Dropout."""
    x, y = tabular
    sets = AuditSets(members=(x[:60], y[:60]), nonmembers=(x[60:120], y[60:120]), population=(x[120:], y[120:]))
    received = tabular_net(dropout=0.3)
    frozen = copy.deepcopy(received)
    frozen[0].requires_grad_(False)
    local = train_one(frozen, *sets.members, TrainingRecipe("SGD", 0.05, 0.9, epochs=2, batch_size=16),
                      [torch.randperm(60, generator=torch.Generator().manual_seed(e)) for e in range(2)])
    before = [(received, state_of(received)), (local, state_of(local))]
    settings = AuditSettings(sections={"fidel": {"enabled": True}, "deanon": DEANON,
                                       "rmia": {"references": ["global", "fine_tuned", "independent"],
                                                "reference_models": 2}})
    training = LocalTraining(TrainingRecipe("SGD", 0.05, 0.9, epochs=2, batch_size=16), 60, 0.5)
    record = audit_round(local, received, sets, settings, party="p", round_num=0, seed=2, training=training,
                         initial_model=received)
    check_record(record, settings, before)
    assert record.extra["rmia"]["fine_tuned"]["reference_models"] == 2  # trained with BatchNorm and Dropout
    fidel = record.extra["fidel"]
    assert fidel["layer"] == "0" and fidel["space"] == "input" and fidel["n_neurons_used"] == 0
    assert record.metrics["fidel_revealed_fraction"] == record.metrics["fidel_revealed_fraction_ica"] == 0.0


def assert_self_audit_leaves_models_unchanged(received, x, y, members: int = 50):
    """The deanonymization self-audit on `received` and a model trained from it on its first `members` samples of x,
    the next `members` the prior: both models bit for bit unchanged after it, every metric the settings declare,
    each finite (x needs at least 2 * members + 1 samples; 8 * members gives the whole crowd of 3 users)."""
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=1, batch_size=16)
    trained = train_one(received, x[:members], y[:members], recipe, [torch.arange(members)])
    before = [(received, state_of(received)), (trained, state_of(trained))]
    settings = DeanonSettings(enabled=True, crowd_users=3, shadows_per_user=3)
    result = deanon_self_audit(received, trained, (x[members:2 * members], y[members:2 * members]), members,
                               (x[2 * members:], y[2 * members:]), recipe, settings, federation_alpha=0.5, seed=0)
    for model, state in before:
        assert_unchanged(model, state)
    assert set(result.metrics) == set(settings.metric_names())
    assert all(math.isfinite(v) for v in result.metrics.values())


def test_deanon_self_audit_leaves_both_models_bit_for_bit_unchanged(tabular):
    x, y = tabular
    assert_self_audit_leaves_models_unchanged(tabular_net(dropout=0.3).eval(), x, y)  # as received: OpenFL's copy
