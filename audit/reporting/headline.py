"""A round's headline leakage, as the run index's grid and the party page's first chart show it, read off the round
record's leak verdict (audit.verdict.leak) and gate entry; and which attacks the default views show.

- With an epsilon budget (the gate's `epsilon_budget`) the headline is the family-wise epsilon lower bound against
  the budget, beside its ceiling (the most these counts can prove).
- Without one it is the verdict's headline figure (the most significant of the round's tests): its estimate, its
  interval at the audit's confidence and the one corrected for the number of tests, against chance.

The default views show at most the strongest attack of each family (the model kind the round record keys its
attacks by: the population attacks on the local and on the global model, the update attack, RMIA, a plug-in's),
the others a click away: nine attacks in one chart or table hide the one that matters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from audit.config.gate_contract import KEPT
from audit.config.vocabulary import LEAK_EPSILON_LB
from audit.reporting.readings import float_or_nan, fmt, ordered_models
from audit.reporting.verdicts import LEAK, NOT_AUDITED, leak_state
from audit.round_record import RoundRecord

__all__ = ["Headline", "headline_of", "budget_of", "statistic_label", "strongest_per_family", "strongest_in_round",
           "worst_of", "OVER_SENT"]


# The gate's verdict as the pictures mark it: the gate contract's words, and an update over a limit that was sent all
# the same (a gate whose action is report_only).
OVER_SENT = "over_sent"


@dataclass(frozen=True)
class Headline:
    """What one party's round comes to, for the pictures."""

    state: str                   # LEAK, NO_LEAK or NOT_AUDITED (audit.reporting.verdicts)
    gate: str | None             # the gate's verdict (kept, withheld, dp_retrained, or OVER_SENT); None: no gate entry
    attack: str = ""             # the headline figure's attack ("rmia / independent")
    statistic: str = ""          # exact_auc, tpr_at_fpr_<t>
    estimate: float = math.nan
    chance: float = math.nan
    interval: tuple[float, float] = (math.nan, math.nan)
    corrected: tuple[float, float] = (math.nan, math.nan)  # corrected for the number of tests (Bonferroni)
    p_adjusted: float = math.nan
    tests: int = 0
    epsilon: float = math.nan    # the family-wise epsilon lower bound
    ceiling: float = math.nan    # the largest bound these counts could prove
    budget: float = math.nan     # the gate's epsilon budget (NaN: none)
    budget_only: bool = False    # the budget is the gate's only limit (no threshold on another metric)
    confidence: float = math.nan  # the leak verdict's confidence level

    @property
    def figure(self) -> str:
        """"AUC 0.67", "TPR@0.5 0.71": the headline figure in a few characters."""
        if math.isnan(self.estimate):
            return ""
        return f"{statistic_label(self.statistic)} {fmt(self.estimate, 2)}"

    @property
    def severity(self) -> float:
        """How far this round is from "nothing shown", to rank rounds by: epsilon over the budget where a budget is
        set, else the headline's -log10 of its adjusted p-value (larger: worse). NaN when not audited."""
        if self.state == NOT_AUDITED:
            return math.nan
        if not math.isnan(self.budget) and not math.isnan(self.epsilon):
            return self.epsilon / self.budget if self.budget > 0 else self.epsilon
        if math.isnan(self.p_adjusted):
            return 0.0
        return -math.log10(max(self.p_adjusted, 1e-300))


def statistic_label(statistic: str) -> str:
    """exact_auc -> "AUC", tpr_at_fpr_0.01 -> "TPR@0.01"."""
    if statistic == "exact_auc":
        return "AUC"
    if statistic.startswith("tpr_at_fpr_"):
        return "TPR@" + statistic[len("tpr_at_fpr_"):]
    return statistic.replace("_", " ")


def budget_of(record: RoundRecord) -> float:
    """The gate's epsilon budget in this round (NaN: none)."""
    gate = record.gate
    return gate.epsilon_budget if gate is not None and gate.has_budget else math.nan


def _pair(value) -> tuple[float, float]:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return float_or_nan(value[0]), float_or_nan(value[1])
    return math.nan, math.nan


def headline_of(record: RoundRecord | None) -> Headline:
    if record is None:
        return Headline(NOT_AUDITED, None)
    gate = record.gate
    verdict = gate.verdict if gate is not None else None
    if verdict == KEPT and gate.tripped:  # over a limit, sent as trained: the gate only reports
        verdict = OVER_SENT
    leak = record.leak if isinstance(record.leak, Mapping) else {}
    head = leak.get("headline") if isinstance(leak.get("headline"), Mapping) else {}
    epsilon = leak.get("epsilon") if isinstance(leak.get("epsilon"), Mapping) else {}
    return Headline(
        state=leak_state(record), gate=verdict, attack=str(head.get("attack") or ""),
        statistic=str(head.get("statistic") or ""), estimate=float_or_nan(head.get("estimate")),
        chance=float_or_nan(head.get("chance")), interval=_pair(head.get("interval")),
        corrected=_pair(head.get("corrected_interval")), p_adjusted=float_or_nan(head.get("p_adjusted")),
        tests=int(leak.get("tests") or 0), epsilon=float_or_nan(epsilon.get("value")),
        ceiling=float_or_nan(epsilon.get("ceiling")), budget=budget_of(record),
        budget_only=gate is not None and gate.has_budget and set(gate.thresholds) <= {LEAK_EPSILON_LB},
        confidence=float_or_nan(leak.get("confidence")))


def worst_of(headlines: Mapping) -> object | None:
    """The key of the worst audited headline (largest severity; leaks before no-leaks), None if none is."""
    # Ties (every epsilon bound 0 under a budget) go to the round whose test is surest.
    ranked = [(h.state == LEAK, h.severity, -math.log10(max(h.p_adjusted, 1e-300)) if h.p_adjusted > 0 else 300.0,
               key) for key, h in headlines.items() if not math.isnan(h.severity)]
    if not ranked:
        return None
    return max(ranked, key=lambda r: (r[0], r[1], -math.inf if math.isnan(r[2]) else r[2]))[3]


def strongest_per_family(records: list[RoundRecord], value_of: Callable[[Mapping], float]) -> set[tuple[str, str]]:
    """(model, signal) of each family's strongest attack over these rounds: the largest mean of `value_of` (NaN
    rounds left out); a family whose every value is NaN keeps its first signal."""
    values: dict[tuple[str, str], list[float]] = {}
    for r in records:
        for (model, signal), result in r.attacks.items():
            value = value_of(result) if isinstance(result, Mapping) else math.nan
            values.setdefault((model, signal), []).append(float_or_nan(value))
    best: dict[str, tuple[float, str]] = {}
    for (model, signal), vs in sorted(values.items()):
        finite = [v for v in vs if not math.isnan(v)]
        mean = float(np.mean(finite)) if finite else -math.inf
        if model not in best or mean > best[model][0]:
            best[model] = (mean, signal)
    return {(model, signal) for model, (_, signal) in best.items()}


def strongest_in_round(record: RoundRecord, value_of: Callable[[Mapping], float]) -> list[tuple[str, str]]:
    """(model, signal) of each family's strongest attack in this round by `value_of`, families in report order."""
    out = []
    for model in ordered_models(record.models()):
        per_signal = record.attacks_of(model)
        signals = sorted(per_signal)
        scored = [(float_or_nan(value_of(per_signal[s])), s) for s in signals]
        finite = [p for p in scored if not math.isnan(p[0])]
        out.append((model, max(finite)[1] if finite else signals[0]))
    return out
