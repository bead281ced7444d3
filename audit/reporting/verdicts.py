"""What a party's round came to, in plain words: the leak verdict (does any attack beat chance, family-wise; what
these counts could have detected when none does), the epsilon the audit proves against the budget, the gate's
verdict, the metric and threshold that decided it, and the epsilon DP spent; read off the round record (its `leak`,
audit.verdict.leak, and `extra.gate`, audit.gate_flow.GateOutcome.record_entry, typed as audit.record_parts.GateEntry).

The pages and the end-of-run summary lead with this; nothing here is computed anew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from audit.config.gate import MISSING
from audit.config.gate_contract import (DP_RETRAINED, DP_VIOLATED, DP_VIOLATED_TEXT, KEPT, NON_FINITE_UPDATE,
                                        RECEIVED_MODEL_REJECTED_REASON, RUN_BUDGET, WITHHELD)
from audit.config.vocabulary import LOWER, UPPER, bounded
from audit.record_parts import GateEntry
from audit.reporting.readings import (exact_auc_band, exact_auc_of, float_or_nan, fmt, fmt_interval, rates_at,
                                      resolvable_at, series_keys, tolerances_of)
from audit.round_record import RoundRecord

__all__ = ["Check", "RoundVerdict", "round_verdict", "inverted_attacks", "strongest_tpr", "NO_DP", "leak_status",
           "leak_text", "headline_figure",
           "sent_leak_status", "Sent", "sent_of", "epsilon_zero_note", "EPSILON_ZERO_SHORT", "gate_reason",
           "dp_spent_text",
           "leak_state", "epsilon_status", "floor_text", "LEAK", "NO_LEAK", "NOT_AUDITED"]

# The leak verdict's three states, as the pages colour them.
LEAK, NO_LEAK, NOT_AUDITED = "leak", "no_leak", "not_audited"

NO_DP = "no DP"


@dataclass(frozen=True)
class Check:
    """One thresholded metric of the gate: the value it compared (`bound`: point, lower or upper) beside the
    estimate and its interval (NaN where the record has none)."""

    metric: str
    bound: str
    value: float
    threshold: float
    estimate: float = math.nan
    lower: float = math.nan
    upper: float = math.nan
    tripped: bool = False
    missing: bool = False

    def text(self) -> str:
        if self.missing:
            return (f"{self.metric}: missing (this round did not produce it; the gate fails closed) - limit "
                    f"{fmt(self.threshold)}")
        interval = fmt_interval(self.estimate, self.lower, self.upper)
        said = "value" if self.bound == "point" else f"{self.bound} bound"
        where = f" (estimate {interval})" if self.bound != "point" else (
            f" [{fmt(self.lower, 3)}, {fmt(self.upper, 3)}]" if not math.isnan(self.lower) else "")
        side = ">" if self.tripped else "≤"
        return f"{self.metric}: {said} {fmt(self.value)}{where} {side} threshold {fmt(self.threshold)}"

    def short(self) -> str:
        """The compared value named, in one phrase: "upper bound 0.668 of mia_local_loss_exact_auc (estimate 0.600)
        > 0.6"; a point value as "mia_local_loss_exact_auc 0.62 > 0.6"."""
        if self.missing:
            return f"missing: {self.metric}"
        side = ">" if self.tripped else "≤"
        if self.bound == "point":
            return f"{self.metric} {fmt(self.value)} {side} {fmt(self.threshold)}"
        estimate = f" (estimate {fmt(self.estimate)})" if not math.isnan(self.estimate) else ""
        return f"{self.bound} bound {fmt(self.value)} of {self.metric}{estimate} {side} {fmt(self.threshold)}"


@dataclass(frozen=True)
class RoundVerdict:
    verdict: str | None          # kept, dp_retrained, withheld; None: the record has no gate entry
    action: str | None           # the gate's action (withhold, dp_retrain, report_only)
    checks: list[Check] = field(default_factory=list)  # every thresholded metric; the deciding ones have tripped
    epsilon: str = NO_DP         # the accountant's epsilon spent on DP this round, or "no DP"
    status: str = ""             # the gate's outcome in plain words (the leak verdict's where no gate is set)
    leak: str = NOT_AUDITED      # LEAK, NO_LEAK or NOT_AUDITED (leak_state)
    sent: str | None = None      # sent_leak_status: the verdict of the DP retrain that was sent, if one was
    leak_text: str = ""          # leak_status: the leak verdict in one sentence
    proven: str = ""             # epsilon_status: the epsilon the audit proves, against the budget

    @property
    def deciding(self) -> list[Check]:
        """The checks that decided the verdict: the tripped ones, else the one closest to its threshold."""
        tripped = [c for c in self.checks if c.tripped]
        if tripped or not self.checks:
            return tripped
        return [max(self.checks, key=lambda c: (c.value - c.threshold) if math.isfinite(c.value) else -math.inf)]


def _bound_of(metric: str, compared: str) -> str:
    for bound in (UPPER, LOWER):
        if compared == bounded(metric, bound):
            return bound
    return "point"


def _checks(gate: GateEntry, metrics: Mapping) -> list[Check]:
    tripped = gate.tripped
    compared = gate.get("compared") or {}
    missing = set(gate.missing)
    out = []
    for metric, threshold in sorted(gate.thresholds.items()):
        name = compared.get(metric, metric)
        if metric in tripped:
            value = float_or_nan((tripped[metric] or {}).get("value"))
        else:
            value = float_or_nan(metrics.get(name))
        out.append(Check(metric, _bound_of(metric, name), value, float_or_nan(threshold),
                         estimate=float_or_nan(metrics.get(metric)),
                         lower=float_or_nan(metrics.get(bounded(metric, LOWER))),
                         upper=float_or_nan(metrics.get(bounded(metric, UPPER))),
                         tripped=metric in tripped, missing=metric in missing))
    return out


def _canary(dp_audit: Mapping | None) -> str:
    """A DP training's canary check beside its accountant (audit.canary.dp): the bound, its ceiling, the claim, and
    the noise multiplier the training behaves like (the white-box estimate, where the check made one)."""
    if not isinstance(dp_audit, Mapping):
        return ""
    text = (f"; canary check ε ≥ {fmt(float_or_nan(dp_audit.get('epsilon_lb')), 3)} (ceiling "
            f"{fmt(float_or_nan(dp_audit.get('ceiling')), 3)}) against the accountant's "
            f"{fmt(float_or_nan(dp_audit.get('claimed_epsilon')), 3)} for that training")
    estimate = dp_audit.get("estimate")
    if isinstance(estimate, Mapping) and estimate.get("noise_multiplier") is not None:
        low, high = estimate.get("noise_interval") or (None, None)
        text += (f"; it behaves like noise multiplier σ = {fmt_interval(estimate['noise_multiplier'], low, high, 3)} "
                 f"(claimed {fmt(float_or_nan(estimate.get('claimed_noise_multiplier')), 3)})")
    return text


def _epsilon(gate: GateEntry, mitigation: Mapping | None = None) -> str:
    """The accountant's epsilon when this round trained with DP (a retry ran, or the update was sent with dp_fedavg),
    with its canary check beside it, else "no DP": a round without DP spends no privacy budget it could account for,
    which 0.0 would wrongly claim."""
    if gate.retries > 0 and not math.isnan(gate.epsilon):
        return dp_spent_text(gate) + _canary((gate.tries[-1] if gate.tries else {}).get("dp_audit"))
    if isinstance(mitigation, Mapping) and mitigation.get("method") == "dp_fedavg" and "epsilon" in mitigation:
        return (f"dp_fedavg ε = {fmt(float_or_nan(mitigation.get('epsilon')), 3)} this round, "
                f"{fmt(float_or_nan(mitigation.get('epsilon_composed')), 3)} over {mitigation.get('releases')} "
                f"updates at δ = {float_or_nan(mitigation.get('delta')):g}" + _canary(mitigation.get("dp_audit")))
    return NO_DP


def dp_spent_text(gate: GateEntry) -> str:
    """The accountant's epsilon of a round's DP tries, said as what it is: "ε = 10.8 at δ = 1e-05 composed over the
    round's 2 DP tries (the sent one alone: 3.62)". The gate's figure composes every try (each one trained on the
    same data); a try's own figure (its canary check's claim) is that training alone."""
    delta = float_or_nan(gate.get("delta"))
    at = f" at δ = {delta:g}" if not math.isnan(delta) else ""
    tries = gate.retries
    said = (f"ε = {fmt(gate.epsilon, 3)}{at}" + (f" composed over the round's {tries} DP tries" if tries > 1 else
                                                  " of the round's DP try"))
    last = gate.tries[-1] if gate.tries else {}
    alone = float_or_nan((last.get("dp_audit") or {}).get("claimed_epsilon")) if isinstance(last, Mapping) else math.nan
    if tries > 1 and not math.isnan(alone):
        whose = "the sent one" if gate.verdict == DP_RETRAINED else "the last one"
        said += f" ({whose} alone: {fmt(alone, 3)})"
    if gate.verdict != DP_RETRAINED:
        said += ", none of them sent"
    return said


# A leak verdict's epsilon lower bound of 0 beside "leak detected", in a few words (the pictures, the grid's cells).
EPSILON_ZERO_SHORT = "ε ≥ 0: beats chance, no ε provable"


def epsilon_zero_note(leak: Mapping | None) -> str | None:
    """Why a detected leak proves an epsilon lower bound of 0, in plain words; None unless both hold. The leak test
    asks whether an attack beats chance at all; an epsilon lower bound asks more: one threshold at which the members
    flagged outnumber the non-members flagged by a proven factor (e^ε), with every threshold and attack tried
    corrected for (audit.membership.epsilon_bound), which few members rarely prove."""
    if _state_of(leak) != LEAK:
        return None
    epsilon = leak.get("epsilon") or {}
    value = float_or_nan(epsilon.get("value"))
    if math.isnan(value) or value > 0:
        return None
    members = (leak.get("floor") or {}).get("members")
    counts = f"{fmt(members)} members" if members is not None else "these counts"
    ceiling = float_or_nan(epsilon.get("ceiling"))
    most = f"; the most they could prove is {fmt(ceiling, 3)}" if not math.isnan(ceiling) else ""
    return ("ε ≥ 0 beside a detected leak: an attack beats chance, but an ε lower bound needs more, one threshold at "
            "which the members flagged outnumber the non-members flagged by a proven factor, corrected for every "
            f"threshold and attack tried ({fmt(epsilon.get('sources'))} attacks); {counts} do not prove one here"
            f"{most}. Zero is not a measured privacy level")


@dataclass(frozen=True)
class Sent:
    """What a party sent in a round, beside what it trained: `what` is "as trained", "DP retrain" or "nothing"
    (withheld: the received model went back); `leak` the leak verdict of what was sent (the trained update's when
    sent as trained, the DP retrain's own audit when one was sent; None when nothing was)."""

    what: str
    leak: str | None
    text: str

    @property
    def sent(self) -> bool:
        return self.what != NOTHING_SENT


AS_TRAINED, DP_RETRAIN_SENT, NOTHING_SENT = "as trained", "DP retrain", "nothing"


def sent_of(record: RoundRecord | None) -> Sent | None:
    """What the party sent in this round and that update's leak verdict; None for a round without a record."""
    if record is None:
        return None
    gate = record.gate
    trained = leak_state(record)
    if gate is None or gate.verdict in (None, KEPT):
        words = {LEAK: "leak detected", NO_LEAK: "no leak detected"}.get(trained, "not audited")
        return Sent(AS_TRAINED, trained, f"the trained update ({words})")
    if gate.verdict == DP_RETRAINED:
        last = gate.tries[-1] if gate.tries else {}
        leak = last.get("leak") if isinstance(last, Mapping) else None
        state = _state_of(leak)
        words = {LEAK: "leak detected", NO_LEAK: "no leak detected"}.get(state, "no leak verdict")
        return Sent(DP_RETRAIN_SENT, state, f"a DP retrain ({words} in its own audit)")
    return Sent(NOTHING_SENT, None, "nothing (update withheld: the received model went back)")


def gate_reason(record: RoundRecord) -> str:
    """Why the gate did what it did, naming the compared value and the rule that tripped: "upper bound 0.668 of
    mia_local_loss_exact_auc (estimate 0.600) > 0.6; 2 DP tries did not bring it below"; "" without a gate that
    tripped."""
    gate = record.gate
    if gate is None:
        return ""
    v = round_verdict(record)
    tripped = [c for c in v.checks if c.tripped or c.missing]
    if not tripped:
        if gate.verdict == WITHHELD or gate.reason in (RUN_BUDGET, DP_VIOLATED, NON_FINITE_UPDATE):
            return v.status
        return ""
    said = "; ".join(c.short() for c in tripped)
    if gate.verdict == WITHHELD and gate.retries:
        said += f"; {gate.retries} DP tr{'ies' if gate.retries > 1 else 'y'} did not bring it below"
    elif gate.verdict == DP_RETRAINED:
        said += f"; the DP retrain (try {gate.retries}) passed"
    return said


def strongest_tpr(record: RoundRecord) -> tuple[str, float, Mapping | None] | None:
    """The largest TPR at the lowest FPR tolerance every attack of the record can resolve: (attack, tolerance,
    rates at its threshold). None when no tolerance is resolvable."""
    results = [(key.label(), record.attacks[key]) for key in series_keys([record])]
    for tol in tolerances_of([record]):
        usable = [(name, res) for name, res in results if resolvable_at(res, tol) and rates_at(res, tol)]
        if not usable:
            continue
        name, res = max(usable, key=lambda p: float_or_nan((rates_at(p[1], tol).get("tpr") or {}).get("rate")))
        return name, tol, rates_at(res, tol)
    return None


def inverted_attacks(record: RoundRecord) -> list[tuple[str, float, float, float]]:
    """(attack, exact AUC, lower, upper) for every attack whose exact AUC is below 0.5: its signal ranks members
    on the wrong side (reversed it would score 1 - AUC); this says nothing about the model being safer."""
    attacks = record.attacks
    return [(key.label(), exact_auc_of(attacks[key]), *exact_auc_band(attacks[key]))
            for key in series_keys([record]) if exact_auc_of(attacks[key]) < 0.5]


def leak_state(record: RoundRecord | None) -> str:
    """LEAK, NO_LEAK or NOT_AUDITED (no record, or a record without a leak verdict or without any test)."""
    return _state_of(record.leak if record is not None else None)


def _state_of(leak: Mapping | None) -> str:
    if not isinstance(leak, Mapping) or leak.get("detected") is None:
        return NOT_AUDITED
    return LEAK if leak["detected"] else NO_LEAK


def _figure(finding: Mapping) -> str:
    """"rmia / independent exact AUC 0.676 [0.61, 0.74], corrected for 36 tests [0.59, 0.76], chance 0.5"."""
    lo, hi = finding.get("interval") or (None, None)
    clo, chi = finding.get("corrected_interval") or (None, None)
    statistic = str(finding.get("statistic", "")).replace("_", " ").replace("tpr at fpr ", "TPR at FPR ")
    statistic = statistic.replace("exact auc", "exact AUC")
    return (f"{finding.get('attack')} {statistic} {fmt_interval(finding.get('estimate'), lo, hi, 3)}"
            f" (corrected: [{fmt(clo, 2)}, {fmt(chi, 2)}]), chance {fmt(finding.get('chance'), 3)}")


def headline_figure(finding: Mapping) -> str:
    """A verdict's headline figure in short: "rmia / independent TPR at FPR 0.01 0.0449 [0.012, 0.11]"."""
    lo, hi = finding.get("interval") or (None, None)
    statistic = str(finding.get("statistic", "")).replace("_", " ").replace("tpr at fpr ", "TPR at FPR ")
    statistic = statistic.replace("exact auc", "exact AUC")
    return f"{finding.get('attack')} {statistic} {fmt_interval(finding.get('estimate'), lo, hi, 3)}"


def floor_text(leak: Mapping) -> str:
    """What the round's counts could have detected: "AUC >= 0.66, TPR >= 0.11 at FPR 0.01, ...; eps >= 4.2 at most"."""
    floor = leak.get("floor") or {}
    parts = []
    if floor.get("exact_auc") is not None:
        parts.append(f"exact AUC ≥ {fmt(floor['exact_auc'], 3)}")
    for tol, tpr in (floor.get("tpr_at_fpr") or {}).items():
        parts.append(f"TPR ≥ {fmt(tpr, 2)} at FPR {tol}" if tpr is not None else f"nothing at FPR {tol}")
    ceiling = (leak.get("epsilon") or {}).get("ceiling")
    counts = f"{fmt(floor.get('members'))} members, {fmt(floor.get('nonmembers'))} non-members"
    text = f"these counts ({counts}) could only have shown " + ", ".join(parts) if parts else "nothing testable"
    return text + (f"; an ε lower bound of at most {fmt(ceiling, 3)}" if ceiling is not None else "")


def leak_status(record: RoundRecord | None) -> str:
    """The leak verdict in one sentence: what was detected (the headline with its interval, the corrected interval,
    chance and the Holm-adjusted p-value), or that nothing was and what could have been."""
    if record is None:
        return "not audited"
    return _leak_text(record.leak)


def leak_text(leak: Mapping | None) -> str:
    """A leak verdict (a record's `leak`, audit.verdict.leak) in one sentence; see leak_status."""
    return _leak_text(leak)


def _leak_text(leak: Mapping | None) -> str:
    state = _state_of(leak)
    if state == NOT_AUDITED:
        return "no leak verdict in this record"
    tests, level = leak.get("tests"), leak.get("confidence")
    family = f"{tests} tests, Holm-corrected, {fmt(100 * float_or_nan(level), 3)}%"
    headline = leak.get("headline") or {}
    if state == LEAK:
        others = len(leak.get("significant") or []) - 1
        more = f"; {others} more figure{'s' if others != 1 else ''} beat chance" if others > 0 else ""
        return (f"leak detected ({family}): {_figure(headline)}, p = {fmt(headline.get('p_adjusted'), 2)} "
                f"adjusted{more}")
    strongest = (f"; strongest: {_figure(headline)}, p = {fmt(headline.get('p_adjusted'), 2)} adjusted"
                 if headline else "")
    return f"no leak detected ({family}){strongest}; {floor_text(leak)}"


def epsilon_status(record: RoundRecord | None) -> str:
    """"ε ≥ 0.42 (95%, corrected for 9 attacks; these counts prove at most 4.2) against a budget of 1"."""
    leak = (record.leak if record is not None else None) or {}
    epsilon = leak.get("epsilon") or {}
    if epsilon.get("value") is None:
        return "no ε lower bound"
    gate = record.gate
    budget = gate.epsilon_budget if gate is not None else None
    source = f", {epsilon['attack']}" if epsilon.get("attack") else ""
    text = (f"ε ≥ {fmt(epsilon['value'], 3)} at δ = {fmt(epsilon.get('delta'))} ({fmt(100 * float_or_nan(epsilon.get('confidence')), 3)}%, "
            f"corrected for {fmt(epsilon.get('sources'))} attacks{source}; these counts prove at most "
            f"{fmt(epsilon.get('ceiling'), 3)})")
    return text + (f" against a budget of {fmt(budget)}" if budget is not None else "")


def sent_leak_status(record: RoundRecord) -> str | None:
    """For a round whose gate sent a DP retrain: that update's leak verdict and proven epsilon beside the accountant's
    epsilon (the round's own verdict is the trained update's, which was not sent); None otherwise."""
    gate = record.gate
    if gate is None or gate.verdict != DP_RETRAINED or not gate.tries:
        return None
    sent = gate.tries[-1]
    leak = sent.get("leak")
    said = _leak_text(leak) if isinstance(leak, Mapping) else "no leak verdict"
    proven = (sent.get("empirical_epsilon") or {}).get("value")
    alone = float_or_nan((sent.get("dp_audit") or {}).get("claimed_epsilon"))
    accountant = (f"accountant ε = {fmt(alone, 3)} for its training alone, {fmt(gate.epsilon, 3)} over the round's "
                  f"{gate.retries} DP tries" if gate.retries > 1 and not math.isnan(alone)
                  else f"accountant ε = {fmt(sent.get('epsilon'), 3)}")
    return (f"sent: the DP retrain ({accountant}): {said}"
            + (f"; ε ≥ {fmt(proven, 3)} proven" if proven is not None else ""))


def round_verdict(record: RoundRecord) -> RoundVerdict:
    gate = record.gate
    leak = dict(leak=leak_state(record), leak_text=leak_status(record), proven=epsilon_status(record),
                sent=sent_leak_status(record))
    if gate is None:
        return RoundVerdict(None, None, status=leak["leak_text"], **leak)
    verdict, action = gate.verdict, gate.action
    checks = _checks(gate, record.metrics)
    epsilon = _epsilon(gate, record.extra.get("mitigation"))
    tripped = [c for c in checks if c.tripped]
    reason = gate.reason or ""
    if NON_FINITE_UPDATE in gate.tripped or reason == NON_FINITE_UPDATE:
        status = "withheld: the trained update holds NaN/Inf"
    elif reason.startswith(MISSING):
        status = f"{verdict}: {reason} (fail closed: what the round did not measure cannot pass)"
    elif reason.startswith(RECEIVED_MODEL_REJECTED_REASON):
        status = f"{gate.reason}; not trained on, nothing new sent"
    elif reason == RUN_BUDGET:
        said = ((gate.get("run_budget") or {}).get("text") or
                f"its release would take the run's DP ε over the run budget {fmt(gate.get('run_epsilon_budget'))}")
        status = (f"{verdict}: {said}" if verdict == WITHHELD else
                  f"{verdict}: only a DP release fits the run budget ({said})")
    elif reason == DP_VIOLATED:
        proof = gate.tripped.get(DP_VIOLATED) or {}
        status = (f"withheld: {DP_VIOLATED_TEXT} (canary ε ≥ {fmt(float_or_nan(proof.get('value')), 3)} > the "
                  f"accountant's {fmt(float_or_nan(proof.get('threshold')), 3)})")
    elif not checks:
        status = "no gate set: sent as trained"
    elif verdict == WITHHELD:
        tried = " after DP retraining did not bring it below" if gate.retries > 0 else ""
        status = "above threshold: withheld" + tried
    elif verdict == DP_RETRAINED:
        status = "above threshold: retrained with DP, the retrained update is below every threshold"
    elif verdict == KEPT and tripped:
        status = f"above threshold: kept (the gate's action is {action}: it only reports)"
    elif verdict == KEPT:
        status = "below every threshold"
    else:
        status = f"gate verdict {verdict!r}"
    return RoundVerdict(verdict, action, checks, epsilon, status, **leak)
