"""A collaborator's deanonymization self-audit: could a server with some prior data tell this update is ours?

The adversary (Orekondy et al., seeds 000/001) knows some data of every user ("prior"); it trains shadow updates
on it, from the round's global model with the collaborators' local recipe, learns what each user's updates look
like and names the owner of anonymous updates. Here the collaborator plays that server against itself:
- users: this collaborator (prior = its own data not trained on: a random part of its non-member shard; private
  = its members) and a crowd of K synthetic users from the population data (audit.deanon.crowd), as skewed as
  the federation;
- training data of the attacks: S shadow updates per user, each on a random subset of that user's prior;
- anonymous updates: this collaborator's real update (what it is about to send) and one update per crowd user
  trained on its private part, the size of this collaborator's training set.
Every user stands alike towards the adversary (audit_sizes): the same prior size, the same private size (the
member count: an update's direction depends on the number of steps), no sample in two users. The crowd is as
large as the population shard holds, at most `crowd_users`. A population shard too small for two users of that
size (the OpenFL tutorial's split, 0.4 / 0.4 / 0.2, gives half the member count) gets the audit sized to it: two
crowd users whose private data and prior shrink together, and a note that says so.
Metrics (all scalars; only these leave the collaborator): per attack mean AP, AP over chance, top-1/top-5, and
this collaborator's own rank and AP; `deanon_ap_over_chance` is the strongest re-identification attack's ratio.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import asdict, dataclass

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning

from audit.deanon.attacks import match, reidentify, single_threaded
from audit.deanon.crowd import crowd_capacity, draw_crowd
from audit.deanon.representation import last_layer, layer_tensor_names, normalise_rows, update_vector
from audit.config.deanon_settings import REID_ATTACKS, DeanonSettings
from audit.training import TrainingRecipe, train_copies

__all__ = ["SELF", "DeanonResult", "AuditSizes", "audit_sizes", "deanon_self_audit"]

SELF = "self"
MIN_CROWD = 2  # the smallest crowd audit.deanon.crowd_users allows
PLAN_KEY = "task_runner.settings.audit.deanon"  # where a plan sets these, for messages
logger = logging.getLogger(__name__)


@dataclass
class DeanonResult:
    metrics: dict      # scalar metrics
    details: dict      # JSON-able: per-attack results, sizes, the crowd's skew, timings

    def to_dict(self) -> dict:
        return {"metrics": self.metrics, **self.details}


@dataclass(frozen=True)
class AuditSizes:
    """How much data each user of the self-audit gets; the same for the collaborator and every crowd user, but for
    the private data of a crowd sized to a small population shard (`private_size` below the member count)."""

    crowd_users: int         # K, the crowd actually drawn
    prior_size: int          # every user's prior (the collaborator's: a random part of its non-members)
    private_size: int        # every crowd user's private data: the member count (the collaborator's private data),
    #                          or less where the population shard cannot hold two users of it
    shadow_size: int         # samples per shadow update, a subset of the user's prior
    crowd_note: str | None = None  # how the audit was sized, where it differs from the plan's settings


def audit_sizes(member_count: int, prior_count: int, population_count: int, settings: DeanonSettings) -> AuditSizes:
    """The self-audit's sizes for a collaborator with these shard sizes (see the module docstring).

    The crowd's K users need K * (prior + private) distinct population samples, and the private size is the member
    count. The crowd is as large as fits with one shadow update's data as the prior (all non-members if fewer),
    at most `crowd_users`. What the population has beyond that goes to a larger prior for every user (at most the
    non-member count: the collaborator's prior is a part of it). A population that cannot give 2 users (a crowd of
    one is no crowd) that much sizes the audit to it: each of the 2 users gets half of it, split between private
    data and prior in the same proportion (so the shadow updates keep the size of the crowd's anonymous ones), and
    the note says how. Only a population that cannot give 2 users one private and one prior sample fails, naming the
    data settings.
    """
    private = int(member_count)
    if private < 1 or prior_count < 1:
        raise ValueError(f"{PLAN_KEY}: the self-audit needs members and non-members, got {private} and {prior_count}")
    wanted_shadow = settings.shadow_size or private
    smallest_prior = min(wanted_shadow, int(prior_count))
    capacity = crowd_capacity(population_count, smallest_prior, private)
    notes = []
    if capacity >= MIN_CROWD:
        users = min(settings.crowd_users, capacity)
        prior = min(int(prior_count), population_count // users - private)
        shadow = min(wanted_shadow, prior)
        if users < settings.crowd_users:
            notes.append(f"a crowd of {users} users, not {PLAN_KEY}.crowd_users = {settings.crowd_users}")
        if shadow < wanted_shadow:
            notes.append(f"shadow updates on {shadow} samples, not {wanted_shadow} ({PLAN_KEY}.shadow_size or the "
                         f"member count)")
        note = None
        if notes:
            note = (f"{' and '.join(notes)}: every user gets {prior} prior + {private} private samples, no sample in "
                    f"two users, from {prior_count} non-members and a population shard of {population_count}")
    else:
        users, share = MIN_CROWD, population_count // MIN_CROWD
        crowd_private = share * private // (private + smallest_prior)
        prior = share - crowd_private
        if crowd_private < 1 or prior < 1:
            raise ValueError(
                f"{PLAN_KEY}: the population shard ({population_count} samples) cannot give {MIN_CROWD} crowd users "
                "one private and one prior sample each; raise data_loader.settings.audit_dataset_ratio")
        shadow = min(wanted_shadow, prior)
        not_asked = "" if settings.crowd_users == MIN_CROWD else f" (not {settings.crowd_users})"
        note = (f"sized to the population shard: {MIN_CROWD} crowd users{not_asked} of {crowd_private} private + "
                f"{prior} prior samples each, shadow updates on {shadow} samples: its {population_count} samples "
                f"cannot give {MIN_CROWD} users the member count ({private}) and a prior of {smallest_prior}; the "
                f"collaborator's update stays its own, on its {private} members (prior: {prior} of its {prior_count} "
                "non-members)")
        private = crowd_private
    return AuditSizes(crowd_users=users, prior_size=prior, private_size=private, shadow_size=shadow, crowd_note=note)


_NOTED: set = set()  # notes already logged in this process: a shrunk crowd is logged once, not every round


def _subsets(x, y, pool: np.ndarray, count: int, size: int, rng: np.random.Generator):
    """`count` random subsets of `size` distinct samples from x[pool] (stacked: (count, size, ...))."""
    picks = np.stack([rng.choice(pool, size=size, replace=False) for _ in range(count)])
    return x[picks], y[picks]


def _attack(settings, shadows, shadow_labels, anonymous, anonymous_labels, seed, metrics: dict, attacks: dict):
    """Each attack of `settings` trained on the shadow updates, scored on the anonymous ones (into metrics, attacks)."""
    for attack in settings.attacks:
        if attack in REID_ATTACKS:
            result = reidentify(shadows, shadow_labels, anonymous, anonymous_labels, attack, seed=seed)
            own_rank = result.rank_of(SELF)
            metrics.update({
                f"deanon_{attack}_ap": result.mean_ap, f"deanon_{attack}_ap_over_chance": result.ap_over_chance,
                f"deanon_{attack}_top1": result.top1, f"deanon_{attack}_top5": result.top5,
                f"deanon_{attack}_own_rank": own_rank,
                f"deanon_{attack}_own_ap_over_chance": result.per_user_ap[SELF] / result.per_user_chance[SELF],
            })
            attacks[attack] = {**result.to_dict(), "own_rank": own_rank}
        else:
            result = match(shadows, shadow_labels, anonymous, anonymous_labels, shadows, shadow_labels, seed=seed)
            metrics.update({f"deanon_{attack}_ap": result.ap, f"deanon_{attack}_ap_over_chance": result.ap_over_chance})
            attacks[attack] = result.to_dict()


def deanon_self_audit(global_model: torch.nn.Module, trained_model: torch.nn.Module, prior: tuple, member_count: int,
                      population: tuple, recipe: TrainingRecipe, settings: DeanonSettings, *,
                      federation_alpha: float | None, seed: int) -> DeanonResult:
    """Run the self-audit of the update `trained_model - global_model` (see the module docstring).

    prior: (x, y) this collaborator's data the adversary may know; population: (x, y) the crowd's pool.
    """
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    layer = settings.layer or last_layer(global_model)
    names = layer_tensor_names([n for n, _ in global_model.named_parameters()], layer)
    prior_x, prior_y = np.asarray(prior[0]), np.asarray(prior[1])
    pop_x, pop_y = np.asarray(population[0]), np.asarray(population[1])
    sizes = audit_sizes(member_count, len(prior_y), len(pop_y), settings)
    if sizes.crowd_note is not None and sizes.crowd_note not in _NOTED:
        _NOTED.add(sizes.crowd_note)
        logger.warning("deanonymization self-audit: %s", sizes.crowd_note)
    alpha = settings.crowd_skew(federation_alpha)
    own_prior = rng.choice(len(prior_y), size=sizes.prior_size, replace=False)
    crowd = draw_crowd(pop_y, sizes.crowd_users, sizes.prior_size, sizes.private_size, alpha, seed=seed)

    # Shadow updates: S per user, each on a random subset of that user's prior.
    S = settings.shadows_per_user
    xs, ys, labels = [], [], []
    own_x, own_y = _subsets(prior_x, prior_y, own_prior, S, sizes.shadow_size, rng)
    xs.append(own_x), ys.append(own_y), labels.extend([SELF] * S)
    for k, user in enumerate(crowd):
        cx, cy = _subsets(pop_x, pop_y, user.prior, S, sizes.shadow_size, rng)
        xs.append(cx), ys.append(cy), labels.extend([f"crowd_{k:02d}"] * S)
    shadows = normalise_rows(train_copies(global_model, np.concatenate(xs), np.concatenate(ys), recipe,
                                          names=names, seed=seed))
    shadow_labels = np.array(labels)

    # Anonymous updates: the real one, and the crowd's private ones.
    crowd_private = normalise_rows(train_copies(
        global_model, pop_x[np.stack([u.private for u in crowd])], pop_y[np.stack([u.private for u in crowd])],
        recipe, names=names, seed=seed + 1))
    received = dict(global_model.named_parameters())
    own = update_vector(received, dict(trained_model.named_parameters()), names)
    anonymous = np.concatenate([own[None, :], crowd_private])
    anonymous_labels = np.array([SELF] + [f"crowd_{k:02d}" for k in range(len(crowd))])
    shadow_s = time.perf_counter() - start

    metrics, attacks = {}, {}
    with single_threaded(), warnings.catch_warnings():
        # sklearn's MLP / LinearSVC warn that a few dozen samples did not "converge"; the scores are what counts.
        warnings.simplefilter("ignore", ConvergenceWarning)
        _attack(settings, shadows, shadow_labels, anonymous, anonymous_labels, seed, metrics, attacks)
    reid = [metrics[f"deanon_{a}_ap_over_chance"] for a in settings.attacks if a in REID_ATTACKS]
    if reid:
        metrics["deanon_ap_over_chance"] = max(reid)
    details = {
        "layer": layer, "dimension": int(shadows.shape[1]), **asdict(sizes),
        "crowd_users_requested": settings.crowd_users, "crowd_alpha": alpha, "shadows_per_user": S,
        "attacks": attacks,
        "timings": {"shadow_training_s": shadow_s, "total_s": time.perf_counter() - start},
    }
    return DeanonResult(metrics=metrics, details=details)
