"""What a party's round came to, in plain words: the gate's verdict, the metric and threshold that decided it, the
epsilon spent and the leak status, read off the round record (its `extra.gate`, audit.gate_flow.record_entry).

The pages lead with this (audit.reporting.html); nothing here is computed anew, it is the gate's own decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from audit.config.gate_contract import DP_RETRAINED, DP_VIOLATED, DP_VIOLATED_TEXT, KEPT, NON_FINITE_UPDATE, WITHHELD
from audit.config.vocabulary import LOWER, UPPER, bounded
from audit.reporting.readings import (exact_auc_band, exact_auc_of, float_or_nan, fmt, fmt_interval, ordered_models,
                                      rates_at, resolvable_at, tolerances_of)

__all__ = ["Check", "RoundVerdict", "round_verdict", "inverted_attacks", "strongest_tpr", "NO_DP"]

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

    def text(self) -> str:
        interval = fmt_interval(self.estimate, self.lower, self.upper)
        said = "value" if self.bound == "point" else f"{self.bound} bound"
        where = f" (estimate {interval})" if self.bound != "point" else (
            f" [{fmt(self.lower, 3)}, {fmt(self.upper, 3)}]" if not math.isnan(self.lower) else "")
        side = ">" if self.tripped else "≤"
        return f"{self.metric}: {said} {fmt(self.value)}{where} {side} threshold {fmt(self.threshold)}"


@dataclass(frozen=True)
class RoundVerdict:
    verdict: str | None          # kept, dp_retrained, withheld; None: the record has no gate entry
    action: str | None           # the gate's action (withhold, dp_retrain, report_only)
    checks: list[Check] = field(default_factory=list)  # every thresholded metric; the deciding ones have tripped
    epsilon: str = NO_DP         # the accountant's epsilon spent on DP this round, or "no DP"
    status: str = ""             # the plain-language leak status

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


def _checks(gate: Mapping, metrics: Mapping) -> list[Check]:
    tripped = gate.get("tripped") or {}
    compared = gate.get("compared") or {}
    out = []
    for metric, threshold in sorted((gate.get("thresholds") or {}).items()):
        name = compared.get(metric, metric)
        if metric in tripped:
            value = float_or_nan((tripped[metric] or {}).get("value"))
        else:
            value = float_or_nan(metrics.get(name))
        out.append(Check(metric, _bound_of(metric, name), value, float_or_nan(threshold),
                         estimate=float_or_nan(metrics.get(metric)),
                         lower=float_or_nan(metrics.get(bounded(metric, LOWER))),
                         upper=float_or_nan(metrics.get(bounded(metric, UPPER))),
                         tripped=metric in tripped))
    return out


def _canary(dp_audit: Mapping | None) -> str:
    """A DP training's canary check beside its accountant (audit.canary.dp): the bound, its ceiling, the claim."""
    if not isinstance(dp_audit, Mapping):
        return ""
    return (f"; canary check ε ≥ {fmt(float_or_nan(dp_audit.get('epsilon_lb')), 3)} (ceiling "
            f"{fmt(float_or_nan(dp_audit.get('ceiling')), 3)}) against the accountant's "
            f"{fmt(float_or_nan(dp_audit.get('claimed_epsilon')), 3)} for that training")


def _epsilon(gate: Mapping, mitigation: Mapping | None = None) -> str:
    """The accountant's epsilon when this round trained with DP (a retry ran, or the update was sent with dp_fedavg),
    with its canary check beside it, else "no DP": a round without DP spends no privacy budget it could account for,
    which 0.0 would wrongly claim."""
    retries = float_or_nan(gate.get("retries"))
    epsilon = float_or_nan(gate.get("epsilon"))
    if retries > 0 and not math.isnan(epsilon):
        delta = float_or_nan(gate.get("delta"))
        at = f" at δ = {delta:g}" if not math.isnan(delta) else ""
        last = (gate.get("tries") or [{}])[-1]
        return (f"ε = {fmt(epsilon, 3)}{at}" + ("" if gate.get("verdict") == DP_RETRAINED else " (spent on DP tries)")
                + _canary(last.get("dp_audit") if isinstance(last, Mapping) else None))
    if isinstance(mitigation, Mapping) and mitigation.get("method") == "dp_fedavg" and "epsilon" in mitigation:
        return (f"dp_fedavg ε = {fmt(float_or_nan(mitigation.get('epsilon')), 3)} this round, "
                f"{fmt(float_or_nan(mitigation.get('epsilon_composed')), 3)} over {mitigation.get('releases')} "
                f"updates at δ = {float_or_nan(mitigation.get('delta')):g}" + _canary(mitigation.get("dp_audit")))
    return NO_DP


def strongest_tpr(record: Mapping) -> tuple[str, float, Mapping | None] | None:
    """The largest TPR at the lowest FPR tolerance every attack of the record can resolve: (attack, tolerance,
    rates at its threshold). None when no tolerance is resolvable."""
    attacks = record.get("attacks") or {}
    results = [(f"{m} / {s}", attacks[m][s]) for m in ordered_models(attacks) for s in sorted(attacks[m])]
    for tol in tolerances_of([record]):
        usable = [(name, res) for name, res in results if resolvable_at(res, tol) and rates_at(res, tol)]
        if not usable:
            continue
        name, res = max(usable, key=lambda p: float_or_nan((rates_at(p[1], tol).get("tpr") or {}).get("rate")))
        return name, tol, rates_at(res, tol)
    return None


def inverted_attacks(record: Mapping) -> list[tuple[str, float, float, float]]:
    """(attack, exact AUC, lower, upper) for every attack whose exact AUC is below 0.5: its signal ranks members
    on the wrong side (reversed it would score 1 - AUC); this says nothing about the model being safer."""
    attacks = record.get("attacks") or {}
    return [(f"{m} / {s}", exact_auc_of(attacks[m][s]), *exact_auc_band(attacks[m][s]))
            for m in ordered_models(attacks) for s in sorted(attacks[m]) if exact_auc_of(attacks[m][s]) < 0.5]


def _no_gate_status(record: Mapping) -> str:
    found = strongest_tpr(record)
    if found is None:
        return "no gate configured; no FPR tolerance is resolvable with this population"
    name, tol, rates = found
    tpr = rates.get("tpr") or {}
    return (f"no gate configured: TPR at the lowest resolvable FPR ({tol:g}) is "
            f"{fmt_interval(tpr.get('rate'), tpr.get('lower'), tpr.get('upper'))} ({name})")


def round_verdict(record: Mapping) -> RoundVerdict:
    gate = (record.get("extra") or {}).get("gate")
    if not isinstance(gate, Mapping):
        return RoundVerdict(None, None, status=_no_gate_status(record))
    verdict, action = gate.get("verdict"), gate.get("action")
    checks = _checks(gate, record.get("metrics") or {})
    epsilon = _epsilon(gate, (record.get("extra") or {}).get("mitigation"))
    tripped = [c for c in checks if c.tripped]
    if NON_FINITE_UPDATE in (gate.get("tripped") or {}) or gate.get("reason") == NON_FINITE_UPDATE:
        status = "withheld: the trained update holds NaN/Inf"
    elif gate.get("reason") == DP_VIOLATED:
        proof = (gate.get("tripped") or {}).get(DP_VIOLATED) or {}
        status = (f"withheld: {DP_VIOLATED_TEXT} (canary ε ≥ {fmt(float_or_nan(proof.get('value')), 3)} > the "
                  f"accountant's {fmt(float_or_nan(proof.get('threshold')), 3)})")
    elif not checks:
        status = _no_gate_status(record)
    elif verdict == WITHHELD:
        tried = " after DP retraining did not bring it below" if float_or_nan(gate.get("retries")) > 0 else ""
        status = "above threshold: withheld" + tried
    elif verdict == DP_RETRAINED:
        status = "above threshold: retrained with DP, the retrained update is below every threshold"
    elif verdict == KEPT and tripped:
        status = f"above threshold: kept (the gate's action is {action}: it only reports)"
    elif verdict == KEPT:
        status = "below every threshold"
    else:
        status = f"gate verdict {verdict!r}"
    return RoundVerdict(verdict, action, checks, epsilon, status)
