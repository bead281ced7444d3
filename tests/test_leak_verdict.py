"""The round's leak verdict (audit.verdict): its tests against chance equal the reference tests, Holm's correction
equals its definition, the floors are what the tests can detect, and through the real audit the verdict's false
positive rate stays at its level when members and non-members come from one distribution (every attack on)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binom, fisher_exact, mannwhitneyu
from torch import nn

from audit.config.audit_settings import AuditSettings
from audit.config.vocabulary import LEAK_METRICS
from audit.membership.epsilon_bound import epsilon_lower_bound
from audit.round_audit import AuditSets, LocalTraining, audit_round
from audit.training import TrainingRecipe
from audit.verdict.chance import (auc_p_value, holm, largest_certifiable_epsilon, smallest_detectable_auc,
                                  smallest_detectable_tpr, tpr_p_value)
from audit.verdict.leak import ChanceTest, EpsilonEvidence, Evidence, leak_verdict

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ------------------------------------------------------------------------------------------ the tests themselves


def test_holm_equals_its_definition_on_hand_made_p_values():
    # sorted: 0.005, 0.01, 0.03, 0.04 -> 4 * 0.005, 3 * 0.01, 2 * 0.03, 1 * 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([]).size == 0


@pytest.mark.parametrize("tp, n_pos, fp, n_neg", [(5, 20, 0, 20), (9, 89, 1, 89), (0, 30, 3, 40), (40, 40, 40, 40),
                                                  (300, 1000, 250, 1000)])
def test_the_tpr_test_is_fishers_exact_test(tp, n_pos, fp, n_neg):
    expected = fisher_exact([[tp, n_pos - tp], [fp, n_neg - fp]], alternative="greater").pvalue
    assert tpr_p_value(tp, n_pos, fp, n_neg) == pytest.approx(expected, rel=1e-9)


def test_the_auc_test_is_the_one_sided_mann_whitney_test():
    rng = np.random.default_rng(3)
    for n in (5, 20, 200):
        pos, neg = rng.gamma(2.0, size=n) + 0.3, rng.gamma(2.0, size=n + 3)
        assert auc_p_value(pos, neg) == pytest.approx(mannwhitneyu(pos, neg, alternative="greater").pvalue)
    assert auc_p_value(np.ones(5), np.ones(7)) == 1.0  # every score equal: no evidence


@pytest.mark.parametrize("n", [20, 90])
def test_each_test_is_valid_at_small_levels_on_tied_scores(n):
    """Under "members and non-members alike" (discrete scores: many ties, as a rounded loss gives), each one-sided
    test rejects at most its level, at the small levels a corrected family uses."""
    rng = np.random.default_rng(11)
    draws, level = 4000, 0.01
    scores = rng.integers(0, 6, size=(draws, 2 * n)).astype(float)  # six distinct values
    # auc_p_value is scipy's one-sided Mann-Whitney test (checked above): its vectorised form here, for speed
    auc_hits = np.sum(mannwhitneyu(scores[:, :n], scores[:, n:], alternative="greater", axis=1).pvalue <= level)
    assert auc_p_value(scores[0, :n], scores[0, n:]) == pytest.approx(
        mannwhitneyu(scores[:1, :n], scores[:1, n:], alternative="greater", axis=1).pvalue[0])
    flagged = scores >= 5  # a fixed threshold set elsewhere
    tpr_hits = np.sum(tpr_p_value(flagged[:, :n].sum(1), n, flagged[:, n:].sum(1), n) <= level)
    allowance = level + 3 * math.sqrt(level * (1 - level) / draws)
    assert auc_hits / draws <= allowance and tpr_hits / draws <= allowance


def test_the_floors_are_what_the_tests_detect_at_that_level():
    level = 0.05 / 36
    for n_pos, n_neg, tol in [(89, 89, 0.01), (89, 404, 0.1), (20, 20, 0.5), (1000, 1000, 0.001)]:
        floor = smallest_detectable_tpr(n_pos, n_neg, tol, level)
        fp = math.floor(tol * n_neg)
        tp = round(floor * n_pos)
        assert tpr_p_value(tp, n_pos, fp, n_neg) <= level < tpr_p_value(tp - 1, n_pos, fp, n_neg)
    assert smallest_detectable_tpr(5, 5, 0.01, 1e-4) is None  # even 5/5 cannot beat 0/5 at that level
    assert smallest_detectable_auc(3, 3, 1e-4) is None
    # the AUC floor: scores with exactly that many (member, non-member) pairs ordered right are declared above chance,
    # one pair fewer are not
    for n in (20, 90, 400):
        floor = smallest_detectable_auc(n, n, level)
        pairs = math.ceil(floor * n * n)
        assert auc_p_value(*_with_pairs(n, pairs)) <= level < auc_p_value(*_with_pairs(n, pairs - 1))


def _with_pairs(n: int, pairs: int):
    """n members and n non-members, no ties, with exactly `pairs` (member, non-member) pairs where the member scores
    higher: non-members 0..n-1, member i just below count_i, the counts spread as evenly as they go."""
    counts = np.full(n, pairs // n) + (np.arange(n) < pairs % n)
    return counts - 0.5 + np.arange(n) * 1e-6, np.arange(n, dtype=float)


@pytest.mark.parametrize("n_pos, n_neg", [(20, 20), (89, 404), (1000, 1000)])
def test_the_epsilon_ceiling_is_the_bound_of_perfect_separation_and_no_scores_exceed_it(n_pos, n_neg):
    ceiling = largest_certifiable_epsilon(n_pos, n_neg, delta=1e-5, confidence=0.95)
    assert ceiling == epsilon_lower_bound(np.ones(n_pos), np.zeros(n_neg), delta=1e-5).epsilon > 0
    rng = np.random.default_rng(n_pos)
    for shift in (0.0, 2.0, 8.0):
        bound = epsilon_lower_bound(rng.normal(size=n_pos) + shift, rng.normal(size=n_neg), delta=1e-5).epsilon
        assert bound <= ceiling + 1e-12


# ------------------------------------------------------------------------------------------ the verdict


def _test(p, estimate=0.7, attack="a", statistic="exact_auc"):
    return ChanceTest(attack, statistic, f"m_{attack}_{statistic}", estimate, 0.5, p, {"members": 50, "nonmembers": 50},
                      lambda c: (estimate - (1 - c), estimate + (1 - c)))


def test_a_figure_significant_alone_is_not_a_leak_among_many():
    alone = leak_verdict(Evidence((_test(0.01),)), confidence=0.95, delta=1e-5)
    assert alone.detected and alone.headline.p_adjusted == pytest.approx(0.01)
    many = leak_verdict(Evidence((_test(0.01), *(_test(0.5, attack=f"x{i}") for i in range(9)))), confidence=0.95,
                        delta=1e-5)
    assert not many.detected and many.tests == 10 and many.headline.p_adjusted == pytest.approx(0.1)
    # the headline's corrected interval is at the Bonferroni level over the 10 tests: wider than its own
    assert many.headline.interval == pytest.approx((0.65, 0.75))
    assert many.headline.corrected_interval == pytest.approx((0.7 - 0.005, 0.7 + 0.005))


def test_the_family_wise_epsilon_corrects_each_bound_for_the_number_of_sources():
    levels = []
    source = EpsilonEvidence("s", bound=lambda c: levels.append(c) or 1.0 - (1 - c) * 10, ceiling=lambda c: 4.0)
    weak = EpsilonEvidence("w", bound=lambda c: 0.1, ceiling=lambda c: 2.0)
    verdict = leak_verdict(Evidence((), (source, weak)), confidence=0.9, delta=1e-5)
    assert levels == [pytest.approx(0.95)]  # 1 - 0.1 / 2 sources
    assert verdict.epsilon["value"] == pytest.approx(0.5) and verdict.epsilon["attack"] == "s"
    assert verdict.epsilon["ceiling"] == 4.0 and verdict.detected is None  # no chance test: no verdict
    assert math.isnan(verdict.metrics["leak_detected"]) and verdict.metrics["leak_epsilon_lb"] == pytest.approx(0.5)


# ------------------------------------------------------------------------------------------ through the real audit

FEATURES, CLASSES = 6, 3


def _tabular(rng, n):
    """Tabular data the suite does not use elsewhere: two informative features, one categorical column, noise."""
    y = rng.integers(0, CLASSES, size=n)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    x[:, 0] += y.astype(np.float32)
    x[:, 1] = (y == 1) + rng.normal(scale=0.5, size=n)
    x[:, 2] = rng.integers(0, 4, size=n)
    return x, y


def _model():
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def _train(model, x, y, epochs=30):
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    for _ in range(epochs):
        opt.zero_grad()
        nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    return model


SETTINGS = AuditSettings.from_mapping({
    "confidence": 0.8, "fpr_tolerance": [0.05, 0.25],
    "rmia": {"references": ["global", "fine_tuned", "independent"], "reference_models": 2},
})


def _audit(seed: int, members_trained: bool) -> dict:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    members, nonmembers, population, other = (_tabular(rng, n) for n in (40, 40, 80, 40))
    received = _train(_model(), *other, epochs=5)
    local = _train(_model(), *(members if members_trained else other), epochs=60)
    training = LocalTraining(TrainingRecipe("Adam", 0.01, 0.9, epochs=2, batch_size=20), member_count=40,
                             federation_alpha=None)
    return audit_round(local, received, AuditSets(members, nonmembers, population), SETTINGS, party="p",
                       round_num=0, seed=seed, training=training, initial_model=_model())


@pytest.mark.slow
def test_through_the_real_audit_the_verdict_is_wrong_at_most_at_its_level_when_nothing_leaks():
    """Members the model never saw: members, non-members and population are one distribution. Every attack is on
    (three signals on the local and the received model, the update attack, RMIA with every kind of reference): 30
    tests a round. At family-wise level 0.2, "leak detected" comes at most that often (binomial allowance), where
    taking the smallest uncorrected p-value would cry leak in most rounds."""
    runs = 30
    detected, uncorrected = 0, 0
    for seed in range(runs):
        record = _audit(seed, members_trained=False)
        leak = record.leak
        assert leak["tests"] == 30 and set(LEAK_METRICS) <= set(record.metrics)
        detected += leak["detected"]
        uncorrected += min(t["p_value"] for t in leak["all_tests"]) <= 0.2
    # a verdict at its level exceeds this count with probability below 1%
    limit = binom.isf(0.01, runs, 0.2)
    assert detected <= limit, (detected, limit)
    assert uncorrected > limit, uncorrected  # the correction is what keeps it at its level


def test_through_the_real_audit_a_model_that_memorised_its_members_is_a_leak():
    record = _audit(0, members_trained=True)
    leak = record.leak
    assert leak["detected"] and leak["headline"]["p_adjusted"] <= 0.2
    assert record.metrics["leak_detected"] == 1.0
    head = leak["headline"]
    assert head["corrected_interval"][0] <= head["interval"][0] <= head["estimate"] <= head["interval"][1]
    assert 0 <= record.metrics["leak_epsilon_lb"] <= record.metrics["leak_epsilon_ceiling"]
