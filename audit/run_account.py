"""What the whole run cost a party's data: the DP account composed over its rounds, and the empirical summary.

The DP account bounds what the weights a party sent say about its data. A DP mechanism run on the party's data
composes when its output could change what the party sent:
- every DP-SGD try of the gate's `dp_retrain` (audit.gate_flow), sent or not: a try that failed its audit was never
  sent, but that it failed decided what was sent instead (the next try, or the received weights), so the weights
  sent are a function of every try run;
- the update of the `dp_fedavg` mitigation (the whole update clipped to C, noise sigma C: a Gaussian mechanism of
  sensitivity 2C, noise multiplier sigma / 2, one release), whenever the gate looked at it before deciding;
- not a mechanism the run budget refused before it ran or before the gate looked at it (`RunBudget`): that decision
  reads only the mechanism's parameters, never its output.
Weights that carry no data of the party (the received global model sent back, an earlier global model after a
rejected one) release nothing. A round that sent weights computed from the data without a DP mechanism (the plain
update, or one with noise but no clipping) has no bound: the total is then "not bounded", naming those rounds, never
a number.

Outside every account here: the gate's decisions (kept, withheld, the number of retries) and the audit's scalars the
aggregator gets are functions of the party's data computed without noise, as that a round needed a DP retrain
depends on its non-private model.

Composition is opacus' RDP accountant (RDPAccountant) over the history of (noise multiplier, sample rate, steps)
of every mechanism that composes, as each round's own figure is (audit.dp_training.RoundAccountant, the same
accountant at its default orders): RDP adds over mechanisms at each order (Mironov, "Renyi Differential Privacy",
CSF 2017, Proposition 1), the subsampled Gaussian's RDP is Mironov, Talwar and Zhang 2019, and opacus converts to
(epsilon, delta) with Balle et al. 2020's conversion (opacus.accountants.analysis.rdp.get_privacy_spent).

The empirical summary is what the audits measured: the largest family-wise epsilon lower bound of any round and how
many rounds detected a leak; a per-round lower bound is not a composed budget (docs/verdict.md, "The run's account").
opacus (and torch) is imported on the first composition, not with this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Sequence

__all__ = ["ACCOUNTANT", "Mechanism", "RoundRelease", "DPAccount", "compose", "dp_account", "dp_sgd_mechanism",
           "dp_fedavg_mechanism", "RunBudget", "BudgetCheck"]

# The accountant every figure of the account is computed with: opacus' RDPAccountant, as the DP retrain reports.
ACCOUNTANT = "rdp"
ACCOUNTANT_TEXT = "opacus' RDP accountant (RDPAccountant, its default orders)"


@dataclass(frozen=True)
class Mechanism:
    """One DP mechanism run on the party's data: `steps` Poisson-subsampled Gaussian steps at `sample_rate` with
    noise `noise_multiplier` (std / sensitivity); `what` says which ("dp_retrain try 1", "dp_fedavg update")."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    what: str = ""

    def entry(self) -> tuple[float, float, int]:
        """Its entry in opacus' accountant history."""
        return (float(self.noise_multiplier), float(self.sample_rate), int(self.steps))

    def to_json(self) -> dict:
        return {"noise_multiplier": float(self.noise_multiplier), "sample_rate": float(self.sample_rate),
                "steps": int(self.steps), "what": self.what}

    @classmethod
    def from_json(cls, data) -> "Mechanism":
        return cls(float(data["noise_multiplier"]), float(data["sample_rate"]), int(data["steps"]),
                   str(data.get("what") or ""))


def dp_sgd_mechanism(noise_multiplier: float, members: int, batch_size: int, epochs: int,
                     what: str = "") -> Mechanism:
    """The mechanism of one DP-SGD training (audit.dp_training.dp_retrain), from its parameters alone, as opacus sets
    it up: Poisson sampling at 1 / (batches of a plain loader) = 1 / ceil(members / batch_size), and
    int(1 / sample_rate) steps an epoch (opacus' DPDataLoader and UniformWithReplacementSampler)."""
    batches = math.ceil(members / batch_size)
    sample_rate = 1 / batches
    return Mechanism(float(noise_multiplier), sample_rate, int(1 / sample_rate) * int(epochs), what)


def dp_fedavg_mechanism(sigma: float, what: str = "dp_fedavg update") -> Mechanism:
    """dp_fedavg's update (clipped to C, noise sigma C): a Gaussian of sensitivity 2C (any change of the party's data
    moves the clipped update within the ball of radius C), i.e. noise multiplier sigma / 2, released once."""
    return Mechanism(float(sigma) / 2, 1.0, 1, what)


def compose(mechanisms: Iterable[Mechanism], delta: float) -> float:
    """The RDP accountant's epsilon at `delta` of every mechanism in `mechanisms` composed (0.0 for none; inf for a
    mechanism without noise).

    Mechanisms with the same noise multiplier and sample rate are one history entry with their steps summed: the
    accountant's RDP of an entry is its steps times one step's, so the sum is the same composition, and opacus' cost
    (about 0.07 CPU-seconds an entry, its fractional orders in pure Python) grows with the distinct mechanisms, not
    with the rounds."""
    merged: dict[tuple[float, float], int] = {}
    for m in mechanisms:
        noise, rate, steps = m.entry()
        if steps > 0:
            merged[(noise, rate)] = merged.get((noise, rate), 0) + steps
    return _compose(tuple((noise, rate, steps) for (noise, rate), steps in sorted(merged.items())), float(delta))


@lru_cache(maxsize=1024)
def _compose(history: tuple[tuple[float, float, int], ...], delta: float) -> float:
    if not history:
        return 0.0
    if any(noise <= 0 for noise, _, _ in history):
        return math.inf
    from opacus.accountants import RDPAccountant  # opacus only where DP is accounted (~0.1 GB per process)

    accountant = RDPAccountant()
    accountant.history = list(history)
    return float(accountant.get_epsilon(delta))


@dataclass(frozen=True)
class RoundRelease:
    """What one round released of the party's data, for the DP account: the mechanisms that compose (`Mechanism`),
    and, when the round sent weights computed from the data without DP, why it has no bound (`unbounded`)."""

    round: int
    mechanisms: tuple[Mechanism, ...] = ()
    unbounded: str | None = None

    def to_json(self) -> dict:
        return {"mechanisms": [m.to_json() for m in self.mechanisms], "unbounded": self.unbounded}


@dataclass(frozen=True)
class DPAccount:
    """A party's DP total over the run: `epsilon` composed over every round's mechanisms at `delta` (None when a round
    sent weights without DP: `unbounded_rounds`, each with why), each round's own figure beside it, and the run
    budget it is held to (None: none)."""

    delta: float
    epsilon: float | None
    unbounded: dict[int, str] = field(default_factory=dict)
    per_round: dict[int, float] = field(default_factory=dict)  # each round's own epsilon (its mechanisms alone)
    mechanisms: int = 0
    budget: float | None = None
    accountant: str = ACCOUNTANT

    @property
    def bounded(self) -> bool:
        return not self.unbounded

    @property
    def over_budget(self) -> bool:
        """Whether the total exceeds the run budget (an unbounded total exceeds every budget)."""
        if self.budget is None:
            return False
        return not self.bounded or self.epsilon is None or self.epsilon > self.budget

    def text(self) -> str:
        """"DP ε = 3.1 over 6 releases at δ = 1e-05 (RDP)" or "DP: not bounded (rounds 0, 2 sent without DP)"."""
        if not self.bounded:
            rounds = sorted(self.unbounded)
            return (f"DP: not bounded (round{'s' if len(rounds) > 1 else ''} {', '.join(map(str, rounds))} sent "
                    f"weights computed from the data without DP)")
        if not self.mechanisms:
            return "DP: no release to account (no weights computed from the data were sent)"
        budget = "" if self.budget is None else f", run budget {self.budget:g}"
        return (f"DP ε = {self.epsilon:.3g} composed over {self.mechanisms} DP release"
                f"{'s' if self.mechanisms != 1 else ''} at δ = {self.delta:g} ({self.accountant.upper()}{budget})")

    def to_json(self) -> dict:
        return {"accountant": self.accountant, "delta": self.delta, "bounded": self.bounded,
                "epsilon": None if self.epsilon is None or not math.isfinite(self.epsilon) else self.epsilon,
                "unbounded_rounds": {str(r): why for r, why in sorted(self.unbounded.items())},
                "per_round": {str(r): e for r, e in sorted(self.per_round.items())},
                "mechanisms": self.mechanisms, "budget": self.budget, "over_budget": self.over_budget}

    @classmethod
    def from_json(cls, data) -> "DPAccount":
        return cls(delta=float(data["delta"]), epsilon=None if data.get("epsilon") is None else float(data["epsilon"]),
                   unbounded={int(r): str(w) for r, w in (data.get("unbounded_rounds") or {}).items()},
                   per_round={int(r): float(e) for r, e in (data.get("per_round") or {}).items()},
                   mechanisms=int(data.get("mechanisms") or 0),
                   budget=None if data.get("budget") is None else float(data["budget"]),
                   accountant=str(data.get("accountant") or ACCOUNTANT))


def dp_account(releases: Sequence[RoundRelease], delta: float, budget: float | None = None) -> DPAccount:
    """The DP total over `releases` (one per round) at `delta`, with each round's own figure."""
    unbounded = {r.round: r.unbounded for r in releases if r.unbounded}
    every = [m for r in releases for m in r.mechanisms]
    per_round = {r.round: compose(r.mechanisms, delta) for r in releases if r.mechanisms}
    epsilon = None if unbounded else compose(every, delta)
    return DPAccount(delta=float(delta), epsilon=epsilon, unbounded=unbounded, per_round=per_round,
                     mechanisms=len(every), budget=budget)


@dataclass(frozen=True)
class BudgetCheck:
    """Whether a release fits the run budget: the total it would make (inf for weights without DP)."""

    allowed: bool
    total: float
    spent: float
    budget: float

    def reason(self) -> str:
        total = "not bounded (weights without DP)" if math.isinf(self.total) else f"{self.total:.4g}"
        return (f"run ε budget: sending it would make the run's DP ε {total} > {self.budget:g} "
                f"(spent so far {self.spent:.4g})")


@dataclass
class RunBudget:
    """`gate.run_epsilon_budget` for one party: the mechanisms of the run so far, and whether one more release fits.
    Before each release the caller asks `check` with the release's mechanisms (None: weights computed from the data
    without DP, which no budget admits); only what it then runs or sends is added (`spend`)."""

    budget: float
    delta: float
    spent: list[Mechanism] = field(default_factory=list)

    def spent_epsilon(self) -> float:
        return compose(self.spent, self.delta)

    def check(self, mechanisms: Sequence[Mechanism] | None) -> BudgetCheck:
        spent = self.spent_epsilon()
        total = math.inf if mechanisms is None else compose([*self.spent, *mechanisms], self.delta)
        return BudgetCheck(total <= self.budget, total, spent, self.budget)

    def spend(self, mechanisms: Iterable[Mechanism]) -> None:
        self.spent.extend(mechanisms)
