"""The aggregator-side deanonymization report: `round_NNNN.json` per round, `summary.csv` (per attack and world: AP,
chance AP, AP over chance, top-1) and `ap_over_chance.png`, rebuilt from the round files on disk."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Mapping

import numpy as np

from audit.config.deanon_settings import ATTACKS
from audit.deanon.server import EVALUATED, clean_record
from audit.reporting.atomic_io import atomic_savefig, atomic_write_text
from audit.reporting.writer import RoundReportWriter

__all__ = ["DeanonReportWriter", "summary_csv", "plot_ap_over_chance"]


def _series(records: list[dict]) -> list[tuple[str, str, str]]:
    """(world, kind, attack) of every result in the records, in a fixed order."""
    found = set()
    for r in records:
        for world in ("closed_world", "open_world"):
            section = r.get(world) or {}
            for kind in ("reidentification", "matching"):
                for attack in section.get(kind) or {}:
                    found.add((world, kind, attack))
    order = {a: i for i, a in enumerate(ATTACKS)}
    return sorted(found, key=lambda s: (s[0] != "closed_world", s[1] != "reidentification", order.get(s[2], 99), s[2]))


def _column(world: str, attack: str, metric: str) -> str:
    return f"{'closed' if world == 'closed_world' else 'open'}_{attack}_{metric}"


def _value(record: Mapping, world: str, kind: str, attack: str, metric: str):
    section = record.get(world) or {}
    result = (section.get(kind) or {}).get(attack) or {}
    value = result.get(metric)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class DeanonReportWriter(RoundReportWriter):
    """`round_NNNN.json` per round, `summary.csv` and `ap_over_chance.png` rebuilt from the round files on disk."""

    what = "deanonymization"

    def prepare(self, record: Mapping) -> Mapping:
        return clean_record(record)

    def rebuild_summary(self) -> None:
        records = self.load_rounds()
        atomic_write_text(self.root / "summary.csv", summary_csv(records))
        plot_ap_over_chance(records, self.root / "ap_over_chance.png")


def summary_csv(records: list[dict]) -> str:
    """One row per round: status, sizes, and per attack and world AP, chance AP, AP over chance (and top-1)."""
    columns = []
    for world, kind, attack in _series(records):
        metrics = ("ap", "chance_ap", "ap_over_chance") if kind == "matching" else (
            "mean_ap", "chance_ap", "ap_over_chance", "top1")
        columns += [(world, kind, attack, m) for m in metrics]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["round", "status", "history_rounds", "train_updates", "test_updates", "open_world",
                     *(_column(w, a, "ap" if m == "mean_ap" else m) for w, _k, a, m in columns)])
    for r in records:
        open_world = (r.get("open_world") or {}).get("status") or ""
        cells = []
        for world, kind, attack, metric in columns:
            value = _value(r, world, kind, attack, metric)
            cells.append("" if value is None else repr(float(value)))
        writer.writerow([r["round"], r.get("status", ""), len(r.get("history_rounds") or []),
                         r.get("train_updates", ""), r.get("test_updates", ""), open_world, *cells])
    return buf.getvalue()


_COLORS = {"mlp": "tab:blue", "svm": "tab:orange", "knn": "tab:green", "siamese": "tab:red"}
_MARKERS = {"mlp": ("o", 8), "svm": ("s", 5), "knn": ("^", 6), "siamese": ("D", 5)}  # equal values stay visible


def plot_ap_over_chance(records: list[dict], path: Path) -> Path:
    """Round vs AP over chance, one line per attack and world (open world dashed), chance line at 1."""
    from matplotlib.figure import Figure  # no pyplot: nothing registered globally, safe in a server thread
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(8.4, 4.4), dpi=100)
    fig.subplots_adjust(left=0.08, right=0.72, bottom=0.12, top=0.9)
    ax = fig.add_subplot()
    rounds = [r["round"] for r in records]
    for world, kind, attack in _series(records):
        ys = np.array([np.nan if (v := _value(r, world, kind, attack, "ap_over_chance")) is None else v
                       for r in records], dtype=float)
        what = "matching" if kind == "matching" else "re-id"
        closed = world == "closed_world"
        marker, size = _MARKERS.get(attack, ("o", 5))
        ax.plot(rounds, ys, linestyle="-" if closed else "--", marker=marker, markersize=size, linewidth=1.4,
                color=_COLORS.get(attack), markerfacecolor=None if closed else "white",
                label=f"{attack} {what} ({'closed' if closed else 'open'} world)")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1.2, label="chance (= 1)")
    if not any(r.get("status") == EVALUATED for r in records):
        ax.text(0.5, 0.5, "no evaluated round yet (building history)", ha="center", va="center",
                transform=ax.transAxes)
    if len(rounds) == 1:
        ax.set_xlim(rounds[0] - 1, rounds[0] + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.25)
    ax.set_xlabel("Round")
    ax.set_ylabel("AP over chance (AP / random-ranking AP)")
    layers = sorted({str((r.get("layer") or {}).get("module")) for r in records if (r.get("layer") or {}).get("module")})
    ax.set_title("Aggregator-side deanonymization of the collaborators' updates"
                 + (f"\nlayer {', '.join(layers)}" if layers else ""), fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return atomic_savefig(fig, path)
