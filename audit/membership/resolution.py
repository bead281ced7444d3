"""Which FPR tolerances a party's audit sets are large enough to resolve.

TPR at FPR t is read with the threshold that flags at most k = floor(n t) of the n population samples
(audit.membership.population_attack). A set of fewer than 1/t samples cannot resolve t:
- the population: k = 0, the threshold flags none of it, so the FPR reached is 0, not t;
- the non-members, whose FPR checks t: it can only be 0 or at least 1/n > t;
- the members: their TPR moves in steps of 1/n > t, so it cannot tell chance (TPR = t) from nothing.
A tolerance is resolvable when each of the three sets has at least 1/t samples. With 100 collaborators on digits and
the tutorial's ratios a party has 7 members, 7 non-members and 4 population samples: only t >= 0.25 is resolvable,
and "TPR at FPR 0.1" is a reading of its 4 population samples, which reports mark.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterable, Mapping

from audit.config.vocabulary import tolerance_name

__all__ = ["largest_count", "resolvable", "resolution_warning"]


def largest_count(n: int, tolerance: float) -> int:
    """k = floor(n * t), the most of n samples a threshold at tolerance t may flag.

    Computed on the tolerance as written (its shortest decimal form, exact as a Fraction), not on the binary
    float: 0.3 is stored as 0.29999999999999998890, and 10 * 0.3 must give 3, not 2.
    """
    return math.floor(n * Fraction(repr(float(tolerance))))


def resolvable(tolerance: float, *set_sizes: int) -> bool:
    """Whether every set (members, non-members, population) has at least 1/t samples (see the module docstring)."""
    return all(largest_count(int(n), tolerance) >= 1 for n in set_sizes)


def resolution_warning(party: str, sizes: Mapping[str, int], tolerances: Iterable[float]) -> str | None:
    """One line for a party whose audit sets cannot resolve some of the tolerances (None if they resolve all)."""
    tolerances = list(tolerances)
    unresolved = [t for t in tolerances if not resolvable(t, *sizes.values())]
    if not unresolved:
        return None
    smallest = min(sizes.values())
    floor = f"{1 / smallest:.3g}" if smallest else "none (an empty set)"
    return (f"{party}: audit sets of {sizes.get('members')} members, {sizes.get('nonmembers')} non-members and "
            f"{sizes.get('population')} population samples resolve FPR tolerances >= {floor} (1 / the smallest set); "
            f"TPR at FPR {', '.join(tolerance_name(t) for t in unresolved)} is read from too few samples and is "
            f"marked unresolvable in the reports")
