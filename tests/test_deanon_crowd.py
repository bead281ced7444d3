"""The self-audit's crowd: disjoint users whose prior and private parts stand to each other as the collaborator's
non-members and members do, and the sizes that make every user alike (audit.deanon.crowd, audit.deanon.self_audit)."""

import itertools

import numpy as np
import pytest

from audit.deanon.self_audit import audit_sizes
from audit.deanon.crowd import crowd_capacity, draw_crowd
from audit.config.deanon_settings import DeanonSettings


def _labels(n, seed=0):
    """Unbalanced labels of 7 classes (class c about (c + 1) times as frequent as class 0)."""
    weights = np.arange(1, 8) / np.arange(1, 8).sum()
    return np.random.default_rng(seed).choice(7, size=n, p=weights)


@pytest.mark.parametrize("alpha", [None, 1.0, 0.05])
def test_crowd_users_share_no_sample_even_when_the_pool_is_used_up(alpha):
    """Exactly as many samples as the crowd needs: every sample is used once; skewed users that find a class
    exhausted drift from their mix instead of repeating samples or taking another user's."""
    prior, private, users = 23, 17, 6
    labels = _labels(users * (prior + private), seed=3)
    for seed in range(5):
        crowd = draw_crowd(labels, users, prior, private, alpha, seed=seed)
        assert len(crowd) == users
        assert all(len(u.prior) == prior and len(u.private) == private for u in crowd)
        taken = np.concatenate([np.concatenate([u.prior, u.private]) for u in crowd])
        assert np.array_equal(np.sort(taken), np.arange(len(labels)))  # each sample exactly once
    again = draw_crowd(labels, users, prior, private, alpha, seed=seed)  # same seed, same crowd
    assert all(np.array_equal(a.prior, b.prior) and np.array_equal(a.private, b.private) for a, b in zip(crowd, again))


def test_a_crowd_too_large_for_the_pool_is_refused():
    assert crowd_capacity(100, 20, 30) == 2
    with pytest.raises(ValueError, match="150 distinct samples; the population has 100"):
        draw_crowd(_labels(100), 3, 20, 30, None, seed=0)


def test_a_users_prior_and_private_part_share_no_label_fluctuation():
    """In an IID crowd a user's private part is no more like its own prior than like another user's prior in its
    label counts (what the attacks see most): the collaborator's members and non-members are independent draws
    too. Cutting one draw of a user into two parts, or dealing the last users the pool's remains, would make them
    alike: the attacks then recognise crowd users in an IID federation. The pool is used up, the hardest case."""
    prior, private, users = 30, 30, 5
    labels = _labels(users * (prior + private), seed=1)
    overall = np.bincount(labels, minlength=7) / len(labels)

    def deviation(part):
        return np.bincount(labels[part], minlength=7) / len(part) - overall

    own, other = [], []
    for seed in range(300):
        crowd = draw_crowd(labels, users, prior, private, None, seed=seed)
        priors = [deviation(u.prior) for u in crowd]
        privates = [deviation(u.private) for u in crowd]
        for i, j in itertools.product(range(users), repeat=2):
            (own if i == j else other).append(priors[i] @ privates[j])
    scale = np.mean([d @ d for d in priors])
    assert abs(np.mean(own) - np.mean(other)) < 0.1 * scale, (np.mean(own), np.mean(other), scale)


def test_skewed_users_keep_their_label_mix_when_the_pool_has_room():
    labels = _labels(3000, seed=2)
    crowd = draw_crowd(labels, 5, 150, 100, alpha=0.3, seed=0)
    for user in crowd:
        for part in (user.prior, user.private):
            hist = np.bincount(labels[part], minlength=7) / len(part)
            assert 0.5 * np.abs(hist - user.mix).sum() < 0.15  # total variation from its mix


# ------------------------------------------------------------------------------------------ sizes
def test_every_user_gets_the_same_prior_and_private_size_within_the_population():
    settings = DeanonSettings(crowd_users=10)
    # The digits demo's shard (90 members, 404 non-members, 404 population): 2 users of 90 + 90 fit, not 10.
    sizes = audit_sizes(90, 404, 404, settings)
    assert (sizes.crowd_users, sizes.private_size, sizes.shadow_size) == (2, 90, 90)
    assert sizes.prior_size == 404 // 2 - 90  # the room left goes to every user's prior
    assert "crowd_users = 10" in sizes.crowd_note
    # Room for all: the prior grows up to the non-member count.
    roomy = audit_sizes(100, 700, 3200, settings)
    assert (roomy.crowd_users, roomy.prior_size, roomy.crowd_note) == (10, 220, None)
    assert audit_sizes(100, 150, 30000, settings).prior_size == 150
    # Two users of the member count and one shadow update's prior do not fit: each of 2 users gets half the
    # population, split between private data and prior as the full sizes would be (here half and half).
    tight = audit_sizes(131, 504, 517, settings)
    assert (tight.crowd_users, tight.private_size, tight.prior_size, tight.shadow_size) == (2, 129, 129, 129)
    assert tight.crowd_note.startswith("sized to the population shard: 2 crowd users (not 10) of 129 private + 129 "
                                       "prior samples each, shadow updates on 129 samples: its 517 samples cannot "
                                       "give 2 users the member count (131) and a prior of 131")
    # With a smaller shadow size the prior needs less: the split follows it.
    shadow = audit_sizes(131, 504, 300, DeanonSettings(crowd_users=10, shadow_size=19))
    assert (shadow.private_size, shadow.prior_size, shadow.shadow_size) == (131, 19, 19)  # 2 x 150 fit as planned
    shadow = audit_sizes(131, 504, 200, DeanonSettings(crowd_users=10, shadow_size=19))
    assert (shadow.private_size, shadow.prior_size, shadow.shadow_size) == (100 * 131 // 150, 100 - 87, 13)
    # Fewer non-members than one shadow update's data: every prior is all of them, and the crowd counts with that.
    few = audit_sizes(90, 30, 404, settings)
    assert (few.crowd_users, few.prior_size, few.shadow_size) == (3, 30, 30)
    for members, nonmembers, population, wanted in itertools.product((1, 7, 90), (1, 50, 400), (20, 200, 5000),
                                                                      (2, 10)):
        try:
            s = audit_sizes(members, nonmembers, population, DeanonSettings(crowd_users=wanted))
        except ValueError:
            assert population < 4 or members == 1 and population < 2 * (1 + min(nonmembers, 1)) + 2
            continue
        fits = population >= 2 * (members + min(members, nonmembers))
        assert 2 <= s.crowd_users <= wanted and (s.private_size == members) == fits and s.private_size <= members
        assert 1 <= s.shadow_size <= s.prior_size <= nonmembers and s.shadow_size <= members
        assert s.crowd_users * (s.prior_size + s.private_size) <= population
        assert (s.crowd_note is None) == (s.crowd_users == wanted and s.shadow_size == members)


def test_a_population_smaller_than_two_users_sizes_the_audit_to_it():
    # The OpenFL tutorial's split (0.4 / 0.4 / 0.2): the population shard is half the member count.
    sizes = audit_sizes(12000, 12000, 6000, DeanonSettings())
    assert (sizes.crowd_users, sizes.private_size, sizes.prior_size, sizes.shadow_size) == (2, 1500, 1500, 1500)
    assert "its 12000 members" in sizes.crowd_note and "of 1500 private + 1500 prior samples each" in sizes.crowd_note


@pytest.mark.parametrize("collaborators", [2, 3])
def test_every_datasets_default_ratios_get_a_sized_audit(collaborators):
    """Each dataset's shards at the tutorial's default ratios, as split_federation cuts them (labels only: the sizes
    do not depend on the images), get a self-audit sized to the shard, with a note, never a refusal."""
    from src.data.datasets import _SAMPLES
    from src.data.split import split_federation

    for name, count in _SAMPLES.items():
        labels = np.arange(count) % 10
        for party in split_federation(np.zeros((count, 1), np.float32), labels, collaborators):
            members, nonmembers, population = len(party.train_y), len(party.test_y), len(party.population_y)
            sizes = audit_sizes(members, nonmembers, population, DeanonSettings())
            assert sizes.crowd_users == 2 and sizes.crowd_note.startswith("sized to the population shard"), name
            # half the population each, split evenly (the default shadow size is the member count)
            assert sizes.private_size + sizes.prior_size == population // 2, name
            assert abs(sizes.private_size - sizes.prior_size) <= 1 and sizes.shadow_size == sizes.prior_size, name


def test_a_population_that_cannot_hold_two_users_fails_naming_the_settings():
    with pytest.raises(ValueError, match=r"^task_runner\.settings\.audit\.deanon: the population shard \(3 "
                                         r"samples\) cannot give 2 crowd users one private and one prior sample each; "
                                         r"raise data_loader\.settings\.audit_dataset_ratio"):
        audit_sizes(12, 12, 3, DeanonSettings())
