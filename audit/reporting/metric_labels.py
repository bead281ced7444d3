"""What a metric name means to a reader, and which way it is worse: the labels the aggregator's page and plots show
instead of raw keys, the direction its "worst collaborator" is read in, and whether a mean over parties means
anything. Torch-free; one definition for every view that names metrics."""

from __future__ import annotations

import re

from audit.config.vocabulary import (ADVANTAGE, AUC, EPSILON_LB, EXACT_AUC, LEAK_DETECTED, LEAK_EPSILON_CEILING,
                                     LEAK_EPSILON_LB, LEAK_P_VALUE)

__all__ = ["metric_label", "worse_when_lower", "averageable"]

_FIXED = {
    LEAK_DETECTED: "leak detected (1) or not (0)",
    LEAK_P_VALUE: "leak test's adjusted p-value",
    LEAK_EPSILON_LB: "proven ε lower bound (family-wise)",
    LEAK_EPSILON_CEILING: "largest ε these counts could prove",
}
_STATISTICS = {EXACT_AUC: "exact AUC", AUC: "AUC (Privacy Meter's grid)", ADVANTAGE: "advantage (max TPR − FPR)",
               EPSILON_LB: "ε lower bound"}
# <prefix><model>_<signal>_<statistic>: the membership step's and RMIA's metric names (audit.config.vocabulary)
_ATTACK = re.compile(r"^(?:mia_(?P<model>local|global|update|final)_(?P<signal>.+?)|rmia_(?P<refs>[a-z_]+?))_"
                     r"(?P<statistic>exact_auc|auc|advantage|epsilon_lb|tpr_at_fpr_[0-9.e-]+)$")


def metric_label(metric: str) -> str:
    """A reader's name for a metric: "exact AUC: local / loss", "TPR at FPR 0.01: rmia / independent",
    "proven ε lower bound (family-wise)"; the key itself where nothing better is known."""
    if metric in _FIXED:
        return _FIXED[metric]
    match = _ATTACK.match(metric)
    if not match:
        return metric
    statistic = match.group("statistic")
    said = (f"TPR at FPR {statistic[len('tpr_at_fpr_'):]}" if statistic.startswith("tpr_at_fpr_")
            else _STATISTICS.get(statistic, statistic))
    attack = (f"rmia / {match.group('refs')}" if match.group("refs") else
              f"{match.group('model')} / {match.group('signal')}")
    return f"{said}: {attack}"


def worse_when_lower(metric: str) -> bool:
    """Whether a smaller value is the worse one for privacy: a p-value (smaller: surer evidence of a leak). Every other
    audit figure (AUC, TPR, advantage, ε bound) is worse when larger."""
    return metric == LEAK_P_VALUE or metric.endswith("_p_value")


def averageable(metric: str) -> bool:
    """Whether a mean over parties is a figure at all: not for p-values (a mean of p-values is no p-value) nor for
    bounds (a mean of lower bounds bounds nothing); the page shows each party's value and the worst instead."""
    return not (worse_when_lower(metric) or metric.endswith((EPSILON_LB, "_ceiling", "_lower", "_upper")))
