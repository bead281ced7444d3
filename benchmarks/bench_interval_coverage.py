"""Benchmark: how often the AUC intervals miss the true AUC, each side separately.

For each score family, AUC (0.5 to 0.995) and pair of class sizes (members / non-members, 20 to 10,000), it draws
samples with a known AUC and counts the draws whose interval has the truth below its lower bound and above its upper
bound, for two intervals at the same confidence:

    wald   DeLong's Wald interval, estimate +- z * sqrt(DeLong variance), clipped to [0, 1] (uncertainty.delong)
    new    the interval the audit reports (uncertainty.auc_interval: audit.membership.auc_bounds)

and the ratio of their mean widths (new / wald). A side that misses more often than (1 - c) / 2 plus three binomial
standard errors of the draws is marked with '!'.

Families (tests/score_families.py): gaussian, exponential, beta, gamma, cauchy (heavy tails), memorised (a share of
members above every non-member) as raw scores, placements by midranks as the audit computes them; `rounded` (a loss
rounded to 5 values: ties), `constant` (every non-member scores the same: the estimate is a binomial proportion) and
`binned-<family>` (the family rounded to --levels bins) as counts per level.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_interval_coverage.py [--draws 1000] [--confidence 0.95]
        [--families gaussian exponential ...] [--sizes 20/20 90/404 ...] [--aucs 0.5 0.99 ...] [--levels 500]
        [--seed 0]

The 10,000-a-class cells of the raw families take most of the time (about a minute each family on 2 cores).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import norm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit import auc_bounds  # noqa: E402
from tests.score_families import (FAMILIES, binned_statistics, raw_statistics,  # noqa: E402
                                  rounded_loss)

AUCS = (0.5, 0.75, 0.9, 0.95, 0.99, 0.995)
SIZES = ((20, 20), (100, 100), (1000, 1000), (10000, 10000), (20, 400), (400, 20), (90, 404), (200, 4000))
DISCRETE = ("rounded", "constant")
CHUNK = 4_000_000  # scores held at once


def wald_bounds(auc, pos_var, neg_var, m, n, confidence):
    half = norm.ppf(1 - (1 - confidence) / 2) * np.sqrt(pos_var / m + neg_var / n)
    return np.clip(auc - half, 0, 1), np.clip(auc + half, 0, 1)


def statistics(family: str, auc: float, m: int, n: int, draws: int, levels: int, rng):
    """(AUC estimates, members' placement variances, non-members') of `draws` samples, and the true AUC."""
    if family == "rounded":
        return binned_statistics(rng, *rounded_loss(auc), m, n, draws), auc
    if family == "constant":  # members above the non-members' one score with probability auc, else below
        return binned_statistics(rng, np.array([1 - auc, 0, auc]), np.array([0.0, 1, 0]), m, n, draws), auc
    if family.startswith("binned-"):
        return binned_statistics(rng, *FAMILIES[family[7:]].binned(auc, levels), m, n, draws), auc
    spec = FAMILIES[family]
    parameter = spec.parameter_for(auc)
    per_chunk = max(1, CHUNK // (m + n))
    parts = [raw_statistics(*spec.raw(rng, parameter, m, n, min(per_chunk, draws - start)))
             for start in range(0, draws, per_chunk)]
    return tuple(np.concatenate(p) for p in zip(*parts)), spec.auc(parameter)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--families", nargs="+", default=[*FAMILIES, *DISCRETE])
    parser.add_argument("--sizes", nargs="+", default=[f"{m}/{n}" for m, n in SIZES])
    parser.add_argument("--aucs", nargs="+", type=float, default=list(AUCS))
    parser.add_argument("--levels", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    known = [*FAMILIES, *DISCRETE, *(f"binned-{name}" for name in FAMILIES)]
    for family in args.families:
        if family not in known:
            parser.error(f"--families: unknown {family!r}; known: {', '.join(known)}")
    try:
        sizes = [tuple(int(v) for v in size.split("/")) for size in args.sizes]
    except ValueError:
        parser.error("--sizes: members/non-members, e.g. 20/400")
    side = (1 - args.confidence) / 2
    allowance = side + 3 * math.sqrt(side * (1 - side) / args.draws)
    print(f"{args.draws} draws a cell, confidence {args.confidence}: each side should miss at most {100 * side:.2f}% "
          f"('!' above {100 * allowance:.2f}%, three binomial standard errors over)")
    flagged = {"wald": 0, "new": 0}
    cells = 0
    for family in args.families:
        about = FAMILIES[family.removeprefix("binned-")].about if family not in DISCRETE else {
            "rounded": "a loss rounded to 5 values (Binomial(4, q) levels): ties",
            "constant": "every non-member scores the same: the estimate is a binomial proportion"}[family]
        print(f"\n{family}: {about}")
        print(f"{'AUC':>6} {'members/non':>12} | {'wald below':>10} {'above':>6} | {'new below':>9} {'above':>6} | "
              f"{'width new/wald':>14}")
        start = time.perf_counter()
        for auc in args.aucs:
            for m, n in sizes:
                rng = np.random.default_rng([args.seed, known.index(family), m, n, int(auc * 1000)])
                (estimate, pos_var, neg_var), truth = statistics(family, auc, m, n, args.draws, args.levels, rng)
                row = []
                widths = []
                for name, bounds in (("wald", wald_bounds), ("new", auc_bounds)):
                    lower, upper = bounds(estimate, pos_var, neg_var, m, n, args.confidence)
                    below, above = np.mean(truth < lower), np.mean(truth > upper)
                    marks = ["!" if rate > allowance else " " for rate in (below, above)]
                    flagged[name] += marks.count("!")
                    row.append(f"{100 * below:9.1f}{marks[0]} {100 * above:5.1f}{marks[1]}")
                    widths.append(np.mean(upper - lower))
                cells += 1
                print(f"{auc:6.3f} {f'{m}/{n}':>12} | {row[0]} | {row[1]:>16} | {widths[1] / widths[0]:14.2f}",
                      flush=True)
        print(f"({time.perf_counter() - start:.0f} s)")
    print(f"\n{cells} cells; sides marked '!': wald {flagged['wald']}, new {flagged['new']}")


if __name__ == "__main__":
    main()
