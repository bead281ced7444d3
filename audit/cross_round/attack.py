"""FedMIA's test over the rounds kept, and source inference, on per-sample signals (numpy; no torch).

For each attacked round r and sample x the party holds its signal under its own sent update L_r and under the other
parties' combined update O_r (audit.cross_round.others). FedMIA (Zhu et al., CVPR 2025) asks, for a target sample,
how unlikely the target party's measurement is under the distribution of non-members' measurements, which the other
parties' updates give (no other party trained on the party's samples), one-sided, and combines the rounds:

    a_r(x) = s(x; O_r) - s(x; L_r)   for the loss (members lower under their own update)
             s(x; L_r) - s(x; O_r)   for the logit margin (members higher)
    c_r(x) = Phi((a_r(x) - mu_r) / sigma_r)          one-sided: how far x sits in the non-members' upper tail
    score(x) = mean over the rounds kept of c_r(x)   FedMIA's combination (the average of the rounds' CDF values)

The others' update sets each sample's own baseline (its difficulty, the round's general learning); FedMIA takes the
spread of the non-members' measurements per sample from the K - 1 other parties' updates one by one, which the party
does not see: it sees their combined update only. So mu_r and sigma_r come from the party's population (samples no
party trained on, a_r's null distribution), per class where it has enough samples of the class, fitted robustly
(median, 1.4826 x the median absolute deviation: the loss has a heavy tail) as LiRA's fixed-variance variant does
with few references. Members and non-members are scored alike, so the round's leak verdict's tests stay valid; the
population's own scores, on which the thresholds are set, are cross-fitted.

Source inference (Hu et al., ICDM 2021): the aggregator names as a record's source the party whose update has the
lowest loss on it; over rounds with the posterior proportional to exp(-loss) per round, the party whose summed loss
is lowest. The party compares its own update with the others' combined one: sum_r loss(x; L_r) < sum_r loss(x; O_r).
With two parties that is the aggregator's rule exactly; with more, the others' combined loss is close to their
weighted mean loss (to first order in the updates), never below their smallest, so the party's rate reads at least
the aggregator's (an upper estimate).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

__all__ = ["SETS", "MEMBER_IF_LOWER", "round_statistic", "round_evidence", "mean_evidence", "combined_scores",
           "SourceInference", "source_inference"]

SETS = ("members", "nonmembers", "population")
# Which way members lie on each signal the step compares (audit.config.vocabulary.MEMBER_IF_LOWER's).
MEMBER_IF_LOWER = {"loss": True, "logits": False}
# 1 / Phi^-1(3/4): the median absolute deviation of a Gaussian is this many times smaller than its standard deviation.
_MAD_TO_SD = 1.4826
# A class's own fit needs this many population samples of it (its median and MAD then move by about a tenth of the
# null's spread between draws); fewer share the pooled fit.
MIN_CLASS = 20
FOLDS = 5  # the population's cross-fitting (round_evidence)


def round_statistic(own: np.ndarray, others: np.ndarray, signal: str) -> np.ndarray:
    """a_r: how much better the party's own update fits each sample than the others' combined update (higher =
    member), in float64."""
    own, others = np.asarray(own, dtype=np.float64), np.asarray(others, dtype=np.float64)
    return others - own if MEMBER_IF_LOWER[signal] else own - others


def _robust_fit(population: np.ndarray) -> tuple[float, float]:
    """The null's location and scale from the population: median and scaled MAD; the standard deviation where half
    the values are one number (MAD 0); 1 where they all are (every score then reads 0.5: no evidence)."""
    mu = float(np.median(population))
    sigma = _MAD_TO_SD * float(np.median(np.abs(population - mu)))
    if not sigma > 0:
        sigma = float(np.std(population))
    return mu, sigma if sigma > 0 else 1.0


def _fitted(labels: np.ndarray | None, fit: np.ndarray, fit_labels: np.ndarray | None, size: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """mu and sigma for each of `size` samples (of class `labels`) from the null sample `fit`: per class where it has
    at least MIN_CLASS values of it, pooled otherwise (and without labels)."""
    pooled = _robust_fit(fit)
    mu, sigma = np.full(size, pooled[0]), np.full(size, pooled[1])
    if labels is not None and fit_labels is not None:
        for label in np.unique(fit_labels):
            in_class = fit_labels == label
            here = labels == label
            if in_class.sum() >= MIN_CLASS and here.any():
                mu[here], sigma[here] = _robust_fit(fit[in_class])
    return mu, sigma


def round_evidence(statistic: dict[str, np.ndarray], labels: dict[str, np.ndarray] | None = None
                   ) -> dict[str, np.ndarray]:
    """c_r per set: Phi((a_r - mu_r) / sigma_r), mu_r and sigma_r fitted on the population's a_r; with `labels` (set
    -> class labels) per class, for every class with at least MIN_CLASS population samples (the pooled fit for the
    rest): a class's samples share much of their difficulty, the nearest the party gets to FedMIA's per-sample fit.
    The population's own values are cross-fitted (each of FOLDS folds scored by the fit on the others), so that the
    thresholds set on them are not drawn in by their own fit (as RMIA's population scores are leave-one-out)."""
    population = np.asarray(statistic["population"], dtype=np.float64)
    fit_labels = None if labels is None else np.asarray(labels["population"])
    out = {}
    for name in ("members", "nonmembers"):
        values = np.asarray(statistic[name], dtype=np.float64)
        mu, sigma = _fitted(None if labels is None else np.asarray(labels[name]), population, fit_labels, values.size)
        out[name] = norm.cdf((values - mu) / sigma)
    folds = np.arange(population.size) % FOLDS
    scores = np.empty(population.size)
    for fold in range(FOLDS):
        held = folds == fold
        rest = ~held if (~held).any() else held  # a population of one sample is its own fit
        mu, sigma = _fitted(None if fit_labels is None else fit_labels[held], population[rest],
                            None if fit_labels is None else fit_labels[rest], int(held.sum()))
        scores[held] = norm.cdf((population[held] - mu) / sigma)
    out["population"] = scores
    return out


def mean_evidence(evidence: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """FedMIA's score per set: the mean over rounds of each round's evidence c_r (`round_evidence`)."""
    if not evidence:
        raise ValueError("mean_evidence: no round to combine")
    return {name: np.mean([e[name] for e in evidence], axis=0) for name in SETS}


def combined_scores(rounds: list[dict[str, np.ndarray]], labels: dict[str, np.ndarray] | None = None
                    ) -> dict[str, np.ndarray]:
    """`mean_evidence` of the rounds' statistics (`rounds`: one {set: a_r} per round; `labels`: see
    round_evidence)."""
    return mean_evidence([round_evidence(r, labels) for r in rounds])


@dataclass(frozen=True)
class SourceInference:
    """How often the party's own update is the most likely source of a sample (its summed loss over the rounds kept
    below the others' combined update's): counts for members and non-members, and chance (1 / parties)."""

    members_own: int
    members: int
    nonmembers_own: int
    nonmembers: int
    parties: int

    @property
    def rate(self) -> float:
        return self.members_own / self.members

    @property
    def nonmember_rate(self) -> float:
        return self.nonmembers_own / self.nonmembers

    @property
    def chance(self) -> float:
        return 1.0 / self.parties


def source_inference(own_loss: dict[str, np.ndarray], others_loss: dict[str, np.ndarray], parties: int
                     ) -> SourceInference:
    """`own_loss`, `others_loss`: set -> (rounds, samples) losses under the party's updates and the others' combined
    ones. A tie (equal sums) does not name the party."""
    own = {name: np.asarray(own_loss[name], dtype=np.float64).sum(axis=0) for name in ("members", "nonmembers")}
    others = {name: np.asarray(others_loss[name], dtype=np.float64).sum(axis=0) for name in ("members", "nonmembers")}
    named = {name: int(np.sum(own[name] < others[name])) for name in own}
    return SourceInference(named["members"], own["members"].size, named["nonmembers"], own["nonmembers"].size,
                           int(parties))
