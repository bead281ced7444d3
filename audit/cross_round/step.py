"""The cross-round step of a round's audit: what the aggregator could tell of the party's members from every update
the party sent, each against the other parties' combined update beside it (FedMIA, Zhu et al., CVPR 2025), and how
often it would name the party as its members' source (Hu et al., ICDM 2021).

Round r's update is averaged into the global model the party receives in round r + 1, so round r + 1's audit attacks
it: `after_sending` (called by the party once its round's update has gone out: audit.config.steps `after_sending`)
keeps the sent update and its weight; `run` in the next round derives the others' combined update from the received
global model (audit.cross_round.others), takes the per-sample signals of the audit's samples under both, adds them to
the bounded history (audit.cross_round.state) and reports FedMIA's test over the rounds kept
(audit.cross_round.attack) through the population attack's statistics (exact AUC and TPR at each tolerance with their
intervals, the epsilon lower bound), and the source inference's rate against chance. Both enter the round's leak
verdict: the attack from its scores like every attack, the source rate as a test of the members' rate against the
non-members' (Fisher's exact test: valid when members and non-members are exchangeable, the verdict's null).

A run's last update is attacked when a global model averaging it is received: in the next round, or by an audit of
the final global model that calls `run` with it as the received model and the round after the last as its round
(the party's store carries the pending update).

Per-sample signals stay in the party's store and its own round folder (cross_round.npz, 0600); only scalars leave.
"""

from __future__ import annotations

import io
import time

import numpy as np
from sklearn.metrics import roc_auc_score

from audit.config.vocabulary import CROSS_ROUND, CROSS_ROUND_FILE
from audit.cross_round.attack import (SETS, SourceInference, mean_evidence, round_evidence, round_statistic,
                                      source_inference)
from audit.cross_round.others import average_weight, left_out_alone, others_model
from audit.config.cross_round_settings import ROUNDS_METRIC, SOURCE_METRICS, CrossRoundSettings
from audit.cross_round.state import DTYPE, STORE_KEY, CrossRoundState, History, Pending, RoundSignals
from audit.membership.attack_uncertainty import attack_metrics
from audit.membership.population_attack import population_attack
from audit.membership.signals import compute_signals
from audit.membership.uncertainty import clopper_pearson
from audit.model_io import model_device
from audit.reporting.atomic_io import atomic_write_bytes
from audit.round_audit import AuditContext, StepResult
from audit.config.attack_key import AttackKey
from audit.spill import SpilledModel
from audit.verdict.chance import tpr_p_value
from audit.verdict.leak import ChanceTest, Evidence

__all__ = ["run", "after_sending", "state_of", "SOURCE_ATTACK", "ATTACKED", "SKIPPED"]

ATTACKED, SKIPPED = "attacked", "skipped"
SOURCE_ATTACK = f"{CROSS_ROUND} / source"  # the source inference's name in the leak verdict
SOURCE_STATISTIC = "source_rate"


def state_of(store: dict, settings: CrossRoundSettings) -> CrossRoundState:
    """The step's state in the party's audit store (made on first use)."""
    state = store.get(STORE_KEY)
    if state is None:
        state = store[STORE_KEY] = CrossRoundState(settings.rounds_kept)
    return state


def after_sending(store: dict, sent, settings: CrossRoundSettings) -> None:
    """Keep what the next round's attack needs of the update the party just sent (`sent`: audit.round_audit.
    SentUpdate): the weights and the party's weight in the average, or why the round cannot be attacked."""
    state = state_of(store, settings)
    if state.pending is not None and state.pending.round_num < sent.round_num:
        state.note(state.pending.round_num, SKIPPED,
                   reason=f"its aggregate arrived in round {state.pending.round_num + 1}, which the audit did not "
                          "cover")
    if not sent.averaged or sent.model is None:
        state.pending = Pending(sent.round_num, why="the party's update of this round was not averaged (withheld by "
                                                    "its gate, or its received model was rejected)")
        return
    weight = average_weight(sent.party, sent.data, sent.collaborators, settings)
    if weight.unknown is not None:
        state.pending = Pending(sent.round_num, parties=weight.parties, why=weight.unknown)
        return
    state.pending = Pending(sent.round_num, SpilledModel(sent.model), weight.value, weight.parties)


def _signal_names(settings: CrossRoundSettings) -> tuple[str, ...]:
    """The loss always (the source inference's), and the test's signal."""
    return ("loss",) if settings.signal == "loss" else ("loss", settings.signal)


def _signals(model, sets, names, batch_size: int) -> dict[str, np.ndarray]:
    """set -> (signals, samples) float32."""
    out = {}
    for name in SETS:
        x, y = sets.tensors(name)
        found = compute_signals(model, x, y, list(names), batch_size=batch_size)
        out[name] = np.stack([np.asarray(found[s], dtype=np.float64) for s in names]).astype(DTYPE)
    return out


def _take(state: CrossRoundState, context: AuditContext, settings: CrossRoundSettings) -> RoundSignals | None:
    """Attack the update of the round before this one, if the party sent one the average took: its signals and the
    others' under the received global model go into the history. Returns the new round, or None (logged why)."""
    sets, target = context.mia_sets, context.round_num - 1
    names = _signal_names(settings)
    if state.history is not None and state.history.label != sets.label:
        state.note(target, "restarted", reason="the audit's samples changed (new audit sets): the rounds before are "
                                               "on other samples and left out")
        state.history = None
    if state.history is None:
        state.history = History(settings.rounds_kept, sets.label, names, sets.sizes())
    pending, state.pending = state.pending, None
    if pending is None or pending.round_num != target:
        state.note(target, SKIPPED, reason="no update of this round is known to the step (none sent, or the step "
                                           "started later)")
        return None
    if pending.why is not None:
        state.note(target, SKIPPED, reason=pending.why)
        return None
    received = context.global_model
    sent = pending.model.load(model_device(received))
    if pending.parties == 2 and left_out_alone(received, sent):
        state.note(target, SKIPPED, reason="the other party's update was left out of this round's average (the "
                                           "received model is this party's own update)")
        return None
    try:
        others = others_model(received, sent, pending.weight)
    except ValueError as err:
        state.note(target, SKIPPED, reason=str(err))
        return None
    batch = context.settings.batch_size
    entry = RoundSignals(target, pending.weight, pending.parties, _signals(sent, sets, names, batch),
                         _signals(others, sets, names, batch))
    bad = [f"{which} {name}" for which in ("own", "others") for name, values in getattr(entry, which).items()
           if not np.isfinite(values).all()]
    if bad:
        state.note(target, SKIPPED, reason=f"non-finite signals under the {', '.join(bad)} update")
        return None
    row = names.index(settings.signal)
    statistic = {n: round_statistic(entry.own[n][row], entry.others[n][row], settings.signal) for n in SETS}
    entry.evidence = round_evidence(statistic, _labels(sets))
    entry.exact_auc = float(roc_auc_score(np.r_[np.ones(sets.sizes()["members"]), np.zeros(sets.sizes()["nonmembers"])],
                                          np.r_[entry.evidence["members"], entry.evidence["nonmembers"]]))
    state.history.add(entry)
    state.note(target, ATTACKED, weight=pending.weight, parties=pending.parties)
    return entry


def _labels(sets) -> dict[str, np.ndarray]:
    return {name: np.asarray(getattr(sets, name)[1]) for name in SETS}


def _source_test(source: SourceInference, confidence: float) -> ChanceTest:
    """The members' source rate against the non-members' under the same rule (Fisher's exact test)."""
    counts = {"members_flagged": source.members_own, "members": source.members,
              "nonmembers_flagged": source.nonmembers_own, "nonmembers": source.nonmembers}

    def interval(level: float) -> tuple[float, float]:
        found = clopper_pearson(source.members_own, source.members, level)
        return found.lower, found.upper

    return ChanceTest(SOURCE_ATTACK, SOURCE_STATISTIC, SOURCE_METRICS[0], source.rate, source.nonmember_rate,
                      float(tpr_p_value(source.members_own, source.members, source.nonmembers_own,
                                        source.nonmembers)), counts, interval)


def _report(state: CrossRoundState, context: AuditContext, settings: CrossRoundSettings,
            new: RoundSignals | None, seconds: float) -> StepResult:
    history, audit = state.history, context.settings
    details = {"signal": settings.signal, "rounds_kept": settings.rounds_kept, "log": list(state.log),
               "rounds": [entry.round_num for entry in history.rounds],
               "state": {"bytes": history.nbytes, "bound_bytes": history.bound_bytes(),
                         "dtype": np.dtype(DTYPE).name}}
    timings = {"cross_round_signals_s": seconds}
    if not history.rounds:
        return StepResult(metrics={ROUNDS_METRIC: 0.0}, details=details, timings=timings)
    scores = mean_evidence([entry.evidence for entry in history.rounds])
    key = AttackKey(CROSS_ROUND, settings.signal)
    result = population_attack(scores["members"], scores["nonmembers"], scores["population"], audit.fpr_tolerance,
                               signal=settings.signal, member_if_lower=False, attack=CROSS_ROUND,
                               confidence=audit.confidence, delta=audit.epsilon_delta)
    parties = history.rounds[-1].parties
    source = source_inference({n: history.signal("own", n, "loss") for n in SETS},
                              {n: history.signal("others", n, "loss") for n in SETS}, parties)
    rate = clopper_pearson(source.members_own, source.members, audit.confidence)
    metrics = {key.metric(s): v for s, v in attack_metrics(result).items()}
    metrics.update(dict(zip(SOURCE_METRICS, (rate.rate, rate.lower, rate.upper, source.chance,
                                              source.nonmember_rate))))
    metrics[ROUNDS_METRIC] = float(len(history.rounds))
    test = _source_test(source, audit.confidence)
    per_round = {str(entry.round_num): entry.exact_auc for entry in history.rounds}  # each round alone, for the page
    details.update({
        "parties": parties, "weights": {str(e.round_num): e.weight for e in history.rounds},
        "combination": "mean over the rounds kept of Phi((a - mu) / sigma), mu and sigma the population's median and "
                       "scaled MAD per class (pooled for a class with fewer than 20)",
        "per_round_exact_auc": per_round,
        "source": {"members_own": source.members_own, "members": source.members,
                   "nonmembers_own": source.nonmembers_own, "nonmembers": source.nonmembers,
                   "parties": parties, "chance": source.chance, "rate": rate.rate,
                   "interval": [rate.lower, rate.upper], "nonmember_rate": source.nonmember_rate,
                   "p_value": test.p_value,
                   "exact": parties == 2},
    })
    arrays = {f"score_{name}": scores[name] for name in SETS}
    if new is not None:
        for which in ("own", "others"):
            for name in SETS:
                for row, signal in enumerate(history.signals):
                    arrays[f"round_{new.round_num}_{which}_{signal}_{name}"] = getattr(new, which)[name][row]

    def write_private(round_dir):  # per-sample signals and scores: only in the party's own round folder
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        atomic_write_bytes(round_dir / CROSS_ROUND_FILE, buffer.getvalue(), private=True)

    return StepResult(metrics=metrics, details=details, attacks={key: result}, timings=timings,
                      write_private=write_private, evidence=Evidence((test,)))


def run(context: AuditContext, settings: CrossRoundSettings) -> StepResult:
    state = state_of(context.store, settings)
    key = (context.round_num, context.mia_sets.label)
    if state.result is not None and state.result[0] == key:
        return state.result[1]
    start = time.perf_counter()
    new = _take(state, context, settings)
    result = _report(state, context, settings, new, time.perf_counter() - start)
    state.result = (key, result)
    return result
