"""The party report's plots: per-round ROC curves and the per-round AUC and TPR lines (matplotlib, no pyplot).

One module though above 400 lines: every figure of the reports (and the aggregator's, plot_collaborators) shares its
styles (models, signals, collaborators), the log-axis rules and the tolerance markers, so they read alike.
"""

from __future__ import annotations

import math
import textwrap
import zlib
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
from matplotlib.figure import Figure  # no pyplot: figures are never registered globally, so none leak
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

from audit.config.fields import is_int
from audit.reporting.atomic_io import atomic_savefig
from audit.reporting.figure_fit import save_fitted
from audit.reporting.readings import (auc_of, curve, exact_auc_of, float_or_nan, fmt, ordered_models, rates_at,
                                      series_keys)
from audit.round_record import RoundRecord

__all__ = ["plot_roc", "plot_per_round", "plot_signal_histograms", "plot_collaborators", "INVERTED_NOTE",
           "log_axis_wanted"]

# An AUC below 0.5: the attack scores members on the wrong side of its threshold; reversed it would score 1 - AUC.
INVERTED_NOTE = "signal direction wrong, not a safer model"

DPI = 100
_MODEL_TITLES = {"local": "local model", "global": "global model", "update": "model update",
                 "rmia": "RMIA (local model, by references)",
                 "cross_round": "every update sent, against the others' (cross-round)"}
_MODEL_STYLES = {"local": ("-", "o"), "global": ("--", "s"), "update": (":", "^"), "rmia": ("-", "v")}
_OTHER_MODEL_STYLE = ("-.", "D")
_SIGNAL_COLORS = {
    "loss": "tab:blue",
    "logits": "tab:orange",
    "gradient_norm": "tab:green",
    "loss_reduction": "tab:red",
    "global": "tab:purple",
    "fine_tuned": "tab:brown",
    "independent": "tab:cyan",
}
_EXTRA_COLORS = ("tab:pink", "tab:olive", "tab:gray", "gold", "navy", "teal")
_COLLABORATOR_COLORS = ("tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
_CHANCE_STYLE = {"color": "0.45", "linestyle": ":", "linewidth": 1.2}

def _model_style(model: str) -> tuple[str, str]:
    return _MODEL_STYLES.get(model, _OTHER_MODEL_STYLE)


def _signal_color(signal: str) -> str:
    color = _SIGNAL_COLORS.get(signal)
    if color is None:  # stable across processes and runs (unlike hash())
        color = _EXTRA_COLORS[zlib.crc32(signal.encode("utf-8")) % len(_EXTRA_COLORS)]
    return color




def _log_floor(values: Iterable[np.ndarray], counts: Iterable[Any] = ()) -> float:
    """Lower axis limit for log axes: half the smallest positive rate shown (or 1/n), >= 1e-6."""
    smallest = 1.0
    for v in values:
        pos = v[v > 0]
        if pos.size:
            smallest = min(smallest, float(pos.min()))
    for n in counts:
        if is_int(n) and n > 0:
            smallest = min(smallest, 1.0 / n)
    if smallest >= 1.0:
        smallest = 1e-2
    return max(smallest / 2.0, 1e-6)


def _tolerance_points(ax, result: Mapping, color: str, floor: float | None) -> None:
    """At each FPR tolerance: the non-members' FPR and the members' TPR at its threshold, each with its interval
    (error bars, one call for all the points). Unresolvable tolerances (the population is too small to set them) are
    drawn hollow."""
    table = (result.get("uncertainty") or {}).get("at_fpr") if isinstance(result, Mapping) else None
    if not isinstance(table, Mapping):
        return
    points = {True: [], False: []}  # resolvable -> [(x, x_lo, x_hi, y, y_lo, y_hi)]
    for key in table:
        rates = rates_at(result, float_or_nan(key))
        if rates is None:
            continue
        values = [float_or_nan(rates[part].get(k)) for part in ("fpr", "tpr") for k in ("rate", "lower", "upper")]
        if any(math.isnan(v) for v in values):
            continue
        if floor is not None:
            values = [max(v, floor) for v in values]
        points[rates.get("resolvable") is not False].append(values)
    for resolvable, rows in points.items():
        if not rows:
            continue
        x, x_lo, x_hi, y, y_lo, y_hi = np.array(rows).T
        # one collection of bars (no caps: each cap is an artist of its own, and the reports draw many)
        ax.hlines(y, x_lo, x_hi, colors=color, linewidth=0.8, alpha=0.8)
        ax.vlines(x, y_lo, y_hi, colors=color, linewidth=0.8, alpha=0.8)
        ax.plot(x, y, "o", markersize=3.5, color=color, mfc=color if resolvable else "white", alpha=0.8)


def _sparse_log_ticks(axis) -> None:
    """Major ticks at powers of ten only: the default minor ticks (and their labels) make a log axis several
    times slower to draw, and the reports draw many."""
    axis.set_major_locator(LogLocator(base=10, numticks=8))
    axis.set_minor_locator(NullLocator())


def plot_roc(record: RoundRecord, path: Path, log_scale: bool) -> None:
    models = ordered_models(record.models())
    n = max(1, len(models))
    width, height = 3.9 * n + 0.3, 4.5
    fig = Figure(figsize=(width, height), dpi=DPI)
    # Fixed margins (in inches) instead of constrained layout: about half the drawing time.
    fig.subplots_adjust(left=0.65 / width, right=1 - 0.15 / width, bottom=0.7 / height, top=1 - 0.95 / height,
                        wspace=0.3)
    axes = fig.subplots(1, n, squeeze=False)[0]
    sized_by_data = []  # the legends (signals' names), the title (the party's name) and the note
    for ax, model in zip(axes, models):
        per_signal = record.attacks_of(model)
        curves = {s: curve(per_signal[s]) for s in sorted(per_signal)}
        counts = []
        for res in per_signal.values():
            counts += [res.get("n_members"), res.get("n_nonmembers")]
        floor = _log_floor([c for pair in curves.values() for c in pair], counts) if log_scale else 0.0
        for signal, (fpr, tpr) in curves.items():
            grid_auc, exact_auc = auc_of(per_signal[signal]), exact_auc_of(per_signal[signal])
            label = f"{signal} (grid AUC {fmt(grid_auc, 3) if not math.isnan(grid_auc) else 'n/a'}"
            label += f", exact {fmt(exact_auc, 3)})" if not math.isnan(exact_auc) else ")"
            if exact_auc < 0.5:
                label += f"\n  {INVERTED_NOTE}"
            if fpr.size == 0:
                ax.plot([], [], color=_signal_color(signal), label=label + " – no curve")
                continue
            if log_scale:
                fpr, tpr = np.clip(fpr, floor, 1.0), np.clip(tpr, floor, 1.0)
            ax.plot(fpr, tpr, color=_signal_color(signal), linewidth=1.6, label=label,
                    marker="." if fpr.size <= 30 else None)
            _tolerance_points(ax, per_signal[signal], _signal_color(signal), floor if log_scale else None)
        lo = floor if log_scale else 0.0
        ax.plot([lo, 1.0], [lo, 1.0], label="chance", **_CHANCE_STYLE)
        if log_scale:
            ax.set_xscale("log")
            ax.set_yscale("log")
            _sparse_log_ticks(ax.xaxis)
            _sparse_log_ticks(ax.yaxis)
        ax.set_xlim(lo, 1.0)
        ax.set_ylim(lo, 1.02 if not log_scale else 1.0)
        if not log_scale:
            ax.set_aspect("equal", adjustable="box")
        ax.grid(True, alpha=0.25, which="major")
        ax.set_xlabel("False positive rate")
        ax.set_ylabel("True positive rate")
        first = next(iter(per_signal.values()))
        sizes = ""
        if is_int(first.get("n_members")) and is_int(first.get("n_nonmembers")):
            sizes = f"\n{first['n_members']} members / {first['n_nonmembers']} non-members"
        ax.set_title(_MODEL_TITLES.get(model, model) + sizes, fontsize=10)
        sized_by_data.append(ax.legend(loc="lower right", fontsize=8, framealpha=0.85))
    if not models:
        ax = axes[0]
        ax.text(0.5, 0.5, "no attack results in this round", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("False positive rate")
        ax.set_ylabel("True positive rate")
    scale = " (log-log)" if log_scale else ""
    sized_by_data.append(fig.text(
        0.5, 0.012, "dots: TPR and non-members' FPR at each FPR tolerance's threshold, bars: their confidence "
        "intervals; hollow: the population cannot resolve that tolerance", ha="center", fontsize=7, color="0.35"))
    sized_by_data.append(fig.suptitle(f"{record.party} – round {record.round}: membership-inference ROC{scale}",
                                      fontsize=11))
    save_fitted(fig, path, sized_by_data=sized_by_data)  # no label cut, whatever the legends' length


def log_axis_wanted(values: np.ndarray) -> bool:
    """Whether a log axis helps: the positive values span more than a decade (a rate near 0.001 beside one near
    0.3). Otherwise a linear axis shows the values better, and a zero is simply drawn at 0."""
    positive = values[np.isfinite(values) & (values > 0)]
    return positive.size > 0 and float(positive.max()) / float(positive.min()) > 10.0


def _tick_text(value: float, _pos=None) -> str:
    return f"{value:g}"


def _readable_log_ticks(axis, low: float, high: float) -> None:
    """Enough labelled ticks on a log axis: powers of ten, and 2 and 5 times them where it spans few decades (one
    decade or less had a single label). No minor ticks: they make a log axis several times slower to draw."""
    decades = math.log10(max(high, low * 1.0001) / low)
    subs = (1.0,) if decades > 4 else (1.0, 2.0, 5.0) if decades > 1.2 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=20))
    axis.set_major_formatter(FuncFormatter(_tick_text))
    axis.set_minor_locator(NullLocator())


# Each series of a per-round plot has its own colour, and its family (model kind) its own dash and marker.
_SERIES_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
                  "tab:olive", "tab:cyan", "tab:gray", "navy", "gold")


def plot_per_round(
    records: list[RoundRecord], path: Path, *, party: str, value_of, ylabel: str, title: str,
    chance: float, chance_label: str, log_y: bool = False, band_of=None, flag_below: float | None = None,
    counts_of=None, only: set | None = None,
) -> None:
    """One line per model / signal across rounds (`only`: just these (model, signal) pairs); `band_of(result) ->
    (lower, upper)` adds each value's confidence interval as an error bar, the series side by side around each round
    so that their bars stay apart. `flag_below`: shade the values below it (an AUC below 0.5) and say what they mean.
    `log_y`: a log axis where the values span more than a decade (log_axis_wanted); a zero on it is drawn as an open
    marker on the axis floor with its count (`counts_of(result) -> (k, n)`, e.g. "0/90"), never joined into the line
    as if it were a small value."""
    rounds = np.array([r.round for r in records], dtype=float)
    width, height = 8.6, 4.4
    fig = Figure(figsize=(width, height), dpi=DPI)
    # Margins in inches: the y tick labels and label at the left, the legend and notes at the right (save_fitted).
    fig.subplots_adjust(left=0.9 / width, right=1 - 2.1 / width, bottom=0.53 / height, top=1 - 0.4 / height)
    ax = fig.add_subplot()
    series = []
    for model, signal in series_keys(records):
        if only is not None and (model, signal) not in only:
            continue
        results = [r.attack(model, signal) for r in records]
        ys = np.array([value_of(res) if isinstance(res, Mapping) else math.nan for res in results], dtype=float)
        bands = None
        if band_of is not None:
            bands = np.array([band_of(res) if isinstance(res, Mapping) else (math.nan, math.nan) for res in results],
                             dtype=float).reshape(-1, 2)
            if not np.isfinite(bands).any():
                bands = None
        counts = [counts_of(res) if counts_of is not None and isinstance(res, Mapping) else None for res in results]
        series.append((model, signal, ys, bands, counts))
    finite = np.concatenate([v[np.isfinite(v)] for _, _, ys, bands, _ in series
                             for v in ((ys,) if bands is None else (ys, bands.ravel()))] or [np.empty(0)])
    log_y = log_y and log_axis_wanted(np.concatenate([finite, [chance]]))
    floor = _log_floor([finite, np.array([chance])]) if log_y else None
    step = min(np.diff(np.unique(rounds)).min(), 1.0) if len(np.unique(rounds)) > 1 else 1.0
    width = 0.5 * step / max(len(series), 1)  # the series' bars spread over half the gap between rounds
    drew_bars = drew_zeros = False
    for i, (model, signal, ys, bands, counts) in enumerate(series):
        linestyle, marker = _model_style(model)
        color = _SERIES_COLORS[i % len(_SERIES_COLORS)]
        x = rounds + (i - (len(series) - 1) / 2) * width
        zero = np.isfinite(ys) & (ys <= 0) if floor is not None else np.zeros(ys.shape, dtype=bool)
        shown = np.where(zero, np.nan, ys)  # a zero breaks the line: it is not a small value
        ax.plot(rounds, shown, linestyle=linestyle, marker=marker, markersize=5, linewidth=1.5, color=color,
                label=f"{model} / {signal}")
        if zero.any():
            drew_zeros = True
            ax.plot(x[zero], np.full(int(zero.sum()), floor), linestyle="none", marker=marker, markersize=6,
                    markerfacecolor="white", markeredgecolor=color, markeredgewidth=1.3, clip_on=False, zorder=4)
            for xi, count in zip(x[zero], [c for c, z in zip(counts, zero) if z]):
                if count is not None:
                    ax.annotate(f"{count[0]}/{count[1]}", (xi, floor), xytext=(0, 5), textcoords="offset points",
                                rotation=90, ha="center", va="bottom", fontsize=6.5, color=color)
        if bands is not None:
            lo, hi = bands[:, 0], bands[:, 1]
            if floor is not None:  # a lower bound of 0 sits on the axis floor
                lo, hi = np.clip(lo, floor, None), np.clip(hi, floor, None)
            centre = np.where(zero, floor if floor is not None else 0.0, np.clip(shown, lo, hi))
            keep = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(centre)
            ax.vlines(x[keep], lo[keep], hi[keep], colors=color, linewidth=1.0, alpha=0.55)
            drew_bars = True
    ax.axhline(chance, label=chance_label, **_CHANCE_STYLE)
    if flag_below is not None and finite.size and float(finite.min()) < flag_below:
        ax.axhspan(0.0, flag_below, color="tab:red", alpha=0.07, linewidth=0,
                   label=textwrap.fill(f"below {flag_below:g}: {INVERTED_NOTE}", 26))  # the legend's width
    if log_y:
        ax.set_yscale("log")
        ax.set_ylim(floor, 1.05)
        _readable_log_ticks(ax.yaxis, floor, 1.05)
    else:
        lo = min([chance - 0.05] + ([float(finite.min()) - 0.05] if finite.size else []))
        hi = max([chance + 0.05] + ([float(finite.max()) + 0.05] if finite.size else []))
        ax.set_ylim(max(lo, 0.0), min(hi, 1.02))  # rates and AUCs: never a negative axis
        ax.yaxis.set_major_locator(MaxNLocator(nbins=6, min_n_ticks=4))
    if len(rounds) == 1:
        ax.set_xlim(rounds[0] - 1, rounds[0] + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.25)
    ax.set_xlabel("Round")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{party}: {title}", fontsize=11)
    legend = ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="model / signal",
                       title_fontsize=8)
    notes = (["bars: confidence interval\nof each value"] if drew_bars else []) + (
        ["open markers on the floor:\na zero (members flagged / members)"] if drew_zeros else [])
    note = None
    if notes:
        note = ax.text(1.01, 0.0, "\n".join(notes), transform=ax.transAxes, fontsize=7, color="0.35", va="bottom")
    # The margins hold the tick labels (at most "0.0005" wide) and axis labels; the legend, the note and the title
    # (the party's name) are as long as the data makes them.
    save_fitted(fig, path, sized_by_data=[legend, note, ax.title])




def histogram_bins(values: np.ndarray, count: int = 30) -> tuple[np.ndarray, bool]:
    """Bin edges for a histogram of `values` (finite), over their 0.5%..99.5% range (one extreme loss would squeeze
    every other sample into one bin), and whether they are on a log scale: geometric bins where the values are (all
    but at most 5%) positive and span more than two decades, as losses and gradient norms near 0 do (on linear bins
    most samples fall in the first one); a value at or below the range's start is counted in the first bin."""
    positive = values[values > 0]
    if positive.size >= 2 and positive.size >= 0.95 * values.size:
        low, high = np.quantile(positive, [0.005, 0.995])
        if low > 0 and high / low > 100:
            return np.geomspace(low, high, count + 1), True
    low, high = np.quantile(values, [0.005, 0.995])
    if not high > low:
        low, high = float(values.min()) - 0.5, float(values.max()) + 0.5
    return np.linspace(low, high, count + 1), False


def plot_signal_histograms(record: RoundRecord, panels: list, path: Path) -> bool:
    """Members' and non-members' per-sample values, one panel per attack (audit.reporting.panels.HistogramPanel, as
    the steps read them from their private files; same bins for both sets, each normalised to its own size so that
    sets of different sizes compare); the panel's exact AUC in its title, flagged when below 0.5. Returns False
    (nothing written) without panels."""
    if not panels:
        return False
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    width, height = 4.2 * cols, 2.9 * rows + 0.4
    fig = Figure(figsize=(width, height), dpi=DPI)
    # Fixed margins (in inches) instead of constrained layout: several times faster, and bbox_inches="tight" on
    # saving keeps every label inside the image.
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.15 / width, bottom=0.55 / height, top=1 - 0.75 / height,
                        wspace=0.28, hspace=0.75)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, panel in zip(axes, panels):
        members, nonmembers = panel.members, panel.nonmembers
        both = np.concatenate([members, nonmembers])
        both = both[np.isfinite(both)]
        if both.size == 0:
            ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)
            continue
        bins, log_x = histogram_bins(both)
        lo, hi = bins[0], bins[-1]
        for values, label, color in ((nonmembers, "non-members", "tab:gray"), (members, "members", "tab:blue")):
            values = np.clip(values[np.isfinite(values)], lo, hi)
            counts, _ = np.histogram(values, bins=bins)
            # one artist per set (ax.hist draws a patch per bin)
            ax.stairs(counts / max(values.size, 1), bins, fill=True, alpha=0.45, color=color,
                      label=f"{label} ({values.size})")
        auc = panel.auc
        title = f"{panel.title}\nexact AUC {fmt(auc, 3)}"
        inverted = auc < 0.5
        if inverted:
            title += f" < 0.5: {INVERTED_NOTE}"
        ax.set_title(title, fontsize=8.5, color="tab:red" if inverted else "black")
        if log_x:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10, numticks=6))
            ax.xaxis.set_major_formatter(FuncFormatter(_tick_text))
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel(panel.xlabel + ("; log scale" if log_x else ""), fontsize=8)
        ax.set_ylabel("share of the set", fontsize=8)
        ax.tick_params(labelsize=7)
        if not log_x:
            ax.xaxis.set_major_locator(MaxNLocator(5))  # few ticks: the axes' ticks are most of the drawing time
        ax.yaxis.set_major_locator(MaxNLocator(4))
        ax.legend(fontsize=7, loc="upper right")  # "best" searches every position against the data
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(f"{record.party} – round {record.round}: members vs non-members, per signal", fontsize=11)
    atomic_savefig(fig, path, dpi=DPI)  # the fixed margins hold every label (a tight bbox draws the figure twice)
    return True


def plot_collaborators(rounds: list[int], values: Mapping[str, list[float]], path: Path, *, metric: str,
                       thresholds: list[float] | None = None, log_y: bool = False,
                       tripped: Mapping[str, list[bool]] | None = None, label: str | None = None,
                       worse_when_lower: bool = False, mean: bool = True) -> None:
    """One metric per round for every collaborator (dots), their mean and the worst (largest) of them: for privacy
    the maximum counts; `thresholds` (per round, NaN where unknown) as a red step line; `tripped` (per collaborator
    and round: its gate tripped) ringed in red."""
    x = np.asarray(rounds, dtype=float)
    fig = Figure(figsize=(8.4, 4.2), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    table = np.array([values[name] for name in sorted(values)], dtype=float).reshape(len(values), len(rounds))
    for i, name in enumerate(sorted(values)):
        ax.plot(x, table[i], "o", markersize=7, alpha=0.85, color=_COLLABORATOR_COLORS[i % len(_COLLABORATOR_COLORS)],
                label=name)
    rings = [(x[j], table[i, j]) for i, name in enumerate(sorted(values))
             for j, hit in enumerate((tripped or {}).get(name, [])) if hit and np.isfinite(table[i, j])]
    if rings:
        ax.plot(*np.array(rings).T, "o", markersize=13, markerfacecolor="none", markeredgecolor="tab:red",
                markeredgewidth=1.5, label="gate tripped (withheld or DP-retrained)")
    with np.errstate(all="ignore"):
        have = np.isfinite(table).any(axis=0)
        means = np.where(have, np.nanmean(np.where(np.isfinite(table), table, np.nan), axis=0), np.nan)
        if worse_when_lower:
            worst = np.where(have, np.nanmin(np.where(np.isfinite(table), table, np.inf), axis=0), np.nan)
        else:
            worst = np.where(have, np.nanmax(np.where(np.isfinite(table), table, -np.inf), axis=0), np.nan)
    if mean:  # not of p-values or bounds: their mean is no figure
        ax.plot(x, means, "-", color="tab:blue", linewidth=1.5, label="mean")
    ax.plot(x, worst, "--", color="black", linewidth=1.5,
            label=f"worst collaborator ({'min' if worse_when_lower else 'max'})")
    if thresholds is not None and np.isfinite(np.asarray(thresholds, dtype=float)).any():
        ax.step(x, np.asarray(thresholds, dtype=float), where="mid", color="tab:red", linewidth=1.2,
                label="gate threshold")
    if "auc" in metric:
        ax.axhline(0.5, label="chance (AUC 0.5)", **_CHANCE_STYLE)
    finite = table[np.isfinite(table)]
    if log_y and finite.size and log_axis_wanted(finite):
        ax.set_yscale("log")
        floor = _log_floor([finite])
        ax.set_ylim(floor, None)
        _readable_log_ticks(ax.yaxis, floor, float(finite.max()))
    elif finite.size and finite.min() >= 0:
        shown = [float(finite.min()), float(finite.max())] + [t for t in (thresholds or []) if math.isfinite(t)]
        shown += [0.5] if "auc" in metric else []
        low, top = min(shown), max(shown)
        pad = max(0.05 * (top - low), 0.02)
        # rates, AUCs, epsilons: never a negative axis; no dot on the edge
        ax.set_ylim(max(0.0, low - pad), top + pad)
    if len(x) == 1:
        ax.set_xlim(x[0] - 1, x[0] + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.25)
    ax.set_xlabel("Round")
    ax.set_ylabel(label or metric, fontsize=9)
    ax.set_title(f"{label or metric} per round: each collaborator" + (", mean" if mean else "") + " and worst",
                 fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    atomic_savefig(fig, path, dpi=DPI)
