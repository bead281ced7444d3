"""The accountant's epsilon of the mechanisms the canary audits check, with opacus' RDP accountant (the one the
party's DP training reports through audit/dp_training.py), at its default orders. opacus (and with it torch) is
imported on the first epsilon computed, not with this module.
"""

from __future__ import annotations

import math
from functools import lru_cache

__all__ = ["dp_sgd_epsilon", "gaussian_epsilon", "update_mechanism_epsilon"]


def dp_sgd_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """The RDP accountant's epsilon (opacus, the one the party's DP training reports, at its default orders) of one
    DP-SGD training."""
    return _dp_sgd_epsilon(float(noise_multiplier), float(sample_rate), int(steps), float(delta))


@lru_cache(maxsize=256)  # opacus' fractional orders are seconds of pure Python per call
def _dp_sgd_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    if steps == 0:
        return 0.0
    from opacus.accountants import RDPAccountant  # opacus only where DP is audited: its memory stays out elsewhere

    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, sample_rate, steps)]
    return float(accountant.get_epsilon(delta))


def gaussian_epsilon(noise_multiplier: float, delta: float, releases: int = 1) -> float:
    """The RDP accountant's epsilon of `releases` Gaussian mechanisms of this noise multiplier (std / sensitivity)."""
    if noise_multiplier <= 0:
        return math.inf
    return dp_sgd_epsilon(noise_multiplier, 1.0, releases, delta)


def update_mechanism_epsilon(sigma: float, delta: float, releases: int = 1) -> float:
    """dp_fedavg's claim for the party's update: clipped to C, noise sigma C, sensitivity 2 C (any change of the
    party's data moves the clipped update within the ball of radius C)."""
    return gaussian_epsilon(sigma / 2, delta, releases)
