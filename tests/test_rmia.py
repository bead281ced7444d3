"""audit.membership.rmia: RMIA against a direct implementation of the paper's formulas (explicit loops), its identities with
simpler attacks, its power where references carry information, Privacy Meter v2's tuning of `a`, and its cost."""

import math
import time
import tracemalloc

import numpy as np
import pytest
from scipy.special import softmax
from sklearn.metrics import roc_auc_score

from audit.membership.rmia import (
    OFFLINE_A_GRID,
    Signals,
    marginal_probability,
    rmia,
    rmia_scores,
    true_class_probability,
    tune_offline_a,
)
from audit.membership.uncertainty import auc, auc_interval, tpr_at_population_fpr

# ------------------------------------------------------------------------------------------ the paper, by hand


def direct_marginal(refs, trained, offline_a, global_model=None):
    """Pr(x) sample by sample: the paper's (Pr_IN + Pr_OUT) / 2, or the offline ((1 + a) Pr_OUT + 1 - a) / 2."""
    out = []
    for n in range(refs.shape[1]):
        outs = [float(refs[k, n]) for k in range(refs.shape[0]) if not trained[k, n]]
        if global_model is not None:
            outs.append(float(global_model[n]))
        ins = [float(refs[k, n]) for k in range(refs.shape[0]) if trained[k, n]]
        p_out = sum(outs) / len(outs)
        out.append(((1 + offline_a) * p_out + (1 - offline_a)) / 2 if offline_a is not None
                   else (sum(ins) / len(ins) + p_out) / 2)
    return np.array(out)


def direct_scores(target_x, marginal_x, target_z, marginal_z, gamma, strict=False):
    """score(x) = (1/|Z|) sum_z 1[LR(x, z) >= gamma], LR(x, z) = (Pr(x|t)/Pr(x)) / (Pr(z|t)/Pr(z)): a double loop."""
    scores = []
    for i in range(len(target_x)):
        ratio_x = target_x[i] / marginal_x[i]
        count = 0
        for j in range(len(target_z)):
            ratio_z = target_z[j] / marginal_z[j]
            lr = ratio_x / ratio_z if ratio_z != 0 else (math.inf if ratio_x > 0 else math.nan)
            count += (lr > gamma) if strict else (lr >= gamma)
        scores.append(count / len(target_z))
    return np.array(scores)


def random_logits(rng, k, n, c=5, scale=2.0):
    return rng.normal(0, scale, (k, n, c)) if k else rng.normal(0, scale, (n, c))


# ------------------------------------------------------------------------------------------ signal


def test_true_class_probability_is_the_softmax_at_a_temperature():
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(0, 3, (4, 30, 7)), rng.integers(0, 7, 30)
    for temperature in (0.5, 1.0, 2.0, 7.5):  # float64 both ways: a few roundings of 1e-16, 1e-12 leaves 1e4
        want = np.take_along_axis(softmax(logits / temperature, axis=-1), labels[None, :, None], axis=-1)[..., 0]
        np.testing.assert_allclose(true_class_probability(logits, labels, temperature), want, rtol=1e-12)
        np.testing.assert_allclose(true_class_probability(logits[2], labels, temperature), want[2], rtol=1e-12)
    # T = 1: exp(-cross-entropy); a huge temperature flattens to 1 / classes; huge logits stay finite.
    ce = -(logits[0][np.arange(30), labels] - np.log(np.exp(logits[0]).sum(axis=1)))
    np.testing.assert_allclose(true_class_probability(logits[0], labels), np.exp(-ce), rtol=1e-12)
    # at T = 1e9 each probability is 1/7 within |logit| / 1e9 (about 1e-8: logits of size 10)
    np.testing.assert_allclose(true_class_probability(logits, labels, 1e9), 1 / 7, rtol=1e-6)
    big = true_class_probability(np.array([[1e4, 0.0], [0.0, 1e4]]), np.array([0, 0]))
    assert big.tolist() == [1.0, 0.0]


def test_true_class_probability_rejects_bad_input():
    with pytest.raises(ValueError, match="temperature"):
        true_class_probability(np.zeros((2, 3)), np.array([0, 1]), 0)
    with pytest.raises(ValueError, match="labels must be integers in \\[0, 3\\)"):
        true_class_probability(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="logits"):
        true_class_probability(np.zeros((2, 3)), np.array([0, 1, 2]))


# ------------------------------------------------------------------------------------------ the formula


@pytest.mark.parametrize("offline_a", [0.0, 0.3, 1.0, None])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_rmia_equals_the_papers_formula_by_double_loop(offline_a, temperature):
    """Members, non-members and population from random logits, 4 references with random training sets (online
    needs an IN and an OUT one per sample), the global model as one more reference; population samples that
    duplicate members give ties at LR = 1 exactly. Several gammas, both comparisons."""
    rng = np.random.default_rng(int(10 * temperature) + (7 if offline_a is None else int(10 * offline_a)))
    sizes = {"members": 23, "non-members": 17, "population": 31}
    labels = {k: rng.integers(0, 5, n) for k, n in sizes.items()}
    logits = {k: (random_logits(rng, 0, n), random_logits(rng, 4, n), random_logits(rng, 0, n))
              for k, n in sizes.items()}
    for part in range(3):  # population samples 0-5: exact copies of members 0-5 (every model, same label)
        target = logits["population"][part]
        target[..., :6, :] = logits["members"][part][..., :6, :]
    labels["population"][:6] = labels["members"][:6]
    masks = {}
    for k, n in sizes.items():
        masks[k] = rng.random((4, n)) < 0.5
        masks[k][0], masks[k][1] = True, False  # at least one IN and one OUT reference per sample
    masks["population"][:, :6] = masks["members"][:, :6]
    sets = {}
    for k, n in sizes.items():
        trained = masks[k]
        t, r, g = (true_class_probability(x, labels[k], temperature) for x in logits[k])
        sets[k] = Signals(t, r, trained, g)
    marg = {k: direct_marginal(s.references, s.reference_in, offline_a, s.global_model) for k, s in sets.items()}
    for k, s in sets.items():
        np.testing.assert_allclose(marginal_probability(s.references, s.reference_in, offline_a=offline_a,
                                                        global_model=s.global_model), marg[k], rtol=1e-15)
    pop = sets["population"]
    for gamma in (0.5, 1.0, 1.3, 2.0, 4.0):
        for strict in (False, True):
            result = rmia(sets["members"], sets["non-members"], pop, offline_a=offline_a, gamma=gamma,
                          strict=strict)
            for name, got in (("members", result.members), ("non-members", result.nonmembers)):
                want = direct_scores(sets[name].target, marg[name], pop.target, marg["population"], gamma, strict)
                np.testing.assert_array_equal(got, want, err_msg=f"{name} gamma={gamma} strict={strict}")
            # the population's own scores: against every other population sample
            loo = [direct_scores(pop.target[[j]], marg["population"][[j]], np.delete(pop.target, j),
                                 np.delete(marg["population"], j), gamma, strict)[0] for j in range(31)]
            np.testing.assert_allclose(result.population, loo, rtol=0, atol=1e-12)
    # The duplicated members tie with their copies: counted by >= 1, not by > 1.
    at_one = rmia(sets["members"], sets["non-members"], pop, offline_a=offline_a, gamma=1.0)
    above_one = rmia(sets["members"], sets["non-members"], pop, offline_a=offline_a, gamma=1.0, strict=True)
    assert (at_one.members[:6] > above_one.members[:6]).all()


def test_ties_at_exactly_gamma_count_as_the_definition_says():
    """Dyadic probabilities make every LR a power of two, so LR(x, z) == gamma exactly for many pairs; the count
    follows >= (the paper) or > (Privacy Meter v2's code) exactly, including Pr(z | target) = 0 (LR = inf) and
    Pr(x | target) = 0 (never counted)."""
    rng = np.random.default_rng(1)
    values = np.array([0.0, 0.125, 0.25, 0.5, 1.0])
    tx, tz = rng.choice(values, 60), rng.choice(values, 80)
    mx, mz = rng.choice([0.25, 0.5, 1.0], 60), rng.choice([0.25, 0.5, 1.0], 80)
    for gamma in (0.25, 0.5, 1.0, 2.0, 4.0, 3.0):
        for strict in (False, True):
            np.testing.assert_array_equal(rmia_scores(tx, mx, tz, mz, gamma=gamma, strict=strict),
                                          direct_scores(tx, mx, tz, mz, gamma, strict))
    assert (rmia_scores(tx, mx, tz, mz, gamma=1.0) >= rmia_scores(tx, mx, tz, mz, gamma=1.0, strict=True)).all()
    assert (rmia_scores(tx, mx, tz, mz, gamma=1.0)[tx == 0] == 0).all()


# ------------------------------------------------------------------------------------------ identities


def test_offline_a_interpolates_between_the_out_mean_and_one():
    rng = np.random.default_rng(2)
    refs = rng.random((3, 50))
    trained = rng.random((3, 50)) < 0.3
    trained[2] = False
    p_out = (refs * ~trained).sum(axis=0) / (~trained).sum(axis=0)
    np.testing.assert_allclose(marginal_probability(refs, trained, offline_a=1.0), p_out, rtol=1e-15)
    np.testing.assert_allclose(marginal_probability(refs, trained, offline_a=0.0), (1 + p_out) / 2, rtol=1e-15)
    # When IN references really are a * Pr_OUT + (1 - a), the online Pr(x) is the offline one.
    a = 0.3
    online = np.concatenate([refs[:1] * 0 + p_out, a * p_out[None] + (1 - a)])
    online_in = np.array([[False] * 50, [True] * 50])
    np.testing.assert_allclose(marginal_probability(online, online_in, offline_a=None),
                               marginal_probability(refs, trained, offline_a=a), rtol=1e-12)


def test_an_uninformative_reference_gives_the_population_attack_on_the_loss():
    """One reference that says 0.5 for every sample, a = 1, gamma = 1: ratio(x) = 2 Pr(x | target), so
    score(x) = share of population z with Pr(z | target) <= Pr(x | target), i.e. loss(z) >= loss(x): the
    population attack's empirical CDF on the loss."""
    rng = np.random.default_rng(3)
    labels_x, labels_z = rng.integers(0, 4, 200), rng.integers(0, 4, 300)
    px = true_class_probability(rng.normal(0, 2, (200, 4)), labels_x)
    pz = true_class_probability(rng.normal(0, 2, (300, 4)), labels_z)
    half = lambda n: np.full((1, n), 0.5)  # noqa: E731
    result = rmia(Signals(px[:100], half(100)), Signals(px[100:], half(100)), Signals(pz, half(300)),
                  offline_a=1.0, gamma=1.0)
    loss_x, loss_z = -np.log(px), -np.log(pz)
    np.testing.assert_array_equal(np.r_[result.members, result.nonmembers], (pz[None] <= px[:, None]).mean(axis=1))
    np.testing.assert_array_equal(np.r_[result.members, result.nonmembers],
                                  (loss_z[None] >= loss_x[:, None]).mean(axis=1))


def test_the_global_model_alone_ranks_like_the_update_attack():
    """The received global model as the only reference, a = 1, gamma = 1: log ratio(x) = loss_global(x) -
    loss_local(x), the update attack's loss reduction; score(x) = share of the population whose loss reduction is
    at most x's."""
    rng = np.random.default_rng(4)
    n, m, c = 150, 250, 6
    lab = {k: rng.integers(0, c, s) for k, s in (("x", n), ("z", m))}
    glob = {k: rng.normal(0, 2, (len(v), c)) for k, v in lab.items()}
    local = {k: glob[k] + rng.normal(0, 0.7, glob[k].shape) for k in glob}  # this round's local training
    p = {(model, k): true_class_probability(logits[k], lab[k]) for model, logits in (("g", glob), ("l", local))
         for k in lab}
    result = rmia(Signals(p["l", "x"], global_model=p["g", "x"]),
                  Signals(p["l", "x"][:5], global_model=p["g", "x"][:5]),
                  Signals(p["l", "z"], global_model=p["g", "z"]), offline_a=1.0)
    reduction = {k: np.log(p["l", k]) - np.log(p["g", k]) for k in lab}  # = loss_global - loss_local
    np.testing.assert_array_equal(result.members, (reduction["z"][None] <= reduction["x"][:, None]).mean(axis=1))
    assert result.n_references == 0 and result.global_model


def test_scores_fall_with_gamma_and_stay_in_the_unit_interval():
    rng = np.random.default_rng(5)
    tx, tz = rng.random(100), rng.random(120)
    mx, mz = rng.random(100) * 0.5 + 0.2, rng.random(120) * 0.5 + 0.2
    previous = np.ones(100)
    for gamma in (1e-9, 0.5, 1, 2, 8, 1e9):
        s = rmia_scores(tx, mx, tz, mz, gamma=gamma)
        assert ((0 <= s) & (s <= 1)).all() and (s <= previous).all()
        previous = s
    assert (rmia_scores(tx, mx, tz, mz, gamma=1e-9) == 1).all() and (previous == 0).all()


# ------------------------------------------------------------------------------------------ power


def difficulty_task(rng, n_members=1500, n_nonmembers=1500, n_population=3000, n_refs=2, shared=True):
    """10 classes; sample i's true-class logit is 2 - d_i (+ 1.2 in the target if a member) + model noise, the
    other logits N(0, 1). The per-sample difficulty d_i ~ N(0, 2) is the same in every model (references trained
    on the same distribution find the same samples hard) unless `shared` is False (references see other
    difficulties: they carry no information about the samples)."""
    def probs(n, member, d, noise=0.4):
        logits = rng.normal(0, 1, (n, 10))
        logits[:, 0] = 2 - d + 1.2 * member + rng.normal(0, noise, n)
        return true_class_probability(logits, np.zeros(n, dtype=int))

    def signals(n, member):
        d = rng.normal(0, 2, n)
        refs = np.stack([probs(n, False, d if shared else rng.normal(0, 2, n)) for _ in range(n_refs)])
        return Signals(probs(n, member, d), refs)

    return signals(n_members, True), signals(n_nonmembers, False), signals(n_population, False)


def test_rmia_beats_a_global_loss_threshold_when_references_share_the_difficulty():
    members, nonmembers, population = difficulty_task(np.random.default_rng(6))
    result = rmia(members, nonmembers, population, offline_a=0.3)
    loss = {k: np.log(s.target) for k, s in (("m", members), ("n", nonmembers), ("p", population))}  # = -loss
    rmia_auc = auc_interval(result.members, result.nonmembers)
    loss_auc = auc_interval(loss["m"], loss["n"])
    assert rmia_auc.lower > loss_auc.upper + 0.05  # measured: 0.743 [0.726, 0.761] against 0.648 [0.628, 0.667]
    rmia_at = tpr_at_population_fpr(result.members, result.nonmembers, result.population, 0.01)
    loss_at = tpr_at_population_fpr(loss["m"], loss["n"], loss["p"], 0.01)
    assert rmia_at.tpr.lower > 2 * loss_at.tpr.upper  # measured: 0.191 [0.171, 0.211] against 0.040 [0.031, 0.051]
    assert rmia_at.fpr.rate < 0.03  # the population threshold holds on the non-members
    # Without the shared difficulty the references add nothing: RMIA is no better than the loss.
    members, nonmembers, population = difficulty_task(np.random.default_rng(6), shared=False)
    blind = rmia(members, nonmembers, population, offline_a=0.3)
    assert auc(blind.members, blind.nonmembers) < auc(np.log(members.target), np.log(nonmembers.target)) + 0.02


# ------------------------------------------------------------------------------------------ tuning a


def reference_pool(rng, k=4, n=600, m=400, true_a=0.4):
    """k references, each trained on a random half of a pool of n samples; an IN reference's probability is
    true_a * Pr_OUT + (1 - true_a) plus noise, Pr_OUT driven by the sample's difficulty."""
    d = rng.normal(0, 1.5, n)
    p_out = 1 / (1 + np.exp(d))
    trained = np.zeros((k, n), dtype=bool)
    for r in range(k):
        trained[r, rng.choice(n, n // 2, replace=False)] = True
    noise = lambda: rng.normal(0, 0.05, n)  # noqa: E731
    refs = np.clip(np.stack([np.where(trained[r], true_a * p_out + 1 - true_a, p_out) + noise()
                             for r in range(k)]), 1e-3, 1)
    dz = rng.normal(0, 1.5, m)
    pop = np.clip(1 / (1 + np.exp(dz)) + rng.normal(0, 0.05, (k, m)), 1e-3, 1)
    return refs, trained, pop


def test_tuning_a_attacks_a_reference_with_the_others_as_privacy_meter_v2_does():
    refs, trained, pop = reference_pool(np.random.default_rng(7), true_a=0.8)
    tuned = tune_offline_a(refs, trained, pop, paired=1)
    assert tuned.paired == 1 and list(tuned.aucs) == list(OFFLINE_A_GRID)
    assert tuned.aucs[tuned.offline_a] == max(tuned.aucs.values())
    others = [0, 2, 3]
    usable = (~trained[others]).any(axis=0)  # samples every other reference trained on have no Pr(x): left out
    assert (tuned.n_in, tuned.n_out) == (int((trained[1] & usable).sum()), int((~trained[1] & usable).sum()))
    assert tuned.n_population == 400
    # Each candidate's AUC, by hand: reference 1 is the target, references 0, 2, 3 give Pr, sklearn's AUC.
    for a in (0.0, 0.8, 1.0):
        scores = direct_scores(refs[1, usable], direct_marginal(refs[others][:, usable], trained[others][:, usable], a),
                               pop[1], direct_marginal(pop[others], np.zeros((3, 400), dtype=bool), a), 1.0)
        assert tuned.aucs[a] == pytest.approx(roc_auc_score(trained[1, usable], scores), abs=1e-12)
    # The pool follows Pr_IN = 0.8 Pr_OUT + 0.2 (a weak IN effect, where a matters most): every stand-in target
    # finds it, and it beats the ends of the grid (measured AUCs 0.62-0.68 at a = 0, 0.82-0.86 at 0.8, 0.76-0.79
    # at 1).
    for paired in range(4):
        found = tune_offline_a(refs, trained, pop, paired=paired)
        assert abs(found.offline_a - 0.8) <= 0.1 + 1e-9
        assert found.aucs[found.offline_a] > max(found.aucs[0.0], found.aucs[1.0]) + 0.02


def test_tuning_leaves_out_samples_without_an_out_reference_and_needs_two_references():
    refs, trained, pop = reference_pool(np.random.default_rng(8), k=2)
    tuned = tune_offline_a(refs, trained, pop, paired=0)
    assert tuned.n_in + tuned.n_out == int((~trained[1]).sum())  # reference 1's own training samples have no OUT
    pop_in = np.zeros(pop.shape, dtype=bool)
    pop_in[0, :100] = True  # the stand-in target trained on them: not population for it
    assert tune_offline_a(refs, trained, pop, pop_in, paired=0).n_population == 300
    with pytest.raises(ValueError, match="K >= 2"):
        tune_offline_a(refs[:1], trained[:1], pop[:1])
    with pytest.raises(ValueError, match="paired"):
        tune_offline_a(refs, trained, pop, paired=2)
    with pytest.raises(ValueError, match="offline_a"):
        tune_offline_a(refs, trained, pop, candidates=[0.5, 1.5])


# ------------------------------------------------------------------------------------------ input


def test_bad_input_is_named():
    p = np.full(4, 0.5)
    with pytest.raises(ValueError, match="no OUT reference"):
        marginal_probability(np.full((2, 4), 0.5), np.ones((2, 4), dtype=bool), offline_a=0.3)
    with pytest.raises(ValueError, match="no IN reference"):
        marginal_probability(np.full((2, 4), 0.5), None, offline_a=None)
    with pytest.raises(ValueError, match="population: references: probabilities"):
        marginal_probability(np.full((2, 4), 1.5), offline_a=0.3, name="population")
    with pytest.raises(ValueError, match="offline_a"):
        marginal_probability(np.full((2, 4), 0.5), offline_a=2)
    with pytest.raises(ValueError, match="no reference"):
        marginal_probability(None, offline_a=0.3)
    with pytest.raises(ValueError, match="gamma"):
        rmia_scores(p, p, p, p, gamma=0)
    with pytest.raises(ValueError, match="Pr\\(x\\) must be finite and > 0"):
        rmia_scores(p, np.zeros(4), p, p)
    with pytest.raises(ValueError, match="same references"):
        rmia(Signals(p, np.full((2, 4), 0.5)), Signals(p, np.full((1, 4), 0.5)), Signals(p, np.full((2, 4), 0.5)))
    with pytest.raises(ValueError, match="global_model must be given for every set"):
        rmia(Signals(p, global_model=p), Signals(p, global_model=p), Signals(p))


# ------------------------------------------------------------------------------------------ cost


def test_twelve_thousand_by_six_thousand_is_fast_and_never_builds_the_pair_matrix():
    """The (12,000 x 6,000) LR matrix would take 576 MB; the sorted search needs a few arrays of 12,000 (measured
    2-7 ms; the matrix 0.7-1.6 s). Its scores equal the matrix's on a slice."""
    rng = np.random.default_rng(9)
    tx, mx = rng.random(12000), rng.random(12000) * 0.5 + 0.25
    tz, mz = rng.random(6000), rng.random(6000) * 0.5 + 0.25
    tracemalloc.start()
    start = time.perf_counter()
    scores = rmia_scores(tx, mx, tz, mz, gamma=1.0)
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 10 * 2**20 and seconds < 5
    np.testing.assert_array_equal(scores[:500], ((tx[:500] / mx[:500])[:, None] / (tz / mz)[None] >= 1.0).mean(1))
