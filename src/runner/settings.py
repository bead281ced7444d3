"""The task runner's plan settings (`task_runner.settings`, src.taskrunner.AuditedTaskRunner), declared once.

The runner's own keys (device, model, optimizer, ...) are checked here; `audit`, `gate` and `per_collaborator` are
sections whose owners parse them where they know what they depend on (the gate's metrics depend on the audit).
Torch- and OpenFL-free: the device is checked against this machine's (which needs torch) only when it is parsed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from audit import (AuditSettings, GatePolicy, Mitigation, OPTIMIZERS, PER_COLLABORATOR, SettingsError, choice, custom,
                   did_you_mean, integer, mapping, optional, real, section, setting, subsection, to_dict)

__all__ = ["PREFIX", "RunnerSettings"]

PREFIX = "task_runner.settings"


def _model(key: str, value) -> str:
    """A name src.runner.models builds (its own models, torchvision's classifiers), in any case; asked of
    src.runner.models itself (which imports torch) when a plan is parsed, so that it is the one list of names."""
    from src.runner.models import is_model_name, model_names

    found = value.strip().lower() if isinstance(value, str) else value
    if isinstance(found, str) and is_model_name(found):
        return found
    raise SettingsError(f"{key}: unknown model {value!r}; known: {', '.join(model_names())}"
                        f"{did_you_mean(value, model_names())}")


def _device(key: str, value) -> str:
    from src.runner.devices import check_device  # imports torch: only when a plan is parsed, not when it is documented

    check_device(key, value)
    return value


@dataclass(frozen=True)
class RunnerSettings:
    """What the task runner trains with, and the sections of its audit, gate and mitigation."""

    device: str | None = setting("cpu", optional(custom("a torch device this machine has (cpu, cuda, cuda:N, mps)",
                                                        _device), "OpenFL's choice: CUDA if there is one"),
                                 "where the local training and the audit run")
    model: str = setting("cnn", custom("cnn, fcnn, alexnet or a torchvision classifier (e.g. resnet18)", _model),
                         "the model (src.runner.models)")
    model_settings: Mapping = setting({}, mapping(), "the model's keyword arguments (fcnn: activation, dropout)")
    optimizer: str = setting("SGD", choice(OPTIMIZERS, "optimizer"), "the local training's optimizer")
    learning_rate: float = setting(0.05, real(gt=0), "the local training's learning rate")
    momentum: float = setting(0.9, real(ge=0), "SGD's momentum")
    seed: int = setting(0, integer(min=0), "seed of the initial model and of the audit's draws")
    audit: Mapping | None = setting(None, section(AuditSettings, later=True),
                                    "the privacy audit of every update (its keys below; each audit step has its own "
                                    "section)")
    gate: Mapping | None = setting(None, section(GatePolicy, later=True),
                                   "gating of leaky updates: withheld, retrained with DP-SGD, or only reported")
    mitigation: Mitigation = subsection(Mitigation, "deanonymization mitigation of every update")
    per_collaborator: Mapping = setting({}, PER_COLLABORATOR, "one collaborator's own epochs, learning rate, gate "
                                                              "and mitigation")

    def to_dict(self) -> dict:
        return to_dict(self)
