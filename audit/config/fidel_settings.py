"""Settings of the Fidel reconstruction audit (`task_runner.settings.audit.fidel`) and the metrics it reports."""

from __future__ import annotations

from dataclasses import dataclass, fields

from audit.config.checks import SettingsError, check_bool, check_optional_module, from_checks, is_real

__all__ = ["FidelSettings", "fidel_settings", "FIDEL_METRICS", "DEFAULT_THRESHOLD"]

FIDEL_METRICS = ("fidel_revealed_fraction", "fidel_revealed_fraction_ica", "fidel_mean_best_r")
#: The paper's "fully revealed" Pearson correlation.
DEFAULT_THRESHOLD = 0.98


@dataclass(frozen=True)
class FidelSettings:
    enabled: bool = False              # off by default
    layer: str | None = None           # the dense layer to attack; None = the first nn.Linear in forward order
    threshold: float = DEFAULT_THRESHOLD  # Pearson r of a full reveal
    decoder: bool = False              # CNNs: also score decoded (pixel-level) reconstructions

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _fraction(key: str, value) -> float:
    if not is_real(value) or not 0 < value <= 1:
        raise SettingsError(f"{key}: expected a number in (0, 1], got {value!r}")
    return float(value)


_CHECKS = {"enabled": check_bool, "layer": check_optional_module, "threshold": _fraction, "decoder": check_bool}


def fidel_settings(key: str, value) -> FidelSettings:
    """FidelSettings from a plan mapping (None -> defaults); errors name the dotted key."""
    if isinstance(value, bool):  # earlier plans had `fidel: true` where the section now is
        raise SettingsError(f"{key}: is a section now; write {key}.enabled: {str(value).lower()}")
    return from_checks(FidelSettings, _CHECKS, value, key)
