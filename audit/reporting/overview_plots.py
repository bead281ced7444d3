"""The two pictures the pages open with: the run index's party x round grid of leak verdicts, and a party's headline
leakage over rounds (audit.reporting.headline reads both off the round records). matplotlib, no pyplot."""

from __future__ import annotations

import math
import string
from pathlib import Path
from typing import Mapping

import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from audit.config.gate_contract import DP_RETRAINED, WITHHELD
from audit.reporting.atomic_io import atomic_savefig
from audit.reporting.headline import OVER_SENT, Headline, statistic_label, worst_of
from audit.reporting.readings import fmt
from audit.reporting.verdicts import LEAK, NO_LEAK, NOT_AUDITED
from audit.round_record import RoundRecord

__all__ = ["plot_verdict_grid", "plot_headline", "epsilon_chart", "STATE_COLORS", "GATE_COLORS", "GATE_WORDS"]

DPI = 100
# The pages' colours (templates/page.html): leak red, no leak green, not audited grey.
STATE_COLORS = {LEAK: "#c0392b", NO_LEAK: "#5aa469", NOT_AUDITED: "#d9d9d9"}
STATE_WORDS = {LEAK: "leak detected", NO_LEAK: "no leak detected", NOT_AUDITED: "not audited"}
# An update that was not sent as trained is marked by a band in its cell (or under its round): withheld (the
# received model went back), or DP-retrained.
GATE_COLORS = {WITHHELD: "#333333", DP_RETRAINED: "#1f4e9c", OVER_SENT: "#b35900"}
GATE_WORDS = {WITHHELD: "withheld", DP_RETRAINED: "DP-retrained", OVER_SENT: "over, sent"}
GATE_LEGEND = {WITHHELD: "withheld: nothing sent", DP_RETRAINED: "DP-retrained: a DP retrain sent instead",
               OVER_SENT: "over the gate's limit, sent (it only reports)"}
# The grid's red: deeper for a stronger leak, relative to the run's strongest (the legend says so).
LEAK_LEGEND = "leak detected (deeper red: stronger, relative to this run's strongest)"
_BAND = 0.26  # the gate band's share of a grid cell's height


def _cell_lines(h: Headline) -> list[str]:
    if h.state == NOT_AUDITED:
        return ["not audited"]
    lines = ["leak" if h.state == LEAK else "no leak"]
    if h.figure:
        lines.append(h.figure)
    # An epsilon bound of 0 is no figure to show beside a leak (the pages say why); a positive one is, against the
    # budget where one is set.
    if h.epsilon > 0:
        lines.append(f"ε≥{fmt(h.epsilon, 2)}" + (f" / {fmt(h.budget, 2)}" if not math.isnan(h.budget) else ""))
    return lines


def _luminance(color) -> float:
    return 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2]


def plot_verdict_grid(grid: Mapping[str, Mapping[int, Headline]], path: Path) -> bool:
    """Party (rows) x round (columns): each cell coloured by its leak verdict (red shades by how strong the leak is,
    relative to the run's strongest), its headline figure or epsilon against the budget, a band at its foot where the
    update was withheld or DP-retrained; the worst cell framed. Returns False (nothing written) without rounds."""
    parties = list(grid)
    rounds = sorted({r for cells in grid.values() for r in cells})
    if not parties or not rounds:
        return False
    n_rows, n_cols = len(parties), len(rounds)
    cell_w = 1.05 if n_cols <= 12 else max(0.28, 12.6 / n_cols)
    with_text = cell_w >= 0.75
    left = 0.25 + 0.075 * max(len(p) for p in parties)
    width = left + cell_w * n_cols + 0.3
    height = 0.8 * n_rows + 1.05
    fig = Figure(figsize=(width, height), dpi=DPI)
    fig.subplots_adjust(left=left / width, right=1 - 0.3 / width, top=1 - 0.5 / height, bottom=0.5 / height)
    ax = fig.add_subplot()
    headlines = {(p, r): grid[p].get(r, Headline(NOT_AUDITED, None)) for p in parties for r in rounds}
    leaks = [h.severity for h in headlines.values() if h.state == LEAK and not math.isnan(h.severity)]
    top = max(leaks, default=1.0)
    for (party, rnd), h in headlines.items():
        x, y = rounds.index(rnd), parties.index(party)
        color = to_rgba(STATE_COLORS[h.state])
        if h.state == LEAK and top > 0:  # the stronger the leak, the deeper the red
            share = 0.45 + 0.55 * min(max(h.severity / top, 0.0), 1.0)
            color = (*[1 - share * (1 - c) for c in color[:3]], 1.0)
        ax.add_patch(Rectangle((x, y), 1, 1, facecolor=color, edgecolor="white", linewidth=2))
        gated = h.gate in GATE_COLORS
        if gated:  # a band at the cell's foot, named where there is room
            ax.add_patch(Rectangle((x + 0.03, y + 1 - _BAND), 0.94, _BAND - 0.03, facecolor=GATE_COLORS[h.gate],
                                   edgecolor="none", label=f"_{h.gate}"))
            if with_text:
                ax.text(x + 0.5, y + 1 - _BAND / 2 - 0.015, GATE_WORDS[h.gate], ha="center", va="center",
                        fontsize=7, color="white")
        if with_text:
            centre = y + (1 - _BAND) / 2 if gated else y + 0.5
            ax.text(x + 0.5, centre, "\n".join(_cell_lines(h)), ha="center", va="center", fontsize=7.5,
                    color="white" if _luminance(color) < 0.45 else "black", linespacing=1.15)
    worst = worst_of(headlines)
    if worst is not None and headlines[worst].state == LEAK:
        x, y = rounds.index(worst[1]), parties.index(worst[0])
        ax.add_patch(Rectangle((x + 0.04, y + 0.04), 0.92, 0.92, fill=False, edgecolor="black", linewidth=2.5))
    ax.set_xlim(0, n_cols)
    ax.set_ylim(n_rows, 0)
    step = max(1, math.ceil(n_cols / 20))
    ax.set_xticks([i + 0.5 for i in range(0, n_cols, step)], [str(rounds[i]) for i in range(0, n_cols, step)])
    ax.set_yticks([i + 0.5 for i in range(n_rows)], parties)
    ax.tick_params(length=0, labelsize=9)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("round", fontsize=9)
    for side in ax.spines.values():
        side.set_visible(False)
    present = {h.state for h in headlines.values()} | {LEAK, NO_LEAK}
    words = {**STATE_WORDS, LEAK: LEAK_LEGEND if sum(h.state == LEAK for h in headlines.values()) > 1 else
             STATE_WORDS[LEAK]}
    handles = [Patch(facecolor=STATE_COLORS[s], label=words[s]) for s in (LEAK, NO_LEAK, NOT_AUDITED)
               if s in present]
    handles += [Patch(facecolor=GATE_COLORS[g], label=GATE_LEGEND[g])
                for g in GATE_COLORS if any(h.gate == g for h in headlines.values())]
    if worst is not None and headlines[worst].state == LEAK:
        handles.append(Patch(facecolor="white", edgecolor="black", linewidth=2.5, label="worst round"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=min(len(handles), 3),
              fontsize=8, frameon=False, handlelength=1.6)
    # "tight": a grid of few rounds is narrower than its legend, which would be cut at the figure's edge
    atomic_savefig(fig, path, dpi=DPI, bbox_inches="tight", pad_inches=0.15)
    return True


def _mark_gated_rounds(ax, rounds: list[int], headlines: list[Headline]) -> set[str]:
    """A light band behind each round whose update was withheld or DP-retrained, and its x label says so in the
    band's colour; returns the kinds drawn."""
    drawn = set()
    labels = []
    for rnd, h in zip(rounds, headlines):
        label = str(rnd)
        if h.gate in GATE_COLORS:
            ax.axvspan(rnd - 0.45, rnd + 0.45, color=GATE_COLORS[h.gate], alpha=0.08, linewidth=0, zorder=0)
            label += "\n" + GATE_WORDS[h.gate]
            drawn.add(h.gate)
        labels.append(label)
    if drawn and len(rounds) <= 16:
        ax.set_xticks(rounds, labels)
        for tick, h in zip(ax.get_xticklabels(), headlines):
            tick.set_fontsize(8)
            if h.gate in GATE_COLORS:
                tick.set_color(GATE_COLORS[h.gate])
    return drawn


def epsilon_chart(headlines: list[Headline]) -> bool:
    """Whether a party's headline chart shows the epsilon bound against the budget: where the budget is the gate's
    only rule, or some round proved a bound above 0. Otherwise a chart of zeros under a budget line would hide the
    threshold that tripped the gate and the leaks the tests found."""
    return any(not math.isnan(h.budget) for h in headlines) and (
        all(h.budget_only for h in headlines if not math.isnan(h.budget)) or any(h.epsilon > 0 for h in headlines))


def _evidence(p: float) -> float:
    """-log10 of an adjusted p-value, floored at 1e-16 (float64's resolution near 1 limits smaller ones anyway)."""
    return -math.log10(min(max(p, 1e-16), 1.0))


def plot_headline(records: list[RoundRecord], headlines: list[Headline], path: Path, *, party: str) -> None:
    """The party's headline leakage per round (audit.reporting.headline): the epsilon lower bound against the budget
    and its ceiling when the budget is what the gate decides on (or a bound above 0 was proven), else how sure each
    round's strongest attack beats chance (-log10 of its adjusted p-value: one scale whether the figure is an AUC or
    a TPR), the figure written beside it; red where a leak was detected, green where none was."""
    rounds = [r.round for r in records]
    # The epsilon chart only where the budget is the gate's rule, or a bound above 0 was proven: a chart of zeros
    # under a budget line hides the threshold that tripped the gate and the leaks the tests found.
    budgeted = epsilon_chart(headlines)
    fig = Figure(figsize=(8.4, 3.6), dpi=DPI)
    fig.subplots_adjust(left=0.08, right=0.64, bottom=0.16, top=0.9)
    ax = fig.add_subplot()
    colors = [STATE_COLORS[h.state] for h in headlines]
    handles = []
    if budgeted:
        eps = np.array([h.epsilon for h in headlines], dtype=float)
        budget = np.array([h.budget for h in headlines], dtype=float)
        ceiling = np.array([h.ceiling for h in headlines], dtype=float)
        shown = np.concatenate([eps[np.isfinite(eps)], budget[np.isfinite(budget)]])
        high = max(float(shown.max()) if shown.size else 0.0, 1e-3) * 1.35
        ax.plot(rounds, eps, "-", color="0.55", linewidth=1, zorder=1)
        ax.scatter(rounds, eps, c=colors, s=42, zorder=3, edgecolors="black", linewidths=0.5)
        ax.step(rounds, budget, where="mid", color="tab:red", linewidth=1.6)
        handles.append(Line2D([], [], color="tab:red", linewidth=1.6, label="budget"))
        fits = np.isfinite(ceiling) & (ceiling <= high)
        if fits.any():
            ax.step(np.array(rounds)[fits], ceiling[fits], where="mid", color="0.4", linestyle="--", linewidth=1)
            handles.append(Line2D([], [], color="0.4", linestyle="--", label="ceiling: the most\nthese counts prove"))
        if (np.isfinite(ceiling) & ~fits).any():
            ax.text(0.99, 0.97, f"ceiling (the most these counts can prove): ε = {fmt(np.nanmax(ceiling), 3)}, "
                    "above the chart", transform=ax.transAxes, ha="right", va="top", fontsize=7.5, color="0.35")
        ax.set_ylim(0, high)
        ax.set_ylabel("ε lower bound (family-wise)")
        ax.set_title(f"{party}: proven ε per round against the budget", fontsize=11)
    else:
        # One scale for every round, whatever its strongest figure is (an AUC, a TPR at some FPR): how sure the
        # audit is that it beats chance, -log10 of its Holm-adjusted p-value; a leak is detected above the line.
        # The figure itself is written beside each point.
        level = next((h.confidence for h in headlines if not math.isnan(h.confidence)), 0.95)
        line = -math.log10(1 - level)
        evidence = [(rnd, h, color, _evidence(h.p_adjusted)) for rnd, h, color in zip(rounds, headlines, colors)
                    if not math.isnan(h.p_adjusted)]
        for rnd, h, color, y in evidence:
            ax.plot([rnd], [y], marker="o", markersize=8, color=color, markeredgecolor="black",
                    markeredgewidth=0.6, linestyle="none", zorder=3)
            if h.figure:
                ax.annotate(f"{h.attack}\n{h.figure}", (rnd, y), xytext=(0, 6), textcoords="offset points",
                            ha="center", va="bottom", fontsize=7, color="0.2")
        if len(evidence) > 1:
            ax.plot([e[0] for e in evidence], [e[3] for e in evidence], "-", color="0.55", linewidth=1, zorder=1)
        ax.axhline(line, color="tab:red", linewidth=1.4)
        high = max([line, *(e[3] for e in evidence)]) * 1.45
        ax.set_ylim(0, high)
        ax.set_ylabel("evidence: −log10 adjusted p")
        ax.set_title(f"{party}: how sure each round's strongest attack beats chance", fontsize=11)
        handles.append(Line2D([], [], color="tab:red", linewidth=1.4,
                              label=f"leak detected above\n(adjusted p < {fmt(1 - level, 2)})"))
    handles += [Patch(facecolor=STATE_COLORS[s], label=STATE_WORDS[s]) for s in (LEAK, NO_LEAK)
                if any(h.state == s for h in headlines)]
    if len(rounds) == 1:
        ax.set_xlim(rounds[0] - 1, rounds[0] + 1)
    else:
        ax.set_xlim(min(rounds) - 0.6, max(rounds) + 0.6)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    drawn = _mark_gated_rounds(ax, rounds, headlines)
    handles += [Patch(facecolor=GATE_COLORS[g], alpha=0.25, label=GATE_LEGEND[g]) for g in GATE_COLORS if g in drawn]
    ax.grid(True, axis="y", alpha=0.25)
    ax.set_xlabel("Round")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, frameon=False,
              handlelength=1.6)
    atomic_savefig(fig, path, dpi=DPI)
