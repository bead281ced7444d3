"""One round's membership-inference audit of a party's update.

Given the model the party received this round (global) and the model it trained from it (local), compute
the per-sample signals on its members (train shard), non-members (test shard) and population (audit shard),
run the population attack for each signal and model, and the update-based attack (loss under the received
model minus loss under the trained one); optionally the Fidel reconstruction audit and the deanonymization
self-audit (the non-members are the adversary's prior data of this party). Returns a JSON-able round record the report writer stores and
flat scalar metrics that may leave the party.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch

from audit.deanon_audit import deanon_self_audit
from audit.fidel import fidel_audit
from audit.fidel_decoder import train_decoder
from audit.population_attack import population_attack, tolerance_name, update_attack
from audit.settings import AuditSettings
from audit.shadow_training import TrainingRecipe
from audit.signals import compute_signals, member_if_lower

SETS = ("members", "nonmembers", "population")


@dataclass(frozen=True)
class AuditSets:
    """The three sample sets the audit needs, each (x, y)."""

    members: tuple[np.ndarray, np.ndarray]
    nonmembers: tuple[np.ndarray, np.ndarray]
    population: tuple[np.ndarray, np.ndarray]

    @classmethod
    def from_mapping(cls, sets: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> "AuditSets":
        missing = [name for name in SETS if name not in sets]
        if missing:
            raise ValueError(f"audit sets: missing {missing}; need {list(SETS)}")
        return cls(**{name: sets[name] for name in SETS})

    def tensors(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The set as tensors: floating inputs as float32, integer inputs (token ids) as they are, labels int64."""
        x, y = getattr(self, name)
        x = torch.as_tensor(np.asarray(x))
        if x.is_floating_point():
            x = x.float()
        return x, torch.as_tensor(np.asarray(y), dtype=torch.int64)


@dataclass(frozen=True)
class DeanonContext:
    """The collaborator's facts the deanonymization self-audit needs (audit.deanon_audit)."""

    recipe: TrainingRecipe          # the local training recipe, for the shadow updates
    member_count: int               # how many samples the real update was trained on (before any mitigation)
    federation_alpha: float | None  # the federation's label skew (None = IID)


def _signals_per_set(model, sets: AuditSets, names, settings: AuditSettings) -> tuple[dict, dict]:
    """signal name -> set name -> values, and signal name -> seconds spent over the three sets.

    One compute_signals call per set: the signals share its forward pass (see compute_signals)."""
    values: dict[str, dict[str, np.ndarray]] = {name: {} for name in names}
    seconds = {name: 0.0 for name in names}
    for set_name in SETS:
        x, y = sets.tensors(set_name)
        timings: dict[str, float] = {}
        found = compute_signals(model, x, y, list(names), layer=settings.gradient_layer,
                                batch_size=settings.batch_size, timings=timings)
        for name in names:
            values[name][set_name] = found[name]
            seconds[name] += timings[name]
    return values, seconds


def _population_attacks(signal_values: dict, settings: AuditSettings) -> dict:
    return {
        name: population_attack(
            per_set["members"],
            per_set["nonmembers"],
            per_set["population"],
            settings.fpr_tolerance,
            signal=name,
            member_if_lower=member_if_lower(name),
            threshold_function=settings.threshold_function,
        )
        for name, per_set in signal_values.items()
    }


def scalar_metrics(attacks: Mapping[str, Mapping[str, object]]) -> dict[str, float]:
    """Flat scalars: mia_<model>_<signal>_auc (Privacy Meter's grid AUC), mia_<model>_<signal>_exact_auc (the
    members-vs-non-members AUC over every threshold) and mia_<model>_<signal>_tpr_at_fpr_<t>."""
    metrics: dict[str, float] = {}
    for model_kind, per_signal in attacks.items():
        for signal, result in per_signal.items():
            prefix = f"mia_{model_kind}_{signal}"
            metrics[f"{prefix}_auc"] = float(result.auc)
            metrics[f"{prefix}_exact_auc"] = float(result.exact_auc)
            for tolerance, tpr in result.tpr_at_fpr.items():
                metrics[f"{prefix}_tpr_at_fpr_{tolerance_name(tolerance)}"] = float(tpr)
    return metrics


def audit_round(
    local_model: torch.nn.Module,
    global_model: torch.nn.Module | None,
    sets: AuditSets,
    settings: AuditSettings,
    *,
    party: str,
    round_num: int,
    seed: int | None = None,
    deanon: DeanonContext | None = None,
) -> dict:
    """Audit one round; returns the round record (see audit.report for its layout).

    The record's "attacks" hold AttackResult objects; `record_to_json` turns them into dicts.
    `deanon`: what the deanonymization self-audit needs besides the sets (run when settings.deanon is due).
    """
    start = time.perf_counter()
    wanted = list(settings.signals)
    need_global = global_model is not None and (settings.audit_global or settings.update_attack)
    # The update attack needs the loss under both models, whether or not "loss" is an audited signal.
    extra_loss = ["loss"] if settings.update_attack and "loss" not in wanted else []

    local_values, local_seconds = _signals_per_set(local_model, sets, wanted + extra_loss, settings)
    attacks = {"local": _population_attacks({k: local_values[k] for k in wanted}, settings)}
    signal_seconds = {"local": local_seconds}

    if need_global:
        global_names = list(wanted) if settings.audit_global else []
        if settings.update_attack and "loss" not in global_names:
            global_names.append("loss")
        global_values, global_seconds = _signals_per_set(global_model, sets, global_names, settings)
        signal_seconds["global"] = global_seconds
        if settings.audit_global:
            attacks["global"] = _population_attacks({k: global_values[k] for k in wanted}, settings)
        if settings.update_attack:
            g, lo = global_values["loss"], local_values["loss"]
            attacks["update"] = {
                "loss_reduction": update_attack(
                    g["members"], lo["members"],
                    g["nonmembers"], lo["nonmembers"],
                    g["population"], lo["population"],
                    settings.fpr_tolerance,
                )
            }

    metrics = scalar_metrics(attacks)
    extra: dict = {}
    timings = {"signals_s": signal_seconds}
    fidel = None
    if settings.fidel and global_model is not None:
        fidel_start = time.perf_counter()
        fidel = run_fidel(local_model, global_model, sets, settings, seed=seed)
        metrics.update(fidel.metrics())
        extra["fidel"] = fidel.to_dict()
        timings["fidel_s"] = time.perf_counter() - fidel_start
    if deanon is not None and global_model is not None and settings.deanon.due(round_num):
        deanon_start = time.perf_counter()
        result = deanon_self_audit(
            global_model, local_model, sets.nonmembers, deanon.member_count, sets.population, deanon.recipe,
            settings.deanon, federation_alpha=deanon.federation_alpha, seed=seed or 0,
        )
        metrics.update(result.metrics)
        extra["deanon"] = result.to_dict()
        timings["deanon_s"] = time.perf_counter() - deanon_start
    timings["audit_s"] = time.perf_counter() - start

    return {
        "party": party,
        "round": int(round_num),
        "seed": seed,
        "settings": settings.to_dict(),
        "timings": timings,
        "attacks": attacks,
        "metrics": metrics,
        "sizes": {name: int(len(getattr(sets, name)[1])) for name in SETS},
        "extra": extra,
        # In-memory only (record_to_json drops it): the reconstructions, for the collaborator's own grid image.
        "_fidel": fidel,
    }


def run_fidel(local_model, global_model, sets: AuditSets, settings: AuditSettings, *, seed: int | None):
    """The Fidel reconstruction audit of this update against the round's training samples (the members)."""
    decoder = None
    if settings.fidel_decoder:  # fitted on the population under the received model, never on members
        decoder = train_decoder(global_model, sets.population[0], layer=settings.fidel_layer)
    return fidel_audit(
        global_model, local_model, sets.members[0], layer=settings.fidel_layer,
        threshold=settings.fidel_threshold, seed=seed or 0, decoder=decoder, batch_size=settings.batch_size,
    )


def record_to_json(record: dict) -> dict:
    """The round record with every AttackResult replaced by its JSON-able dict."""
    out = {key: value for key, value in record.items() if not key.startswith("_")}
    out["attacks"] = {
        kind: {signal: result.to_dict() for signal, result in per_signal.items()}
        for kind, per_signal in record["attacks"].items()
    }
    return out
