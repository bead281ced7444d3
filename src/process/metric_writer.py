"""Each participant's metrics per round, as OpenFL's MetricWriter writes them (`<name>_metrics.txt`, one JSON line per
round, and with TENSORBOARD=1 event files in `<name>_tensorboard/`), with TensorBoard tags named by metric so that
the parties overlay on one chart.

OpenFL tags a scalar `<party>/<task>/<metric>`: every party's own tag, one chart per party and metric. Here each
participant's event folder is one TensorBoard run (its name says whose), and a tag is the metric's alone:

    privacy/<metric>           an audit metric (every registered step's and the leak verdict's, audit.config.steps)
    privacy/<metric>_lower     the bounds of its interval, each its own tag (a party's own: they never leave it)
    privacy/<metric>_upper
    gate/<metric>              the gate's scalars (gate_kept, gate_retries, ...)
    population/<attack>        the population size each membership attack set its thresholds on
    train/<metric>             the train task's other metrics (cross_entropy)
    validation/global_model_<metric>, validation/local_model_<metric>   the validation tasks' (accuracy)
    time/elapsed_seconds

The aggregator's run holds OpenFL's averages over the collaborators under the same tags (no bounds: a mean of bounds
is no interval). A custom-scalars layout (TensorBoard's "Custom Scalars" tab) shows each figure with its interval as
a margin chart, which draws no smoothing. The event format cannot carry the scalars dashboard's smoothing (0.6 by
default, a setting of the viewer); TensorBoard takes it from its address: http://localhost:6006/?smoothing=0.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from openfl.callbacks import MetricWriter

from audit import BOUNDS, POPULATION_PREFIX, is_audit_metric

__all__ = ["PartyMetricWriter", "tensorboard_tag", "UNSMOOTHED_URL"]

logger = logging.getLogger(__name__)

UNSMOOTHED_URL = "http://localhost:6006/?smoothing=0#timeseries"  # TensorBoard 2.x reads its smoothing from here
_VALIDATION = {"aggregated_model_validation": "global_model", "locally_tuned_model_validation": "local_model"}
_SKIPPED = ("round_number",)  # the step itself


def tensorboard_tag(key: str, origin: str) -> str | None:
    """The tag of one of OpenFL's round-end metric keys (`<origin>/<task>/<metric>`, `elapsed_seconds`, ...); None
    for a key that is no metric (the round number: the step)."""
    if key in _SKIPPED:
        return None
    if "/" not in key:
        return f"time/{key}"
    parts = key.split("/")
    if parts[0] == origin:
        parts = parts[1:]
    task, metric = (parts[0], "/".join(parts[1:])) if len(parts) > 1 else ("", parts[0])
    if is_audit_metric(metric):
        return f"privacy/{metric}"
    if metric.startswith("gate_"):
        return f"gate/{metric}"
    if metric.startswith(POPULATION_PREFIX):
        return f"population/{metric[len(POPULATION_PREFIX):]}"
    if task in _VALIDATION:
        return f"validation/{_VALIDATION[task]}_{metric}"
    return f"{task or 'other'}/{metric}"


class PartyMetricWriter(MetricWriter):
    """OpenFL's MetricWriter (the same `<name>_metrics.txt` and event folder) with tags named by metric
    (tensorboard_tag). `record_source`: an object whose `last_record` is the party's latest round record
    (src.taskrunner.AuditedTaskRunner), for its intervals' bounds; None for the aggregator."""

    def __init__(self, log_dir: str = "./logs/", record_source: Any = None):
        super().__init__(log_dir=log_dir)
        self.record_source = record_source
        self._layout_written = False

    def _bounds(self, round_num: int) -> dict[str, float]:
        record = getattr(self.record_source, "last_record", None)  # an audit.round_record.RoundRecord
        if record is None or record.round != round_num:
            return {}
        return {f"privacy/{name}": value for name, value in record.metrics.items()
                if name.endswith(tuple("_" + b for b in BOUNDS)) and is_audit_metric(name)}

    def on_round_end(self, round_num: int, logs=None):
        logs = logs or {}
        elapsed_seconds = time_since(self._round_start_time)
        metrics = {"round_number": round_num, "elapsed_seconds": elapsed_seconds, **logs}
        logger.info(f"Round {round_num}: Metrics: {metrics}")
        self._log_file_handle.write(json.dumps(metrics) + "\n")
        self._log_file_handle.flush()
        if not self._summary_writer:
            return
        origin = self.params.get("origin", "")
        scalars = {}
        for key, value in metrics.items():
            tag = tensorboard_tag(key, origin)
            if tag is not None:
                scalars[tag] = value
        scalars.update(self._bounds(round_num))
        for tag, value in scalars.items():
            self._summary_writer.add_scalar(tag, value, round_num)
        if not self._layout_written and any(tag.endswith("_lower") for tag in scalars):
            self._summary_writer.add_custom_scalars(interval_layout(scalars))
            self._layout_written = True
        self._summary_writer.flush()


def time_since(start) -> float:
    """Seconds since `start` (time.monotonic), as OpenFL's writer counts a round; NaN without a start."""
    return time.monotonic() - start if start is not None else math.nan


def interval_layout(tags) -> dict:
    """TensorBoard's custom-scalars layout: a margin chart (the value and its interval, no smoothing) for each
    privacy figure with both bounds, grouped by figure (exact AUC, TPR at each tolerance, advantage)."""
    layout: dict[str, dict] = {}
    for tag in sorted(tags):
        if not tag.startswith("privacy/") or tag.endswith(tuple("_" + b for b in BOUNDS)):
            continue
        if not all(f"{tag}_{b}" in tags for b in BOUNDS):
            continue
        name = tag[len("privacy/"):]
        group = ("TPR at FPR " + name.rsplit("_tpr_at_fpr_", 1)[1] if "_tpr_at_fpr_" in name
                 else "exact AUC" if name.endswith("exact_auc") else name.rsplit("_", 1)[-1])
        layout.setdefault(f"privacy with intervals: {group}", {})[name] = [
            "Margin", [tag, f"{tag}_lower", f"{tag}_upper"]]

    def order(category: str) -> tuple:  # exact AUC first, then TPR by tolerance, then the rest
        group = category.split(": ", 1)[1]
        if group == "exact AUC":
            return (0, 0.0, group)
        if group.startswith("TPR at FPR "):
            return (1, float(group[len("TPR at FPR "):]), group)
        return (2, 0.0, group)

    return {category: layout[category] for category in sorted(layout, key=order)}
