"""The aggregator's canary clients (audit.canary.clients) on a simulated dp_fedavg round, against the values the
Gaussian mechanism has analytically: held-out canaries' cosines are N(0, 1/d), the inserted ones give the mechanism's
own Gaussian-DP parameter for one party of the mean weight."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from audit.canary.accountant import gaussian_epsilon
from audit.canary.clients import CanaryClients
from audit.canary.tradeoff import gdp_epsilon


def test_gdp_epsilon_is_the_gaussian_mechanisms_own():
    """mu-GDP at delta: the Gaussian mechanism with noise multiplier 1/mu (Balle and Wang's exact epsilon)."""
    for mu in (0.3, 1.0, 2.5):
        eps = gdp_epsilon(mu, 1e-5)
        delta = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
        assert delta == pytest.approx(1e-5, rel=1e-6)
    assert gdp_epsilon(1.0, 1e-5) == pytest.approx(4.38, abs=0.01)
    assert gdp_epsilon(0.0, 1e-5) == 0.0
    assert math.isfinite(gdp_epsilon(200.0, 1e-5))  # no overflow where e^epsilon would


def simulate(clients: CanaryClients, rounds: int, parties: int, sigma: float, clip: float, shapes, seed: int,
             update: float = 0.5):
    """Rounds of dp_fedavg: each party's clipped update (a random direction of norm `update` x clip) plus its noise
    sigma clip, averaged with equal weights, the canary clients added by the function under test."""
    rng = np.random.default_rng(seed)
    d = sum(int(np.prod(s)) for s in shapes)
    start = {f"t{i}": rng.standard_normal(s) for i, s in enumerate(shapes)}
    for fl_round in range(rounds):
        clients.start_round(fl_round, dimension=d, weights=[1.0] * parties)
        for name, value in start.items():
            updates = [value + rng.standard_normal(value.shape) * (update * clip / math.sqrt(d))
                       + rng.standard_normal(value.shape) * sigma * clip for _ in range(parties)]
            start[name] = clients.add(fl_round, name, value, np.mean(updates, axis=0))


@pytest.mark.parametrize("parties, sigma", [(3, 0.5), (2, 1.0)])
def test_estimate_matches_the_mechanism_and_the_null_holds(parties, sigma):
    clip, scale = 2.0, 0.5
    clients = CanaryClients(count=100, scale=scale, clip=clip, sigma=sigma, seed=3)
    simulate(clients, 2, parties, sigma, clip, [(60, 50), (1000,), (7,)], seed=parties)
    estimate = clients.estimate(1)
    # one party of weight 1/n among n with noise sigma clip each: the average's noise is sigma clip / sqrt(n), the
    # party's clipped update moves it by clip / n: mu = (clip / n) / (sigma clip / sqrt(n)) = 1 / (sigma sqrt(n))
    mu = 1 / (sigma * math.sqrt(parties))
    lo, hi = estimate["mu_interval"]
    assert lo <= mu <= hi and hi - lo < 1.0
    assert abs(estimate["held_out_mean_z"]) < 0.3 and abs(estimate["held_out_sd_z"] - 1) < 0.25
    assert estimate["epsilon"] == pytest.approx(gdp_epsilon(estimate["mu"], 1e-5))
    # the accountant: the same Gaussian mechanism, noise multiplier sigma sqrt(n)
    assert estimate["accountant_epsilon"] == pytest.approx(gaussian_epsilon(sigma * math.sqrt(parties), 1e-5))
    assert estimate["rounds"] == 2 and estimate["mu_run"] == pytest.approx(
        math.hypot(clients.estimate(0)["mu"], estimate["mu"]))
    assert estimate["accountant_epsilon_run"] == pytest.approx(gaussian_epsilon(sigma * math.sqrt(parties), 1e-5, 2))


def test_no_estimate_without_a_start_or_an_average():
    clients = CanaryClients(count=4, scale=0.1, clip=1.0, sigma=1.0)
    clients.start_round(0, dimension=10, weights=[1.0, 1.0])
    averaged = np.ones(10)
    assert clients.add(0, "w", None, averaged) is averaged
    assert clients.estimate(0)["estimated"] is False and "no starting value" in clients.estimate(0)["why"]
    clients.start_round(1, dimension=10, weights=[])  # every update left out: no canary goes in
    assert clients.add(1, "w", np.zeros(10), averaged) is averaged
    assert clients.estimate(1)["why"] == "no update was averaged"
    assert np.array_equal(clients.add(1, "steps", np.array(3), np.array(3)), np.array(3))  # integers pass


@pytest.mark.parametrize("scale", [0.05, 1.0])
def test_estimate_does_not_depend_on_the_canaries_scale(scale):
    """Canaries as large as the rest of the change (scale 1, 100 of them in 2,000 values) do not hide each other:
    each is measured against the parties' change without the canaries."""
    sigma, parties = 0.1, 3
    clients = CanaryClients(count=100, scale=scale, clip=2.0, sigma=sigma, seed=5)
    simulate(clients, 1, parties, sigma, 2.0, [(2000,)], seed=11, update=0.0)  # the Gaussian mechanism alone
    estimate = clients.estimate(0)
    lo, hi = estimate["mu_interval"]
    assert lo <= 1 / (sigma * math.sqrt(parties)) <= hi
