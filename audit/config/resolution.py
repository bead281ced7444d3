"""Which FPR tolerances a party's population is large enough to resolve.

TPR at FPR t is read with the threshold that flags at most k = floor(n t) of the n population samples
(audit.membership.population_attack). With fewer than 1/t population samples k = 0: the threshold flags none of
the population, the FPR reached is 0, not t, and "TPR at FPR t" is the TPR at population FPR 0 whatever t says.
A tolerance is resolvable when the population has at least 1/t samples. Few members or
non-members do not make the figure a reading of another tolerance: they make it coarse (steps of 1/n), which its
Clopper-Pearson interval (audit.membership.uncertainty) shows; with 7 members a TPR of 1/7 has the interval
[0.004, 0.58], chance included. With 100 collaborators on digits and the tutorial's ratios a party has 4 population
samples: only t >= 0.25 is resolvable, and "TPR at FPR 0.1" is a reading of FPR 0, which reports mark.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterable, Mapping

from audit.config.vocabulary import BOUNDS, tolerance_name, tpr_statistic

__all__ = ["largest_count", "resolvable", "resolution_warning", "unresolvable_thresholds"]


def largest_count(n: int, tolerance: float) -> int:
    """k = floor(n * t), the most of n samples a threshold at tolerance t may flag.

    Computed on the tolerance as written (its shortest decimal form, exact as a Fraction), not on the binary
    float: 0.3 is stored as 0.29999999999999998890, and 10 * 0.3 must give 3, not 2.
    """
    return math.floor(n * Fraction(repr(float(tolerance))))


def resolvable(tolerance: float, n_population: int) -> bool:
    """Whether a population of n_population samples resolves tolerance t: at least 1/t samples (module docstring)."""
    return largest_count(int(n_population), tolerance) >= 1


def resolution_warning(party: str, sizes: Mapping[str, int], tolerances: Iterable[float]) -> str | None:
    """One line for a party whose population cannot resolve some of the tolerances (None if it resolves all)."""
    n = int(sizes.get("population", 0))
    unresolved = [t for t in tolerances if not resolvable(t, n)]
    if not unresolved:
        return None
    floor = f"{1 / n:.3g}" if n else "none (an empty population)"
    return (f"{party}: {n} population samples resolve FPR tolerances >= {floor} (1 / population); TPR at FPR "
            f"{', '.join(tolerance_name(t) for t in unresolved)} would be read at population FPR 0 and is marked "
            f"unresolvable in the reports")


def unresolvable_thresholds(metrics: Iterable[str], tolerances: Iterable[float],
                            n_population: int) -> list[tuple[str, float]]:
    """The (metric, tolerance) pairs among gated `metrics` that read TPR at a tolerance a population of n_population
    samples cannot resolve: a gate on one would compare the TPR at population FPR 0, whatever its name says."""
    endings = {}
    for tol in tolerances:
        statistic = tpr_statistic(tol)
        endings.update({f"_{statistic}": tol, **{f"_{statistic}_{bound}": tol for bound in BOUNDS}})
    out = []
    for metric in metrics:
        tol = next((t for ending, t in endings.items() if str(metric).endswith(ending)), None)
        if tol is not None and not resolvable(tol, n_population):
            out.append((metric, tol))
    return out
