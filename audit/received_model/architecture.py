"""The received tensors against the plan's architecture: the same names, shapes and dtypes, finite values.

The parties build their model from the plan; a server only chooses the tensors it sends. A tensor the plan does not
have, one it lacks, one of another shape, or one whose values the plan's dtype cannot hold is no model the party can
train (and may be a model built for something else). OpenFL sends every tensor as float32 (its default pipeline's
Float32NumpyArrayToBytes), so a received dtype passes when it is the plan's own, or float32 holding finite values in the
range of the plan's dtype (for an integer buffer such as BatchNorm's num_batches_tracked, which an honest average
need not keep whole).
"""

from __future__ import annotations

import difflib
import weakref
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

__all__ = ["ArchitectureResult", "check_architecture", "plan_tensors"]

_TRANSPORT_DTYPE = np.dtype(np.float32)


@dataclass(frozen=True)
class ArchitectureResult:
    problems: tuple[str, ...]          # one line per mismatch, in the plan's tensor order
    tensors: dict[str, torch.Tensor] | None  # the received values in the plan's dtypes; None when they do not fit
    checked: int                       # tensors the plan has

    @property
    def passed(self) -> bool:
        return not self.problems

    def figure(self) -> str:
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        return self.problems[0] + more

    def to_dict(self) -> dict:
        return {"passed": self.passed, "problems": list(self.problems), "tensors_in_plan": self.checked}


def plan_tensors(template: nn.Module) -> dict[str, torch.Tensor]:
    """The plan's tensors: the template's state dict (parameters and persistent buffers), as OpenFL names them."""
    return dict(template.state_dict())


# The plan's (shape, dtype, device) per tensor name, read once per template (its architecture does not change).
_SPECS: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def _plan_spec(template: nn.Module) -> dict[str, tuple[tuple, torch.dtype, torch.device]]:
    if template not in _SPECS:
        _SPECS[template] = {name: (tuple(t.shape), t.dtype, t.device) for name, t in plan_tensors(template).items()}
    return _SPECS[template]


def _close(name: str, names) -> str:
    near = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _dtype_problem(name: str, value: np.ndarray, plan: torch.dtype) -> str | None:
    plan_np = torch.empty((), dtype=plan).numpy().dtype
    if value.dtype == plan_np:
        return None
    if value.dtype != _TRANSPORT_DTYPE:
        return f"{name} has dtype {value.dtype}, the plan's {plan_np} (or the transport's float32)"
    if plan.is_floating_point:
        return None
    # float32 on the wire for an integer or bool tensor (an honest average of BatchNorm's num_batches_tracked is no
    # whole number when the parties' step counts differ; loading truncates it): finite and in the dtype's range
    low, high = (0, 1) if plan == torch.bool else (np.iinfo(plan_np).min, np.iinfo(plan_np).max)
    fits = np.isfinite(value).all() and (value.size == 0 or (value.min() >= low and value.max() <= high))
    return None if fits else f"{name} holds values a {plan_np} tensor cannot (received as float32)"


def check_architecture(received: Mapping[str, Any], template: nn.Module) -> ArchitectureResult:
    """Compare the received tensors (name -> array) with the plan's model `template`."""
    plan = _plan_spec(template)
    problems: list[str] = []
    for name in received:
        if name not in plan:
            problems.append(f"unexpected tensor {name!r}{_close(name, plan)}")
    tensors: dict[str, torch.Tensor] = {}
    for name, (shape, dtype, device) in plan.items():
        if name not in received:
            problems.append(f"missing tensor {name!r}")
            continue
        value = np.asarray(received[name])
        if tuple(value.shape) != shape:
            problems.append(f"{name} has shape {tuple(value.shape)}, the plan's {shape}")
            continue
        if value.dtype.kind not in "biuf":
            problems.append(f"{name} has dtype {value.dtype}, not a numeric tensor")
            continue
        problem = _dtype_problem(name, value, dtype)
        if problem is None and value.dtype.kind == "f" and not np.isfinite(value).all():
            problem = f"{name} holds NaN/Inf"
        if problem is not None:
            problems.append(problem)
            continue
        tensors[name] = torch.tensor(value, dtype=dtype, device=device)
    return ArchitectureResult(tuple(problems), None if problems else tensors, len(plan))
