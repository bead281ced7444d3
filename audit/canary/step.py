"""The canary step of a round's audit: an epsilon lower bound of the party's local training from one shadow run.

A shadow local training with the round's exact recipe (from the received model; the party's optimiser, learning
rate, epochs and batch size, or its DP-SGD training when the audited update was trained with DP; then the party's
update mitigation, if any) on the party's members plus m input canaries (audit.canary.inputs), each included with
probability 1/2. Each canary is scored with the shadow model (its loss, the default; or its loss reduction from the
received model, which never saw it), and the one-run bound (audit.canary.one_run) of the scores is a lower bound, at
the audit's confidence and delta, on the epsilon of the training as the party runs it (for adding or removing one
example: a canary of this construction, whatever the rest of its data). Beside it the f-DP bound (audit.canary.fdp)
of the same counts: without DP, the epsilon of the most private mu-Gaussian-DP mechanism the canaries reject (not an
(epsilon, delta) bound: a training can fail mu-GDP and still be (epsilon(mu), delta)-DP); with DP, the accountant's
epsilon of the most private mechanism of the claimed kind (the shadow's DP-SGD rate and steps, or dp_fedavg's
Gaussian mechanism) they reject. Metrics `CANARY_METRICS` (audit.config.canary_settings); with DP, the accountant's
epsilon of the shadow's mechanism beside them in the record, and the claim found violated when either bound, each at
half the level, rejects it.

Private: the canaries, their inclusion and their scores stay in the party's round folder (canary.npz) and record;
the update the party sends is its real one, trained without canaries (the shadow is a separate model).
Cost: one local training (on the members and about m / 2 canaries) per audited round.
"""

from __future__ import annotations

import copy
import io
import time

import numpy as np
import torch
import torch.nn.functional as F

from audit.canary.claims import dp_sgd_family, gaussian_family, gdp_family
from audit.canary.dp import dp_sgd_epsilon, update_mechanism_epsilon
from audit.canary.fdp import fdp_bound
from audit.canary.inputs import canary_seed, draw_inclusion, input_canaries
from audit.canary.one_run import counts_from_scores
from audit.config.canary_settings import CANARY_EPSILON_LB, CANARY_FDP_EPSILON, LOSS, CanarySettings
from audit.model_io import chunks, eval_mode, model_input
from audit.reporting.atomic_io import atomic_write_bytes
from audit.config.vocabulary import CANARY_FILE
from audit.membership.uncertainty import clopper_pearson
from audit.round_audit import AuditContext, StepResult
from audit.verdict.leak import ChanceTest, EpsilonEvidence, Evidence
from audit.scaled_pixels import take_rows
from audit.training import train_references

__all__ = ["run", "CANARY_FILE", "per_sample_loss", "shadow_training"]

_UPDATE_MITIGATIONS = ("noise", "dp_fedavg")


def per_sample_loss(model: torch.nn.Module, x, y, batch_size: int) -> np.ndarray:
    """Cross-entropy of each sample under `model` in eval mode (float64)."""
    x = model_input(model, x)
    y = torch.as_tensor(np.asarray(y), dtype=torch.long, device=x.device)
    with torch.no_grad(), eval_mode(model):
        return torch.cat([F.cross_entropy(model(x[part]), y[part], reduction="none")
                          for part in chunks(len(x), batch_size)]).double().cpu().numpy()


def _state_arrays(model: torch.nn.Module) -> dict:
    return {name: t.detach().cpu().numpy() for name, t in model.state_dict().items()}


def shadow_training(global_model: torch.nn.Module, x, y, training, *, seed: int) -> tuple[torch.nn.Module, dict]:
    """The party's local training from `global_model` on (x, y) as it runs it: its DP training when `training.dp`,
    else its recipe (audit.training, as RMIA's references train); then its update mitigation. Returns the model and
    what the audited mechanism claims (its accountant's epsilon is computed by the caller at its delta)."""
    claim: dict = {"mechanism": None}
    if training.dp is not None:
        run = training.dp(global_model, x, y, seed=seed)
        shadow = copy.deepcopy(global_model)
        shadow.load_state_dict(run.state)
        claim = {"mechanism": "dp_sgd", "noise_multiplier": run.noise_multiplier, "sample_rate": run.sample_rate,
                 "steps": run.steps, "max_grad_norm": run.max_grad_norm}
    else:
        copies = train_references(global_model, x[None], np.asarray(y)[None], training.recipe, seed=seed)
        shadow = copy.deepcopy(global_model)
        shadow.load_state_dict({**{n: t[0] for n, t in copies.params.items()},
                                **{n: t[0] for n, t in copies.buffers.items()}})
    mitigation = training.update_mitigation
    if mitigation is not None and mitigation.method in _UPDATE_MITIGATIONS and mitigation.active:
        from audit.deanon.mitigation import mitigate_update

        received, trained = _state_arrays(global_model), _state_arrays(shadow)
        sent = mitigate_update(mitigation, received, trained, seed=seed)
        shadow.load_state_dict({n: torch.as_tensor(v) for n, v in sent.items()})
        if claim["mechanism"] is None and mitigation.method == "dp_fedavg":
            claim = {"mechanism": "dp_fedavg", "sigma": mitigation.sigma, "clip": mitigation.clip}
    return shadow, claim


def _claimed_family(claim: dict):
    """The claimed mechanism's family and its noise multiplier; mu-GDP (no claim) without DP."""
    if claim["mechanism"] == "dp_sgd":
        return dp_sgd_family(claim["sample_rate"], claim["steps"]), claim["noise_multiplier"]
    if claim["mechanism"] == "dp_fedavg":
        return gaussian_family(2.0), claim["sigma"]
    return gdp_family(), None


def _claimed_epsilon(claim: dict, delta: float) -> float | None:
    if claim["mechanism"] == "dp_sgd":
        return dp_sgd_epsilon(claim["noise_multiplier"], claim["sample_rate"], claim["steps"], delta)
    if claim["mechanism"] == "dp_fedavg":
        return update_mechanism_epsilon(claim["sigma"], delta)
    return None


def _predictions(model: torch.nn.Module, x, batch_size: int) -> np.ndarray:
    x = model_input(model, x)
    with torch.no_grad(), eval_mode(model):
        return torch.cat([model(x[part]).argmax(dim=1) for part in chunks(len(x), batch_size)]).cpu().numpy()


def _classes(model: torch.nn.Module, x) -> int:
    with torch.no_grad(), eval_mode(model):
        return int(model(model_input(model, np.asarray(take_rows(x, np.arange(1))))).shape[-1])


def run(context: AuditContext, settings: CanarySettings) -> StepResult:
    training = context.training
    if training is None:
        raise ValueError("the canary audit trains like the party: pass audit_round the party's LocalTraining "
                         "(training=)")
    audit = context.settings
    alpha, delta, batch = 1 - audit.confidence, audit.epsilon_delta, audit.batch_size
    start = time.perf_counter()
    population, (mx, my) = context.sets.population, context.sets.members
    classes = _classes(context.global_model, population[0])
    cx, cy = input_canaries(population, settings.count, settings.construction, classes,
                            canary_seed(context.seed, context.party, context.round_num, "inputs"),
                            predict=lambda x: _predictions(context.global_model, x, batch))
    included = draw_inclusion(settings.count, canary_seed(context.seed, context.party, context.round_num, "in"))
    x = np.concatenate([np.asarray(mx), cx[included].astype(np.asarray(mx[:1]).dtype)])
    y = np.concatenate([np.asarray(my, dtype=np.int64), cy[included]])
    training_seed = canary_seed(context.seed, context.party, context.round_num, "shadow")
    shadow, claim = shadow_training(context.global_model, x, y, training, seed=training_seed)
    trained_s = time.perf_counter() - start
    loss = per_sample_loss(shadow, cx, cy, batch)
    scores = -loss if settings.score == LOSS else per_sample_loss(context.global_model, cx, cy, batch) - loss
    if not np.isfinite(scores).all():  # the shadow diverged (as the party's own training can): nothing is shown
        scores = np.zeros(settings.count)
    counts = counts_from_scores(scores, included)
    bound = counts.bound(delta, alpha)
    no_leak = counts.no_leak_p_value()
    family, claimed_noise = _claimed_family(claim)
    fdp = fdp_bound(counts, family, delta=delta, alpha=alpha, claimed_noise=claimed_noise)
    metrics = {CANARY_EPSILON_LB: bound.epsilon, "canary_epsilon_ceiling": bound.ceiling,
               "canary_count": float(settings.count), "canary_guesses": float(bound.guess.r if bound.guess else 0),
               "canary_correct": float(bound.correct), "canary_no_leak_p_value": no_leak,
               CANARY_FDP_EPSILON: fdp.epsilon}
    details = {"bound": bound.to_dict(), "counts": counts.to_dict(), "no_leak_p_value": no_leak, "fdp": fdp.to_dict(),
               "construction": settings.construction, "score": settings.score, "count": settings.count,
               "included": int(included.sum()), "training_set_size": int(len(y)), "members": int(len(my)),
               "local_trainings": 1, "training_s": trained_s, "mechanism": claim}
    claimed = _claimed_epsilon(claim, delta)
    if claim["mechanism"] is not None:
        # the claim tested twice (each bound at alpha / 2): violated when either rejects it
        half = counts.bound(delta, alpha / 2)
        fdp_half = fdp_bound(counts, family, delta=delta, alpha=alpha / 2, claimed_noise=claimed_noise)
        details["dp"] = {"claimed_epsilon": claimed, "epsilon_lb": bound.epsilon, "fdp_epsilon": fdp.epsilon,
                         "violated": bool(claimed is not None and (half.epsilon > claimed
                                                                   or fdp_half.claim_rejected))}

    def write_canaries(round_dir):  # the canaries, their inclusion and scores: only in this party's round folder
        buffer = io.BytesIO()
        np.savez_compressed(buffer, labels=cy, included=included, scores=scores)
        atomic_write_bytes(round_dir / CANARY_FILE, buffer.getvalue())

    return StepResult(metrics=metrics, details=details, timings={"canary_training_s": trained_s},
                      write_private=write_canaries, evidence=canary_evidence(counts, bound, delta, no_leak))


def canary_evidence(counts, bound, delta: float, no_leak: float) -> Evidence:
    """The canaries in the round's leak verdict (audit.verdict.leak): the share of right guesses against chance (1/2;
    the p-value is already corrected for the choice of the guess count), and the one-run bound, recomputed at the
    verdict's corrected level."""
    guesses = bound.guess.r if bound.guess else max((c.guess.r for c in counts.counts), default=0)
    correct = bound.correct if bound.guess else 0
    share = correct / guesses if guesses else 0.0

    def interval(confidence: float) -> tuple[float, float]:
        if not guesses:
            return 0.0, 1.0
        found = clopper_pearson(correct, guesses, confidence)
        return found.lower, found.upper

    test = ChanceTest("canary / one run", "guess_accuracy", "canary_no_leak_p_value", share, 0.5, float(no_leak),
                      {"canaries": counts.m, "guesses": guesses, "correct": correct}, interval)
    epsilon = EpsilonEvidence("canary / one run",
                              bound=lambda confidence: counts.bound(delta, 1.0 - confidence).epsilon,
                              ceiling=lambda confidence: counts.bound(delta, 1.0 - confidence).ceiling,
                              counts={"canaries": counts.m})
    return Evidence((test,), (epsilon,))
