"""The canary check of a party's DP training, beside the accountant's epsilon.

Wherever a party trains with DP, a white-box canary audit of the same mechanism tests the claim, four ways:

- `one_run`: Steinke, Nasr and Jagielski's epsilon lower bound (audit.canary.one_run): valid for any mechanism;
- `fdp`: the f-DP one-run bound (Mahloujifar et al., audit.canary.fdp) against the claimed mechanism's whole
  trade-off curve: valid for any mechanism;
- `independent`: the independent-canary bound (audit.canary.independent) against the same curves: tight where the
  canaries do not interact, which the DP-SGD check's orthogonal gradient canaries do not;
- `estimate`: the white-box estimate of the effective noise multiplier and clipping bound (audit.canary.whitebox):
  the claim above its upper confidence limit.

Each runs at alpha / (the number of tests) (Bonferroni), so a correct DP training trips any of them with probability
at most alpha = 1 - confidence per check. Any one that rejects the claim proves the DP training (or its accounting)
broken: the update is withheld ("DP guarantee violated by the audit"). The check's figure `epsilon_lb` is the largest
of the tests' epsilons (each in the claim's units, above the claim's epsilon exactly when it rejects it).

- DP-SGD (the gate's dp_retrain): `audit_dp_training` runs the party's own DP training (a `DPTrainer`, the same code
  that trains the update: audit/dp_training.py) once more from the same start on the same members, with gradient
  canaries (audit.canary.gradients) inside its optimizer step. Claimed: the accountant's epsilon of one such training
  (RDP, Poisson sampling rate, steps, noise multiplier), the claim this run must honour.
- dp_fedavg (clip the whole update to `clip`, add N(0, (sigma clip)^2)): `audit_update_mechanism` passes an update
  made of m orthogonal canary directions (each of norm `gradient_norm` x clip, each included with probability 1/2)
  through the party's own mitigation function and scores each by its coordinate in what comes out. Claimed: the
  Gaussian mechanism's epsilon with sensitivity 2 clip (any change of the party's data moves the clipped update
  within a ball of radius clip) and noise sigma clip, per round. One release of one vector shares the clipping bound
  among the m canaries, so this check is weak (it catches a skipped clip, not a slightly wrong noise); its figures
  are in benchmarks/README.md. Tests: `one_run` and `fdp` (the Gaussian mechanism's curves); the canaries share one
  clipping of the whole update, so they interact and `independent` does not apply.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

import numpy as np
import torch

from audit.canary.accountant import dp_sgd_epsilon, gaussian_epsilon, update_mechanism_epsilon
from audit.canary.claims import dp_sgd_family, gaussian_family, on_grid
from audit.canary.fdp import FamilyBound, fdp_bound
from audit.canary.gradients import DEFAULT_COUNT, GradientCanaries
from audit.canary.independent import independent_bound, null_thresholds, threshold_counts
from audit.canary.inputs import draw_inclusion
from audit.canary.one_run import CanaryCounts, OneRunBound, counts_from_scores
from audit.canary.tradeoff import subsampled_gaussian
from audit.canary.whitebox import Estimate, StepStatistics, estimate
from audit.config.canary_settings import AUTO, CanarySettings
from audit.config.gate_contract import DP_VIOLATED_TEXT

__all__ = ["DPRun", "DPTrainer", "DPAudit", "VIOLATION", "DP_SGD_TESTS", "UPDATE_TESTS", "dp_sgd_epsilon",
           "gaussian_epsilon", "update_mechanism_epsilon", "audit_dp_training", "dp_sgd_tests",
           "audit_update_mechanism", "dp_fedavg_entry", "check_canary_settings"]

VIOLATION = DP_VIOLATED_TEXT


@dataclass(frozen=True)
class DPRun:
    """One DP-SGD training as its trainer reports it."""

    state: Mapping[str, torch.Tensor]  # the trained weights (the plain model's state dict)
    noise_multiplier: float
    max_grad_norm: float
    sample_rate: float
    steps: int


class DPTrainer(Protocol):
    """The party's DP-SGD training with its recipe (optimiser, learning rate, epochs, batch size, noise, clipping),
    as a callable the audit can run on other data: trains a copy of `start_model` on (x, y), with `gradient_canaries`
    (GradientCanaries) inside its optimizer step when given."""

    noise_multiplier: float
    max_grad_norm: float

    def __call__(self, start_model: torch.nn.Module, x, y, *, seed: int,
                 gradient_canaries: GradientCanaries | None = None) -> DPRun: ...


@dataclass(frozen=True)
class DPAudit:
    """The canary check of one DP mechanism: its tests' figures beside the accountant's epsilon of the same
    mechanism (see the module)."""

    mechanism: str              # "dp_sgd" or "dp_fedavg"
    bound: OneRunBound          # Steinke et al.'s bound, at alpha / tests
    claimed_epsilon: float      # the accountant's epsilon of the audited mechanism at bound.delta
    counts: CanaryCounts        # every guess count's right guesses: the bound at any other level (counts.bound)
    fdp: FamilyBound | None = None
    independent: FamilyBound | None = None
    estimate: Estimate | None = None
    tests: int = 1              # the tests the check's level is shared among
    details: dict = field(default_factory=dict)

    @property
    def figures(self) -> dict[str, float]:
        """Each test's epsilon, in the claim's units (the estimate's: the lower end of its interval)."""
        out = {"one_run": self.bound.epsilon}
        if self.fdp is not None:
            out["fdp"] = self.fdp.epsilon
        if self.independent is not None:
            out["independent"] = self.independent.epsilon
        if self.estimate is not None:
            out["estimate"] = self.estimate.epsilon_interval[0]
        return out

    @property
    def epsilon_lb(self) -> float:
        return max(self.figures.values())

    @property
    def by(self) -> str:
        figures = self.figures
        return max(figures, key=lambda k: (figures[k], k))

    @property
    def violated(self) -> bool:
        return bool(self.bound.epsilon > self.claimed_epsilon
                    or any(t is not None and t.claim_rejected for t in (self.fdp, self.independent, self.estimate)))

    @property
    def ceiling(self) -> float:
        """The most the bounds could show with these canaries (the ceiling of the figure that gave `epsilon_lb`;
        the estimate has none, so the bounds' largest)."""
        ceilings = {"one_run": self.bound.ceiling,
                    **{k: b.ceiling for k, b in (("fdp", self.fdp), ("independent", self.independent)) if b}}
        return ceilings.get(self.by, max(ceilings.values()))

    def summary(self) -> str:
        """One line for a log: the figure, its ceiling, the estimate, the accountant's epsilon, the verdict."""
        names = {"one_run": "Steinke et al.", "fdp": "f-DP", "independent": "independent canaries",
                 "estimate": "white-box estimate"}
        others = ", ".join(f"{names[k]} {v:.3g}" for k, v in self.figures.items() if k != self.by)
        text = (f"canary check epsilon >= {self.epsilon_lb:.3g} ({names[self.by]}; {others}; ceiling "
                f"{self.ceiling:.3g} of {self.bound.m} canaries), accountant's epsilon {self.claimed_epsilon:.3g}")
        if self.estimate is not None:
            text += f"; {self.estimate.summary()}"
        return text + (f": {VIOLATION}" if self.violated else "")

    def to_dict(self) -> dict:
        def finite(value):
            return value if math.isfinite(value) else None

        return {"mechanism": self.mechanism, "epsilon_lb": finite(self.epsilon_lb), "by": self.by,
                "ceiling": finite(self.ceiling), "claimed_epsilon": finite(self.claimed_epsilon),
                "violated": self.violated, "reason": VIOLATION if self.violated else None, "summary": self.summary(),
                "tests": self.tests, "alpha_each": self.bound.alpha,
                "figures": {k: finite(v) for k, v in self.figures.items()},
                "bound": self.bound.to_dict(), "counts": self.counts.to_dict(),
                "fdp": None if self.fdp is None else self.fdp.to_dict(),
                "independent": None if self.independent is None else self.independent.to_dict(),
                "estimate": None if self.estimate is None else self.estimate.to_dict(), **self.details}


# The DP-SGD check's tests (see the module), each at alpha / len(DP_SGD_TESTS).
DP_SGD_TESTS = ("one_run", "fdp", "independent", "estimate")
UPDATE_TESTS = ("one_run", "fdp")


def audit_dp_training(trainer: DPTrainer, start_model: torch.nn.Module, members, settings: CanarySettings, *,
                      delta: float, alpha: float, seed: int) -> DPAudit:
    """A shadow run of the party's DP training (same start, same members) with `settings.gradient_count` gradient
    canaries; their tests of the accountant's claim for that run, at alpha in all."""
    start = time.perf_counter()
    requested = None if settings.gradient_count == AUTO else settings.gradient_count
    canaries = GradientCanaries(requested, kind=settings.gradient_kind, norm_factor=settings.gradient_norm,
                                seed=seed)
    run = trainer(start_model, members[0], members[1], seed=seed, gradient_canaries=canaries)
    trained_s = time.perf_counter() - start
    scores = canaries.scores()
    details = {"canaries": canaries.m, "kind": settings.gradient_kind, "norm_factor": settings.gradient_norm,
               "local_trainings": 1, "training_s": trained_s}
    return dp_sgd_tests(scores, canaries.included, canaries.statistics(), noise_multiplier=run.noise_multiplier,
                        max_grad_norm=run.max_grad_norm, sample_rate=run.sample_rate, steps=run.steps, delta=delta,
                        alpha=alpha, details=details, started=start)


def dp_sgd_tests(scores, included, statistics: StepStatistics, *, noise_multiplier: float, max_grad_norm: float,
                 sample_rate: float, steps: int, delta: float, alpha: float, details: Mapping | None = None,
                 started: float | None = None) -> DPAudit:
    """The four tests of a DP-SGD claim (noise multiplier, clipping bound, Poisson rate, steps) from its gradient
    canaries' observations: each canary's score (the likelihood ratio of its steps' observations), whether it was
    included, and the per-step statistics of the white-box estimate. Each test at alpha / 4."""
    start = time.perf_counter() if started is None else started
    scores = np.asarray(scores, dtype=np.float64)
    finite = bool(np.isfinite(scores).all())
    # A diverged training's gradients (non-finite scores): nothing can be read from them, nothing is proven.
    scores = scores if finite else np.zeros(scores.size)
    counts = counts_from_scores(scores, included)
    each = alpha / len(DP_SGD_TESTS)
    claimed = dp_sgd_epsilon(noise_multiplier, sample_rate, steps, delta)
    fdp = independent = found = None
    details = {**(details or {}), "noise_multiplier": noise_multiplier, "max_grad_norm": max_grad_norm,
               "sample_rate": sample_rate, "steps": steps}
    if steps and finite:
        family = dp_sgd_family(sample_rate, steps)
        fdp = fdp_bound(counts, family, delta=delta, alpha=each, claimed_noise=noise_multiplier)
        thresholds = threshold_counts(scores, included,
                                      null_thresholds(subsampled_gaussian(noise_multiplier, sample_rate, steps)))
        independent = independent_bound(thresholds, family, delta=delta, alpha=each, claimed_noise=noise_multiplier)
        found = estimate(statistics, noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
                         epsilon_of=lambda sigma, up: family.epsilon(on_grid(sigma, noise_multiplier, up=up), delta),
                         alpha=each)
        details.update(threshold_counts=thresholds.to_dict(), statistics=statistics.to_dict())
    details["seconds"] = time.perf_counter() - start
    return DPAudit("dp_sgd", counts.bound(delta, each), claimed, counts, fdp, independent, found,
                   len(DP_SGD_TESTS), details)


def audit_update_mechanism(mechanism: Callable[[Mapping, Mapping], Mapping], received: Mapping, *, sigma: float,
                           clip: float, settings: CanarySettings, delta: float, alpha: float,
                           seed: int) -> DPAudit:
    """The white-box check of an update mechanism (dp_fedavg: `mechanism(received, trained) -> sent`, the party's own
    function): a synthetic update of included canary directions in, each canary scored by its coordinate out."""
    start = time.perf_counter()
    names = sorted(k for k, v in received.items() if np.asarray(v).dtype.kind == "f")
    sizes = [np.asarray(received[k]).size for k in names]
    d = sum(sizes)
    m = min(DEFAULT_COUNT, d) if settings.gradient_count == AUTO else settings.gradient_count
    if m > d:
        raise ValueError(f"canary: {m} update canaries need as many coordinates; the update has {d}")
    rng = np.random.default_rng([seed, 0])
    coords = rng.permutation(d)[:m]  # one coordinate each (Dirac): orthogonal, no interference
    signs = rng.choice([-1.0, 1.0], size=m)
    included = draw_inclusion(m, seed)
    flat = np.zeros(d)
    flat[coords[included]] = signs[included] * settings.gradient_norm * clip
    trained, offset = dict(received), 0
    for name, size in zip(names, sizes):
        base = np.asarray(received[name])
        trained[name] = (base.astype(np.float64) + flat[offset:offset + size].reshape(base.shape)).astype(base.dtype)
        offset += size
    sent = mechanism(received, trained)
    out = np.concatenate([(np.asarray(sent[n], dtype=np.float64) - np.asarray(received[n], dtype=np.float64)).ravel()
                          for n in names])
    scores = out[coords] * signs
    finite = bool(np.isfinite(scores).all())
    counts = counts_from_scores(scores if finite else np.zeros(m), included)
    each = alpha / len(UPDATE_TESTS)
    fdp = (fdp_bound(counts, gaussian_family(2.0), delta=delta, alpha=each, claimed_noise=sigma)
           if finite and sigma > 0 else None)
    return DPAudit("dp_fedavg", counts.bound(delta, each), update_mechanism_epsilon(sigma, delta), counts, fdp,
                   tests=len(UPDATE_TESTS), details={
                       "canaries": m, "kind": "dirac", "norm_factor": settings.gradient_norm, "sigma": sigma,
                       "clip": clip, "sensitivity": 2 * clip, "local_trainings": 0,
                       "seconds": time.perf_counter() - start})


def dp_fedavg_entry(mitigation, received: Mapping, *, releases: int, audit_settings, seed: int) -> dict:
    """What a party's record says of its dp_fedavg update (audit.config.mitigation_settings.Mitigation): the
    accountant's epsilon of this round's and of its `releases` updates so far (composed) at the audit's delta, and
    with `audit.canary.dp_check` the canary check of the mitigation itself (`audit_update_mechanism`)."""
    from audit.deanon.mitigation import mitigate_update

    delta = audit_settings.epsilon_delta
    out = {"epsilon": update_mechanism_epsilon(mitigation.sigma, delta), "delta": delta, "releases": int(releases),
           "epsilon_composed": update_mechanism_epsilon(mitigation.sigma, delta, releases)}
    if audit_settings.canary.dp_check:
        out["dp_audit"] = audit_update_mechanism(
            lambda r, t: mitigate_update(mitigation, r, t, seed=seed), received, sigma=mitigation.sigma,
            clip=mitigation.clip, settings=audit_settings.canary, delta=delta, alpha=1 - audit_settings.confidence,
            seed=seed).to_dict()
    return out


def check_canary_settings(audit_settings, trainable_values: int, population_size: int | None, classes: int, *,
                          dp_training: bool, prefix: str) -> None:
    """At start, what the canary settings need of the model and the data: where a party may train with DP
    (`dp_training`), as many trainable values as gradient canaries (each has its own coordinates); population samples
    for the input canaries' construction (None: no data loaded yet, as when the plan is initialised). Raises
    SettingsError naming the key."""
    from audit.canary.inputs import max_canaries
    from audit.config.fields import SettingsError

    settings = audit_settings.canary
    explicit = settings.gradient_count != AUTO
    if dp_training and settings.dp_check and explicit and settings.gradient_count > trainable_values:
        raise SettingsError(f"{prefix}.gradient_count: {settings.gradient_count} canaries need as many of the model's "
                            f"trainable values, it has {trainable_values}")
    limit = None if population_size is None else max_canaries(settings.construction, population_size, classes)
    if audit_settings.enabled and settings.enabled and limit is not None and settings.count > limit:
        raise SettingsError(f"{prefix}.count: {settings.count} {settings.construction} canaries cannot be built from "
                            f"a population shard of {population_size} samples and {classes} classes (at most "
                            f"{limit}; construction noise has no limit)")
