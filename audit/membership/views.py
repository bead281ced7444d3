"""The membership and RMIA steps' part of the party's report: histograms of the per-sample values they keep in the
round folder (signals.npz: `<model>_<signal>_<set>`; rmia_scores.npz: `<kind>_<set>`), and the start-up check of the
gradient-norm signal's layer. Numpy only: the report worker draws from files."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from audit.config.fields import SettingsError
from audit.config.vocabulary import RMIA
from audit.reporting.panels import HistogramPanel, read_npz
from audit.reporting.readings import exact_auc_of, ordered_models
from audit.reporting.records import RMIA_SCORES_FILE, SIGNALS_FILE
from audit.round_record import RoundRecord

__all__ = ["membership_histograms", "rmia_histograms", "check_gradient_layer"]

_TITLES = {"local": "local model", "global": "global model", "update": "model update"}


def _panels(record: RoundRecord, models, scores: Mapping[str, np.ndarray], key, title, xlabel=None) -> list:
    out = []
    for model in models:
        for signal in sorted(record.attacks_of(model)):
            members, nonmembers = scores.get(f"{key(model, signal)}_members"), scores.get(f"{key(model, signal)}_nonmembers")
            if members is None or nonmembers is None:
                continue
            extra = {} if xlabel is None else {"xlabel": xlabel}
            out.append(HistogramPanel(title(model, signal), np.asarray(members, dtype=float),
                                      np.asarray(nonmembers, dtype=float), exact_auc_of(record.attack(model, signal)),
                                      **extra))
    return out


def membership_histograms(record: RoundRecord, round_dir: Path) -> list[HistogramPanel]:
    """One panel per (model, signal) of the population and update attacks, from signals.npz."""
    models = [m for m in ordered_models(record.models()) if m != RMIA]
    return _panels(record, models, read_npz(round_dir / SIGNALS_FILE), lambda m, s: f"{m}_{s}",
                   lambda m, s: f"{_TITLES.get(m, m)} / {s}")


def rmia_histograms(record: RoundRecord, round_dir: Path) -> list[HistogramPanel]:
    """One panel per kind of reference, from rmia_scores.npz."""
    return _panels(record, [RMIA], read_npz(round_dir / RMIA_SCORES_FILE), lambda m, s: s,
                   lambda m, s: f"RMIA (local model) / {s} references", xlabel="RMIA score")


def check_gradient_layer(model, feature_shape, settings, key: str) -> None:
    """The gradient-norm signal's layer (audit.gradient_layer) must name a layer of the model with parameters."""
    if settings.gradient_layer is None:
        return
    from audit.membership.gradient_norms import gradient_parameter_names  # torch: only when there is a layer

    try:
        gradient_parameter_names(model, settings.gradient_layer)
    except ValueError as err:
        raise SettingsError(f"{key}.gradient_layer: {err}") from None
