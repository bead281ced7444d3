"""Settings of the deanonymization mitigations (`task_runner.settings.mitigation`, also per collaborator); the
mitigations themselves are in audit.deanon.mitigation. Torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from audit.config.fields import SettingsError, check_fields, choice, integer, real, setting, to_dict

__all__ = ["MITIGATIONS", "DATA_MITIGATIONS", "UPDATE_MITIGATIONS", "Mitigation"]

MITIGATIONS = ("none", "noise", "dp_fedavg", "bkg_repl", "rand_aug", "mm_aug")
DATA_MITIGATIONS = ("bkg_repl", "rand_aug", "mm_aug")
UPDATE_MITIGATIONS = ("noise", "dp_fedavg")


@dataclass(frozen=True)
class Mitigation:
    """Deanonymization mitigation of every update (audit.deanon.mitigation)."""

    method: str = setting("none", choice(MITIGATIONS, "mitigation"),
                          "noise: Gaussian noise on the update; dp_fedavg: clip the update, then noise; bkg_repl, "
                          "rand_aug, mm_aug: train on population samples too")
    alpha: float = setting(0.0, real(ge=0), "bkg_repl: fraction of the data replaced, in [0, 1]; rand_aug / mm_aug: "
                                            "population samples added per training sample")
    sigma: float = setting(0.0, real(ge=0), "noise: std of the Gaussian added to each update element; dp_fedavg: "
                                            "noise multiplier")
    clip: float = setting(50.0, real(gt=0), "dp_fedavg: L2 bound on the whole update")
    clusters: int = setting(10, integer(min=1), "mm_aug: k-means clusters of the background data")

    def __post_init__(self):
        # Direct construction is validated too (ints -> floats), so an invalid Mitigation cannot exist.
        _check_alpha(check_fields(self, "mitigation"), "mitigation")

    @staticmethod
    def validate(values: Mapping, key: str, given) -> None:
        """alpha within what the method takes; and a plan that names a mitigation must set its strength: with the
        default 0 it would change nothing, and a no-op mitigation is not recorded. dp_fedavg with sigma 0 still clips
        (and is recorded)."""
        _check_alpha(values, key)
        method = values["method"]
        if method == "noise" and values["sigma"] == 0:
            raise SettingsError(f"{key}.sigma: method noise needs the noise std sigma > 0, got {values['sigma']:g}"
                                f"{'' if 'sigma' in given else ' (not set)'}")
        if method in DATA_MITIGATIONS and values["alpha"] == 0:
            raise SettingsError(f"{key}.alpha: method {method} needs alpha > 0 (the share of population samples "
                                f"it trains on), got {values['alpha']:g}{'' if 'alpha' in given else ' (not set)'}")

    def to_dict(self) -> dict:
        """JSON-able dict; parse(Mitigation, to_dict(), key) gives back an equal Mitigation."""
        return to_dict(self)

    @property
    def active(self) -> bool:
        """Whether the mitigation changes anything (dp_fedavg always clips, even with sigma == 0)."""
        if self.method in DATA_MITIGATIONS:
            return self.alpha > 0
        if self.method == "noise":
            return self.sigma > 0
        return self.method == "dp_fedavg"


def _check_alpha(values: Mapping, key: str) -> None:
    if values["method"] == "bkg_repl" and values["alpha"] > 1:
        raise SettingsError(f"{key}.alpha: bkg_repl replaces a fraction of the data, expected [0, 1], "
                            f"got {values['alpha']!r}")
