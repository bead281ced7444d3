"""The membership-inference step of a round's audit: signals of the local (and global) model on members,
non-members and population; Privacy Meter's population attack per model and signal; the update attack (loss under
the received model minus loss under the trained one). Every figure comes with its interval, the epsilon lower bound
and the advantage (audit.membership.uncertainty, computed by the attacks)."""

from __future__ import annotations

import io

import numpy as np

from audit.membership.attack_uncertainty import attack_metrics
from audit.membership.population_attack import population_attack, update_attack
from audit.membership.signals import compute_signals, member_if_lower
from audit.reporting.atomic_io import atomic_write_bytes
from audit.reporting.records import SIGNALS_FILE
from audit.round_audit import SETS, AuditContext, AuditSets, StepResult
from audit.round_record import attack_keys

__all__ = ["run", "scalar_metrics"]


def _signals_per_set(model, sets: AuditSets, names, settings, signal_cache=None) -> tuple[dict, dict]:
    """signal name -> set name -> values, and signal name -> seconds spent over the three sets.

    One compute_signals call per set: the signals share its forward pass (see compute_signals). With the party's
    SignalCache, signals already computed this round on the same weights and set are reused (the party's validation of the
    received model computes them before training)."""
    if signal_cache is not None:
        values, seconds, _ = signal_cache.signals(model, sets, list(names), layer=settings.gradient_layer,
                                          batch_size=settings.batch_size)
        return values, seconds
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


def signal_names(settings) -> tuple[list[str], list[str]]:
    """The signals the step computes on the local model and on the received global model (empty if neither the
    global audit nor the update attack runs). The update attack needs the loss under both."""
    wanted = list(settings.signals)
    extra_loss = ["loss"] if settings.update_attack and "loss" not in wanted else []
    global_names = list(wanted) if settings.audit_global else []
    if settings.update_attack and "loss" not in global_names:
        global_names.append("loss")
    return wanted + extra_loss, global_names


def _population_attacks(signal_values: dict, settings) -> dict:
    return {
        name: population_attack(
            per_set["members"], per_set["nonmembers"], per_set["population"], settings.fpr_tolerance,
            signal=name, member_if_lower=member_if_lower(name), threshold_function=settings.threshold_function,
            confidence=settings.confidence, delta=settings.epsilon_delta,
        )
        for name, per_set in signal_values.items()
    }


def scalar_metrics(attacks) -> dict[str, float]:
    """Flat scalars mia_<model>_<signal>_<statistic> (see `attack_metrics`), named by each attack's AttackKey: the
    names audit.config.builtin_steps declares. `attacks`: AttackKey -> AttackResult, or model -> signal -> result."""
    return {key.metric(statistic): value for key, result in attack_keys(attacks).items()
            for statistic, value in attack_metrics(result).items()}


def run(context: AuditContext, settings) -> StepResult:
    """The membership audit; `settings` is the AuditSettings (its keys are the audit section's own)."""
    sets, global_model = context.mia_sets, context.global_model
    wanted = list(settings.signals)
    local_names, global_names = signal_names(settings)

    local_values, local_seconds = _signals_per_set(context.local_model, sets, local_names, settings, context.signal_cache)
    kind = context.model_kind  # "local", or "final" for the final global model (audit.round_audit.audit_final_model)
    attacks = {kind: _population_attacks({k: local_values[k] for k in wanted}, settings)}
    signal_seconds = {kind: local_seconds}

    if global_model is not None and global_names:
        global_values, global_seconds = _signals_per_set(global_model, sets, global_names, settings, context.signal_cache)
        signal_seconds["global"] = global_seconds
        if settings.audit_global:
            attacks["global"] = _population_attacks({k: global_values[k] for k in wanted}, settings)
        if settings.update_attack:
            g, lo = global_values["loss"], local_values["loss"]
            attacks["update"] = {"loss_reduction": update_attack(
                g["members"], lo["members"], g["nonmembers"], lo["nonmembers"], g["population"], lo["population"],
                settings.fpr_tolerance, confidence=settings.confidence, delta=settings.epsilon_delta,
            )}
    scores = {f"{kind}_{name}_{set_name}": values for name in wanted for set_name, values in local_values[name].items()}
    if "global" in attacks:
        scores.update({f"global_{name}_{set_name}": values
                       for name in wanted for set_name, values in global_values[name].items()})
    if "update" in attacks:
        scores.update({f"update_loss_reduction_{set_name}": global_values["loss"][set_name] - local_values["loss"][set_name]
                       for set_name in SETS})

    def write_signals(round_dir):  # per-sample signals (the report's histograms): only in this party's round folder
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **scores)
        atomic_write_bytes(round_dir / SIGNALS_FILE, buffer.getvalue(), private=True)

    keyed = attack_keys(attacks)
    return StepResult(metrics=scalar_metrics(keyed), attacks=keyed, timings={"signals_s": signal_seconds},
                      write_private=write_signals)
