"""The settings `src.aggregator.AuditingAggregator` adds to `aggregator.settings`, checked by name.

Kept free of OpenFL and torch imports so that the local federation tooling (`python -m workspace`) can check a
plan before it spends a minute on certificates, and `fx aggregator start` fails at once on the same errors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

PREFIX = "aggregator.settings"
DEFAULT_POLL_INTERVAL_S = 1
DEFAULT_REPORT_DIR = "reports/aggregator"


@dataclass(frozen=True)
class AggregatorSettings:
    poll_interval_s: int = DEFAULT_POLL_INTERVAL_S
    report_dir: str = DEFAULT_REPORT_DIR

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any] | None) -> "AggregatorSettings":
        """Check the keys this workspace owns in `aggregator.settings`; other keys belong to OpenFL."""
        settings = dict(settings or {})
        return cls(
            poll_interval_s=check_poll_interval(settings.get("poll_interval_s", DEFAULT_POLL_INTERVAL_S)),
            report_dir=check_report_dir(settings.get("report_dir", DEFAULT_REPORT_DIR)),
        )


def check_poll_interval(value: Any) -> int:
    # The value travels to the collaborators in GetTasksResponse.sleep_time, an int32: a fraction would be
    # truncated (0.5 -> 0, a busy loop), so only whole seconds are accepted.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{PREFIX}.poll_interval_s: expected a whole number of seconds (OpenFL sends it as an int32), "
            f"got {value!r}"
        )
    if value < 1:
        raise ValueError(f"{PREFIX}.poll_interval_s: must be >= 1 second, got {value!r}")
    if value > 3600:
        raise ValueError(f"{PREFIX}.poll_interval_s: {value} s is more than an hour; collaborators would idle that long")
    return value


def check_report_dir(value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{PREFIX}.report_dir: expected a folder path (string), got {type(value).__name__} {value!r}")
    text = os.fspath(value)
    if not text.strip():
        raise ValueError(f"{PREFIX}.report_dir: must not be empty")
    if "\0" in text:
        raise ValueError(f"{PREFIX}.report_dir: contains a NUL character: {text!r}")
    return text
