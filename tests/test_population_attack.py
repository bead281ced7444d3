"""Tests for audit.membership.population_attack: equality with Privacy Meter's own PopulationMetric pipeline, the exact
TPR-at-FPR reading, the member-if-higher and update attacks, and input validation."""

from __future__ import annotations

import contextlib
import importlib.machinery
import io
import json
import math
import subprocess
import sys
import types
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from audit.membership.population_attack import (
    DEFAULT_ALPHAS,
    THRESHOLD_FUNCTIONS,
    AttackResult,
    population_attack,
    update_attack,
)

REPO = Path(__file__).resolve().parents[1]
TOLERANCES = (0.01, 0.1, 0.5)


# ----------------------------------------------------------------------------------------------------------------------
# Privacy Meter's real pipeline on a small overfitted classifier
# ----------------------------------------------------------------------------------------------------------------------


def _digits_sets(seed: int = 0):
    from sklearn.datasets import load_digits  # bundled with scikit-learn, no download

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(y))
    members, nonmembers, population = order[:100], order[100:800], order[800:1175]
    as_tensors = lambda idx: (torch.from_numpy(x[idx]), torch.from_numpy(y[idx]).long())  # noqa: E731
    return as_tensors(members), as_tensors(nonmembers), as_tensors(population)


def _train_mlp(x: torch.Tensor, y: torch.Tensor) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(300):  # full batch; enough to overfit 100 samples
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    model.eval()
    return model


def _plain_torch_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        return F.cross_entropy(model(x), y, reduction="none").numpy()


@pytest.fixture(scope="module")
def pm_pipeline(tmp_path_factory):
    """Privacy Meter's PopulationMetric, prepared on an MLP overfitted to 100 digits.

    privacy_meter.model (imported by information_source, information_source_signal and metric) does
    `import tensorflow as tf` at module level but only uses tf inside the TensorFlow model classes, which this
    test never touches. tensorflow is not installed (and is ~1.3 GB), so the test - and only the test - puts an
    empty placeholder module in sys.modules for the duration of this fixture, then removes it together with the
    privacy_meter modules that were imported through it, so no other test sees them.
    """
    (xm, ym), (xn, yn), (xp, yp) = _digits_sets()
    model = _train_mlp(xm, ym)  # before the placeholder exists: torch's optimizers import torch._dynamo, which
    # looks tensorflow up with importlib.util.find_spec
    with torch.no_grad():
        train_acc = (model(xm).argmax(1) == ym).float().mean().item()
        test_acc = (model(xn).argmax(1) == yn).float().mean().item()

    placeholder = types.ModuleType("tensorflow")
    # A spec without an origin: importlib.util.find_spec("tensorflow") works and points at no files.
    placeholder.__spec__ = importlib.machinery.ModuleSpec("tensorflow", loader=None)
    before = set(sys.modules)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "tensorflow", placeholder)
        from privacy_meter.dataset import Dataset
        from privacy_meter.hypothesis_test import linear_itp_threshold_func
        from privacy_meter.information_source import InformationSource
        from privacy_meter.information_source_signal import ModelLoss
        from privacy_meter.metric import PopulationMetric
        from privacy_meter.model import PytorchModelTensor

        pm_model = PytorchModelTensor(model_obj=model, loss_fn=nn.CrossEntropyLoss())
        # PopulationMetric's default mappings (unique_dataset=False): the target model is queried on the
        # target dataset's "train" (members) and "test" (non-members) splits, and each reference model k on
        # the "train" split of reference dataset k; for the population attack the reference model is the
        # target model itself and the reference dataset is the population.
        target_dataset = Dataset(
            data_dict={"train": {"x": xm, "y": ym}, "test": {"x": xn, "y": yn}},
            default_input="x",
            default_output="y",
        )
        reference_dataset = Dataset(data_dict={"train": {"x": xp, "y": yp}}, default_input="x", default_output="y")
        metric = PopulationMetric(
            target_info_source=InformationSource(models=[pm_model], datasets=[target_dataset]),
            reference_info_source=InformationSource(models=[pm_model], datasets=[reference_dataset]),
            signals=[ModelLoss()],
            hypothesis_test_func=linear_itp_threshold_func,
            logs_dirname=str(tmp_path_factory.mktemp("pm_logs")),
        )
        metric.prepare_metric()
        losses = {
            "members": _plain_torch_loss(model, xm, ym),
            "nonmembers": _plain_torch_loss(model, xn, yn),
            "population": _plain_torch_loss(model, xp, yp),
        }
        yield types.SimpleNamespace(
            metric=metric,
            model=model,
            sets={"members": (xm, ym), "nonmembers": (xn, yn), "population": (xp, yp)},
            losses=losses,
            train_acc=train_acc,
            test_acc=test_acc,
        )
    for name in set(sys.modules) - before:
        if name == "privacy_meter" or name.startswith("privacy_meter."):
            if name not in ("privacy_meter.hypothesis_test", "privacy_meter.metric_result"):
                del sys.modules[name]


def _run_pm(metric, threshold_function: str):
    metric.hypothesis_test_func = THRESHOLD_FUNCTIONS[threshold_function]
    # logit_rescale_threshold_func prints debug lines; keep pytest's output clean.
    with contextlib.redirect_stdout(io.StringIO()):
        (result,) = metric.run_metric()
    n_members, n_nonmembers = len(metric.member_signals), len(metric.non_member_signals)
    return result.fp / n_nonmembers, result.tp / n_members, result.roc_auc


@pytest.mark.numerics
def test_pipeline_overfits_and_losses_match_privacy_meter(pm_pipeline):
    assert pm_pipeline.train_acc == 1.0
    assert pm_pipeline.test_acc < 0.97  # there is a generalisation gap to attack
    metric = pm_pipeline.metric
    np.testing.assert_allclose(metric.member_signals, pm_pipeline.losses["members"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metric.non_member_signals, pm_pipeline.losses["nonmembers"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metric.reference_signals, pm_pipeline.losses["population"], rtol=1e-5, atol=1e-7)


@pytest.mark.numerics
@pytest.mark.parametrize("threshold_function", sorted(THRESHOLD_FUNCTIONS))
def test_equals_privacy_meter_population_metric(pm_pipeline, threshold_function):
    metric = pm_pipeline.metric
    pm_fpr, pm_tpr, pm_auc = _run_pm(metric, threshold_function)
    assert 0.55 < pm_auc < 0.95  # an actual attack, not a degenerate curve

    # On Privacy Meter's own signal arrays: bit-for-bit the same ROC.
    ours = population_attack(
        metric.member_signals, metric.non_member_signals, metric.reference_signals, TOLERANCES,
        threshold_function=threshold_function,
    )
    np.testing.assert_array_equal(ours.fpr, pm_fpr)
    np.testing.assert_array_equal(ours.tpr, pm_tpr)
    assert ours.auc == pm_auc

    # On losses computed independently with plain torch (eval mode, reduction="none").
    losses = pm_pipeline.losses
    plain = population_attack(
        losses["members"], losses["nonmembers"], losses["population"], TOLERANCES,
        threshold_function=threshold_function,
    )
    np.testing.assert_allclose(plain.fpr, pm_fpr, rtol=0, atol=1e-12)
    np.testing.assert_allclose(plain.tpr, pm_tpr, rtol=0, atol=1e-12)
    assert plain.auc == pytest.approx(pm_auc, abs=1e-12)
    assert plain.n_members == 100 and plain.n_nonmembers == 700 and plain.n_population == 375


def _crossings(values: np.ndarray, thresholds: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """At each threshold, how many of `values` lie within its `shift` of it: the most whose side of it a
    perturbation of at most that much (values and threshold together) can change."""
    return (np.abs(values.reshape(1, -1) - thresholds.reshape(-1, 1)) <= shift.reshape(-1, 1)).sum(axis=1)


def _auc_bound(fpr, tpr, fpr_slack, tpr_slack) -> float:
    """The most Privacy Meter's AUC, sum_k (f[k+1] - f[k]) (t[k] + t[k+1]) / 2 over the grid's points, can move when
    each point moves by at most its slack. The sum is bilinear in (f, t): its first-order terms (each point's
    partial derivative times its slack) plus the products of two slacks bound it."""
    t, f = np.pad(tpr, 1, mode="edge"), np.pad(fpr, 1, mode="edge")  # an end point has one segment
    d_f = (t[:-2] - t[2:]) / 2  # d/df[j]: (t[j-1] + t[j]) / 2 - (t[j] + t[j+1]) / 2
    d_t = (f[2:] - f[:-2]) / 2  # d/dt[j]: (f[j+1] - f[j]) / 2 + (f[j] - f[j-1]) / 2
    d_f[0], d_f[-1] = -(tpr[0] + tpr[1]) / 2, (tpr[-2] + tpr[-1]) / 2
    first = np.sum(np.abs(d_f) * fpr_slack + np.abs(d_t) * tpr_slack)
    return float(first + np.sum((fpr_slack[1:] + fpr_slack[:-1]) * (tpr_slack[1:] + tpr_slack[:-1]) / 2))


@pytest.mark.numerics
def test_equals_privacy_meter_with_audit_signals_loss(pm_pipeline):
    """Same check with the project's loss signal, when audit/membership/signals.py (another module) is present.

    audit.membership.signals computes the loss in float64 from the model's float32 logits, Privacy Meter the whole
    loss in float32, whose losses near 0 are multiples of ~1.2e-7; the two differ by rounding only, by an amount the
    CPU's kernels decide. A non-member (member) can change sides of a threshold between the two runs only if it lies
    within the largest loss difference of its own set plus the population's (a threshold is an interpolation of two
    population losses) of that threshold: the FPR (TPR) may differ by that count at each threshold, and the AUC by
    what those counts move the trapezoids. The attack is also compared with Privacy Meter's run_metric fed the very
    same float64 values (bit-for-bit).
    """
    signals = pytest.importorskip("audit.membership.signals")
    if not hasattr(signals, "loss_signal"):
        pytest.skip("audit.membership.signals has no loss_signal yet")
    metric = pm_pipeline.metric
    values = {name: signals.loss_signal(pm_pipeline.model, x, y) for name, (x, y) in pm_pipeline.sets.items()}
    shift = {}
    for name, pm_values in [
        ("members", metric.member_signals),
        ("nonmembers", metric.non_member_signals),
        ("population", metric.reference_signals),
    ]:
        # float32 losses against float64 ones from float32 logits: 1e-6 is 8 float32 spacings at 1 (the
        # log-sum-exp of a fitted sample rounds to that grid), 1e-5 relative is 80 float32 epsilons (a 64-term
        # dot product's rounding, then log-softmax's)
        np.testing.assert_allclose(values[name], pm_values, rtol=1e-5, atol=1e-6)
        shift[name] = float(np.max(np.abs(values[name] - np.asarray(pm_values, np.float64))))

    result = population_attack(values["members"], values["nonmembers"], values["population"], TOLERANCES)
    pm_fpr, pm_tpr, pm_auc = _run_pm(metric, "linear_itp")
    # the thresholds' own float32 interpolation: one rounding of a value of their size
    rounding = np.abs(result.thresholds) * np.finfo(np.float32).eps
    fp_slack = _crossings(values["nonmembers"], result.thresholds, shift["nonmembers"] + shift["population"]
                          + rounding)
    tp_slack = _crossings(values["members"], result.thresholds, shift["members"] + shift["population"] + rounding)
    assert np.all(np.abs(np.rint((result.fpr - pm_fpr) * result.n_nonmembers)) <= fp_slack)
    assert np.all(np.abs(np.rint((result.tpr - pm_tpr) * result.n_members)) <= tp_slack)
    auc_slack = _auc_bound(result.fpr, result.tpr, fp_slack / result.n_nonmembers, tp_slack / result.n_members)
    assert abs(result.auc - pm_auc) <= auc_slack + 1e-12  # the trapezoids' own float64 rounding
    assert fp_slack.sum() < 0.05 * result.n_nonmembers * len(fp_slack)  # the bound leaves the comparison its bite

    saved = metric.member_signals, metric.non_member_signals, metric.reference_signals
    try:
        metric.member_signals = values["members"]
        metric.non_member_signals = values["nonmembers"]
        metric.reference_signals = values["population"]
        same_fpr, same_tpr, same_auc = _run_pm(metric, "linear_itp")
    finally:
        metric.member_signals, metric.non_member_signals, metric.reference_signals = saved
    np.testing.assert_array_equal(result.fpr, same_fpr)
    np.testing.assert_array_equal(result.tpr, same_tpr)
    assert result.auc == same_auc


def test_default_alphas_are_privacy_meters():
    # privacy_meter.utils imports only numpy, so the test may import it to check the copied grid.
    from privacy_meter.utils import default_quantile

    np.testing.assert_array_equal(DEFAULT_ALPHAS, default_quantile())


def test_threshold_functions_are_privacy_meters():
    import privacy_meter.hypothesis_test as ht

    assert THRESHOLD_FUNCTIONS == {
        "linear_itp": ht.linear_itp_threshold_func,
        "logit_rescale": ht.logit_rescale_threshold_func,
        "gaussian": ht.gaussian_threshold_func,
        "min_linear_logit": ht.min_linear_logit_threshold_func,
    }


@pytest.mark.federation
def test_imports_only_allowed_privacy_meter_modules():
    code = (
        "import sys, audit.membership.population_attack, audit.config.audit_settings\n"
        "pm = sorted(m for m in sys.modules if m.startswith('privacy_meter.'))\n"
        "assert pm == ['privacy_meter.hypothesis_test', 'privacy_meter.metric_result'], pm\n"
        "assert 'tensorflow' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


# ----------------------------------------------------------------------------------------------------------------------
# The TPR at an FPR tolerance is read with the threshold at exactly that tolerance
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shifted():
    rng = np.random.default_rng(1)
    return types.SimpleNamespace(
        population=rng.normal(0.0, 1.0, 20001),
        nonmembers=rng.normal(0.0, 1.0, 5000),
        members=rng.normal(-1.0, 1.0, 5000),  # members lower, like a loss
    )


def test_threshold_at_tolerance_is_exact(shifted):
    result = population_attack(shifted.members, shifted.nonmembers, shifted.population, TOLERANCES)
    n = shifted.population.size
    for t in TOLERANCES:
        threshold = result.threshold_at_fpr[t]
        below = int(np.sum(shifted.population < threshold))
        assert abs(below - t * n) <= 1, (t, below)  # exactly fraction t of the population, to one sample
        assert result.tpr_at_fpr[t] == np.mean(shifted.members < threshold)
        assert result.fpr_at_fpr[t] == np.mean(shifted.nonmembers < threshold)
        assert result.fpr_at_fpr[t] == pytest.approx(t, abs=0.03)  # non-members: same distribution, sampling noise
        assert threshold == pytest.approx(np.quantile(shifted.population, t), abs=1e-12)
    assert result.tolerances == TOLERANCES


def test_exact_reading_differs_from_grid_readings(shifted):
    """Reading "TPR at FPR 0.1" off the alpha grid gives another operating point: the tutorial takes the first
    grid point whose measured FPR exceeds the tolerance, and the next grid alpha above 0.1 is ~0.1097."""
    t = 0.1
    result = population_attack(shifted.members, shifted.nonmembers, shifted.population, [t])
    exact_threshold = result.threshold_at_fpr[t]

    # The next grid alpha above the tolerance: its threshold leaves ~11% of the population below it.
    k = int(np.argmax(DEFAULT_ALPHAS >= t))
    assert DEFAULT_ALPHAS[k] == pytest.approx(0.1097, abs=1e-4)
    below = np.sum(shifted.population < result.thresholds[k]) / shifted.population.size
    assert below - t > 0.009
    assert result.tpr[k] - result.tpr_at_fpr[t] > 0.01

    # The tutorial's reading: the first grid point whose measured FPR exceeds the tolerance.
    j = int(np.argmax(result.fpr > t))
    assert result.fpr[j] > t and result.thresholds[j] != exact_threshold
    assert result.tpr[j] != result.tpr_at_fpr[t]
    assert abs(np.sum(shifted.population < exact_threshold) - t * shifted.population.size) <= 1


def test_linear_itp_end_replacement_does_not_affect_tolerances(shifted):
    # linear_itp_threshold_func replaces the first and last alpha of its grid with min-1e-4 / max+1e-4; a
    # single tolerance, or the smallest/largest of several, must still get its own quantile.
    for tolerances in ([0.2], [0.05, 0.95], [0.999], [1e-4]):
        result = population_attack(shifted.members, shifted.nonmembers, shifted.population, tolerances)
        for t in tolerances:
            assert result.threshold_at_fpr[t] == pytest.approx(np.quantile(shifted.population, t), abs=1e-12)


def test_grid_matches_privacy_meter_formula(shifted):
    result = population_attack(shifted.members, shifted.nonmembers, shifted.population, TOLERANCES)
    expected = np.quantile(shifted.population, DEFAULT_ALPHAS[1:-1], method="linear")
    np.testing.assert_allclose(result.thresholds[1:-1], expected, rtol=0, atol=1e-12)
    assert result.thresholds[0] == pytest.approx(shifted.population.min() - 1e-4)
    assert result.thresholds[-1] == pytest.approx(shifted.population.max() + 1e-4)
    assert result.fpr[-1] == 1.0 and result.tpr[-1] == 1.0
    assert result.fpr.shape == result.tpr.shape == result.thresholds.shape == DEFAULT_ALPHAS.shape
    assert 0.7 < result.auc < 0.8  # N(-1,1) vs N(0,1): 0.76 in theory


# ----------------------------------------------------------------------------------------------------------------------
# Population FPR at the reported threshold: never above the tolerance, as close to it as the data allow
# ----------------------------------------------------------------------------------------------------------------------

# Written as decimal strings: the reference bound floor(n * t) is taken on the exact decimal (Fraction("0.29")),
# independently of how the module rounds. 0.29 * 100 and 0.57 * 100 are 28.999999999999996 and 56.99999999999999
# in floats, 0.15 * 20 is 3.0000000000000004.
PROPERTY_TOLERANCES = ("0.001", "0.002", "0.005", "0.01", "0.015", "0.03", "0.05", "0.07", "0.1", "0.15", "0.2",
                       "0.25", "0.29", "0.3", "0.33", "0.35", "0.45", "0.5", "0.57")
PROPERTY_SIZES = (20, 21, 37, 99, 100, 101, 199, 200, 333, 404, 405, 999, 1000, 1001, 1499, 1999, 2000)


def _population(kind: str, n: int, rng) -> np.ndarray:
    if kind == "gaussian":
        return rng.normal(0.0, 1.0, n)
    if kind == "float32_losses":
        return rng.gamma(1.5, 0.6, n).astype(np.float32)
    if kind == "heavy_ties":  # few distinct values: most boundaries fall inside a tied group
        return rng.integers(0, 12, n).astype(np.float64) / 4
    if kind == "one_big_tie":  # a third of the population is exactly 0 (e.g. losses of memorised samples)
        return np.where(rng.random(n) < 0.33, 0.0, rng.gamma(2.0, 1.0, n))
    raise AssertionError(kind)


def _best_achievable(population: np.ndarray, k: int) -> int:
    """Brute force over every threshold a "value < threshold" rule can take (each distinct value, and above the
    maximum): the largest count of population values flagged that is at most k."""
    candidates = np.append(np.unique(population), np.inf)
    counts = (population[None, :] < candidates[:, None]).sum(axis=1)
    return int(counts[counts <= k].max())


@pytest.mark.parametrize("kind", ["gaussian", "float32_losses", "heavy_ties", "one_big_tie"])
@pytest.mark.parametrize("member_if_lower", [True, False])
@pytest.mark.slow
def test_population_fpr_never_above_tolerance_and_best_achievable(kind, member_if_lower):
    """Issue 10, defect 2: over population sizes 20..2,000 and tolerances 0.001..0.5, the share of the population
    flagged at the reported threshold is never above t, and equals the best achievable count under t (found by
    brute force), so it is never even one sample below it. The old interpolated quantile flagged
    floor((n - 1) t) + 1 samples: 5 of 404 at t = 0.01."""
    tolerances = [float(t) for t in PROPERTY_TOLERANCES]
    for n in PROPERTY_SIZES:
        rng = np.random.default_rng(n)
        population = _population(kind, n, rng)
        members, nonmembers = population[:15] * 0.9, population[15:45]
        if not member_if_lower:
            population, members, nonmembers = -population, -members, -nonmembers
        result = population_attack(members, nonmembers, population, tolerances, member_if_lower=member_if_lower)
        for text, t in zip(PROPERTY_TOLERANCES, tolerances):
            k = math.floor(n * Fraction(text))
            threshold = result.threshold_at_fpr[t]
            flagged = (lambda v: v < threshold) if member_if_lower else (lambda v: v > threshold)
            count = int(np.sum(flagged(population)))
            where = f"{kind}, n={n}, t={text}"
            assert count <= k, f"{where}: {count} flagged, at most {k} allowed"
            assert count == _best_achievable(population if member_if_lower else -population, k), where
            # The threshold is the largest with that count: one step further would flag more than k (ties whole).
            assert np.sum(population <= threshold if member_if_lower else population >= threshold) > k, where
            assert result.population_fpr_at_fpr[t] == count / n and result.population_fpr_at_fpr[t] <= t, where
            assert result.tpr_at_fpr[t] == np.mean(flagged(members)), where
            assert result.fpr_at_fpr[t] == np.mean(flagged(nonmembers)), where


def test_shard_of_404_at_one_percent():
    """The issue's figure: on a population of 404 at t = 0.01 the old reading flagged 5 samples (1.24%)."""
    rng = np.random.default_rng(404)
    population = rng.normal(0.0, 1.0, 404)
    result = population_attack(rng.normal(-1, 1, 90), rng.normal(0, 1, 404), population, [0.01])
    assert int(np.sum(population < result.threshold_at_fpr[0.01])) == 4  # floor(4.04); 4 / 404 = 0.99%
    assert result.threshold_at_fpr[0.01] == np.sort(population)[4]
    assert result.population_fpr_at_fpr[0.01] == pytest.approx(4 / 404)


def test_tied_boundary_group_is_never_split():
    # 10 values: 0, 1, 1, 1, 1, 2, ...; t = 0.3 allows 3, but the three values after 0 are part of a group of four 1s.
    population = np.array([0, 1, 1, 1, 1, 2, 3, 4, 5, 6], dtype=float)
    result = population_attack([0.5, 1.0, 1.5], [1.0, 2.0, 6.5], population, [0.3, 0.5, 0.1])
    assert result.threshold_at_fpr[0.3] == 1.0  # flags only the 0: the whole group of 1s would be 5 > 3
    assert result.population_fpr_at_fpr[0.3] == 0.1
    assert result.tpr_at_fpr[0.3] == pytest.approx(1 / 3)  # a member equal to the threshold is not flagged
    assert result.threshold_at_fpr[0.5] == 2.0 and result.population_fpr_at_fpr[0.5] == 0.5  # 10 * 0.5 = 5 exactly
    assert result.threshold_at_fpr[0.1] == 1.0 and result.population_fpr_at_fpr[0.1] == 0.1


@pytest.mark.parametrize("function", ["gaussian", "logit_rescale", "min_linear_logit"])
def test_parametric_threshold_functions_never_above_tolerance(function):
    """The parametric functions' own threshold at alpha = t promises no population FPR: it is capped at the
    empirical bound, so at most floor(n t) population samples are flagged, whatever the fit."""
    tolerances = [float(t) for t in PROPERTY_TOLERANCES]
    for n in PROPERTY_SIZES[::2]:
        rng = np.random.default_rng(n + 7)
        population = rng.gamma(1.0, 0.7, n)  # skewed, non-negative: a poor fit for the Gaussians
        result = population_attack(rng.gamma(1.0, 0.5, 20), rng.gamma(1.0, 0.7, 40), population, tolerances,
                                   threshold_function=function)
        for text, t in zip(PROPERTY_TOLERANCES, tolerances):
            count = int(np.sum(population < result.threshold_at_fpr[t]))
            assert count <= math.floor(n * Fraction(text)), (function, n, text, count)
            assert result.population_fpr_at_fpr[t] == count / n


def test_gaussian_threshold_is_its_own_below_the_bound_and_capped_above():
    from scipy.stats import norm

    rng = np.random.default_rng(11)
    population = rng.exponential(1.0, 1000)  # right-skewed: the Gaussian fit's 1% quantile is below every value,
    result = population_attack(population[:50], population[50:150], population, [0.01, 0.5],  # its median above
                               threshold_function="gaussian")
    own = norm.ppf([0.01, 0.5], *norm.fit(population))
    assert result.threshold_at_fpr[0.01] == pytest.approx(own[0], abs=1e-12)  # the fit's own threshold, kept
    assert result.population_fpr_at_fpr[0.01] == 0.0  # far below 1%: the fit does not match the population
    assert own[1] > np.sort(population)[500]
    assert result.threshold_at_fpr[0.5] == np.sort(population)[500]  # capped at the empirical bound
    assert result.population_fpr_at_fpr[0.5] == 0.5


# ----------------------------------------------------------------------------------------------------------------------
# The exact (all-thresholds) AUC beside Privacy Meter's grid AUC
# ----------------------------------------------------------------------------------------------------------------------


def _mann_whitney_auc(members_lower: np.ndarray, nonmembers_lower: np.ndarray) -> float:
    """P(member scores as more member-like than a non-member), ties half: every pair, by brute force."""
    diff = nonmembers_lower[None, :] - members_lower[:, None]
    return float(np.mean((diff > 0) + 0.5 * (diff == 0)))


def test_exact_auc_with_twenty_population_samples():
    """Issue 10, defect 3: Privacy Meter's grid AUC spans only the population's range; with 20 population
    samples it reads 0.681 where the members-vs-non-members ROC AUC is 0.756."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    members, nonmembers, population = rng.normal(-1, 1, 500), rng.normal(0, 1, 500), rng.normal(0, 1, 20)
    result = population_attack(members, nonmembers, population, [0.1])
    labels = np.r_[np.ones(500), np.zeros(500)]
    assert result.exact_auc == roc_auc_score(labels, -np.r_[members, nonmembers])
    assert result.exact_auc == pytest.approx(_mann_whitney_auc(members, nonmembers), abs=1e-12)
    assert round(result.exact_auc, 3) == 0.756
    assert round(result.auc, 3) == 0.681  # Privacy Meter's value, kept as it is
    # The grid curve's last interior point stops at the population's maximum, then jumps to (1, 1).
    assert result.exact_auc - result.auc > 0.05


@pytest.mark.parametrize("member_if_lower", [True, False])
def test_exact_auc_counts_ties_half(member_if_lower):
    """Integer signals (many ties between members and non-members), small sets, both directions."""
    rng = np.random.default_rng(21)
    members, nonmembers, population = rng.integers(0, 5, 37), rng.integers(1, 6, 53), rng.integers(0, 6, 20)
    sign = 1 if member_if_lower else -1
    result = population_attack(sign * members, sign * nonmembers, sign * population, [0.1],
                               member_if_lower=member_if_lower)
    expected = _mann_whitney_auc(members.astype(float), nonmembers.astype(float))
    assert result.exact_auc == pytest.approx(expected, abs=1e-12)
    assert 0.6 < expected < 0.9


def test_exact_auc_of_update_attack_and_json():
    rng = np.random.default_rng(5)
    g = [rng.gamma(2.0, 0.5, n) for n in (40, 60, 20)]
    lo = [g[0] - rng.normal(0.3, 0.2, 40), g[1] - rng.normal(0.1, 0.2, 60), g[2] - rng.normal(0.1, 0.2, 20)]
    result = update_attack(g[0], lo[0], g[1], lo[1], g[2], lo[2], [0.05, 0.25])
    # higher loss reduction = member; _mann_whitney_auc takes "lower = member" values
    assert result.exact_auc == pytest.approx(_mann_whitney_auc(lo[0] - g[0], lo[1] - g[1]), abs=1e-12)
    d = result.to_dict()
    assert d["exact_auc"] == result.exact_auc and d["auc"] == result.auc
    assert d["population_fpr_at_fpr"] == {"0.05": 0.05, "0.25": 0.25}  # 20 samples: 1 and 5 flagged


# ----------------------------------------------------------------------------------------------------------------------
# Members higher, update attack, chance level
# ----------------------------------------------------------------------------------------------------------------------


def test_member_if_higher(shifted):
    members, nonmembers, population = -shifted.members, -shifted.nonmembers, -shifted.population  # members higher
    result = population_attack(members, nonmembers, population, TOLERANCES, signal="logits", member_if_lower=False)
    assert result.auc > 0.7
    assert result.signal == "logits" and result.attack == "population"
    mirrored = population_attack(shifted.members, shifted.nonmembers, shifted.population, TOLERANCES)
    np.testing.assert_array_equal(result.fpr, mirrored.fpr)
    np.testing.assert_array_equal(result.tpr, mirrored.tpr)
    np.testing.assert_array_equal(result.thresholds, -mirrored.thresholds)  # in the signal's own units
    assert result.auc == mirrored.auc
    for t in TOLERANCES:
        threshold = result.threshold_at_fpr[t]
        assert threshold == pytest.approx(np.quantile(population, 1 - t), abs=1e-12)
        assert abs(np.sum(population > threshold) - t * population.size) <= 1
        assert result.tpr_at_fpr[t] == np.mean(members > threshold)
        assert result.fpr_at_fpr[t] == np.mean(nonmembers > threshold)


def test_update_attack():
    rng = np.random.default_rng(2)

    def losses(n, reduction):
        under_global = rng.gamma(2.0, 0.5, n)
        return under_global, under_global - rng.normal(reduction, 0.2, n)

    mg, ml = losses(2000, 0.3)  # local training lowers the members' loss more
    ng, nl = losses(2000, 0.1)
    pg, pl = losses(4000, 0.1)
    result = update_attack(mg, ml, ng, nl, pg, pl, TOLERANCES)
    assert result.attack == "update" and result.signal == "loss_reduction"
    assert result.auc > 0.7
    reference = population_attack(
        mg - ml, ng - nl, pg - pl, TOLERANCES, signal="loss_reduction", member_if_lower=False, attack="update"
    )
    np.testing.assert_array_equal(result.tpr, reference.tpr)
    np.testing.assert_array_equal(result.fpr, reference.fpr)
    assert result.tpr_at_fpr == reference.tpr_at_fpr
    for t in TOLERANCES:
        assert result.tpr_at_fpr[t] == np.mean((mg - ml) > result.threshold_at_fpr[t])
        assert result.tpr_at_fpr[t] > t


def test_identical_distributions_are_at_chance():
    rng = np.random.default_rng(3)
    result = population_attack(rng.normal(size=5000), rng.normal(size=5000), rng.normal(size=10000), TOLERANCES)
    assert result.auc == pytest.approx(0.5, abs=0.03)
    for t in TOLERANCES:
        assert result.tpr_at_fpr[t] == pytest.approx(t, abs=0.03)


def test_logit_rescale_prints_nothing(capsys, shifted):
    result = population_attack(
        np.abs(shifted.members), np.abs(shifted.nonmembers), np.abs(shifted.population), TOLERANCES,
        threshold_function="logit_rescale",
    )
    assert capsys.readouterr().out == ""
    assert np.all(np.diff(result.fpr) >= 0)


def test_to_dict_is_json():
    rng = np.random.default_rng(4)
    result = population_attack(
        rng.normal(-1, 1, 300), rng.normal(size=300), rng.normal(size=1000), TOLERANCES, threshold_function="gaussian"
    )
    assert isinstance(result, AttackResult)
    d = result.to_dict()
    back = json.loads(json.dumps(d, allow_nan=False))
    assert back == d
    assert set(d["tpr_at_fpr"]) == {"0.01", "0.1", "0.5"}
    assert d["tpr_at_fpr"]["0.1"] == result.tpr_at_fpr[0.1]
    assert set(d["population_fpr_at_fpr"]) == {"0.01", "0.1", "0.5"}
    assert d["population_fpr_at_fpr"]["0.1"] == result.population_fpr_at_fpr[0.1] <= 0.1  # the Gaussian fit's
    assert d["exact_auc"] == result.exact_auc and 0.7 < d["exact_auc"] < 0.85
    assert d["tolerances"] == [0.01, 0.1, 0.5]
    assert d["thresholds"][-1] is None  # the Gaussian's quantile at alpha = 1 is +inf; JSON has no inf
    assert len(d["fpr"]) == len(d["tpr"]) == len(d["thresholds"]) == 100
    assert (d["n_members"], d["n_nonmembers"], d["n_population"]) == (300, 300, 1000)
    assert d["attack"] == "population" and d["signal"] == "loss"
    with pytest.raises(Exception):
        result.auc = 0.0  # frozen


# ----------------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------------

_OK = np.array([0.1, 0.2, 0.3])


@pytest.mark.parametrize("position, name", [(0, "members"), (1, "non-members"), (2, "population")])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_name_the_set(position, name, bad):
    sets = [_OK.copy(), _OK.copy(), _OK.copy()]
    sets[position][1] = bad
    with pytest.raises(ValueError, match="not finite") as info:
        population_attack(*sets, [0.1])
    assert str(info.value).startswith(f"{name}:")


@pytest.mark.parametrize("position, name", [(0, "members"), (1, "non-members"), (2, "population")])
@pytest.mark.parametrize("bad", [np.array([]), np.ones((3, 2)), 1.0, ["a", "b"]])
def test_bad_arrays_name_the_set(position, name, bad):
    sets = [_OK, _OK, _OK]
    sets[position] = bad
    with pytest.raises(ValueError) as info:
        population_attack(*sets, [0.1])
    assert str(info.value).startswith(f"{name}:")


@pytest.mark.parametrize("tolerance", [0, 1, 0.0, 1.0, -0.1, 1.5, [], [0.1, 1.0], "0.1", [True], np.nan])
def test_tolerances_must_be_in_open_unit_interval(tolerance):
    with pytest.raises(ValueError, match="fpr_tolerance"):
        population_attack(_OK, _OK, _OK, tolerance)


def test_tolerances_with_one_name_are_rejected_naming_both():
    # f"{0.1000001:g}" == "0.1": both would write mia_..._tpr_at_fpr_0.1 and the JSON key "0.1".
    with pytest.raises(ValueError) as info:
        population_attack(_OK, _OK, _OK, [0.05, 0.1, 0.1000001])
    message = str(info.value)
    assert message.startswith("fpr_tolerance: 0.1 and 0.1000001 ") and "_tpr_at_fpr_0.1" in message
    with pytest.raises(ValueError, match=r"^fpr_tolerance: 0.5 is listed twice"):
        population_attack(_OK, _OK, _OK, [0.5, 0.5])
    result = population_attack(_OK, _OK, _OK, [0.1, 0.100001])  # 6 significant digits apart: two names
    assert set(result.to_dict()["tpr_at_fpr"]) == {"0.1", "0.100001"}


def test_single_tolerance_and_integer_signals():
    result = population_attack([0, 1, 2], [3, 4, 5], [0, 1, 2, 3, 4, 5], 0.5)
    assert result.tolerances == (0.5,)
    assert result.tpr_at_fpr[0.5] == 1.0 and result.fpr_at_fpr[0.5] == 0.0


@pytest.mark.parametrize("function", ["logit_rescale", "min_linear_logit"])
def test_loss_only_threshold_functions(function):
    with pytest.raises(ValueError, match="member_if_lower"):
        population_attack(_OK, _OK, _OK, [0.1], threshold_function=function, member_if_lower=False)
    for position, name in [(0, "members"), (1, "non-members"), (2, "population")]:
        sets = [_OK.copy(), _OK.copy(), _OK.copy()]
        sets[position][0] = -0.5
        with pytest.raises(ValueError, match="non-negative") as info:
            population_attack(*sets, [0.1], threshold_function=function)
        assert str(info.value).startswith(f"{name}:")


def test_other_argument_errors():
    with pytest.raises(ValueError, match="threshold_function"):
        population_attack(_OK, _OK, _OK, [0.1], threshold_function="linear")
    with pytest.raises(ValueError, match="alphas"):
        population_attack(_OK, _OK, _OK, [0.1], alphas=[0.5, 0.1, 1.0])
    with pytest.raises(ValueError, match="alphas"):
        population_attack(_OK, _OK, _OK, [0.1], alphas=[0.1, 2.0])
    with pytest.raises(ValueError, match="member_if_lower"):
        population_attack(_OK, _OK, _OK, [0.1], member_if_lower="yes")


def test_update_attack_validation():
    with pytest.raises(ValueError) as info:
        update_attack(_OK, _OK[:2], _OK, _OK, _OK, _OK, [0.1])
    assert str(info.value).startswith("members:")
    with pytest.raises(ValueError) as info:
        update_attack(_OK, _OK, _OK, _OK, _OK, np.array([0.1, np.nan, 0.3]), [0.1])
    assert str(info.value).startswith("population (loss under the local model):")
    with pytest.raises(ValueError) as info:
        update_attack(_OK, _OK, [np.inf, 0, 0], _OK, _OK, _OK, [0.1])
    assert str(info.value).startswith("non-members (loss under the global model):")


# ---------------------------------------------------------------------------------------------- uncertainty


@pytest.mark.parametrize("threshold_function,member_if_lower", [("linear_itp", True), ("gaussian", True),
                                                                ("linear_itp", False), ("min_linear_logit", True)])
def test_every_figure_carries_the_interval_of_what_the_attack_counted(threshold_function, member_if_lower):
    """The uncertainty rests on exactly the counts the attack reports, whatever the threshold function (a Gaussian
    fit sets other thresholds than the empirical quantile) and the signal's direction; the AUC interval is
    auc_interval's around the exact AUC, the epsilon bound and the advantage are those of the scores (higher =
    member)."""
    from audit.membership.epsilon_bound import epsilon_lower_bound
    from audit.membership.uncertainty import attacker_advantage, auc_interval, clopper_pearson

    rng = np.random.default_rng(3)
    shift = -0.6 if member_if_lower else 0.6
    members = np.abs(rng.normal(1 + shift, 0.7, 70))
    nonmembers, population = np.abs(rng.normal(1, 0.7, 300)), np.abs(rng.normal(1, 0.7, 250))
    result = population_attack(members, nonmembers, population, (0.001, 0.02, 0.3), member_if_lower=member_if_lower,
                               threshold_function=threshold_function, confidence=0.9, delta=1e-3)
    u = result.uncertainty
    sign = 1 if member_if_lower else -1
    for t in result.tolerances:
        flagged = lambda values: int((sign * values < sign * result.threshold_at_fpr[t]).sum())  # noqa: E731
        rates = u.at_fpr[t]
        assert (rates.tpr.k, rates.tpr.n, rates.fpr.k, rates.fpr.n) == (flagged(members), 70, flagged(nonmembers), 300)
        assert rates.tpr.rate == result.tpr_at_fpr[t] and rates.fpr.rate == result.fpr_at_fpr[t]
        assert rates.population_fpr == result.population_fpr_at_fpr[t] and rates.n_population == 250
        expected = clopper_pearson(flagged(members), 70, 0.9)
        assert (rates.tpr.lower, rates.tpr.upper) == (expected.lower, expected.upper)
        assert rates.resolvable == (t >= 1 / 250)
    scores = (-sign * members, -sign * nonmembers)
    assert u.auc.estimate == pytest.approx(result.exact_auc, abs=1e-12)
    expected_auc = auc_interval(*scores, 0.9)
    assert (u.auc.lower, u.auc.upper) == pytest.approx((expected_auc.lower, expected_auc.upper), abs=1e-12)
    assert u.epsilon == epsilon_lower_bound(*scores, delta=1e-3, confidence=0.9)
    assert u.advantage == attacker_advantage(*scores, 0.9)
    assert (u.confidence, u.delta) == (0.9, 1e-3)
    as_json = json.loads(json.dumps(result.to_dict()))["uncertainty"]
    assert as_json["at_fpr"]["0.02"]["tpr"]["k"] == u.at_fpr[0.02].tpr.k and as_json["delta"] == 1e-3


def test_one_member_gets_an_auc_interval_of_everything():
    """A variance needs two samples per class; with one member nothing is known beyond the estimate."""
    result = population_attack([0.1], [0.5, 0.9, 0.3], [0.2, 0.4, 0.6, 0.8], (0.5,))
    assert (result.uncertainty.auc.lower, result.uncertainty.auc.upper) == (0.0, 1.0)
    assert result.uncertainty.auc.estimate == result.exact_auc == 1.0
