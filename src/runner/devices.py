"""The compute device a plan names (`task_runner.settings.device`), checked when the task runner is built.

torch.device("cuda") parses on a machine without CUDA; the first tensor moved there failed inside round 0, naming
no setting. Here the name must parse and the device must exist on this machine.
"""

from __future__ import annotations

import torch

from audit import SettingsError

__all__ = ["available_devices", "check_device"]


def available_devices() -> list[str]:
    """The devices this machine has, by the names a plan uses."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        found.append("mps")
    return found


def check_device(key: str, value) -> torch.device | None:
    """`value` as a torch.device that exists here (None: OpenFL's choice, CUDA if available, else the CPU);
    SettingsError naming `key`, the value and the devices available otherwise."""
    if value is None:
        return None
    here = ", ".join(available_devices())
    if not isinstance(value, str) or not value.strip():
        raise SettingsError(f"{key}: expected a device name (available here: {here}), got {value!r}")
    try:
        device = torch.device(value)
    except RuntimeError:
        raise SettingsError(f"{key}: {value!r} is not a torch device name; available here: {here}") from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count and (device.index is None or device.index < count):
            return device
    elif device.type == "mps" and torch.backends.mps.is_available():
        return device
    raise SettingsError(f"{key}: {value!r} is not available on this machine; available here: {here}")
