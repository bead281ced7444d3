"""The f-DP one-run bound (Mahloujifar, Melis and Chaudhuri, "Auditing f-Differential Privacy in One Run", ICML 2025)
from the counts of a guessing game with abstention. Pure numpy: no torch.

The same game as Steinke, Nasr and Jagielski's (audit.canary.one_run): m canaries, each included with probability
1/2; the auditor guesses "in" for its k best-scored canaries and abstains on the rest; c guesses are right. Where
Steinke et al. test one (epsilon, delta) point, this tests a whole hypothesised trade-off curve f: for a mechanism
that is f-DP towards every canary, the paper's recursion over the number of right guesses bounds the probability
of c or more right guesses, and `rejects` says whether it is at most alpha. The curve comes from a family
(audit.canary.claims): the claimed mechanism at every noise multiplier, or mu-GDP without a claim; the figure is the
least noise the counts reject, as its accountant's epsilon. Valid for any mechanism, however its canaries
interact: it assumes nothing but f-DP towards each canary.

The recursion, with r the right guesses' and h the wrong guesses' probability mass (each started at alpha times its
share of the m canaries), walking down i = c - 1, ..., 0:

    h' = max(h, f_inv(r)),   r' = min(1, r + i / (k - i) (h' - h))

where f_inv(x) is the least false-positive rate that reaches true-positive rate x under f (`fpr_for` of the curve);
the curve is rejected when r + h ends above k / m. The same recursion as the paper's public implementations
(jax_privacy's `_epsilon_one_run_fdp`, PrivacyGuard's `FDPAnalysisNode.rh_with_cap`), written from them and the
paper; tests/test_canary_fdp.py checks it against a separate transcription in 50-digit arithmetic and, for the
pure-epsilon curve, against Steinke et al.'s theorem, which it reproduces when every guess is right.

"In" guesses only (the grid's one-sided entries): the curves are the "canary out against canary in" trade-off the
guesses face (DP-SGD's is not symmetric). The guess count is chosen over the fixed grid, each entry tested at
alpha / (entries): the figure carries the correction for the choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from audit.canary.claims import CEILING_LOWEST, CEILING_TOLERANCE, Family, least_rejected_noise
from audit.canary.one_run import CanaryCounts, GuessCount

__all__ = ["rejects", "FamilyBound", "fdp_bound", "one_sided_counts"]


def rejects(curve, m: int, guesses: int, correct: int, alpha: float) -> bool:
    """Whether `correct` right guesses of `guesses` (m canaries) reject "f-DP towards every canary" at level alpha,
    f the trade-off of `curve` (its `fpr_for`)."""
    if not 0 <= correct <= guesses <= m or m < 1:
        raise ValueError(f"counts: need correct <= guesses <= canaries, got {correct}, {guesses}, {m}")
    if guesses == 0:
        return False
    right = alpha * correct / m
    wrong = alpha * (guesses - correct) / m
    for i in range(correct - 1, -1, -1):
        needed = max(wrong, curve.fpr_for(right))
        if needed == wrong:  # nothing moves again: the rest of the walk is the same
            break
        right = min(1.0, right + i / (guesses - i) * (needed - wrong))
        wrong = needed
    return right + wrong > guesses / m


@dataclass(frozen=True)
class FamilyBound:
    """The least noise of a family the canaries reject, and its epsilon."""

    method: str               # "f-DP one run" or "independent canaries"
    family: Family
    noise: float | None       # sigma*: every noise multiplier >= it is rejected (None: none is)
    epsilon: float            # family.epsilon(noise, delta): 0 when nothing is rejected
    ceiling: float            # the figure when the canaries are told apart perfectly (at least: the search stops at a
                              # sixteenth of the claimed noise, on the family's coarse curves)
    claim_rejected: bool | None  # the claimed noise multiplier is rejected (None: no claim)
    alpha: float              # the whole figure's one-sided level (each grid entry's share inside)
    delta: float
    grid: int                 # entries the choice was made over

    def to_dict(self) -> dict:
        return {"method": self.method, "family": self.family.to_dict(), "noise_multiplier": self.noise,
                "epsilon": self.epsilon, "ceiling": self.ceiling, "claim_rejected": self.claim_rejected,
                "alpha": self.alpha, "delta": self.delta, "grid": self.grid}


def one_sided_counts(counts: CanaryCounts) -> tuple[GuessCount, ...]:
    """The grid entries that guess only "in"."""
    return tuple(c for c in counts.counts if c.guess.out_guesses == 0)


def _rejects_any(family: Family, noise: float, m: int, entries, level: float, coarse: bool = False) -> bool:
    curve = family.curve(noise, coarse=coarse)
    return any(rejects(curve, m, c.guess.r, c.correct, level) for c in entries)


def fdp_bound(counts: CanaryCounts, family: Family, *, delta: float, alpha: float,
              claimed_noise: float | None = None) -> FamilyBound:
    """The f-DP bound of the counts: the least noise of `family` whose curve they reject at alpha (corrected for the
    choice over the one-sided grid entries), its epsilon, the ceiling, and whether the claimed noise is rejected."""
    entries = one_sided_counts(counts)
    if not entries:
        raise ValueError("f-DP bound: the counts hold no one-sided (\"in\" only) guess count")
    level = alpha / len(entries)
    scale = claimed_noise or 1.0
    # A noise whose coarse curve is rejected needs no fine one: a looser curve rejected means the fine one is (the
    # recursion grows with f_inv), so the answer is the fine curves' alone, from fewer of them.
    noise = least_rejected_noise(lambda s: (_rejects_any(family, s, counts.m, entries, level, coarse=True)
                                            or _rejects_any(family, s, counts.m, entries, level)), scale)
    perfect = tuple(GuessCount(c.guess, c.guess.r) for c in entries)
    # The ceiling on coarse curves: a looser curve is rejected at no lower noise than the fine one (the recursion
    # grows with f_inv, which a looser curve lowers), so the ceiling is understated, never overstated.
    best = least_rejected_noise(lambda s: _rejects_any(family, s, counts.m, perfect, level, coarse=True), scale,
                                CEILING_TOLERANCE, CEILING_LOWEST)
    claim = None if claimed_noise is None else _rejects_any(family, claimed_noise, counts.m, entries, level)
    return FamilyBound("f-DP one run", family, noise, family.epsilon(noise, delta), family.epsilon(best, delta),
                       claim, alpha, float(delta), len(entries))
