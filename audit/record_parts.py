"""The typed parts of a round record that its readers (the summary, the pages, the demo's tables) decide on: the
settings the round was audited with, and the gate's entry.

Each is read once, where the record is made (from the audit's typed `AuditSettings`, the gate's typed outcome) or
read back (`RoundRecord.from_json`), and read by attribute afterwards: no reader parses a tolerance list or asks a
mapping whether there was a budget. Each is also a read-only mapping of what the record states (every key as the JSON
holds it, for the page's settings table and the JSON itself), so a plug-in step's own keys travel untouched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterator

from audit.config.fields import is_int, is_real
from audit.config.tolerances import FPR_TOLERANCES, FprTolerances

__all__ = ["RecordSettings", "GateEntry"]


class _Stated(Mapping):
    """A read-only mapping over the values a record states (`stated`), with typed attributes beside them."""

    stated: Mapping

    def __getitem__(self, key: str) -> Any:
        return self.stated[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.stated)

    def __len__(self) -> int:
        return len(self.stated)

    def to_dict(self) -> dict:
        """The stated values as the record's JSON holds them."""
        return dict(self.stated)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self.stated) == dict(other)

    __hash__ = None


def _number(where: str, value, default: float | None) -> float | None:
    if value is None:
        return default
    if not is_real(value):
        raise ValueError(f"{where} must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True, eq=False)
class RecordSettings(_Stated):
    """The audit's settings as the round record states them (`AuditSettings.to_dict`), with the ones its readers use
    typed: the FPR tolerances TPR was read at, the intervals' confidence and the epsilon bounds' delta (None where the
    record does not say: a record made by hand, or of a round without an audit)."""

    stated: Mapping = field(default_factory=dict)
    fpr_tolerance: FprTolerances | tuple = ()
    confidence: float | None = None
    epsilon_delta: float | None = None

    @classmethod
    def of(cls, settings) -> "RecordSettings":
        """From the audit's `AuditSettings`: its typed values, nothing parsed again."""
        return cls(settings.to_dict(), settings.fpr_tolerance, settings.confidence,
                   settings.epsilon_delta)

    @classmethod
    def from_mapping(cls, values: Mapping, where: str = "record.settings") -> "RecordSettings":
        """From a record's stated settings (its JSON); ValueError naming the key when a typed one is malformed."""
        if isinstance(values, RecordSettings):
            return values
        if not isinstance(values, Mapping):
            raise ValueError(f"{where} must be a mapping, got {type(values).__name__}")
        tolerances = values.get("fpr_tolerance")
        return cls(dict(values),
                   () if tolerances is None else FPR_TOLERANCES(f"{where}.fpr_tolerance", tolerances),
                   _number(f"{where}.confidence", values.get("confidence"), None),
                   _number(f"{where}.epsilon_delta", values.get("epsilon_delta"), None))



@dataclass(frozen=True, eq=False)
class GateEntry(_Stated):
    """The gate's part of a round record (audit.gate_flow.GateOutcome.record_entry), with what its readers decide on
    typed: the verdict and why, the limits it held the round to (`thresholds`, the epsilon budget as the limit of the
    leak verdict's epsilon lower bound among them), the DP retries and the accountant's epsilon over them."""

    stated: Mapping = field(default_factory=dict)
    verdict: str | None = None                     # kept, dp_retrained or withheld (audit.config.gate_contract)
    action: str | None = None                      # the policy's action: withhold, dp_retrain, report_only
    reason: str | None = None
    thresholds: Mapping[str, float] = field(default_factory=dict)
    epsilon_budget: float | None = None            # None: the gate has no budget
    tripped: Mapping[str, Mapping] = field(default_factory=dict)  # metric -> {value, threshold}
    missing: tuple[str, ...] = ()
    retries: int = 0
    epsilon: float = math.nan                      # the accountant's epsilon over the round's DP tries
    tries: tuple[Mapping, ...] = ()

    @property
    def has_budget(self) -> bool:
        return self.epsilon_budget is not None

    @property
    def decides(self) -> bool:
        """Whether the gate had anything to decide on: a threshold or an epsilon budget."""
        return bool(self.thresholds) or self.has_budget

    @classmethod
    def from_mapping(cls, values: Mapping, where: str = "record.extra.gate") -> "GateEntry":
        """From the entry's mapping (the gate's outcome, or a record's JSON); ValueError naming the key when a typed
        one is malformed."""
        if isinstance(values, GateEntry):
            return values
        if not isinstance(values, Mapping):
            raise ValueError(f"{where} must be a mapping, got {type(values).__name__}")
        thresholds = values.get("thresholds") or {}
        tripped = values.get("tripped") or {}
        for key, value in (("thresholds", thresholds), ("tripped", tripped)):
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}.{key} must be a mapping, got {type(value).__name__}")
        retries = values.get("retries") or 0
        if not is_int(retries) or retries < 0:
            raise ValueError(f"{where}.retries must be a whole number >= 0, got {retries!r}")
        tries = values.get("tries") or ()
        if not isinstance(tries, (list, tuple)) or not all(isinstance(t, Mapping) for t in tries):
            raise ValueError(f"{where}.tries must be a list of mappings")
        text = {key: values.get(key) for key in ("verdict", "action", "reason")}
        for key, value in text.items():
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{where}.{key} must be a string, got {value!r}")
        return cls(dict(values), **text,
                   thresholds={str(k): _number(f"{where}.thresholds.{k}", v, math.nan) for k, v in thresholds.items()},
                   epsilon_budget=_number(f"{where}.epsilon_budget", values.get("epsilon_budget"), None),
                   tripped=dict(tripped), missing=tuple(values.get("missing") or ()),
                   retries=int(retries), epsilon=_number(f"{where}.epsilon", values.get("epsilon"), math.nan),
                   tries=tuple(tries))

