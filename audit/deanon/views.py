"""The deanonymization self-audit's part of the party's report (how well a server tells this party's updates from a
crowd's) and its start-up check of the layer it compares."""

from __future__ import annotations

import math
from typing import Mapping

from audit.config.fields import SettingsError
from audit.reporting.readings import float_or_nan, fmt
from audit.round_record import RoundRecord

__all__ = ["page_section", "check_layer", "summary_line"]

NOTE = ("Could a server tell this party's updates from a crowd of users'? AP over chance is the attack's average "
        "precision divided by a random ranking's; its ceiling, n/H_n for n candidate users, is reached when the attack "
        "ranks this party first every time (shown as the maximum it is). 1 = no better than chance.")


def page_section(record: RoundRecord, round_dir: str, files: set[str]) -> list[str]:
    from audit.reporting.html import escape

    deanon = record.extra.get("deanon")
    if not isinstance(deanon, Mapping) or not isinstance(deanon.get("attacks"), Mapping):
        return []
    rows = []
    for name, a in sorted(deanon["attacks"].items()):
        if not isinstance(a, Mapping):
            continue
        chance = float_or_nan(a.get("chance_ap"))
        ceiling = 1.0 / chance if chance > 0 else math.nan
        rows.append(f"<tr><td>{escape(name)}</td><td>{escape(fmt(a.get('ap_over_chance'), 3))}</td>"
                    f"<td>{escape(fmt(ceiling, 3))}</td><td>{escape(fmt(a.get('mean_ap', a.get('ap')), 3))}</td>"
                    f"<td>{escape(fmt(a.get('top1'), 3))}</td></tr>")
    return [f'<h4 id="{escape(round_dir)}-deanon">Deanonymization self-audit</h4><p>{escape(NOTE)} (Crowd of '
            f"{escape(fmt(deanon.get('crowd_users')))} users, layer {escape(deanon.get('layer'))}.)</p>",
            '<div class="scroll"><table><tr><th>attack</th><th>AP over chance</th><th>ceiling: the maximum '
            "(1 / chance AP; n/H_n for n users)</th><th>AP</th><th>top-1</th></tr>" + "".join(rows) + "</table></div>"]


def check_layer(model, feature_shape, settings, key: str) -> None:
    """A layer named for the comparison must be one of the model's."""
    if settings.layer is None:
        return
    from audit.deanon.representation import layer_tensor_names

    try:
        layer_tensor_names([name for name, _ in model.named_parameters()], settings.layer)
    except ValueError as err:
        raise SettingsError(f"{key}.layer: {err}") from None


def summary_line(record: RoundRecord) -> str | None:
    """Its part of the end-of-run summary: the strongest re-identification's AP over chance, and its ceiling."""
    metrics = record.metrics
    if "deanon_ap_over_chance" not in metrics:
        return None
    return f"deanonymization AP {float_or_nan(metrics['deanon_ap_over_chance']):.2f}x chance" + _ceiling(record)


def _ceiling(record: RoundRecord) -> str:
    crowd = (record.extra.get("deanon") or {}).get("crowd_users")
    if not isinstance(crowd, int) or crowd < 1:
        return ""
    from audit.deanon.attacks import random_ranking_ap  # torch and sklearn: only when a record has a self-audit

    users = crowd + 1  # the collaborator and its crowd
    # the ceiling of AP over chance: a perfect AP (1) over one positive's chance AP among `users` (H_n / n)
    return f", at most {1.0 / random_ranking_ap(1, users):.2f} with {users} users"
