"""Settings of the Fidel reconstruction audit (`task_runner.settings.audit.fidel`) and the metrics it reports."""

from __future__ import annotations

from dataclasses import dataclass

from audit.config.fields import SettingsError, boolean, module_name, optional, parse, real, setting, to_dict

__all__ = ["FidelSettings", "fidel_settings", "FIDEL_METRICS", "DEFAULT_THRESHOLD"]

FIDEL_METRICS = ("fidel_revealed_fraction", "fidel_revealed_fraction_ica", "fidel_mean_best_r")
#: The paper's "fully revealed" Pearson correlation.
DEFAULT_THRESHOLD = 0.98


@dataclass(frozen=True)
class FidelSettings:
    """Fidel first-dense-layer reconstruction audit of the update (docs/fidel.md)."""

    enabled: bool = setting(False, boolean(), "run the Fidel reconstruction audit")
    layer: str | None = setting(None, optional(module_name(), "the first nn.Linear in forward order"),
                                "the dense layer to attack")
    threshold: float = setting(DEFAULT_THRESHOLD, real(gt=0, le=1),
                               "Pearson r at which a training sample counts as fully revealed")
    decoder: bool = setting(False, boolean(), "CNNs: also score reconstructions decoded to pixels")

    def to_dict(self) -> dict:
        return to_dict(self)


def fidel_settings(key: str, value) -> FidelSettings:
    """FidelSettings from a plan mapping (None -> defaults); errors name the dotted key."""
    if isinstance(value, bool):  # earlier plans had `fidel: true` where the section now is
        raise SettingsError(f"{key}: is a section now; write {key}.enabled: {str(value).lower()}")
    return parse(FidelSettings, value, key)
