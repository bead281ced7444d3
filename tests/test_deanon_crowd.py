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
    # Two users fit only with a smaller prior than one shadow update's data: the shadow size shrinks with it.
    tight = audit_sizes(131, 504, 517, settings)
    assert (tight.crowd_users, tight.prior_size, tight.shadow_size) == (2, 127, 127)
    assert "shadow updates on 127 samples, not 131" in tight.crowd_note
    # Fewer non-members than one shadow update's data: every prior is all of them, and the crowd counts with that.
    few = audit_sizes(90, 30, 404, settings)
    assert (few.crowd_users, few.prior_size, few.shadow_size) == (3, 30, 30)
    for members, nonmembers, population, wanted in itertools.product((1, 7, 90), (1, 50, 400), (20, 200, 5000),
                                                                      (2, 10)):
        try:
            s = audit_sizes(members, nonmembers, population, DeanonSettings(crowd_users=wanted))
        except ValueError:
            assert population < 2 * (members + 1)
            continue
        assert 2 <= s.crowd_users <= wanted and s.private_size == members
        assert 1 <= s.shadow_size <= s.prior_size <= nonmembers
        assert s.crowd_users * (s.prior_size + s.private_size) <= population


def test_a_population_that_cannot_hold_two_users_fails_naming_the_settings():
    # The OpenFL tutorial's split (0.4 / 0.4 / 0.2): the population shard is half the member count.
    with pytest.raises(ValueError, match=r"^task_runner\.settings\.audit\.deanon: the population shard \(6000 "
                                         r"samples\) cannot give 2 crowd users 12000 private samples.*"
                                         r"audit_dataset_ratio"):
        audit_sizes(12000, 12000, 6000, DeanonSettings())
