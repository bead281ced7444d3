"""RMIA, the relative membership-inference attack (Zarifzadeh, Liu, Shokri, ICML 2024, "Low-Cost High-Power
Membership Inference Attacks"), as Privacy Meter v2 runs it, on precomputed signals.

The signal is the true-class probability at a temperature T, Pr(x | model) = softmax(z / T)[y]
(`true_class_probability`). For a sample x and the audited (target) model:

    Pr(x)         from reference models (`marginal_probability`):
                  online  (IN and OUT references):  Pr(x) = (Pr_IN(x) + Pr_OUT(x)) / 2, the means over the
                          references that trained on x and those that did not;
                  offline (OUT references only):    Pr_IN ~ a Pr_OUT + (1 - a), so
                                                    Pr(x) = ((1 + a) Pr_OUT(x) + 1 - a) / 2
    ratio(x)      = Pr(x | target) / Pr(x)
    LR(x, z)      = ratio(x) / ratio(z), for population samples z (non-members of the target)
    score(x)      = share of the population samples z with LR(x, z) >= gamma (the paper; `strict=True`: > gamma, as
                    Privacy Meter v2's code compares). Higher = more likely a member.

Kinds of reference, as a federation has them:
- references the party trains itself with its own recipe (`audit.training.train_references`), e.g. on
  population subsets of the member count: the party knows which samples each trained on (`reference_in`), so
  population samples get Pr(z) from the references that did not train on them, and `tune_offline_a` can pick `a`;
- the round's received global model (`global_model`): free, counted as one more OUT reference for every sample. It
  is OUT for the party's non-members and population, but it has already seen the party's members in earlier rounds
  (averaged with the other parties' updates). So for members Pr(x) is inflated by the earlier rounds and
  ratio(x) = Pr(x | local) / Pr(x) measures what this round's local training adds on top of the global model, not
  the cumulative leakage of the local model. With the global model as the only reference, a = 1 and gamma = 1, RMIA
  ranks samples exactly as the update attack (loss under the global model minus loss under the local one) does.
  References that never saw the party's data answer the other question (how much the local model leaks in all).

Use:

    from audit.membership.rmia import Signals, rmia, true_class_probability
    p = lambda logits, y: true_class_probability(logits, y, temperature=2.0)
    result = rmia(Signals(p(local_m, y_m), references=p(refs_m, y_m), global_model=p(global_m, y_m)),
                  Signals(...non-members...), Signals(...population..., reference_in=trained_on_population),
                  offline_a=0.3, gamma=1.0)
    result.members, result.nonmembers   # per-sample scores: audit.membership.uncertainty.auc_interval(...), ...
    result.population                   # leave-one-out scores of the population, for population thresholds

numpy only, plus audit.membership.uncertainty's AUC for tuning `a`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from audit.membership.uncertainty import auc

__all__ = [
    "OFFLINE_A_GRID",
    "ZeroMarginal",
    "Signals",
    "RMIAScores",
    "TunedA",
    "true_class_probability",
    "marginal_probability",
    "rmia_scores",
    "rmia",
    "tune_offline_a",
]

# Privacy Meter v2 tunes `a` over 0, 0.1, ..., 1 (attacks.py, tune_offline_a).
OFFLINE_A_GRID = tuple(round(0.1 * i, 1) for i in range(11))


# ------------------------------------------------------------------------------------------ signal


def true_class_probability(logits, labels, temperature: float = 1.0) -> np.ndarray:
    """softmax(logits / temperature)[label] per sample, float64.

    logits: (N, C) or (K, N, C) (K models on the same N samples); labels: (N,) integers. Returns (N,) or (K, N).
    Computed as exp(z_y / T - logsumexp(z / T)), stable for large logits (a probability may still underflow to 0
    for a sample the model gets wrong by a logit gap of ~745 T; RMIA scores such a sample 0)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < np.inf:
        raise ValueError(f"temperature: {temperature!r} must be a positive number")
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels)
    if z.ndim not in (2, 3) or y.ndim != 1 or z.shape[-2] != y.shape[0]:
        raise ValueError(f"logits {z.shape} must be (N, C) or (K, N, C) and labels {y.shape} (N,)")
    if not np.issubdtype(y.dtype, np.integer) or (y.size and (y.min() < 0 or y.max() >= z.shape[-1])):
        raise ValueError(f"labels must be integers in [0, {z.shape[-1]}), got dtype {y.dtype}"
                         + (f" and range [{y.min()}, {y.max()}]" if y.size and np.issubdtype(y.dtype, np.number)
                            else ""))
    if not np.isfinite(z).all():
        raise ValueError("logits: not all finite")
    z = z / temperature
    top = z.max(axis=-1, keepdims=True)
    log_norm = top[..., 0] + np.log(np.exp(z - top).sum(axis=-1))
    true = np.take_along_axis(z, np.broadcast_to(y[:, None], z.shape[:-1] + (1,)), axis=-1)[..., 0]
    return np.exp(true - log_norm)


# ------------------------------------------------------------------------------------------ Pr(x)


def _probabilities(values, name: str, shape: tuple | None = None) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if shape is not None and arr.shape != shape:
        raise ValueError(f"{name}: shape {arr.shape}, expected {shape}")
    if not (np.isfinite(arr).all() and (arr >= 0).all() and (arr <= 1).all()):
        raise ValueError(f"{name}: probabilities must be finite and in [0, 1]")
    return arr


def _check_a(offline_a) -> None:
    if offline_a is not None and (isinstance(offline_a, bool) or not isinstance(offline_a, (int, float))
                                  or not 0 <= offline_a <= 1):
        raise ValueError(f"offline_a: {offline_a!r} must be a number in [0, 1] (or None for the online attack)")


def marginal_probability(references=None, reference_in=None, *, offline_a: float | None,
                         global_model=None, name: str = "samples") -> np.ndarray:
    """Pr(x) per sample from reference models' true-class probabilities.

    references: (K, N) probabilities of K party-trained references (or None); reference_in: (K, N) bool, True where
    reference k trained on sample n (None: none did); global_model: (N,) the received global model's probabilities,
    counted as one more OUT reference (see the module docstring).
    offline_a: a in [0, 1] for the offline attack: OUT references only (IN ones are left out), every sample needs
    one, Pr(x) = ((1 + a) Pr_OUT + 1 - a) / 2; a = 1 gives Pr_OUT itself, a = 0 (1 + Pr_OUT) / 2. None for the
    online attack: Pr(x) = (Pr_IN + Pr_OUT) / 2, every sample needs an IN and an OUT reference."""
    _check_a(offline_a)
    if references is None and global_model is None:
        raise ValueError(f"{name}: no reference (neither references nor global_model)")
    if references is None:
        if reference_in is not None:
            raise ValueError(f"{name}: reference_in given without references")
        g = _probabilities(global_model, f"{name}: global_model")
        if g.ndim != 1:
            raise ValueError(f"{name}: global_model must be (N,), got {g.shape}")
        refs, trained = np.empty((0, g.size)), np.zeros((0, g.size), dtype=bool)
    else:
        refs = _probabilities(references, f"{name}: references")
        if refs.ndim != 2 or refs.shape[0] == 0:
            raise ValueError(f"{name}: references must be (K, N) with K >= 1, got {refs.shape}")
        trained = (np.zeros(refs.shape, dtype=bool) if reference_in is None
                   else np.asarray(reference_in))
        if trained.shape != refs.shape or trained.dtype != bool:
            raise ValueError(f"{name}: reference_in must be a bool array of shape {refs.shape}, got "
                             f"{trained.dtype} {trained.shape}")
        g = None if global_model is None else _probabilities(global_model, f"{name}: global_model",
                                                              (refs.shape[1],))
    out_sum = (refs * ~trained).sum(axis=0)
    out_count = (~trained).sum(axis=0)
    if g is not None:
        out_sum, out_count = out_sum + g, out_count + 1
    lacking_out = int((out_count == 0).sum())
    if lacking_out:
        raise ValueError(f"{name}: {lacking_out} sample(s) have no OUT reference (every reference trained on them); "
                         "RMIA needs one per sample")
    p_out = out_sum / out_count
    if offline_a is not None:
        return ((1 + offline_a) * p_out + (1 - offline_a)) / 2
    in_count = trained.sum(axis=0)
    lacking_in = int((in_count == 0).sum())
    if lacking_in:
        raise ValueError(f"{name}: {lacking_in} sample(s) have no IN reference; the online attack needs one per "
                         "sample (use offline_a for OUT references only)")
    return ((refs * trained).sum(axis=0) / in_count + p_out) / 2


# ------------------------------------------------------------------------------------------ scores


class ZeroMarginal(ValueError):
    """Pr(x) is 0 for some sample: its likelihood ratio is undefined, so the attack cannot score it."""


def _ratio(target, marginal, name: str) -> np.ndarray:
    target = _probabilities(target, f"{name}: target")
    marginal = np.asarray(marginal, dtype=np.float64)
    if target.ndim != 1 or marginal.shape != target.shape:
        raise ValueError(f"{name}: target {target.shape} and Pr(x) {marginal.shape} must be the same (N,) shape")
    if not (np.isfinite(marginal).all() and (marginal > 0).all()):
        raise ZeroMarginal(f"{name}: Pr(x) must be finite and > 0 (it is 0 only with offline_a = 1 and references "
                           "whose probabilities underflow to 0: logits far apart; raise audit.rmia.temperature)")
    return target / marginal


def _check_gamma(gamma) -> float:
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 < gamma < np.inf:
        raise ValueError(f"gamma: {gamma!r} must be a positive number")
    return float(gamma)


def _count_lr_at_least(ratio_x: np.ndarray, ratio_z_sorted: np.ndarray, gamma: float, strict: bool) -> np.ndarray:
    """For each x, #{z : ratio_x / ratio_z >= gamma} (> with strict), exactly as that expression evaluates.

    Not the (n, m) matrix of LRs (12,000 x 6,000 would be 576 MB of float64): z sorted by ratio once, then a
    vectorised binary search per x, O((n + m) log m). The division is correctly rounded, hence monotone in the
    divisor: ratio_x / ratio_z is non-increasing along the sorted ratio_z, so the z that pass form a prefix of it.
    The search evaluates the same division the paper's formula does (not ratio_z <= ratio_x / gamma, which rounds
    differently), so ties at LR exactly gamma count as the definition says. ratio_z = 0 gives LR = inf (counted);
    ratio_x = 0 gives LR 0 or 0/0 = NaN (never counted)."""
    m = ratio_z_sorted.size
    lo = np.zeros(ratio_x.size, dtype=np.int64)  # every z before lo passes
    hi = np.full(ratio_x.size, m, dtype=np.int64)  # no z from hi on passes
    with np.errstate(divide="ignore", invalid="ignore"):
        while True:
            active = lo < hi
            if not active.any():
                return lo
            mid = (lo + hi) // 2
            lr = ratio_x / ratio_z_sorted[np.minimum(mid, m - 1)]
            passes = (lr > gamma) if strict else (lr >= gamma)
            lo = np.where(active & passes, mid + 1, lo)
            hi = np.where(active & ~passes, mid, hi)


def rmia_scores(target_x, marginal_x, target_z, marginal_z, *, gamma: float = 1.0,
                strict: bool = False) -> np.ndarray:
    """score(x) = share of the population z with LR(x, z) >= gamma (> gamma with `strict`), per x.

    target_*: Pr(. | target model), marginal_*: Pr(.) from `marginal_probability`; x: (N,), z: (M,)."""
    gamma = _check_gamma(gamma)
    if not isinstance(strict, bool):
        raise ValueError(f"strict: expected a bool, got {strict!r}")
    ratio_x = _ratio(target_x, marginal_x, "samples x")
    ratio_z = _ratio(target_z, marginal_z, "population z")
    if ratio_z.size == 0:
        raise ValueError("population z: empty")
    return _count_lr_at_least(ratio_x, np.sort(ratio_z), gamma, strict) / ratio_z.size


@dataclass(frozen=True)
class Signals:
    """One sample set's true-class probabilities: under the audited model (`target`, (N,)), under the party's
    references (`references`, (K, N), with `reference_in` (K, N) True where reference k trained on the sample) and
    under the received global model (`global_model`, (N,))."""

    target: np.ndarray
    references: np.ndarray | None = None
    reference_in: np.ndarray | None = None
    global_model: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class RMIAScores:
    """Per-sample RMIA scores (higher = more likely a member). `population`: each population sample scored against
    the others (leave-one-out), for thresholds set on the population."""

    members: np.ndarray
    nonmembers: np.ndarray
    population: np.ndarray
    gamma: float
    offline_a: float | None
    strict: bool
    n_references: int
    global_model: bool


def rmia(members: Signals, nonmembers: Signals, population: Signals, *, offline_a: float | None = 0.3,
         gamma: float = 1.0, strict: bool = False) -> RMIAScores:
    """RMIA scores of the members and non-members against the population, and the population's own (leave-one-out).

    offline_a: 0.3 by default (the RMIA paper's configurations; tune it with `tune_offline_a` when two or more
    references with known training sets exist); None for the online attack (needs IN references for every sample).
    gamma: 1 by default (Privacy Meter v2's)."""
    sets = {"members": members, "non-members": nonmembers, "population": population}
    for name, s in sets.items():
        if not isinstance(s, Signals):
            raise ValueError(f"{name}: expected an audit.membership.rmia.Signals, got {type(s).__name__}")
    k = {name: (0 if s.references is None else np.shape(s.references)[0]) for name, s in sets.items()}
    if len(set(k.values())) != 1:
        raise ValueError(f"every set needs the same references; counts: {k}")
    has_global = {name: s.global_model is not None for name, s in sets.items()}
    if len(set(has_global.values())) != 1:
        raise ValueError(f"global_model must be given for every set or for none; given: {has_global}")
    gamma = _check_gamma(gamma)
    _check_a(offline_a)
    marg = {name: marginal_probability(s.references, s.reference_in, offline_a=offline_a,
                                       global_model=s.global_model, name=name) for name, s in sets.items()}
    m = np.shape(population.target)[0] if np.ndim(population.target) == 1 else 0
    if m < 2:
        raise ValueError(f"population: needs at least 2 samples, got {m}")
    scores = {name: rmia_scores(s.target, marg[name], population.target, marg["population"], gamma=gamma,
                                strict=strict) for name, s in sets.items()}
    # Leave-one-out for the population: z against itself has LR = r / r = 1 exactly when r > 0 (0/0 when r = 0).
    r = _ratio(population.target, marg["population"], "population")
    self_counted = (r > 0) & ((1.0 > gamma) if strict else (1.0 >= gamma))
    population_scores = (scores["population"] * m - self_counted) / (m - 1)
    return RMIAScores(scores["members"], scores["non-members"], population_scores, gamma, offline_a, strict,
                      k["members"], has_global["members"])


# ------------------------------------------------------------------------------------------ tuning a


@dataclass(frozen=True)
class TunedA:
    """The `a` with the highest AUC of the offline attack on the stand-in target (`paired`), every candidate's AUC,
    and the sample counts it rests on."""

    offline_a: float
    aucs: dict
    paired: int
    n_in: int
    n_out: int
    n_population: int


def tune_offline_a(references, reference_in, population_references, population_in=None, *, paired: int = 0,
                   candidates=OFFLINE_A_GRID, gamma: float = 1.0, strict: bool = False) -> TunedA:
    """Pick `a` as Privacy Meter v2 does: one reference plays the target, the others are its references, and the
    `a` whose offline attack has the highest AUC on that reference's known members (IN) and non-members (OUT) wins
    (the first in `candidates` order on a tie).

    It needs references whose training sets are known, so it works with the party's own references (two or more)
    and not with the global model alone: whom the global model trained on is the very question the audit asks.
    references: (K, N) probabilities on N samples, reference_in (K, N) which reference trained on which sample;
    population_references (K, M) on the population z, population_in (K, M) or None. Samples without an OUT
    reference among the others, and population samples the stand-in target trained on, are left out."""
    refs = _probabilities(references, "references")
    if refs.ndim != 2 or refs.shape[0] < 2:
        raise ValueError(f"references: tuning needs (K, N) with K >= 2 (one stands in for the target), got "
                         f"{refs.shape}")
    trained = np.asarray(reference_in)
    if trained.shape != refs.shape or trained.dtype != bool:
        raise ValueError(f"reference_in: a bool array of shape {refs.shape} is needed, got {trained.dtype} "
                         f"{trained.shape}")
    pop = _probabilities(population_references, "population_references")
    if pop.ndim != 2 or pop.shape[0] != refs.shape[0]:
        raise ValueError(f"population_references: ({refs.shape[0]}, M) expected, got {pop.shape}")
    pop_trained = np.zeros(pop.shape, dtype=bool) if population_in is None else np.asarray(population_in)
    if pop_trained.shape != pop.shape or pop_trained.dtype != bool:
        raise ValueError(f"population_in: a bool array of shape {pop.shape} is needed")
    if isinstance(paired, bool) or not isinstance(paired, (int, np.integer)) or not 0 <= paired < refs.shape[0]:
        raise ValueError(f"paired: {paired!r} is not a reference index in [0, {refs.shape[0]})")
    grid = [float(a) for a in candidates]
    if not grid:
        raise ValueError("candidates: empty")
    for a in grid:
        _check_a(a)
    others = [k for k in range(refs.shape[0]) if k != paired]
    keep_x = (~trained[others]).any(axis=0)
    keep_z = (~pop_trained[others]).any(axis=0) & ~pop_trained[paired]
    is_in = trained[paired, keep_x]
    n_in, n_out, n_z = int(is_in.sum()), int((~is_in).sum()), int(keep_z.sum())
    if n_in == 0 or n_out == 0 or n_z == 0:
        raise ValueError(f"tune_offline_a: reference {paired} needs usable IN samples, OUT samples and population "
                         f"samples; got {n_in}, {n_out}, {n_z}")
    x_refs, x_in = refs[others][:, keep_x], trained[others][:, keep_x]
    z_refs, z_in = pop[others][:, keep_z], pop_trained[others][:, keep_z]
    aucs = {}
    for a in grid:
        scores = rmia_scores(refs[paired, keep_x], marginal_probability(x_refs, x_in, offline_a=a),
                             pop[paired, keep_z], marginal_probability(z_refs, z_in, offline_a=a),
                             gamma=gamma, strict=strict)
        aucs[a] = auc(scores[is_in], scores[~is_in])
    best = max(grid, key=lambda a: (aucs[a], -grid.index(a)))
    return TunedA(best, aucs, int(paired), n_in, n_out, n_z)
