"""What a step hands the party's report to draw: histogram panels of its per-sample values, read from the private
files it wrote into the round folder (audit.config.steps `histograms`)."""

from __future__ import annotations

import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["HistogramPanel", "read_npz"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HistogramPanel:
    """One panel: the members' and the non-members' per-sample values of one attack, its exact AUC and axis label."""

    title: str
    members: np.ndarray
    nonmembers: np.ndarray
    auc: float
    xlabel: str = "per-sample value (clipped to its 0.5-99.5% range)"


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a private .npz file; {} when it is missing or unreadable (logged: its histograms are then
    missing, the rest of the report is not)."""
    if not path.is_file():
        return {}
    try:
        with np.load(path, allow_pickle=False) as stored:
            return {key: stored[key] for key in stored.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        logger.warning("%s: unreadable (%s); its histograms are left out", path, err)
        return {}
