"""A figure saved at its own size when what may outgrow its margins fits, with a tight bounding box when not.

matplotlib's `bbox_inches="tight"` keeps every label inside the image, but it lays the whole figure out a second time
before drawing it (about a quarter of a cross-round rebuild; benchmarks/README.md, "Report drawing"). The reports'
figures have fixed margins (in inches) sized for what has a bounded size: tick labels in fixed formats, fixed axis
labels. What the data sizes (a legend of plug-in signals' names, a party's name in a title, a note) is checked here,
from its extent on the renderer the PNG is drawn with; only a figure where one of those would be cut is saved tight.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from matplotlib.backends.backend_agg import FigureCanvasAgg

from audit.reporting.atomic_io import atomic_savefig

__all__ = ["save_fitted", "outside_of_figure"]


def outside_of_figure(fig: Any, artists: Iterable[Any]) -> list[Any]:
    """The visible artists of `artists` (None skipped) whose drawn extent leaves the figure's canvas."""
    renderer = FigureCanvasAgg(fig).get_renderer()  # the canvas savefig draws a PNG on: the same font metrics
    for ax in fig.axes:  # an axes of fixed aspect takes its drawn size now, not at the draw
        ax.apply_aspect()
    canvas = fig.bbox
    out = []
    for artist in artists:
        if artist is None or not artist.get_visible():
            continue
        box = artist.get_window_extent(renderer)
        if box.x0 < canvas.x0 or box.y0 < canvas.y0 or box.x1 > canvas.x1 or box.y1 > canvas.y1:
            out.append(artist)
    return out


def save_fitted(fig: Any, path: str | os.PathLike, *, sized_by_data: Iterable[Any]) -> Path:
    """Save `fig` at its size and dpi (those the extents are measured at) when every artist of `sized_by_data` lies
    inside it, else with a tight bounding box (the image grows to hold them)."""
    if outside_of_figure(fig, sized_by_data):
        return atomic_savefig(fig, path, dpi=fig.dpi, bbox_inches="tight")
    return atomic_savefig(fig, path, dpi=fig.dpi)
