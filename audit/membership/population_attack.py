"""Privacy Meter's population membership-inference attack, and an update-based variant, on precomputed signals.

`population_attack` is Privacy Meter's ``PopulationMetric.run_metric`` on per-sample signal values that the
caller computed (members = the model's training samples, non-members = held-out samples, population = a
third, disjoint set from the same distribution):

* thresholds = ``threshold_function(population_signal, alphas)`` (Privacy Meter's hypothesis-test functions);
* a sample is predicted a member iff ``signal < threshold``;
* TP/FP counts and the grid ROC AUC (``auc``) come from Privacy Meter's ``CombinedMetricResult``.

On top of that:

* TPR at each FPR tolerance t, with the threshold chosen so that at most a fraction t of the population is
  flagged, as close to t as the data allow (not read at the next point of the alpha grid). With n population
  values sorted ascending and k = floor(n * t) the largest count allowed, the threshold is the (k+1)-th smallest
  value, sorted[k]: "signal < sorted[k]" flags every value below it, at most k of them. Ties are never split: a
  group of equal population values is flagged wholly or not at all, so when sorted[k] is tied with values
  below it the count is the largest achievable one up to k (and the population FPR is below t). Samples equal
  to the threshold are not flagged. With ``linear_itp`` (the default) that is the threshold; the parametric
  functions (``gaussian``, ``logit_rescale``, ``min_linear_logit``) give their own threshold at alpha = t, which
  promises no population FPR, so it is capped at sorted[k]: their population FPR is at most t too, and may be
  well below it where the fitted distribution does not match the population.
* ``uncertainty`` (audit.membership.attack_uncertainty.AttackUncertainty): the exact AUC's interval, at each
  tolerance the TPR's and the non-members' FPR's Clopper-Pearson intervals with the counts they rest on (members
  flagged, non-members flagged, population flagged) and whether the population resolves the tolerance, the
  empirical epsilon lower bound and the attacker's advantage, at the caller's confidence and delta.
* ``exact_auc``: the ROC AUC of members against non-members over every threshold on the attack's scores
  (the Mann-Whitney statistic; ties count half). Privacy Meter's ``auc`` integrates its curve over the alpha
  grid only, whose thresholds are population quantiles: the curve never reaches beyond the population's range
  and takes few distinct points on a small population, so it under-reads there (with 20 population samples,
  0.681 where the members-vs-non-members AUC is 0.756).

Only ``privacy_meter.hypothesis_test`` and ``privacy_meter.metric_result`` are imported: Privacy Meter's other
modules import tensorflow at module level.
"""

from __future__ import annotations

import contextlib
import io
import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
from privacy_meter.hypothesis_test import (
    gaussian_threshold_func,
    linear_itp_threshold_func,
    logit_rescale_threshold_func,
    min_linear_logit_threshold_func,
)
from privacy_meter.metric_result import CombinedMetricResult
from sklearn.metrics import roc_auc_score

from audit.config.tolerances import FPR_TOLERANCES
from audit.config.vocabulary import LOSS_ONLY_FUNCTIONS, THRESHOLD_FUNCTIONS as THRESHOLD_FUNCTION_NAMES
from audit.config.vocabulary import tolerance_name
from audit.config.resolution import largest_count, resolvable
from audit.membership.attack_uncertainty import AttackUncertainty, attack_uncertainty
from audit.membership.uncertainty import CONFIDENCE

__all__ = [
    "DEFAULT_ALPHAS",
    "THRESHOLD_FUNCTIONS",
    "AttackResult",
    "population_attack",
    "update_attack",
]

# Privacy Meter's default alpha (FPR) grid, privacy_meter.utils.default_quantile(). Written out rather than
# imported because the project only imports privacy_meter.hypothesis_test and privacy_meter.metric_result;
# tests/test_population_attack.py checks that the two are identical.
DEFAULT_ALPHAS = np.logspace(-5, 0, 100)
DEFAULT_ALPHAS.setflags(write=False)

THRESHOLD_FUNCTIONS: Mapping[str, Callable] = {
    "linear_itp": linear_itp_threshold_func,
    "logit_rescale": logit_rescale_threshold_func,
    "gaussian": gaussian_threshold_func,
    "min_linear_logit": min_linear_logit_threshold_func,
}
assert tuple(THRESHOLD_FUNCTIONS) == THRESHOLD_FUNCTION_NAMES  # the names plans use (audit.config.vocabulary)

_SET_NAMES = ("members", "non-members", "population")


@dataclass(frozen=True, eq=False)  # eq=False: fields hold numpy arrays, which have no single truth value
class AttackResult:
    """Outcome of one membership-inference attack on one signal.

    ``fpr``/``tpr``/``thresholds`` run over the alpha grid (one entry per alpha); thresholds are in the
    signal's own units. ``auc`` is Privacy Meter's AUC of that grid curve; ``exact_auc`` the members-vs-non-members
    ROC AUC over every threshold (see the module docstring). ``tpr_at_fpr`` (members), ``fpr_at_fpr``
    (non-members), ``population_fpr_at_fpr`` (the population, at most the tolerance) and ``threshold_at_fpr``
    are keyed by tolerance (float); ``resolvable`` says at which tolerances the three sets are large enough for
    these readings to mean anything (audit.config.resolution).
    """

    attack: str
    signal: str
    fpr: np.ndarray
    tpr: np.ndarray
    thresholds: np.ndarray
    auc: float
    exact_auc: float
    tolerances: tuple[float, ...]
    tpr_at_fpr: dict[float, float]
    fpr_at_fpr: dict[float, float]
    population_fpr_at_fpr: dict[float, float]
    threshold_at_fpr: dict[float, float]
    n_members: int
    n_nonmembers: int
    n_population: int
    uncertainty: AttackUncertainty | None = None

    def to_dict(self) -> dict:
        """JSON-serialisable dict; tolerance keys as `tolerance_name` strings, non-finite numbers as None."""

        def keyed(values: dict[float, float]) -> dict[str, float | None]:
            return {tolerance_name(tol): _json_float(v) for tol, v in values.items()}

        return {
            "attack": self.attack,
            "signal": self.signal,
            "fpr": [_json_float(v) for v in self.fpr],
            "tpr": [_json_float(v) for v in self.tpr],
            "thresholds": [_json_float(v) for v in self.thresholds],
            "auc": _json_float(self.auc),
            "exact_auc": _json_float(self.exact_auc),
            "tolerances": [float(t) for t in self.tolerances],
            "tpr_at_fpr": keyed(self.tpr_at_fpr),
            "fpr_at_fpr": keyed(self.fpr_at_fpr),
            "population_fpr_at_fpr": keyed(self.population_fpr_at_fpr),
            "threshold_at_fpr": keyed(self.threshold_at_fpr),
            "n_members": int(self.n_members),
            "n_nonmembers": int(self.n_nonmembers),
            "n_population": int(self.n_population),
            # per tolerance: whether every set has at least 1/t samples (audit.config.resolution)
            "resolvable": {tolerance_name(t): ok for t, ok in self.resolvable.items()},
            **({"uncertainty": self.uncertainty.to_dict()} if self.uncertainty is not None else {}),
        }

    @property
    def resolvable(self) -> dict[float, bool]:
        """Tolerance -> whether the population has at least 1/t samples (audit.config.resolution)."""
        return {t: resolvable(t, self.n_population) for t in self.tolerances}


def _json_float(value) -> float | None:
    value = float(value)
    # Thresholds can be +-inf (the Gaussian fits at alpha = 1); strict JSON has no Infinity/NaN.
    return value if math.isfinite(value) else None


def _as_signal(values, name: str) -> np.ndarray:
    """A 1-D, non-empty, finite float array. Floating dtypes are kept (float32 losses stay float32, so the
    thresholds and comparisons are bit-for-bit those Privacy Meter computes on the same values)."""
    try:
        arr = np.asarray(values)
    except Exception as exc:  # e.g. ragged sequences
        raise ValueError(f"{name}: not an array of numbers ({exc})") from exc
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
                                   or arr.dtype == np.bool_):
        raise ValueError(f"{name}: expected numbers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of per-sample values, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name}: empty")
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(
            f"{name}: {int(bad.sum())} of {arr.size} values are not finite (first at index {int(np.argmax(bad))})"
        )
    return arr


def _as_alphas(alphas) -> np.ndarray:
    arr = np.asarray(alphas, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"alphas: expected a 1-D grid of at least 2 values, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or arr.min() < 0.0 or arr.max() > 1.0:
        raise ValueError("alphas: values must lie in [0, 1]")
    if np.any(np.diff(arr) <= 0):
        # The ROC AUC integrates FPR against TPR in grid order; an unsorted grid makes it meaningless.
        raise ValueError("alphas: must be strictly increasing")
    return arr


def _thresholds(func: Callable, distribution: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    # privacy_meter.hypothesis_test.logit_rescale_threshold_func (also called by min_linear_logit) prints two
    # debug lines ("none" and a count of -inf values) on every call; keep them out of the federation's logs.
    with contextlib.redirect_stdout(io.StringIO()):
        return np.asarray(func(distribution, alphas)).reshape(-1)


def _thresholds_at(func: Callable, distribution: np.ndarray, tolerances: tuple[float, ...]) -> np.ndarray:
    """The threshold function evaluated at alpha = each tolerance exactly.

    linear_itp_threshold_func (and so min_linear_logit) ignores the first and last alpha and puts
    min - 1e-4 / max + 1e-4 there, so the tolerances go in the middle of a padded grid and the two ends are
    dropped. The pads are 0.5 rather than 0 / 1 so that the Gaussian-based functions, which do use every
    alpha, stay finite at the dropped ends (norm.ppf(1) is inf and would warn on inf - inf).
    """
    padded = np.array([0.5, *tolerances, 0.5])
    return _thresholds(func, distribution, padded)[1:-1]


def _thresholds_within(threshold_function: str, population: np.ndarray, tolerances: tuple[float, ...]) -> np.ndarray:
    """The threshold at each tolerance t: the largest with at most floor(n * t) population values below it
    (sorted[k]; see the module docstring), or the parametric function's own threshold at alpha = t where it is lower.

    Written by hand (a sort and an index): np.quantile's methods place the quantile at (n - 1) t (linear
    interpolation there flags floor((n - 1) t) + 1 values) or at ceil(n t) - 1 (inverted_cdf), so none gives
    sorted[floor(n t)] for every n and t.
    """
    ordered = np.sort(population)
    bound = ordered[[largest_count(ordered.size, t) for t in tolerances]]
    if threshold_function == "linear_itp":  # the empirical quantile function: sorted[k] is its reading
        return bound
    own = _thresholds_at(THRESHOLD_FUNCTIONS[threshold_function], population, tolerances)
    if np.isnan(own).any():
        raise ValueError(f"population: threshold function {threshold_function!r} gave NaN thresholds on it")
    return np.minimum(own, bound)


def population_attack(
    member_signal,
    nonmember_signal,
    population_signal,
    fpr_tolerance,
    *,
    signal: str = "loss",
    member_if_lower: bool = True,
    threshold_function: str = "linear_itp",
    alphas=DEFAULT_ALPHAS,
    attack: str = "population",
    confidence: float = CONFIDENCE,
    delta: float = 0.0,
) -> AttackResult:
    """Privacy Meter's population attack (PopulationMetric.run_metric) on precomputed per-sample signals.

    Args:
        member_signal, nonmember_signal, population_signal: 1-D per-sample signal values of the audited
            model on its training samples, on held-out samples, and on the attacker's reference population.
        fpr_tolerance: the audit settings' `fpr_tolerance` (FprTolerances, taken as it is), or one tolerance or a
            sequence, each in (0, 1), no two with one `tolerance_name` (parsed here, once); TPR is also reported at
            each of them, with at most that share of the population flagged.
        signal: name of the signal, recorded in the result.
        member_if_lower: True when members have lower values (loss, gradient norm); False when they have
            higher values (e.g. the true-class logit): the signals are then negated before thresholding and
            the thresholds are reported back in the signal's own units (member iff value > threshold).
        threshold_function: a key of THRESHOLD_FUNCTIONS.
        alphas: the alpha (target FPR) grid; defaults to Privacy Meter's.
        attack: name of the attack, recorded in the result.
        confidence, delta: of the intervals and the epsilon lower bound in the result's ``uncertainty``.
    """
    if threshold_function not in THRESHOLD_FUNCTIONS:
        raise ValueError(
            f"threshold_function: unknown {threshold_function!r}; known: {', '.join(THRESHOLD_FUNCTIONS)}"
        )
    if not isinstance(member_if_lower, (bool, np.bool_)):
        raise ValueError(f"member_if_lower: expected a bool, got {member_if_lower!r}")
    members = _as_signal(member_signal, "members")
    nonmembers = _as_signal(nonmember_signal, "non-members")
    population = _as_signal(population_signal, "population")
    tolerances = FPR_TOLERANCES("fpr_tolerance", fpr_tolerance)  # the settings' own value, as it is
    alpha_grid = _as_alphas(alphas)

    if threshold_function in LOSS_ONLY_FUNCTIONS:
        if not member_if_lower:
            raise ValueError(
                f"threshold_function: {threshold_function!r} assumes a non-negative loss-like signal where "
                f"members are lower; it cannot be used with member_if_lower=False (signal {signal!r})"
            )
        for name, values in zip(_SET_NAMES, (members, nonmembers, population)):
            if values.min() < 0:
                raise ValueError(
                    f"{name}: threshold_function {threshold_function!r} needs a non-negative loss-like signal, "
                    f"got a minimum of {float(values.min())!r}"
                )

    sign = 1 if member_if_lower else -1
    if sign < 0:  # attack "-signal < -threshold", i.e. "signal > threshold"
        members, nonmembers, population = -members, -nonmembers, -population

    func = THRESHOLD_FUNCTIONS[threshold_function]

    # --- Privacy Meter's PopulationMetric.run_metric, on the arrays instead of its InformationSource ---
    thresholds = _thresholds(func, population, alpha_grid)
    if thresholds.shape != alpha_grid.shape or np.isnan(thresholds).any():
        raise ValueError(
            f"population: threshold function {threshold_function!r} gave no usable thresholds on it "
            f"(NaN or wrong shape); e.g. logit_rescale on losses too large for exp(-loss)"
        )
    column = thresholds.reshape(-1, 1)
    member_preds = np.less(members.reshape(1, -1), column)
    nonmember_preds = np.less(nonmembers.reshape(1, -1), column)
    predictions = np.concatenate([member_preds, nonmember_preds], axis=1)
    true_labels = np.concatenate([np.ones(members.size), np.zeros(nonmembers.size)])
    result = CombinedMetricResult(
        metric_id=f"{attack}_metric",
        predicted_labels=predictions,
        true_labels=true_labels,
        predictions_proba=None,
        signal_values=np.concatenate([members, nonmembers]),
    )
    fpr = np.asarray(result.fp, dtype=np.float64) / nonmembers.size
    tpr = np.asarray(result.tp, dtype=np.float64) / members.size
    auc = float(result.roc_auc)

    # --- Over every threshold: members (label 1) score higher when their signal is lower ---
    exact_auc = float(roc_auc_score(true_labels, -np.concatenate([members, nonmembers])))

    # --- TPR with at most the tolerance of the population flagged ---
    at = _thresholds_within(threshold_function, population, tolerances)
    tpr_at = {t: float(np.mean(members < thr)) for t, thr in zip(tolerances, at)}
    fpr_at = {t: float(np.mean(nonmembers < thr)) for t, thr in zip(tolerances, at)}
    population_fpr_at = {t: float(np.mean(population < thr)) for t, thr in zip(tolerances, at)}
    thr_at = {t: float(sign * thr) for t, thr in zip(tolerances, at)}

    # --- Their uncertainty, on scores where higher = member: flagged iff -value > -threshold, as counted above ---
    uncertainty = attack_uncertainty(-members, -nonmembers, -population, {t: -thr for t, thr in zip(tolerances, at)},
                                     confidence=confidence, delta=delta)

    reported = (sign * thresholds).astype(np.float64)
    for arr in (fpr, tpr, reported):
        arr.setflags(write=False)
    return AttackResult(
        attack=attack,
        signal=signal,
        fpr=fpr,
        tpr=tpr,
        thresholds=reported,
        auc=auc,
        exact_auc=exact_auc,
        tolerances=tolerances,
        tpr_at_fpr=tpr_at,
        fpr_at_fpr=fpr_at,
        population_fpr_at_fpr=population_fpr_at,
        threshold_at_fpr=thr_at,
        n_members=int(members.size),
        n_nonmembers=int(nonmembers.size),
        n_population=int(population.size),
        uncertainty=uncertainty,
    )


def update_attack(
    member_loss_global,
    member_loss_local,
    nonmember_loss_global,
    nonmember_loss_local,
    population_loss_global,
    population_loss_local,
    fpr_tolerance,
    *,
    alphas=DEFAULT_ALPHAS,
    confidence: float = CONFIDENCE,
    delta: float = 0.0,
) -> AttackResult:
    """Membership inference from one party's update, with the received global model as the reference.

    Score = loss under the received global model - loss under the locally trained model ("loss_reduction"):
    local training lowers the loss of the party's own samples more than that of others, so higher = member.
    Thresholds are calibrated on the population's scores exactly as in `population_attack` (linear_itp).
    """
    pairs = (
        ("members", member_loss_global, member_loss_local),
        ("non-members", nonmember_loss_global, nonmember_loss_local),
        ("population", population_loss_global, population_loss_local),
    )
    scores = []
    for name, under_global, under_local in pairs:
        g = _as_signal(under_global, f"{name} (loss under the global model)")
        lo = _as_signal(under_local, f"{name} (loss under the local model)")
        if g.shape != lo.shape:
            raise ValueError(
                f"{name}: {g.size} losses under the global model but {lo.size} under the local model"
            )
        scores.append(g - lo)
    return population_attack(
        scores[0],
        scores[1],
        scores[2],
        fpr_tolerance,
        signal="loss_reduction",
        member_if_lower=False,
        threshold_function="linear_itp",
        alphas=alphas,
        attack="update",
        confidence=confidence,
        delta=delta,
    )

