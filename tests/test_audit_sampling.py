"""audit.sample_size: the membership audits on a random sample of each set (audit.round_audit.AuditSets.sampled).

What must hold: the sample is a seeded simple random sample of each set (nothing invented, nothing twice, the same
every round); the intervals computed on it cover the whole set's value as often as their level says (checked by
simulation against the whole finite set); the membership and RMIA attacks use the sample and the record and the
report say so, while validation still sees every sample; RMIA's references train on halves of the sampled
population, so that `a` can be tuned even when the members outnumber the population."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import make_classification
from torch import nn

from audit.config.audit_settings import AuditSettings
from audit.config.fields import SettingsError
from audit.membership.references import population_subsets
from audit.membership.uncertainty import auc, auc_interval, tpr_at_population_fpr
from audit.reporting.html import sampling_note
from audit.round_audit import SETS, AuditSets, LocalTraining, audit_round, sample_seed
from audit.round_record import RoundRecord
from audit.training import TrainingRecipe

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tabular_sets(n_members=600, n_nonmembers=500, n_population=400, seed=0) -> AuditSets:
    n = n_members + n_nonmembers + n_population
    x, y = make_classification(n_samples=n, n_features=10, n_informative=5, n_classes=3, flip_y=0.05,
                               random_state=seed)
    x, y = x.astype(np.float32), y.astype(np.int64)
    a, b = n_members, n_members + n_nonmembers
    return AuditSets(members=(x[:a], y[:a]), nonmembers=(x[a:b], y[a:b]), population=(x[b:], y[b:]))


# ------------------------------------------------------------------------------------------ the sample


def test_a_sample_is_a_seeded_simple_random_subset_of_each_set():
    sets = tabular_sets()
    sample = sets.sampled(250, seed=7)
    assert sample.sizes() == {"members": 250, "nonmembers": 250, "population": 250}
    assert sample.drawn_from == {"members": 600, "nonmembers": 500, "population": 400}
    assert sample.sampling() == {"members": {"audited": 250, "of": 600}, "nonmembers": {"audited": 250, "of": 500},
                                 "population": {"audited": 250, "of": 400}}
    for name in SETS:
        (x, y), (sx, sy) = getattr(sets, name), getattr(sample, name)
        # Every sampled row is a row of the set with its own label, none twice, in the set's order.
        rows = {row.tobytes(): i for i, row in enumerate(x)}
        index = np.array([rows[row.tobytes()] for row in sx])
        assert len(set(index.tolist())) == 250 and np.all(np.diff(index) > 0)
        assert np.array_equal(sy, y[index])
    # The same seed gives the same sample (the rounds compare on the same samples); another seed another one, and
    # each set is drawn from its own stream (equal sizes do not give equal index lists).
    again = sets.sampled(250, seed=7)
    assert all(np.array_equal(getattr(sample, n)[0], getattr(again, n)[0]) for n in SETS)
    other = sets.sampled(250, seed=8)
    assert not np.array_equal(sample.members[0], other.members[0])


def test_sets_within_the_size_are_used_whole_and_the_party_seed_is_stable():
    sets = tabular_sets()
    assert sets.sampled(None, seed=1) is sets and sets.sampled(600, seed=1) is sets
    partial = sets.sampled(550, seed=1)  # only the members are larger
    assert partial.nonmembers[0] is sets.nonmembers[0] and partial.population[0] is sets.population[0]
    assert len(partial.members[1]) == 550
    assert sets.sampling() == {n: {"audited": s, "of": s} for n, s in sets.sizes().items()}
    assert sample_seed(0, "collaborator1") == sample_seed(0, "collaborator1") != sample_seed(0, "collaborator2")
    assert sample_seed(None, "p") == sample_seed(0, "p")


@pytest.mark.parametrize("value, words", [(1, "integer >= 2"), (0, "integer >= 2"), (2.5, "integer >= 2"),
                                          ("all", "or null"), (True, "integer >= 2")])
def test_a_bad_sample_size_is_named_by_its_key(value, words):
    with pytest.raises(SettingsError) as err:
        AuditSettings.from_mapping({"sample_size": value}, prefix="task_runner.settings.audit")
    assert str(err.value).startswith("task_runner.settings.audit.sample_size:") and words in str(err.value)
    assert AuditSettings.from_mapping({"sample_size": None}).sample_size is None
    assert AuditSettings.from_mapping({"sample_size": 2}).sample_size == 2


# ------------------------------------------------------------------------------------------ coverage


@pytest.mark.slow
def test_intervals_on_a_sample_cover_the_whole_sets_values_as_often_as_they_say():
    """A finite set of 20,000 members' and 20,000 non-members' scores (members shifted by 0.6) and 20,000 population
    scores; 400 samples of 300 each (AuditSets.sampled, seeds 0..399). The interval of each sample's AUC must
    cover the whole sets' exact AUC, and the Clopper-Pearson interval of each sample's TPR (at the threshold its
    sampled population sets for FPR 0.1) the share of ALL members above that threshold, in at least 92% of the
    samples (nominal 95%; 400 draws put the observed rate within +-2.2 points of it at 2 standard deviations)."""
    rng = np.random.default_rng(11)
    n = 20_000
    members, nonmembers, population = rng.normal(0.6, 1, n), rng.normal(0, 1, n), rng.normal(0, 1, n)
    labels = np.zeros(n, dtype=np.int64)
    sets = AuditSets((members[:, None], labels), (nonmembers[:, None], labels), (population[:, None], labels))
    whole_auc = auc(members, nonmembers)
    auc_hits = tpr_hits = 0
    widths = []
    reps = 400
    for seed in range(reps):
        sample = sets.sampled(300, seed=seed)
        m, nm, pop = (getattr(sample, name)[0][:, 0] for name in SETS)
        interval = auc_interval(m, nm, 0.95)
        auc_hits += interval.lower <= whole_auc <= interval.upper
        widths.append(interval.upper - interval.lower)
        rates = tpr_at_population_fpr(m, nm, pop, 0.1, 0.95)
        whole_tpr = float(np.mean(members > rates.threshold))
        tpr_hits += rates.tpr.lower <= whole_tpr <= rates.tpr.upper
    assert auc_hits / reps >= 0.92, (auc_hits, reps)
    assert tpr_hits / reps >= 0.92, (tpr_hits, reps)
    # The intervals are the sample's, not the whole set's: about sqrt(20000 / 300) ~ 8x wider than the whole set's.
    whole_width = auc_interval(members, nonmembers, 0.95)
    assert np.median(widths) > 5 * (whole_width.upper - whole_width.lower)


# ------------------------------------------------------------------------------------------ the audit


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3))


def overfit(model: nn.Module, x, y, epochs=40) -> nn.Module:
    import copy

    local = copy.deepcopy(model).train()
    optimizer = torch.optim.Adam(local.parameters(), lr=0.01)
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    generator = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), 50):
            batch = order[start:start + 50]
            optimizer.zero_grad()
            nn.functional.cross_entropy(local(x[batch]), y[batch]).backward()
            optimizer.step()
    return local.eval()


def audit_settings(sample_size):
    return AuditSettings(signals=("loss", "logits", "gradient_norm"), fpr_tolerance=(0.01, 0.1),
                         sample_size=sample_size,
                         sections={"rmia": {"references": ["global", "independent"], "reference_models": 4}})


@pytest.mark.slow
def test_the_membership_audits_run_on_the_sample_and_the_record_says_so():
    """The record's attacks and RMIA use the sample (counts, reference subsets), with exactly the metrics an audit
    of the pre-sampled sets gives; the members outnumber the population (600 against 400, as in the tutorial's
    0.4 / 0.4 / 0.2), and RMIA's references (halves of the 200 sampled population samples) still let `a` be tuned."""
    sets = tabular_sets()
    initial = mlp(0)
    received = overfit(initial, *sets.members, epochs=2)
    local = overfit(received, *sets.members)
    training = LocalTraining(TrainingRecipe("Adam", 0.01, 0.9, epochs=2, batch_size=50), member_count=600,
                             federation_alpha=None)
    common = dict(party="p", round_num=0, seed=3, training=training, initial_model=initial)
    record = audit_round(local, received, sets, audit_settings(200), store={}, **common)
    assert record.sizes == {"members": 200, "nonmembers": 200, "population": 200}
    assert record.sampling == {"sample_size": 200, "sets": {
        "members": {"audited": 200, "of": 600}, "nonmembers": {"audited": 200, "of": 500},
        "population": {"audited": 200, "of": 400}}}
    for result in record.attacks.values():
        assert (result.n_members, result.n_nonmembers) == (200, 200)
    rmia = record.extra["rmia"]["independent"]
    assert rmia["subset_size"] == 100 and rmia["population_used"] == 200  # half the sample each, every z has an OUT
    assert rmia["a_tuning"]["tuned"], rmia["a_tuning"]
    # The same audit on sets sampled beforehand (what the task runner passes): the same metrics, bit for bit.
    presampled = sets.sampled(200, sample_seed(3, "p"))
    again = audit_round(local, received, sets, audit_settings(200), store={}, mia_sets=presampled, **common)
    assert again.metrics == record.metrics
    whole = audit_round(local, received, presampled, audit_settings(None), store={}, **common)
    assert whole.metrics == record.metrics
    # Sets sampled beforehand remember what they were drawn from: the record still says 200 of 600.
    assert whole.sampling["sets"] == record.sampling["sets"]
    # A sampled record says so in one sentence of the report; a whole one says nothing.
    assert sampling_note(record).startswith("Sampled: the membership attacks used 200 of 600 members, 200 of 500 "
                                            "non-members, 200 of 400 population samples")
    assert sampling_note(RoundRecord("p", 0, sampling={"sample_size": None, "sets": sets.sampling()})) is None


def test_reference_subsets_are_halves_at_most_and_every_sample_has_an_out_reference():
    # Room for all K: consecutive disjoint slices of one permutation (as Privacy Meter v2's random halves, smaller).
    subsets = population_subsets(100, 20, 4, seed=5)
    assert np.array_equal(subsets, np.random.default_rng(5).permutation(100)[:80].reshape(4, 20))
    # Members outnumber the population: each reference takes half, and pairs come from fresh permutations.
    for n, size, k in [(200, 600, 4), (201, 600, 3), (7, 3, 5), (2, 9, 2)]:
        subsets = population_subsets(n, size, k, seed=1)
        half = n // 2
        assert subsets.shape == (k, min(size, half))
        assert all(len(set(row.tolist())) == len(row) for row in subsets)  # no sample twice in a subset
        trained = np.zeros((k, n), dtype=bool)
        for j, row in enumerate(subsets):
            trained[j, row] = True
        assert (~trained).any(axis=0).all()  # every sample is OUT of some reference: Pr(z) exists
        per_permutation = n // min(size, half)
        for first in range(0, k, per_permutation):  # the slices of one permutation are disjoint
            group = trained[first:first + per_permutation]
            assert group.sum(axis=0).max() <= 1
