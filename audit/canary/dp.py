"""The canary check of a party's DP training, beside the accountant's epsilon.

Wherever a party trains with DP, a white-box canary audit of the same mechanism gives an epsilon lower bound; the
accountant's epsilon is an upper bound on the same quantity, so a lower bound above it proves the DP training (or its
accounting) broken: the update is withheld ("DP guarantee violated by the audit"). A correct DP training trips it
with probability at most 1 - confidence per check (the bound's own error level; tests/test_canary_soundness.py checks
it on correct DP trainings).

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
  are in benchmarks/README.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

import numpy as np
import torch

from audit.canary.accountant import dp_sgd_epsilon, gaussian_epsilon, update_mechanism_epsilon
from audit.canary.gradients import GradientCanaries
from audit.canary.inputs import draw_inclusion
from audit.canary.one_run import CanaryCounts, OneRunBound, counts_from_scores
from audit.config.canary_settings import CanarySettings
from audit.config.gate_contract import DP_VIOLATED_TEXT

__all__ = ["DPRun", "DPTrainer", "DPAudit", "VIOLATION", "dp_sgd_epsilon", "gaussian_epsilon",
           "update_mechanism_epsilon", "audit_dp_training", "audit_update_mechanism", "dp_fedavg_entry",
           "check_canary_settings"]

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
    """A canary bound beside the accountant's epsilon of the same DP mechanism."""

    mechanism: str              # "dp_sgd" or "dp_fedavg"
    bound: OneRunBound
    claimed_epsilon: float      # the accountant's epsilon of the audited mechanism at bound.delta
    counts: CanaryCounts        # every guess count's right guesses: the bound at any other level (counts.bound)
    details: dict = field(default_factory=dict)

    @property
    def violated(self) -> bool:
        return self.bound.epsilon > self.claimed_epsilon

    def summary(self) -> str:
        """One line for a log: the bound, its ceiling, the accountant's epsilon, the verdict."""
        return (f"canary check epsilon >= {self.bound.epsilon:.3g} (ceiling {self.bound.ceiling:.3g} of "
                f"{self.bound.m} canaries), accountant's epsilon {self.claimed_epsilon:.3g}"
                + (f": {VIOLATION}" if self.violated else ""))

    def to_dict(self) -> dict:
        claimed = self.claimed_epsilon if math.isfinite(self.claimed_epsilon) else None
        return {"mechanism": self.mechanism, "epsilon_lb": self.bound.epsilon, "ceiling": self.bound.ceiling,
                "claimed_epsilon": claimed, "violated": self.violated,
                "reason": VIOLATION if self.violated else None, "summary": self.summary(),
                "bound": self.bound.to_dict(), "counts": self.counts.to_dict(), **self.details}


def audit_dp_training(trainer: DPTrainer, start_model: torch.nn.Module, members, settings: CanarySettings, *,
                      delta: float, alpha: float, seed: int) -> DPAudit:
    """A shadow run of the party's DP training (same start, same members) with `settings.gradient_count` gradient
    canaries; their one-run bound at level alpha beside the accountant's epsilon of that run."""
    start = time.perf_counter()
    canaries = GradientCanaries(settings.gradient_count, kind=settings.gradient_kind,
                                norm_factor=settings.gradient_norm, seed=seed)
    run = trainer(start_model, members[0], members[1], seed=seed, gradient_canaries=canaries)
    scores = canaries.scores()
    # A diverged training's gradients (non-finite scores): nothing can be read from them, nothing is proven.
    counts = counts_from_scores(scores if np.isfinite(scores).all() else np.zeros(canaries.m), canaries.included)
    claimed = dp_sgd_epsilon(run.noise_multiplier, run.sample_rate, run.steps, delta)
    return DPAudit("dp_sgd", counts.bound(delta, alpha), claimed, counts, {
        "canaries": canaries.m, "kind": settings.gradient_kind, "norm_factor": settings.gradient_norm,
        "noise_multiplier": run.noise_multiplier, "max_grad_norm": run.max_grad_norm,
        "sample_rate": run.sample_rate, "steps": run.steps, "local_trainings": 1,
        "seconds": time.perf_counter() - start})


def audit_update_mechanism(mechanism: Callable[[Mapping, Mapping], Mapping], received: Mapping, *, sigma: float,
                           clip: float, settings: CanarySettings, delta: float, alpha: float,
                           seed: int) -> DPAudit:
    """The white-box check of an update mechanism (dp_fedavg: `mechanism(received, trained) -> sent`, the party's own
    function): a synthetic update of included canary directions in, each canary scored by its coordinate out."""
    start = time.perf_counter()
    names = sorted(k for k, v in received.items() if np.asarray(v).dtype.kind == "f")
    sizes = [np.asarray(received[k]).size for k in names]
    d, m = sum(sizes), settings.gradient_count
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
    counts = counts_from_scores(scores if np.isfinite(scores).all() else np.zeros(m), included)
    return DPAudit("dp_fedavg", counts.bound(delta, alpha), update_mechanism_epsilon(sigma, delta), counts, {
        "canaries": m, "kind": "dirac", "norm_factor": settings.gradient_norm, "sigma": sigma, "clip": clip,
        "sensitivity": 2 * clip, "local_trainings": 0, "seconds": time.perf_counter() - start})


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
    if dp_training and settings.dp_check and settings.gradient_count > trainable_values:
        raise SettingsError(f"{prefix}.gradient_count: {settings.gradient_count} canaries need as many of the model's "
                            f"trainable values, it has {trainable_values}")
    limit = None if population_size is None else max_canaries(settings.construction, population_size, classes)
    if audit_settings.enabled and settings.enabled and limit is not None and settings.count > limit:
        raise SettingsError(f"{prefix}.count: {settings.count} {settings.construction} canaries cannot be built from "
                            f"a population shard of {population_size} samples and {classes} classes (at most "
                            f"{limit}; construction noise has no limit)")
