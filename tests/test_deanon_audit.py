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
from audit.config.checks import SettingsError
from audit.training import TrainingRecipe, train_copies
from src.data import load_dataset, split_federation
from src.models import build_model

RECIPE = TrainingRecipe("Adam", 0.003, 0.9, epochs=3, batch_size=32)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _model(seed=0):
    torch.manual_seed(seed)
    return build_model("cnn", (1, 8, 8), 10)


# ------------------------------------------------------------------------------------------ shadow training
def test_stacked_copies_train_exactly_like_separate_models(digits):
    """train_copies == each copy trained on its own with torch.optim on the same batches."""
    x, y = digits
    model = _model()
    rng = np.random.default_rng(0)
    picks = np.stack([rng.choice(len(y), 40, replace=False) for _ in range(3)])
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=2, batch_size=16)
    names = [n for n, _ in model.named_parameters()]
    stacked = train_copies(model, x[picks], y[picks], recipe, names=names, seed=5)

    generator = torch.Generator().manual_seed(5)  # the same shuffles train_copies draws
    orders = [torch.argsort(torch.rand(3, 40, generator=generator), dim=1) for _ in range(recipe.epochs)]
    for c in range(3):
        copy_model = copy.deepcopy(model)
        optimizer = torch.optim.SGD(copy_model.parameters(), lr=0.05, momentum=0.9)
        xc, yc = torch.tensor(x[picks[c]]), torch.tensor(y[picks[c]])
        for order in orders:
            for start in range(0, 40, 16):
                idx = order[c, start:start + 16]
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(copy_model(xc[idx]), yc[idx]).backward()
                optimizer.step()
        delta = torch.cat([(dict(copy_model.named_parameters())[n] - dict(model.named_parameters())[n]).flatten()
                           for n in names]).detach().double().numpy()
        np.testing.assert_allclose(stacked[c], delta, rtol=1e-4, atol=1e-6)
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
def test_random_ranking_ap_is_the_mean_ap_of_random_scores():
    rng = np.random.default_rng(0)
    from sklearn.metrics import average_precision_score
    for positives, total in [(1, 11), (3, 20), (10, 20)]:
        labels = np.zeros(total)
        labels[:positives] = 1
        simulated = np.mean([average_precision_score(labels, rng.random(total)) for _ in range(4000)])
        assert abs(simulated - random_ranking_ap(positives, total)) < 0.01
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
    party = split_federation(x, y, 4, train_ratio=0.1, test_ratio=0.45, audit_ratio=0.45, seed=seed,
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


def test_a_strongly_biased_user_is_reidentified_well_above_chance(digits):
    result = _self_audit(digits, alpha=0.1)
    m = result.metrics
    assert m["deanon_ap_over_chance"] > 2.5  # the ceiling with 11 users, one update each, is 1 / 0.274 = 3.65
    assert m["deanon_mlp_own_rank"] <= 2 and m["deanon_mlp_top1"] > 0.6
    assert set(m) == set(DeanonSettings(attacks=("mlp", "knn")).metric_names())
    assert result.details["attacks"]["mlp"]["per_user_ap"][SELF] > 0.5


def test_iid_users_are_near_chance(digits):
    ratios = [_self_audit(digits, alpha=None, seed=s, attacks=("mlp",)).metrics["deanon_mlp_ap_over_chance"]
              for s in range(3)]
    assert 0.5 < np.mean(ratios) < 1.6, ratios


def test_deanon_settings_validate_with_dotted_keys():
    assert deanon_settings("a.deanon", None) == DeanonSettings()
    assert deanon_settings("a.deanon", {"crowd_alpha": 0.5}).crowd_skew(0.1) == 0.5
    assert DeanonSettings().crowd_skew(0.1) == 0.1 and DeanonSettings(crowd_alpha=None).crowd_skew(0.1) is None
    for bad, key in [({"crowd_users": 1}, "crowd_users"), ({"attacks": ["svm", "lasso"]}, "attacks"),
                     ({"crowd_alpha": -1}, "crowd_alpha"), ({"shadows": 3}, "shadows"),
                     ({"shadows_per_user": 1}, "shadows_per_user")]:
        with pytest.raises(SettingsError, match=rf"^a\.deanon\.{key}:"):
            deanon_settings("a.deanon", bad)
