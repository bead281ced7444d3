"""Settings of the deanonymization mitigations (`task_runner.settings.mitigation`, also per collaborator); the
mitigations themselves are in audit.deanon.mitigation. Torch-free."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from audit.config.checks import SettingsError, is_int, is_real, with_defaults

__all__ = ["MITIGATIONS", "DATA_MITIGATIONS", "UPDATE_MITIGATIONS", "Mitigation"]

MITIGATIONS = ("none", "noise", "dp_fedavg", "bkg_repl", "rand_aug", "mm_aug")
DATA_MITIGATIONS = ("bkg_repl", "rand_aug", "mm_aug")
UPDATE_MITIGATIONS = ("noise", "dp_fedavg")


@dataclass(frozen=True)
class Mitigation:
    method: str = "none"
    alpha: float = 0.0  # bkg_repl: fraction replaced, [0, 1]; rand_aug / mm_aug: augmentation ratio >= 0
    sigma: float = 0.0  # noise: std of the Gaussian added to each update element; dp_fedavg: noise multiplier
    clip: float = 50.0  # dp_fedavg: L2 bound on the whole update
    clusters: int = 10  # mm_aug: k-means clusters of the background data

    def __post_init__(self):
        # Direct construction is validated too (ints -> floats), so an invalid Mitigation cannot exist.
        for name, value in _validate({f.name: getattr(self, f.name) for f in fields(self)}, "mitigation").items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_mapping(cls, mapping: Mapping | None, *, prefix: str = "mitigation") -> "Mitigation":
        """Settings from a plan's mapping (None or {} -> no mitigation); errors start with the dotted key."""
        if mapping is None:
            return cls()
        values = _validate(with_defaults(cls, mapping, prefix), prefix)
        # A plan that names a mitigation must set its strength: with the default 0 it would change nothing, and a
        # no-op mitigation is not recorded. dp_fedavg with sigma 0 still clips (and is recorded).
        method = values["method"]
        if method == "noise" and values["sigma"] == 0:
            raise SettingsError(f"{prefix}.sigma: method noise needs the noise std sigma > 0, got {values['sigma']:g}"
                                f"{'' if 'sigma' in mapping else ' (not set)'}")
        if method in DATA_MITIGATIONS and values["alpha"] == 0:
            raise SettingsError(f"{prefix}.alpha: method {method} needs alpha > 0 (the share of population samples "
                                f"it trains on), got {values['alpha']:g}{'' if 'alpha' in mapping else ' (not set)'}")
        return cls(**values)

    def to_dict(self) -> dict:
        """JSON-able dict; from_mapping(to_dict()) gives back an equal Mitigation."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def active(self) -> bool:
        """Whether the mitigation changes anything (dp_fedavg always clips, even with sigma == 0)."""
        if self.method in DATA_MITIGATIONS:
            return self.alpha > 0
        if self.method == "noise":
            return self.sigma > 0
        return self.method == "dp_fedavg"


def _number(key: str, value, *, low: float, low_inclusive: bool = True) -> float:
    if not is_real(value) or not math.isfinite(value):
        raise SettingsError(f"{key}: expected a finite number, got {value!r}")
    if value < low or (value == low and not low_inclusive):
        raise SettingsError(f"{key}: expected a number {'>=' if low_inclusive else '>'} {low:g}, got {value!r}")
    return float(value)


def _validate(values: dict, prefix: str) -> dict:
    method = values["method"]
    if not isinstance(method, str) or method not in MITIGATIONS:
        raise SettingsError(f"{prefix}.method: unknown mitigation {method!r}; known: {', '.join(MITIGATIONS)}")
    alpha = _number(f"{prefix}.alpha", values["alpha"], low=0.0)
    if method == "bkg_repl" and alpha > 1:
        raise SettingsError(f"{prefix}.alpha: bkg_repl replaces a fraction of the data, expected [0, 1], got {alpha!r}")
    clusters = values["clusters"]
    if not is_int(clusters) or clusters < 1:
        raise SettingsError(f"{prefix}.clusters: expected an integer >= 1, got {clusters!r}")
    return {
        "method": method,
        "alpha": alpha,
        "sigma": _number(f"{prefix}.sigma", values["sigma"], low=0.0),
        "clip": _number(f"{prefix}.clip", values["clip"], low=0.0, low_inclusive=False),
        "clusters": int(clusters),
    }
