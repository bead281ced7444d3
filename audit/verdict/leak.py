"""The round's leak verdict: does any attack beat chance, after correcting for how many were looked at?

Every audit step hands in its evidence (`Evidence`): tests of its figures against chance (`ChanceTest`: an AUC
against 0.5, a TPR against the non-members' FPR at the same threshold, ...) and epsilon lower bounds it can recompute
at any confidence (`EpsilonEvidence`). The membership attacks' evidence comes from their scores (`attack_evidence`).
`leak_verdict` pools all of it:

- "leak detected" when at least one test rejects "no better than chance" at the audit's level after Holm's
  family-wise correction over every test of the round (each attack, signal, model and tolerance); the headline is
  the most significant finding, with its interval at the audit's confidence and the one corrected for the number
  of tests (Bonferroni: simultaneous over all of them, so it holds for the figure picked as the strongest);
- "no leak detected" comes with what the round's sample sizes could have detected at all (`floor`): the smallest
  TPR at each tolerance and the smallest AUC that would have been declared a leak, and the largest epsilon lower
  bound the counts can prove, so that "not detected" is never read as "safe";
- the family-wise epsilon lower bound: each source's bound at confidence 1 - (1 - c) / k for k sources, the largest
  kept, so that with probability at least c every bound holds at once and so does the largest. This is what an
  epsilon budget (audit.config.gate) is compared with.

The tests are valid whatever the attack when members and non-members are exchangeable given the model
(audit.verdict.chance); Holm holds under any dependence between them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Iterable, Mapping

from audit.config.vocabulary import (EXACT_AUC, LEAK_DETECTED, LEAK_EPSILON_CEILING, LEAK_EPSILON_LB, LEAK_P_VALUE,
                                     tolerance_name, tpr_statistic)
from audit.membership.attack_uncertainty import AttackUncertainty
from audit.membership.epsilon_bound import epsilon_lower_bound
from audit.membership.uncertainty import auc_interval, clopper_pearson
from audit.verdict.chance import (auc_p_value, holm, largest_certifiable_epsilon, smallest_detectable_auc,
                                  smallest_detectable_tpr, tpr_p_value)

__all__ = ["ChanceTest", "EpsilonEvidence", "Evidence", "attack_evidence", "LeakVerdict", "leak_verdict",
           "NOT_TESTED"]

NOT_TESTED = "nothing was tested this round"


@dataclass(frozen=True)
class ChanceTest:
    """One figure of one attack tested against what a guess scores."""

    attack: str                  # e.g. "local / loss", "rmia / independent"
    statistic: str               # e.g. exact_auc, tpr_at_fpr_0.01
    metric: str                  # the round record's name of the figure
    estimate: float
    chance: float                # what a guess scores: 0.5 for an AUC, the non-members' FPR for a TPR
    p_value: float               # one-sided, under "members and non-members are alike"
    counts: Mapping[str, int]
    # The figure's two-sided interval at a given confidence (the one the reports print at the audit's level).
    interval: Callable[[float], tuple[float, float]] = field(repr=False, compare=False)
    tolerance: float | None = None  # the FPR tolerance of a TPR figure


@dataclass(frozen=True)
class EpsilonEvidence:
    """An epsilon lower bound a source can prove, at any confidence (to be corrected for the number of sources)."""

    attack: str
    bound: Callable[[float], float] = field(repr=False, compare=False)    # confidence -> epsilon lower bound
    ceiling: Callable[[float], float] = field(repr=False, compare=False)  # confidence -> the largest it could be
    counts: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Evidence:
    tests: tuple[ChanceTest, ...] = ()
    epsilons: tuple[EpsilonEvidence, ...] = ()

    def __add__(self, other: "Evidence") -> "Evidence":
        return Evidence(self.tests + other.tests, self.epsilons + other.epsilons)


@lru_cache(maxsize=256)
def _ceiling(n_pos: int, n_neg: int, delta: float, confidence: float) -> float:
    return largest_certifiable_epsilon(n_pos, n_neg, delta=delta, confidence=confidence)


def attack_evidence(attack: str, metric_of: Callable[[str], str], uncertainty: AttackUncertainty) -> Evidence:
    """The tests of one membership attack from its scores: its exact AUC, and its TPR at each tolerance the
    population resolves (an unresolvable one reads the TPR at population FPR 0, which is not the figure the report
    names); and its epsilon lower bound. `metric_of(statistic)` names the attack's figure in the round record."""
    if uncertainty.scores is None:
        raise ValueError(f"{attack}: the attack's scores are needed to test it against chance")
    pos, neg = uncertainty.scores
    n_pos, n_neg = int(pos.size), int(neg.size)
    sizes = {"members": n_pos, "nonmembers": n_neg}

    def auc_bounds(confidence: float) -> tuple[float, float]:
        if n_pos < 2 or n_neg < 2:
            return 0.0, 1.0
        found = auc_interval(pos, neg, confidence)
        return found.lower, found.upper

    tests = [ChanceTest(attack, EXACT_AUC, metric_of(EXACT_AUC), uncertainty.auc.estimate, 0.5,
                        auc_p_value(pos, neg), sizes, auc_bounds)]
    for tolerance, rates in uncertainty.at_fpr.items():
        if rates.resolvable is False:
            continue
        tp, fp = rates.tpr.k, rates.fpr.k

        def tpr_bounds(confidence: float, tp=tp) -> tuple[float, float]:
            found = clopper_pearson(tp, n_pos, confidence)
            return found.lower, found.upper

        statistic = tpr_statistic(tolerance)
        tests.append(ChanceTest(attack, statistic, metric_of(statistic), rates.tpr.rate, rates.fpr.rate,
                                tpr_p_value(tp, n_pos, fp, n_neg),
                                {"members_flagged": tp, "members": n_pos, "nonmembers_flagged": fp,
                                 "nonmembers": n_neg}, tpr_bounds, tolerance=float(tolerance)))
    delta = uncertainty.delta
    epsilon = EpsilonEvidence(
        attack,
        bound=lambda confidence: epsilon_lower_bound(pos, neg, delta=delta, confidence=confidence).epsilon,
        ceiling=lambda confidence: _ceiling(n_pos, n_neg, delta, confidence),
        counts=sizes,
    )
    return Evidence(tuple(tests), (epsilon,))


@dataclass(frozen=True)
class Finding:
    """A tested figure as the verdict reports it: its interval at the audit's confidence and the one corrected for
    the number of tests, its distance from chance, its raw and Holm-adjusted p-values and the counts."""

    attack: str
    statistic: str
    metric: str
    estimate: float
    chance: float
    p_value: float
    p_adjusted: float
    interval: tuple[float, float]
    corrected_interval: tuple[float, float]
    counts: Mapping[str, int]
    tolerance: float | None = None

    def to_dict(self) -> dict:
        return {"attack": self.attack, "statistic": self.statistic, "metric": self.metric,
                "estimate": _finite(self.estimate), "chance": _finite(self.chance), "p_value": self.p_value,
                "p_adjusted": self.p_adjusted, "interval": [_finite(v) for v in self.interval],
                "corrected_interval": [_finite(v) for v in self.corrected_interval], "counts": dict(self.counts),
                "tolerance": self.tolerance}


@dataclass(frozen=True)
class LeakVerdict:
    detected: bool | None        # None: nothing was tested
    confidence: float
    tests: int                   # how many figures were tested (the family)
    significant: tuple[Finding, ...]
    headline: Finding | None     # the most significant figure, detected or not
    floor: Mapping               # what these counts could detect (see leak_verdict)
    epsilon: Mapping             # the family-wise epsilon lower bound and what it rests on
    all_tests: tuple[Mapping, ...] = ()

    @property
    def metrics(self) -> dict[str, float]:
        """The verdict's scalars (they may leave the party): detected (1/0; NaN when nothing was tested), the
        headline's Holm-adjusted p-value, the family-wise epsilon lower bound and its ceiling."""
        return {
            LEAK_DETECTED: math.nan if self.detected is None else float(self.detected),
            LEAK_P_VALUE: math.nan if self.headline is None else float(self.headline.p_adjusted),
            LEAK_EPSILON_LB: float(self.epsilon.get("value", math.nan)),
            LEAK_EPSILON_CEILING: float(self.epsilon.get("ceiling", math.nan)),
        }

    def to_dict(self) -> dict:
        return {"detected": self.detected, "confidence": self.confidence, "correction": "holm", "tests": self.tests,
                "significant": [f.to_dict() for f in self.significant],
                "headline": None if self.headline is None else self.headline.to_dict(),
                "floor": _json_ready(dict(self.floor)), "epsilon": _json_ready(dict(self.epsilon)),
                "all_tests": list(self.all_tests)}


def _finite(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _json_ready(value):
    if isinstance(value, Mapping):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, float):
        return _finite(value)
    return value


def _finding(test: ChanceTest, p_adjusted: float, confidence: float, corrected: float) -> Finding:
    return Finding(test.attack, test.statistic, test.metric, test.estimate, test.chance, test.p_value, p_adjusted,
                   test.interval(confidence), test.interval(corrected), test.counts, test.tolerance)


def _floor(tests: Iterable[ChanceTest], alpha: float) -> dict:
    """What the round's counts could have detected with the correction for k tests (Holm's first step rejects at
    alpha / k): at the sizes of the most sensitive attack (the most members times non-members)."""
    tests = list(tests)
    sizes = max(((t.counts.get("members", 0), t.counts.get("nonmembers", 0)) for t in tests if "members" in t.counts),
                key=lambda s: s[0] * s[1], default=None)
    if sizes is None:
        return {}
    n_pos, n_neg = sizes
    level = alpha / len(tests)
    tolerances = sorted({t.tolerance for t in tests if t.tolerance is not None})
    return {"members": n_pos, "nonmembers": n_neg, "level_per_test": level,
            "exact_auc": smallest_detectable_auc(n_pos, n_neg, level),
            "tpr_at_fpr": {tolerance_name(t): smallest_detectable_tpr(n_pos, n_neg, t, level) for t in tolerances}}


def leak_verdict(evidence: Evidence, *, confidence: float, delta: float, run_rounds: int | None = None) -> LeakVerdict:
    """The verdict of the module docstring at the audit's `confidence` (the family-wise level is 1 - confidence)
    and the epsilon bounds' `delta`. `run_rounds`: the rounds of the run, when known: the epsilon bound is then also
    given at 1 - (1 - confidence) / run_rounds (`epsilon.run`), so that the largest of the run's rounds is a bound at
    `confidence` for the run (audit.party_account's empirical summary)."""
    alpha = 1.0 - confidence
    tests = list(evidence.tests)
    epsilon = _family_epsilon(evidence.epsilons, alpha, delta)
    if epsilon and run_rounds:
        run = _family_epsilon(evidence.epsilons, alpha / run_rounds, delta)
        epsilon["run"] = {"value": run["value"], "attack": run["attack"], "rounds": int(run_rounds),
                          "confidence_each": run["confidence_each"]}
    if not tests:
        return LeakVerdict(None, confidence, 0, (), None, {}, epsilon)
    k = len(tests)
    adjusted = holm([t.p_value for t in tests])
    corrected = 1.0 - alpha / k
    ranked = sorted(range(k), key=lambda i: (adjusted[i], tests[i].p_value, -(tests[i].estimate - tests[i].chance)))
    significant = tuple(_finding(tests[i], float(adjusted[i]), confidence, corrected)
                        for i in ranked if adjusted[i] <= alpha)
    headline = significant[0] if significant else _finding(tests[ranked[0]], float(adjusted[ranked[0]]), confidence,
                                                           corrected)
    every = tuple({"attack": t.attack, "statistic": t.statistic, "estimate": _finite(t.estimate),
                   "chance": _finite(t.chance), "p_value": t.p_value, "p_adjusted": float(a)}
                  for t, a in zip(tests, adjusted))
    return LeakVerdict(bool(significant), confidence, k, significant, headline, _floor(tests, alpha), epsilon, every)


def _family_epsilon(sources: Iterable[EpsilonEvidence], alpha: float, delta: float) -> dict:
    """Each source's bound at confidence 1 - alpha / k; the largest, whose source it is, and the largest bound the
    sources' counts could prove at that level (the ceiling: a bound near it reads as "as much as this audit can
    show")."""
    sources = list(sources)
    if not sources:
        return {}
    each = 1.0 - alpha / len(sources)
    bounds = [(float(s.bound(each)), s.attack) for s in sources]
    value, attack = max(bounds, key=lambda b: (b[0], b[1]))
    return {"value": value, "attack": attack if value > 0 else None, "sources": len(sources),
            "confidence": 1.0 - alpha, "confidence_each": each, "delta": delta,
            "ceiling": float(max(s.ceiling(each) for s in sources))}
