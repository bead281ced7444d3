"""A collaborator's deanonymization self-audit: could a server with some prior data tell this update is ours?

The adversary (Orekondy et al., seeds 000/001) knows some data of every user ("prior"); it trains shadow updates
on it, from the round's global model with the collaborators' local recipe, learns what each user's updates look
like and names the owner of anonymous updates. Here the collaborator plays that server against itself:
- users: this collaborator (prior = its own data not trained on, by default its non-member shard) and a crowd
  of K synthetic users from the population data (audit.deanon.crowd), as skewed as the federation;
- training data of the attacks: S shadow updates per user, each on a random subset of that user's prior;
- anonymous updates: this collaborator's real update (what it is about to send) and one update per crowd user
  trained on its private part, the size of this collaborator's training set.
Metrics (all scalars; only these leave the collaborator): per attack mean AP, AP over chance, top-1/top-5, and
this collaborator's own rank and AP; `deanon_ap_over_chance` is the strongest re-identification attack's ratio.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning

from audit.deanon.attacks import match, reidentify, single_threaded
from audit.deanon.crowd import draw_crowd
from audit.deanon.representation import last_layer, layer_tensor_names, normalise_rows, update_vector
from audit.config.deanon_settings import REID_ATTACKS, DeanonSettings
from audit.training import TrainingRecipe, train_copies

__all__ = ["SELF", "DeanonResult", "deanon_self_audit"]

SELF = "self"


@dataclass
class DeanonResult:
    metrics: dict      # scalar metrics
    details: dict      # JSON-able: per-attack results, sizes, the crowd's skew, timings

    def to_dict(self) -> dict:
        return {"metrics": self.metrics, **self.details}


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
    private_size = int(member_count)
    shadow_size = min(settings.shadow_size or private_size, len(prior_y))
    crowd_prior = len(prior_y)  # the adversary knows as much of every user
    alpha = settings.crowd_skew(federation_alpha)
    crowd = draw_crowd(pop_y, settings.crowd_users, crowd_prior, private_size, alpha, seed=seed)

    # Shadow updates: S per user, each on a random subset of that user's prior.
    S = settings.shadows_per_user
    xs, ys, labels = [], [], []
    own_x, own_y = _subsets(prior_x, prior_y, np.arange(len(prior_y)), S, shadow_size, rng)
    xs.append(own_x), ys.append(own_y), labels.extend([SELF] * S)
    for k, user in enumerate(crowd):
        cx, cy = _subsets(pop_x, pop_y, user.prior, S, shadow_size, rng)
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
        "layer": layer, "dimension": int(shadows.shape[1]), "crowd_users": len(crowd), "crowd_alpha": alpha,
        "shadows_per_user": S, "shadow_size": shadow_size, "crowd_prior_size": crowd_prior,
        "private_size": private_size, "attacks": attacks,
        "timings": {"shadow_training_s": shadow_s, "total_s": time.perf_counter() - start},
    }
    return DeanonResult(metrics=metrics, details=details)
