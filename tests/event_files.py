"""Reading back what OpenFL's MetricWriter writes: TensorBoard event files (with TensorBoard's own reader) and the
<name>_metrics.txt JSON lines."""

import json
import math
from pathlib import Path

import numpy as np


def read_events(folder: Path) -> dict:
    """{tag: [(step, value), ...]} of every scalar in the event files of `folder` (TensorBoard's reader)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every event
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def read_metric_lines(path: Path) -> list[dict]:
    """OpenFL's <name>_metrics.txt: one JSON object per finished round."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def same_float32(stored: float, value: float) -> bool:
    """Event files hold float32: `stored` is `value` rounded to float32."""
    return stored == float(np.float32(value)) or (math.isnan(stored) and math.isnan(value))
