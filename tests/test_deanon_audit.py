"""The deanonymization self-audit and its parts: shadow training, the crowd, the attacks and their chance levels."""

import copy
import math

import numpy as np
import pytest
import torch

from audit.deanon.attacks import balanced_pairs, match, random_ranking_ap, reidentify
from audit.deanon.self_audit import SELF, deanon_self_audit
from audit.deanon.crowd import draw_crowd, label_mixes
from audit.deanon.representation import last_layer, layer_tensor_names, normalise_rows, update_vector
from audit.config.deanon_settings import DeanonSettings, deanon_settings
from audit.config.fields import SettingsError
from audit.training import TrainingRecipe, train_copies
from src.data.split import split_federation
from src.data.datasets import load_dataset
from src.runner.models import build_model
from rounding import assert_same_float64

RECIPE = TrainingRecipe("Adam", 0.003, 0.9, epochs=3, batch_size=32)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _model(seed=0):
    torch.manual_seed(seed)
    return build_model("cnn", (1, 8, 8), 10)


# ------------------------------------------------------------------------------------------ shadow training
@pytest.mark.numerics
def test_stacked_copies_train_exactly_like_separate_models(digits):
    """train_copies == each copy trained on its own with torch.optim on the same batches (in float64, where the two
    paths differ by rounding alone: tests/rounding.py)."""
    x, y = digits
    x, model = np.asarray(x, np.float64), _model().double()
    rng = np.random.default_rng(0)
    picks = np.stack([rng.choice(len(y), 20, replace=False) for _ in range(2)])
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=2, batch_size=8)  # batches of 8, 8 and 4
    names = [n for n, _ in model.named_parameters()]
    stacked = train_copies(model, x[picks], y[picks], recipe, names=names, seed=5)

    generator = torch.Generator().manual_seed(5)  # the same shuffles train_copies draws
    orders = [torch.argsort(torch.rand(2, 20, generator=generator), dim=1) for _ in range(recipe.epochs)]
    for c in range(2):
        copy_model = copy.deepcopy(model)
        optimizer = torch.optim.SGD(copy_model.parameters(), lr=0.05, momentum=0.9)
        xc, yc = torch.tensor(x[picks[c]]), torch.tensor(y[picks[c]])
        for order in orders:
            for start in range(0, 20, 8):
                idx = order[c, start:start + 8]
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(copy_model(xc[idx]), yc[idx]).backward()
                optimizer.step()
        delta = torch.cat([(dict(copy_model.named_parameters())[n] - dict(model.named_parameters())[n]).flatten()
                           for n in names]).detach().double().numpy()
        assert_same_float64(stacked[c], delta)
    assert np.abs(stacked).max() > 0


def test_shadow_training_is_seeded_and_leaves_the_model_alone(digits):
    x, y = digits
    model = _model()
    before = copy.deepcopy(model.state_dict())
    picks = np.arange(60).reshape(2, 30)
    names = layer_tensor_names([n for n, _ in model.named_parameters()], last_layer(model))
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=2, batch_size=8)  # several batches: the shuffle matters
    a = train_copies(model, x[picks], y[picks], recipe, names=names, seed=1)
    b = train_copies(model, x[picks], y[picks], recipe, names=names, seed=1)
    c = train_copies(model, x[picks], y[picks], recipe, names=names, seed=2)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert a.shape == (2, 64 * 10 + 10)  # the last layer, classifier.out


def test_representation_is_the_normalised_delta_of_one_layer():
    model = _model()
    assert last_layer(model) == "classifier.out"
    names = layer_tensor_names(model.state_dict(), "classifier.out")
    assert names == ["classifier.out.weight", "classifier.out.bias"]
    received = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    trained = {k: v + 3.0 for k, v in received.items()}
    vec = update_vector(received, trained, names)
    assert vec.shape == (650,) and math.isclose(np.linalg.norm(vec), 1.0)
    assert np.allclose(vec, 1 / math.sqrt(650))
    assert np.array_equal(normalise_rows(np.zeros((2, 3))), np.zeros((2, 3)))  # withheld: no direction
    with pytest.raises(ValueError, match="classifier.nope"):
        layer_tensor_names(model.state_dict(), "classifier.nope")


# ------------------------------------------------------------------------------------------ crowd
def test_crowd_users_follow_their_own_label_mix(digits):
    _, y = digits
    crowd = draw_crowd(y, 6, 150, 60, alpha=0.2, seed=0)
    for user in crowd:
        assert not set(user.prior) & set(user.private)
        for part in (user.prior, user.private):
            hist = np.bincount(y[part], minlength=10) / len(part)
            assert 0.5 * np.abs(hist - user.mix).sum() < 0.25  # total variation from its mix
    mixes = np.array([u.mix for u in crowd])
    assert 0.5 * np.abs(mixes[0] - mixes[1]).sum() > 0.3  # users differ
    iid = label_mixes(np.bincount(y), 4, None, np.random.default_rng(0))
    assert np.allclose(iid, np.bincount(y) / len(y))


# ------------------------------------------------------------------------------------------ attacks
@pytest.mark.slow
def test_random_ranking_ap_is_the_mean_ap_of_random_scores():
    """Random scores place the positives at every set of ranks with equal probability: the mean of the average
    precision over all those placements is random_ranking_ap, exactly (float64's rounding of a mean of at most
    184,756 values in [0, 1]: 1e-12 leaves 1e3). The AP of a placement is sklearn's, checked on some of them."""
    from itertools import combinations

    from sklearn.metrics import average_precision_score
    for positives, total in [(1, 11), (3, 20), (10, 20)]:
        ranks = np.array(list(combinations(range(total), positives)))  # sorted ranks of the positives, 0 the top
        # the mean over the positives of the precision at each one's rank: the j-th positive at rank r, (j + 1) / (r + 1)
        ap = np.mean(np.arange(1, positives + 1) / (ranks + 1), axis=1)
        scores = np.arange(total, 0, -1)
        for row in range(0, len(ranks), max(1, len(ranks) // 20)):
            labels = np.zeros(total, dtype=int)
            labels[ranks[row]] = 1
            assert average_precision_score(labels, scores) == pytest.approx(ap[row], abs=1e-12)
        assert float(np.mean(ap)) == pytest.approx(random_ranking_ap(positives, total), abs=1e-12)
    assert math.isclose(random_ranking_ap(1, 11), sum(1 / k for k in range(1, 12)) / 11)


def _clustered_updates(n_users, per_user, dim, spread, noise_seed):
    """Each user's updates scatter around its own direction (the same directions for every noise_seed)."""
    centres = np.random.default_rng(0).normal(size=(n_users, dim))
    noise = np.random.default_rng(noise_seed).normal(size=(n_users * per_user, dim))
    return normalise_rows(np.repeat(centres, per_user, axis=0) + spread * noise), \
        np.repeat([f"u{i}" for i in range(n_users)], per_user)


@pytest.mark.parametrize("attack", ["mlp", "svm", "knn"])
def test_reidentification_finds_distinct_users_and_not_identical_ones(attack):
    train_x, train_u = _clustered_updates(8, 10, 50, 0.5, noise_seed=1)
    test_x, test_u = _clustered_updates(8, 3, 50, 0.5, noise_seed=2)
    found = reidentify(train_x, train_u, test_x, test_u, attack, seed=0)
    assert found.top1 > 0.8 and found.ap_over_chance > 2.5
    assert found.rank_of("u0") < 2
    # One distribution for everyone: nothing to find.
    rng = np.random.default_rng(1)
    noise = normalise_rows(rng.normal(size=(80 + 24, 50)))
    chance = reidentify(noise[:80], train_u, noise[80:], test_u, attack, seed=0)
    assert 0.5 < chance.ap_over_chance < 1.6


@pytest.mark.slow
def test_siamese_matching_scores_same_user_pairs_higher():
    train_x, train_u = _clustered_updates(8, 10, 50, 0.5, noise_seed=1)
    test_x, test_u = _clustered_updates(8, 3, 50, 0.5, noise_seed=2)
    result = match(train_x, train_u, test_x, test_u, train_x, train_u, seed=0)
    assert math.isclose(result.chance_ap, 0.5, abs_tol=0.01)
    assert result.ap > 0.8
    i, j, labels = balanced_pairs(train_u, train_u, np.random.default_rng(0), exclude_self=True)
    assert labels.sum() == len(labels) / 2 and np.all((train_u[i] == train_u[j]) == labels.astype(bool))
    assert not np.any((i == j) & labels.astype(bool))


# ------------------------------------------------------------------------------------------ self-audit
def _self_audit(digits, alpha, seed=0, attacks=("mlp", "knn")):
    x, y = digits
    # A population shard with room for 10 disjoint crowd users (26 members, 152 non-members, 718 population).
    party = split_federation(x, y, 2, train_ratio=0.03, test_ratio=0.17, audit_ratio=0.8, seed=seed,
                             dirichlet_alpha=alpha)[0]
    global_model = _model(seed)
    trained = copy.deepcopy(global_model)
    members = (party.train_x[None], party.train_y[None])
    names = [n for n, _ in global_model.named_parameters()]
    delta = train_copies(global_model, *members, RECIPE, names=names, seed=seed + 100)[0]
    offset = 0
    with torch.no_grad():  # the real update: the same recipe on the members
        for name, param in trained.named_parameters():
            param += torch.tensor(delta[offset:offset + param.numel()].reshape(param.shape), dtype=param.dtype)
            offset += param.numel()
    settings = DeanonSettings(enabled=True, crowd_users=10, shadows_per_user=6, attacks=attacks)
    return deanon_self_audit(global_model, trained, (party.test_x, party.test_y), len(party.train_y),
                             (party.population_x, party.population_y), RECIPE, settings,
                             federation_alpha=alpha, seed=seed)


@pytest.mark.slow
def test_a_strongly_biased_user_is_reidentified_well_above_chance(digits):
    results = [_self_audit(digits, alpha=0.1, seed=seed) for seed in range(4)]
    assert all(r.details["crowd_users"] == 10 for r in results)
    assert set(results[0].metrics) == set(DeanonSettings(attacks=("mlp", "knn")).metric_names())
    mean = {name: np.mean([r.metrics[name] for r in results]) for name in results[0].metrics}
    assert mean["deanon_ap_over_chance"] > 2.5  # the ceiling with 11 users, one update each, is 1 / 0.274 = 3.65
    assert mean["deanon_mlp_own_rank"] <= 2 and mean["deanon_mlp_top1"] > 0.6
    assert np.mean([r.details["attacks"]["mlp"]["per_user_ap"][SELF] for r in results]) > 0.5


@pytest.mark.slow
def test_iid_users_are_near_chance(digits):
    ratios = [_self_audit(digits, alpha=None, seed=s, attacks=("mlp",)).metrics["deanon_mlp_ap_over_chance"]
              for s in range(3)]
    assert 0.5 < np.mean(ratios) < 1.6, ratios


# ------------------------------------------------------------------------------------------ calibration
# A synthetic tabular task and an MLP, split as the digits demo is (2 parties, few members, a population shard a
# few times their size): the crowd's data are scarce, where a crowd drawn with repeats from one shared pool put
# crowd users' private samples into other users' priors and the collaborator stood out in an IID federation.
TABULAR_RECIPE = TrainingRecipe("Adam", 0.003, 0.9, epochs=5, batch_size=32)
REID = ("mlp", "svm", "knn")


@pytest.fixture(scope="module")
def tabular():
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=1800, n_features=20, n_informative=12, n_redundant=4, n_classes=10,
                               n_clusters_per_class=1, class_sep=1.5, random_state=0)
    return x.astype(np.float32), y.astype(np.int64)


def _trained_as_the_task_runner_trains(model, x, y, recipe, seed):
    """A fresh optimizer, one shuffle per epoch, mean cross-entropy per batch, the last partial batch kept."""
    trained = copy.deepcopy(model)
    optimizer = recipe.make_optimizer(list(trained.parameters()))
    rng = np.random.default_rng(seed)
    xt, yt = torch.tensor(x), torch.tensor(y)
    for _ in range(recipe.epochs):
        for batch in torch.tensor(rng.permutation(len(y))).split(recipe.batch_size):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(trained(xt[batch]), yt[batch]).backward()
            optimizer.step()
    return trained


def _tabular_audit(data, alpha, seed):
    x, y = data
    party = split_federation(x, y, 2, train_ratio=0.05, test_ratio=0.25, audit_ratio=0.7, seed=seed,
                             dirichlet_alpha=alpha)[0]  # 45 members, 225 non-members, 630 population (IID)
    torch.manual_seed(seed)
    global_model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    trained = _trained_as_the_task_runner_trains(global_model, party.train_x, party.train_y, TABULAR_RECIPE, seed)
    settings = DeanonSettings(enabled=True, crowd_users=10, attacks=REID)
    return deanon_self_audit(global_model, trained, (party.test_x, party.test_y), len(party.train_y),
                             (party.population_x, party.population_y), TABULAR_RECIPE, settings,
                             federation_alpha=alpha, seed=seed)


def _own_and_crowd(result, attack):
    """The collaborator's AP over chance and its crowd users' mean (every user has one anonymous update)."""
    found = result.details["attacks"][attack]
    crowd = [ap for user, ap in found["per_user_ap"].items() if user != SELF]
    return found["per_user_ap"][SELF] / found["chance_ap"], np.mean(crowd) / found["chance_ap"]


@pytest.mark.slow
def test_an_iid_collaborator_stands_like_its_crowd(tabular):
    """IID: nobody is distinguishable, so the collaborator's own ratio, its crowd's and the headline sit near 1x
    (averaged over seeds: with one anonymous update per user a single audit's own ratio is a rank, 0.3x..3x).
    kNN scores ties pessimistically and reads below 1x at chance, for the collaborator and the crowd alike."""
    results = [_tabular_audit(tabular, None, seed) for seed in range(20)]
    assert all(r.details["crowd_users"] >= 5 for r in results)
    headline = np.mean([r.metrics["deanon_ap_over_chance"] for r in results])
    assert 0.7 <= headline <= 1.4, headline
    for attack in REID:
        own, crowd = np.mean([_own_and_crowd(r, attack) for r in results], axis=0)
        assert abs(own - crowd) < 0.5, (attack, own, crowd)
        if attack != "knn":
            assert 0.7 <= own <= 1.4 and 0.7 <= crowd <= 1.4, (attack, own, crowd)


@pytest.mark.slow
def test_a_skewed_collaborator_still_stands_out_of_its_crowd(tabular):
    results = [_tabular_audit(tabular, 0.1, seed) for seed in range(6)]
    assert np.mean([r.metrics["deanon_mlp_own_rank"] for r in results]) <= 2
    assert np.mean([r.metrics["deanon_ap_over_chance"] for r in results]) > 2  # the ceiling with 7 users: 2.9


def test_deanon_settings_validate_with_dotted_keys():
    assert deanon_settings("a.deanon", None) == DeanonSettings()
    assert deanon_settings("a.deanon", {"crowd_alpha": 0.5}).crowd_skew(0.1) == 0.5
    assert DeanonSettings().crowd_skew(0.1) == 0.1 and DeanonSettings(crowd_alpha=None).crowd_skew(0.1) is None
    for bad, key in [({"crowd_users": 1}, "crowd_users"), ({"attacks": ["svm", "lasso"]}, "attacks"),
                     ({"crowd_alpha": -1}, "crowd_alpha"), ({"shadows": 3}, "shadows"),
                     ({"shadows_per_user": 1}, "shadows_per_user")]:
        with pytest.raises(SettingsError, match=rf"^a\.deanon\.{key}:"):
            deanon_settings("a.deanon", bad)
