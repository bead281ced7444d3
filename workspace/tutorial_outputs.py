"""The OpenFL Privacy Meter tutorial's file names in --log_dir, copied from this project's reports.

Why these names exist: users of OpenFL's tutorial (cifar10_PM.py) look in --log_dir for
``<col>_roc_at_<round>.png``, ``<col>_auc.png`` and ``<col>_tpr_at_<fpr>.png`` (and scripts of theirs may
read them). This project's report writer (audit/reporting/party.py) already draws those plots, with labelled axes,
as ``<col>/round_NNNN/roc.png``, ``<col>/auc.png`` and ``<col>/tpr_at_<fpr>.png``; here they are only
copied (atomically, with audit.reporting.atomic_io) under the tutorial's names, so no plotting code is duplicated.
``<round>`` is the round number of the report's ``round_NNNN`` folder (0-based, as in the tutorial).
The tutorial's ``<col>.pkl`` is not reproduced: ``round_NNNN/audit.json`` and ``metrics.csv`` hold the data.
"""

from __future__ import annotations

import re
from pathlib import Path

from audit import atomic_write_bytes

__all__ = ["tutorial_names", "write_tutorial_outputs"]

_ROUND_DIR = re.compile(r"^round_(\d+)$")
_TPR_PLOT = re.compile(r"^tpr_at_.+\.png$")


def tutorial_names(log_dir: Path, collaborator: str) -> dict[Path, Path]:
    """{source in the collaborator's report: tutorial-named target in log_dir}, for the files there now."""
    log_dir = Path(log_dir)
    party_dir = log_dir / collaborator
    pairs: dict[Path, Path] = {}
    if not party_dir.is_dir():
        return pairs
    for rdir in sorted(party_dir.iterdir()):
        match = _ROUND_DIR.match(rdir.name)
        if match and (rdir / "roc.png").is_file():
            pairs[rdir / "roc.png"] = log_dir / f"{collaborator}_roc_at_{int(match.group(1))}.png"
    for plot in sorted(party_dir.iterdir()):
        if plot.is_file() and (plot.name == "auc.png" or _TPR_PLOT.match(plot.name)):
            pairs[plot] = log_dir / f"{collaborator}_{plot.name}"
    return pairs


def write_tutorial_outputs(log_dir: Path, collaborators) -> list[Path]:
    """Copy each collaborator's report plots to the tutorial's names in log_dir; returns the files written.

    Cheap enough to call after every round (a few small PNGs); unchanged files are not rewritten.
    """
    written = []
    for col in collaborators:
        for source, target in tutorial_names(Path(log_dir), col).items():
            data = source.read_bytes()
            if target.is_file() and target.read_bytes() == data:
                continue
            atomic_write_bytes(target, data)
            written.append(target)
    return written
