"""The auditor's settings: defaults, validation of a plan's mapping, and the round schedule.

Every error is an AuditSettingsError whose message starts with the full dotted key of the offending
setting (e.g. "audit.fpr_tolerance: ..."), so a bad plan entry can be found at once.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from numbers import Integral

from audit.deanon_settings import DeanonSettings, deanon_settings
from audit.population_attack import THRESHOLD_FUNCTIONS, tolerance_name_clash
from audit.setting_checks import (AuditSettingsError, check_bool, check_optional_module, check_positive_int, is_real,
                                  with_defaults)

__all__ = ["AuditSettingsError", "AuditSettings", "SIGNALS"]

SIGNALS = ("loss", "logits", "gradient_norm")

# Threshold functions that assume a non-negative, loss-like signal where members are lower
# (see audit.population_attack); the logits signal is higher for members.
_LOSS_ONLY_FUNCTIONS = ("logit_rescale", "min_linear_logit")


@dataclass(frozen=True)
class AuditSettings:
    enabled: bool = True
    signals: tuple[str, ...] = ("loss", "logits", "gradient_norm")
    fpr_tolerance: tuple[float, ...] = (0.01, 0.1, 0.5)
    interval: int = 1  # audit rounds where round_num % interval == 0
    gradient_layer: str | None = None  # module name for the gradient-norm signal; None = all parameters
    threshold_function: str = "linear_itp"
    batch_size: int = 256
    audit_global: bool = True  # also audit the received global model
    update_attack: bool = True  # run the update-based attack
    log_scale: bool = False  # ROC plots with log axes
    report_dir: str = "reports"
    # Fidel (first-dense-layer) reconstruction audit of the update (audit.fidel); off by default.
    fidel: bool = False
    fidel_layer: str | None = None  # the dense layer to attack; None = the first nn.Linear in forward order
    fidel_threshold: float = 0.98  # Pearson r of a full reveal (the paper's threshold)
    fidel_decoder: bool = False  # CNNs: also score decoded (pixel-level) reconstructions
    # Deanonymization self-audit of the update (audit.deanon_audit): a mapping, see audit.deanon_settings.
    deanon: DeanonSettings = DeanonSettings()

    def __post_init__(self):
        # Direct construction is validated too; values are normalised (lists -> tuples, ints -> floats).
        normalised = _validate({f.name: getattr(self, f.name) for f in fields(self)}, "audit")
        for name, value in normalised.items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_mapping(cls, mapping: Mapping | None, *, prefix: str = "audit") -> "AuditSettings":
        """Settings from a plan's mapping (None or {} -> defaults); unknown keys and bad values are errors."""
        if mapping is None:
            return cls()
        values = with_defaults(cls, mapping, prefix)
        return cls(**_validate(values, prefix))

    def to_dict(self) -> dict:
        """JSON-able dict; from_mapping(to_dict()) gives back equal settings."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, DeanonSettings):
                value = value.to_dict()
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def due(self, round_num: int) -> bool:
        """Whether round `round_num` is audited: enabled and round_num % interval == 0."""
        if isinstance(round_num, bool) or not isinstance(round_num, Integral):
            raise TypeError(f"round_num: expected an int, got {round_num!r}")
        if round_num < 0:
            raise ValueError(f"round_num: expected >= 0, got {round_num}")
        return self.enabled and int(round_num) % self.interval == 0


def _signals(key: str, value) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise AuditSettingsError(f"{key}: expected a list of signal names, got {value!r}")
    if not items:
        raise AuditSettingsError(f"{key}: empty; choose from {', '.join(SIGNALS)}")
    seen = []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise AuditSettingsError(f"{key}: item {i} is not a signal name: {item!r}")
        if item not in SIGNALS:
            raise AuditSettingsError(f"{key}: unknown signal {item!r}; known: {', '.join(SIGNALS)}")
        if item in seen:
            raise AuditSettingsError(f"{key}: signal {item!r} is listed twice")
        seen.append(item)
    return tuple(seen)


def _fpr_tolerance(key: str, value) -> tuple[float, ...]:
    items = [value] if is_real(value) else value
    if not isinstance(items, (list, tuple)):
        raise AuditSettingsError(f"{key}: expected a list of numbers in (0, 1), got {value!r}")
    if not items:
        raise AuditSettingsError(f"{key}: empty; give at least one FPR in (0, 1)")
    out = []
    for i, item in enumerate(items):
        if not is_real(item):
            raise AuditSettingsError(f"{key}: item {i} is not a number: {item!r}")
        item = float(item)
        if not (math.isfinite(item) and 0.0 < item < 1.0):
            raise AuditSettingsError(f"{key}: {item!r} is outside (0, 1) (FPR tolerances are fractions)")
        out.append(item)
    clash = tolerance_name_clash(out)
    if clash:
        raise AuditSettingsError(f"{key}: {clash}")
    return tuple(out)


def _threshold_function(key: str, value) -> str:
    if not isinstance(value, str) or value not in THRESHOLD_FUNCTIONS:
        raise AuditSettingsError(f"{key}: unknown threshold function {value!r}; known: {', '.join(THRESHOLD_FUNCTIONS)}")
    return value


def _fraction(key: str, value) -> float:
    if not is_real(value) or not 0 < value <= 1:
        raise AuditSettingsError(f"{key}: expected a number in (0, 1], got {value!r}")
    return float(value)


def _directory(key: str, value) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise AuditSettingsError(f"{key}: expected a directory path, got {value!r}")
    return value


_CHECKS = {
    "enabled": check_bool,
    "signals": _signals,
    "fpr_tolerance": _fpr_tolerance,
    "interval": check_positive_int,
    "gradient_layer": check_optional_module,
    "threshold_function": _threshold_function,
    "batch_size": check_positive_int,
    "audit_global": check_bool,
    "update_attack": check_bool,
    "log_scale": check_bool,
    "report_dir": _directory,
    "fidel": check_bool,
    "fidel_layer": check_optional_module,
    "fidel_threshold": _fraction,
    "fidel_decoder": check_bool,
    "deanon": deanon_settings,
}


def _validate(values: dict, prefix: str) -> dict:
    out = {name: _CHECKS[name](f"{prefix}.{name}", value) for name, value in values.items()}
    if out["threshold_function"] in _LOSS_ONLY_FUNCTIONS and "logits" in out["signals"]:
        raise AuditSettingsError(
            f"{prefix}.threshold_function: {out['threshold_function']!r} assumes a non-negative loss-like signal "
            f"where members are lower, so it cannot be used with the 'logits' signal "
            f"(remove 'logits' from {prefix}.signals or use linear_itp / gaussian)"
        )
    return out
