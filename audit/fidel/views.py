"""The Fidel step's part of the party's report (its reconstruction grid, private: it shows the members) and its
start-up check that the plan's model has the dense layer it attacks."""

from __future__ import annotations

from typing import Mapping

from audit.config.fields import SettingsError
from audit.reporting.readings import float_or_nan, fmt
from audit.reporting.records import FIDEL_GRID_FILE
from audit.round_record import RoundRecord

__all__ = ["page_section", "check_layer", "summary_line"]

NOTE = ("Fidel's reconstructions from this round's update: top row, members the update reveals; bottom row, their "
        "reconstructions; r is their correlation (revealed when r ≥ the threshold). Any revealed sample is a training "
        "sample an honest-but-curious server could see.")


def page_section(record: RoundRecord, round_dir: str, files: set[str]) -> list[str]:
    from audit.reporting.html import escape, href  # the page's own escaping and links

    if FIDEL_GRID_FILE not in files:
        return []
    fidel = record.extra.get("fidel")
    summary = ""
    if isinstance(fidel, Mapping):
        summary = (f" {fmt(fidel.get('revealed_union', fidel.get('revealed')))} of {fmt(fidel.get('n_samples'))} "
                   f"members revealed (r ≥ {fmt(fidel.get('threshold'))}, layer {fidel.get('layer')}).")
    return [f"<h4>Fidel</h4><p>{escape(summary.strip())} {escape(NOTE)} The grid: "
            f'<a href="{href(round_dir, FIDEL_GRID_FILE)}">{escape(FIDEL_GRID_FILE)}</a> (private: it shows the '
            "members).</p>"]


def check_layer(model, feature_shape, settings, key: str) -> None:
    """Without a layer named, the first dense layer a forward pass of one sample reaches must exist."""
    if not (settings.enabled or settings.layer is not None):
        return
    import torch

    from audit.fidel.layers import find_first_dense_layer

    try:
        find_first_dense_layer(model, torch.zeros((1, *feature_shape)), layer=settings.layer)
    except ValueError as err:
        raise SettingsError(f"{key}.layer: {err}") from None


def summary_line(record: RoundRecord) -> str | None:
    """Its part of the end-of-run summary: the share of the members this round's update revealed."""
    metrics = record.metrics
    if "fidel_revealed_fraction" not in metrics:
        return None
    return (f"Fidel revealed {float_or_nan(metrics['fidel_revealed_fraction']):.2f} of its samples "
            f"({float_or_nan(metrics.get('fidel_revealed_fraction_ica')):.2f} with ICA)")
