"""The aggregator's canary clients (Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning",
ICLR 2024), for a federation whose parties send dp_fedavg updates (clipped to C, Gaussian noise sigma C each).

Each round the aggregator draws 2k random directions over the model's floating tensors, each of norm about C. The
first k are canary clients: each is added to the round's average as the update of one more party (its share of the
average: 1 / the number of parties averaged), times `scale`; the other k are never inserted. After the round, each
canary's cosine with the model's change:

    held out:  cos ~ N(0, 1/d)  (a random direction against a vector it does not depend on, d values)
    inserted:  cos ~ N(scale (C / n) / |change|, 1/d)

so mu = sqrt(d) x the inserted canaries' mean coordinate along their direction, in units of the parties' average
change (the model's change without the canaries), / scale is the Gaussian-DP parameter of one party's presence in
the published model (one party of the mean weight, whose clipped update the others' noise hides), and its epsilon at
delta (Gaussian DP's conversion) estimates the user-level epsilon of the round's global model; rounds compose as
sqrt(sum mu^2). An estimate with its interval (from the k inserted canaries' spread), not a bound: the authors'
method. Beside it, the accountant's epsilon of the same release (the noise the averaged parties add, sensitivity C / n
for adding or removing one such party). `scale` < 1 keeps the canaries from moving the model (their effect on
accuracy: benchmarks/README.md); the estimate is scaled back to a full-size party. Torch-free, OpenFL-free.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import t as student

from audit.canary.accountant import gaussian_epsilon
from audit.canary.tradeoff import gdp_epsilon

__all__ = ["CanaryClients"]


def _finite(value: float) -> float | None:
    """JSON has no infinity: an accountant without noise (no guarantee) is None."""
    return value if math.isfinite(value) else None


@dataclass
class _Round:
    dimension: int
    parties: int
    share_noise: float           # sqrt(sum (w_i / W)^2) of the averaged parties: the average's noise per sigma C
    dots: np.ndarray             # (2k,) each canary's inner product with the model's change
    norms: np.ndarray            # (2k,) each canary's squared norm
    change: float = 0.0          # the model change's squared norm
    rest: float = 0.0            # the parties' average change's squared norm (the change without the canaries)
    tensors: int = 0
    incomplete: list = field(default_factory=list)  # tensors seen without a starting value


class CanaryClients:
    """k inserted and k held-out canary clients per round; `add` is called for every averaged tensor (with the round's
    start value and the parties' average) and returns the tensor with the canaries in; `estimate(round)` after it."""

    def __init__(self, *, count: int, scale: float, clip: float, sigma: float, seed: int = 0,
                 delta: float = 1e-5, confidence: float = 0.95):
        if count < 2 or not 0 < scale <= 1 or clip <= 0 or sigma < 0:
            raise ValueError(f"canary clients: need count >= 2, 0 < scale <= 1, clip > 0, sigma >= 0; got {count}, "
                             f"{scale}, {clip}, {sigma}")
        self.count, self.scale, self.clip, self.sigma = int(count), float(scale), float(clip), float(sigma)
        self.seed, self.delta, self.confidence = int(seed), float(delta), float(confidence)
        self._rounds: dict[int, _Round] = {}

    def start_round(self, fl_round: int, *, dimension: int, weights) -> None:
        """The round's model size (floating values) and the weights of the parties averaged this round."""
        weights = np.asarray(list(weights), dtype=float)
        total = weights.sum()
        share = float(np.sqrt(np.sum((weights / total) ** 2))) if len(weights) and total > 0 else math.nan
        self._rounds[int(fl_round)] = _Round(int(dimension), len(weights), share, np.zeros(2 * self.count),
                                             np.zeros(2 * self.count))

    def started(self, fl_round: int) -> bool:
        return int(fl_round) in self._rounds

    def _direction(self, fl_round: int, tensor_name: str, j: int, shape) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(fl_round), zlib.crc32(tensor_name.encode()), j])
        return rng.standard_normal(shape) * (self.clip / math.sqrt(self._rounds[int(fl_round)].dimension))

    def add(self, fl_round: int, tensor_name: str, start, averaged) -> np.ndarray:
        """The averaged tensor with the inserted canaries added (each its party's share times `scale`); records every
        canary's inner product with the tensor's change from `start` (None: the change is unknown, the round's
        estimate is then refused)."""
        state = self._rounds[int(fl_round)]
        averaged = np.asarray(averaged)
        if averaged.dtype.kind != "f":
            return averaged
        if state.parties == 0:  # every update left out: the model stays as it was, no canary goes in
            return averaged
        if start is None:
            state.incomplete.append(tensor_name)
            return averaged
        weight = self.scale / state.parties
        out = averaged.astype(np.float64)
        for j in range(self.count):  # one direction in memory at a time (a tensor may be large)
            out += weight * self._direction(fl_round, tensor_name, j, averaged.shape)
        change = (out - np.asarray(start, dtype=np.float64)).ravel()
        for j in range(2 * self.count):
            direction = self._direction(fl_round, tensor_name, j, averaged.shape).ravel()
            state.dots[j] += float(direction @ change)
            state.norms[j] += float(direction @ direction)
        state.change += float(change @ change)
        rest = (averaged.astype(np.float64) - np.asarray(start, dtype=np.float64)).ravel()
        state.rest += float(rest @ rest)
        state.tensors += 1
        return out.astype(averaged.dtype)

    def _mu(self, state: _Round) -> dict:
        cosines = state.dots / np.sqrt(state.norms * state.change)
        # Each canary's coordinate in units of the parties' change per coordinate, |rest| / sqrt(d): ~ N(0, 1) for a
        # held-out canary, N(mu scale, 1) for an inserted one. Against the parties' change, not the whole one: the
        # inserted canaries' own norm is no noise that hides a party (with |change| the estimate fell with `scale`).
        z = state.dots * math.sqrt(state.dimension) / np.sqrt(state.norms * state.rest)
        inserted, held_out = z[: self.count], z[self.count:]
        k = self.count
        mean, spread = float(inserted.mean()), float(inserted.std(ddof=1))
        half = float(student.ppf(0.5 + self.confidence / 2, k - 1) * spread / math.sqrt(k))
        return {"mu": mean / self.scale, "mu_interval": [(mean - half) / self.scale, (mean + half) / self.scale],
                "inserted_mean_z": mean, "inserted_sd_z": spread,
                "held_out_mean_z": float(held_out.mean()), "held_out_sd_z": float(held_out.std(ddof=1)),
                "cosines_inserted": cosines[:k].tolist(), "cosines_held_out": cosines[k:].tolist()}

    def accountant_epsilon(self, share_noise: float, parties: int, rounds: int = 1) -> float:
        """The Gaussian mechanism's epsilon (RDP accountant) of `rounds` such releases for one party of the mean weight:
        noise sigma C share_noise per value, sensitivity C / parties (adding or removing it)."""
        if self.sigma == 0 or not parties:
            return math.inf
        return gaussian_epsilon(self.sigma * share_noise * parties, self.delta, rounds)

    def estimate(self, fl_round: int) -> dict | None:
        """This round's estimate and the run's so far (rounds compose as sqrt(sum mu^2)), beside the accountant's."""
        state = self._rounds.get(int(fl_round))
        if state is None:
            return None
        base = {"round": int(fl_round), "count": self.count, "scale": self.scale, "clip": self.clip,
                "sigma": self.sigma, "delta": self.delta, "confidence": self.confidence,
                "dimension": state.dimension, "parties": state.parties}
        if state.incomplete or state.tensors == 0 or state.change == 0 or state.rest == 0:
            return {**base, "estimated": False,
                    "why": (f"no starting value for {state.incomplete[:3]}" if state.incomplete else
                            "no update was averaged" if not state.tensors else
                            "the parties' updates did not change the model")}
        this = self._mu(state)
        done = [r for r in sorted(self._rounds) if r <= fl_round and self._rounds[r].tensors
                and not self._rounds[r].incomplete and self._rounds[r].rest > 0]
        mus = [self._mu(self._rounds[r]) for r in done]
        total = math.sqrt(sum(max(m["mu"], 0.0) ** 2 for m in mus))
        z_eff = [self.sigma * self._rounds[r].share_noise * self._rounds[r].parties for r in done]
        composed = (math.inf if self.sigma == 0 else
                    self._composed_accountant(z_eff))
        lo, hi = this["mu_interval"]
        return {**base, "estimated": True, **this,
                "epsilon": gdp_epsilon(max(this["mu"], 0.0), self.delta),
                "epsilon_interval": [gdp_epsilon(max(lo, 0.0), self.delta), gdp_epsilon(max(hi, 0.0), self.delta)],
                "accountant_epsilon": _finite(self.accountant_epsilon(state.share_noise, state.parties)),
                "rounds": len(done), "mu_run": total, "epsilon_run": gdp_epsilon(total, self.delta),
                "accountant_epsilon_run": _finite(composed)}

    def _composed_accountant(self, noise_multipliers: list[float]) -> float:
        """Gaussian mechanisms compose in RDP as one with 1/z^2 = sum 1/z_r^2."""
        return gaussian_epsilon(1.0 / math.sqrt(sum(1.0 / z ** 2 for z in noise_multipliers)), self.delta)
