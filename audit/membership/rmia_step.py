"""The RMIA step of a round's audit: RMIA (audit.membership.rmia) on the locally trained model, once per kind of
reference the plan lists (audit.config.rmia_settings): the received global model, references fine-tuned from it,
references that never saw the party's data (audit.membership.references).

Each attack's scores go through the population attack's thresholds and statistics (member iff score above a
threshold set on the population's own leave-one-out scores), so RMIA reports what the other attacks report, with the
same intervals, epsilon lower bound and advantage: metrics rmia_<kind>_<statistic>. The per-sample scores stay in the
party's round folder (rmia_scores.npz), never in the metrics.
"""

from __future__ import annotations

import io
import time

import numpy as np
import torch

from audit.config.rmia_settings import (FINE_TUNED, GLOBAL, GLOBAL_A, INDEPENDENT, REFERENCE_DISK_SHARE, TUNE,
                                        RMIASettings)
from audit.config.vocabulary import FINAL, RMIA
from audit.membership.population_attack import population_attack
from audit.membership.references import (References, fine_tuned_references, independent_references,
                                         reference_seed)
from audit.membership.rmia import (OFFLINE_A_GRID, Signals, ZeroMarginal, rmia, true_class_probability,
                                   tune_offline_a)
from audit.membership.attack_uncertainty import attack_metrics
from audit.model_io import chunks, eval_mode, model_input
from audit.reporting.atomic_io import atomic_write_bytes
from audit.reporting.records import RMIA_SCORES_FILE
from audit.round_audit import SETS, AuditContext, StepResult
from audit.round_record import AttackKey

__all__ = ["run", "tuned_a"]


def _logits(model: torch.nn.Module, x, batch_size: int) -> np.ndarray:
    x = model_input(model, x)
    with torch.no_grad(), eval_mode(model):
        return torch.cat([model(x[part]) for part in chunks(len(x), batch_size)]).double().cpu().numpy()


def _probabilities(model, sets, settings: RMIASettings, batch_size: int, signal_cache=None) -> dict[str, np.ndarray]:
    """Pr(x | model) = softmax(z / T)[y] on each set; the outputs the round's signals already took of the same
    weights and set (the SignalCache's) are reused."""
    known = {} if signal_cache is None else signal_cache.logits(model, sets, batch_size=batch_size)
    return {name: true_class_probability(known[name] if name in known else
                                         _logits(model, getattr(sets, name)[0], batch_size),
                                         np.asarray(getattr(sets, name)[1]), settings.temperature)
            for name in SETS}


def tuned_a(references: np.ndarray, trained: np.ndarray, gamma: float) -> tuple[float, dict]:
    """Privacy Meter v2's tuning of `a` (each reference in turn plays the target, the others are its references;
    the `a` with the highest AUC on its known IN and OUT population samples), averaged over every reference that can
    play the target, for a choice that does not hang on one reference's draw. Returns a and what it rests on."""
    per_target = []
    for paired in range(len(references)):
        try:
            per_target.append(tune_offline_a(references, trained, references, trained, paired=paired, gamma=gamma))
        except ValueError:  # this reference has no usable IN / OUT / population samples
            continue
    if not per_target:  # e.g. K x the member count covers the whole population: no sample is OUT of them all
        return GLOBAL_A, {"tuned": False, "why": "no reference has usable IN and OUT population samples (the "
                          "references cover the population: it needs more than K x the member count samples)"}
    mean = {a: float(np.mean([t.aucs[a] for t in per_target])) for a in OFFLINE_A_GRID}
    best = max(OFFLINE_A_GRID, key=lambda a: (mean[a], -OFFLINE_A_GRID.index(a)))
    return best, {"tuned": True, "mean_auc": {f"{a:g}": v for a, v in mean.items()}, "targets": len(per_target),
                  "n_in": per_target[0].n_in, "n_out": per_target[0].n_out}


def _references(kind: str, context: AuditContext, settings: RMIASettings, round_num: int) -> References:
    """This round's references of a trained kind: trained on the first audit of the round, reused after."""
    training = context.training
    if training is None:
        raise ValueError(f"RMIA's {kind} references train like the party: pass audit_round the party's "
                         "LocalTraining (training=)")
    state = context.store.setdefault("rmia", {})
    if state.get("round") != round_num:
        state["round"], state["trained"] = round_num, {}
    if kind in state["trained"]:  # a second audit of the round (a DP retrain's): same references, no training
        refs = state["trained"][kind]
        return References(refs.kind, refs.copies, refs.population_in, refs.trainings, 0.0)
    population, k = context.mia_sets.population, settings.reference_models
    size = settings.reference_size(training.member_count)
    if kind == FINE_TUNED:
        refs = fine_tuned_references(context.global_model, population, training.recipe, k=k, size=size,
                                     seed=reference_seed(context.seed, context.party, round_num, kind))
    else:
        if context.initial_model is None:
            raise ValueError("RMIA's independent references start from the plan's initial model: pass audit_round "
                             "initial_model=")
        refs = independent_references(state.setdefault(INDEPENDENT, {}), context.initial_model, population,
                                      training.recipe, k=k, size=size, trainings=round_num + 1,
                                      seed=reference_seed(context.seed, context.party, 0, kind))
    state["trained"][kind] = refs
    return refs


def _final_references(kind: str, context: AuditContext, settings: RMIASettings) -> References | str:
    """The references of the final global model (audit.round_audit.audit_final_model, `round_num` the number of
    training rounds): those the party's last audited round trained, never on its data. Independent ones are brought to
    as many local trainings as the final model has had (one a round: the last round's already are); fine-tuned ones
    start from the model a round received, so only the last round's can serve. A string: why there are none."""
    state = context.store.setdefault("rmia", {})
    last = context.round_num - 1
    if kind == FINE_TUNED:
        if state.get("round") != last or kind not in state.get("trained", {}):
            return (f"no fine-tuned references of the last round ({last}): they start from the model that round "
                    "received, and were not trained then (its audit or RMIA's interval skipped it)")
        refs = state["trained"][kind]
        return References(refs.kind, refs.copies, refs.population_in, refs.trainings, 0.0)
    training = context.training
    if training is None:
        return "no local training of the party to train the references like (no round was trained)"
    if context.initial_model is None:
        return "no initial model to start the independent references from"
    population, k = context.mia_sets.population, settings.reference_models
    return independent_references(state.setdefault(INDEPENDENT, {}), context.initial_model, population,
                                  training.recipe, k=k, size=settings.reference_size(training.member_count),
                                  trainings=context.round_num,
                                  seed=reference_seed(context.seed, context.party, 0, kind))


def run(context: AuditContext, settings: RMIASettings) -> StepResult:
    audit = context.settings
    sets, batch = context.mia_sets, audit.batch_size
    target = _probabilities(context.local_model, sets, settings, batch, context.signal_cache)
    attacks, metrics, details, seconds, scores = {}, {}, {}, {}, {}
    final = context.model_kind == FINAL
    for kind in settings.references:
        start = time.perf_counter()
        refs = None
        if final:
            refs = (_final_references(kind, context, settings) if kind != GLOBAL else
                    "the final model is the global model: no received model to compare it with")
            if isinstance(refs, str):
                details[kind] = {"skipped": refs}
                seconds[kind] = time.perf_counter() - start
                continue
        if kind == GLOBAL and not final:
            received = _probabilities(context.global_model, sets, settings, batch, context.signal_cache)
            signals = {name: Signals(target[name], global_model=received[name]) for name in SETS}
            a = GLOBAL_A if settings.offline_a == TUNE else settings.offline_a
            info = {"reference_models": 0, "offline_a": a, "a_tuning": {"tuned": False, "why": "no reference with a "
                    "known training set" if settings.offline_a == TUNE else "fixed by the plan"}}
        else:
            refs = refs if refs is not None else _references(kind, context, settings, context.round_num)
            logits = {name: refs.copies.logits(getattr(sets, name)[0], batch_size=batch) for name in SETS}
            # A reference whose training diverged (the party's own recipe can: its update is then withheld as
            # non-finite) has no probabilities: left out. With none left there is no RMIA of this kind this round: its
            # metrics are missing, and a gate watching them fails closed (audit.config.gate).
            usable = np.all([np.isfinite(v).all(axis=(1, 2)) for v in logits.values()], axis=0)
            if not usable.any():
                details[kind] = {"skipped": f"every one of the {len(usable)} references diverged (non-finite "
                                 "outputs): no RMIA of this kind this round", "reference_models": len(usable)}
                seconds[kind] = time.perf_counter() - start
                continue
            trained_on = refs.population_in[usable]
            probs = {name: true_class_probability(logits[name][usable], np.asarray(getattr(sets, name)[1]),
                                                  settings.temperature) for name in SETS}
            # Population samples every reference trained on have no Pr(z) (none occur with K >= 2).
            keep = (~trained_on).any(axis=0)
            signals = {"members": Signals(target["members"], probs["members"]),
                       "nonmembers": Signals(target["nonmembers"], probs["nonmembers"]),
                       "population": Signals(target["population"][keep], probs["population"][:, keep],
                                             trained_on[:, keep])}
            if settings.offline_a != TUNE:
                a, tuning = settings.offline_a, {"tuned": False, "why": "fixed by the plan"}
            elif usable.sum() >= 2:
                a, tuning = tuned_a(probs["population"], trained_on, settings.gamma)
            else:
                a, tuning = GLOBAL_A, {"tuned": False, "why": "fewer than two usable references: tuning needs two"}
            accuracy = float(np.mean(logits["nonmembers"][usable].argmax(axis=2) == np.asarray(sets.nonmembers[1])))
            info = {"reference_models": len(refs.copies), "usable_references": int(usable.sum()), "offline_a": a,
                    "a_tuning": tuning, "local_trainings": refs.trainings, "training_s": refs.seconds,
                    "population_used": int(keep.sum()), "reference_accuracy_nonmembers": accuracy,
                    "subset_size": int(refs.population_in.sum(axis=1).max())}
        try:
            result = rmia(signals["members"], signals["nonmembers"], signals["population"], offline_a=a,
                          gamma=settings.gamma)
        except ZeroMarginal as err:  # no RMIA of this kind this round: its metrics are missing (gates fail closed)
            details[kind] = {**info, "skipped": str(err)}
            seconds[kind] = time.perf_counter() - start
            continue
        key = AttackKey(RMIA, kind)
        attacks[key] = population_attack(result.members, result.nonmembers, result.population, audit.fpr_tolerance,
                                         signal=kind, member_if_lower=False, attack=RMIA,
                                         confidence=audit.confidence, delta=audit.epsilon_delta)
        metrics.update({key.metric(statistic): value for statistic, value in attack_metrics(attacks[key]).items()})
        details[kind] = {**info, "gamma": settings.gamma, "temperature": settings.temperature}
        scores.update({f"{kind}_members": result.members, f"{kind}_nonmembers": result.nonmembers,
                       f"{kind}_population": result.population})
        seconds[kind] = time.perf_counter() - start

    def write_scores(round_dir):  # per-sample scores: only in this party's own round folder
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **scores)
        atomic_write_bytes(round_dir / RMIA_SCORES_FILE, buffer.getvalue(), private=True)

    return StepResult(metrics=metrics, attacks=attacks, details=details, timings={"rmia_kinds_s": seconds},
                      write_private=write_scores)


def check_references(model: torch.nn.Module, feature_shape, settings: RMIASettings, key: str) -> None:
    """At start: the K references of each trained kind are kept across rounds, each a copy of the model's weights (on
    disk, in the temporary folder, once they are more than audit.training's spill size together): they must fit in
    REFERENCE_DISK_SHARE of its free space. SettingsError naming `key`.reference_models."""
    import shutil
    import tempfile

    from audit.config.fields import SettingsError
    from audit.training import _SPILL_BYTES

    trained = [kind for kind in settings.references if kind != GLOBAL]
    if not settings.enabled or not trained:
        return
    copy_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    total = settings.reference_models * len(trained) * copy_bytes
    if total <= _SPILL_BYTES:
        return  # in memory, less than one spill's size
    folder = tempfile.gettempdir()
    free = shutil.disk_usage(folder).free
    if total > REFERENCE_DISK_SHARE * free:
        most = max(1, int(REFERENCE_DISK_SHARE * free // (len(trained) * copy_bytes)))
        raise SettingsError(f"{key}.reference_models: {settings.reference_models:,} reference models; at most {most:,} "
                            f"here: {len(trained)} trained kind{'s' if len(trained) != 1 else ''} x "
                            f"{settings.reference_models:,} copies of the model ({copy_bytes / 2**20:,.1f} MB each) are "
                            f"kept across rounds, {total / 2**30:,.2f} GB in {folder}, which has "
                            f"{free / 2**30:,.2f} GB free (a reference may take {REFERENCE_DISK_SHARE:.0%} of it)")
