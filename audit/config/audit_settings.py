"""The audit's settings (`task_runner.settings.audit`): defaults, validation of a plan's mapping, the round schedule.

The membership audit's keys are the section's own (signals, fpr_tolerance, ...); every other audit step has its own
sub-section (`audit.fidel`, `audit.deanon`, and any registered plug-in, see audit.config.steps), parsed by that step.
Every error is a SettingsError whose message starts with the full dotted key of the offending setting (e.g.
"task_runner.settings.audit.fpr_tolerance: ..."), so a bad plan entry can be found at once. Torch-free.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from numbers import Integral
from types import MappingProxyType

import audit.config.builtin_steps  # noqa: F401  (registers the built-in steps and their sections)
from audit.config.checks import (SettingsError, check_bool, check_fpr_tolerances, check_optional_module,
                                 check_positive_int, is_int, is_real)
from audit.config.plugins import check_plugins
from audit.config.steps import registered
from audit.config.vocabulary import LOSS_ONLY_FUNCTIONS, SIGNALS, THRESHOLD_FUNCTIONS

__all__ = ["AuditSettings", "DEFAULT_SAMPLE_SIZE"]

# Samples per set the membership audits use by default: their cost stays a fraction of a local epoch however large
# the sets (README "Audit sampling" has the cost and the interval widths it gives).
DEFAULT_SAMPLE_SIZE = 1000

# Keys of earlier plans that moved into a step's section: old key -> its place now.
_MOVED = {"fidel_layer": "fidel.layer", "fidel_threshold": "fidel.threshold", "fidel_decoder": "fidel.decoder"}


@dataclass(frozen=True)
class AuditSettings:
    enabled: bool = True
    signals: tuple[str, ...] = ("loss", "logits", "gradient_norm")
    fpr_tolerance: tuple[float, ...] = (0.001, 0.01, 0.1, 0.5)
    interval: int = 1  # audit rounds where round_num % interval == 0
    gradient_layer: str | None = None  # module name for the gradient-norm signal; None = all parameters
    threshold_function: str = "linear_itp"
    batch_size: int = 256
    audit_global: bool = True  # also audit the received global model
    update_attack: bool = True  # run the update-based attack
    log_scale: bool = True  # ROC plots with log-log axes (the low-FPR region), TPR plots with a log axis
    confidence: float = 0.95  # of every interval (AUC, TPR, FPR, advantage) and of the epsilon lower bound
    epsilon_delta: float = 1e-5  # delta of the empirical epsilon lower bound
    report_dir: str = "reports"
    # The membership audits (signals, population, update and RMIA attacks) on at most this many samples of each set
    # (members, non-members, population): a random sample per party, the same every round; None = every sample.
    # Their intervals are over the sampled counts, so they cover the sampling (README "Audit sampling").
    sample_size: int | None = DEFAULT_SAMPLE_SIZE
    # Modules or .py files that register plug-in audit steps (audit.config.plugins), imported before the sections.
    plugins: tuple[str, ...] = ()
    # Every registered step's section (audit.config.steps): name -> its settings; a plan mapping or None is parsed by
    # the step, missing sections get the step's defaults. Read them as attributes: settings.fidel, settings.deanon.
    sections: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self):
        # Direct construction is validated too; values are normalised (lists -> tuples, ints -> floats).
        core = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sections"}
        for name, value in _validate(core, "audit").items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "sections", MappingProxyType(_parse_sections(self.sections, "audit")))

    def __getattr__(self, name: str):
        # Only called for names that are not fields: a step's section, e.g. settings.deanon.
        sections = self.__dict__.get("sections", {})
        if name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__!r} has no setting or section {name!r}")

    @classmethod
    def from_mapping(cls, mapping: Mapping | None, *, prefix: str = "audit") -> "AuditSettings":
        """Settings from a plan's mapping (None or {} -> defaults); unknown keys and bad values are errors."""
        if mapping is None:
            return cls()
        if not isinstance(mapping, Mapping):
            raise SettingsError(f"{prefix}: expected a mapping of settings, got {type(mapping).__name__}")
        # The plug-ins first: they register the sections the rest of the mapping may name.
        check_plugins(f"{prefix}.plugins", mapping.get("plugins"))
        core_names = [f.name for f in fields(cls) if f.name != "sections"]
        section_names = [s.section for s in registered() if s.section is not None]
        core, sections = {}, {}
        for key, value in mapping.items():
            if key in _MOVED:
                raise SettingsError(f"{prefix}.{key}: moved to {prefix}.{_MOVED[key]}")
            if key in core_names:
                core[key] = value
            elif key in section_names:
                sections[key] = value
            else:
                raise SettingsError(f"{prefix}.{key}: unknown setting; known: {', '.join(core_names + section_names)}")
        core = {**{f.name: f.default for f in fields(cls) if f.name != "sections"}, **core}
        return cls(**_validate(core, prefix), sections=_parse_sections(sections, prefix))

    def to_dict(self) -> dict:
        """JSON-able dict; from_mapping(to_dict()) gives back equal settings."""
        out = {}
        for f in fields(self):
            if f.name == "sections":
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        for name, value in self.sections.items():
            out[name] = value.to_dict()
        return out

    def __eq__(self, other) -> bool:
        return isinstance(other, AuditSettings) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(repr(self.to_dict()))

    def due(self, round_num: int) -> bool:
        """Whether round `round_num` is audited: enabled and round_num % interval == 0."""
        if isinstance(round_num, bool) or not isinstance(round_num, Integral):
            raise TypeError(f"round_num: expected an int, got {round_num!r}")
        if round_num < 0:
            raise ValueError(f"round_num: expected >= 0, got {round_num}")
        return self.enabled and int(round_num) % self.interval == 0


def _parse_sections(values: Mapping, prefix: str) -> dict:
    """Every registered step's section: its parser applied to the given value (None when not given)."""
    known = {s.section: s for s in registered() if s.section is not None}
    unknown = [name for name in values if name not in known]
    if unknown:
        raise SettingsError(f"{prefix}.{unknown[0]}: unknown section; known: {', '.join(known)}")
    return {name: step.parse(f"{prefix}.{name}", values.get(name)) for name, step in known.items()}


def _signals(key: str, value) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise SettingsError(f"{key}: expected a list of signal names, got {value!r}")
    if not items:
        raise SettingsError(f"{key}: empty; choose from {', '.join(SIGNALS)}")
    seen = []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise SettingsError(f"{key}: item {i} is not a signal name: {item!r}")
        if item not in SIGNALS:
            raise SettingsError(f"{key}: unknown signal {item!r}; known: {', '.join(SIGNALS)}")
        if item in seen:
            raise SettingsError(f"{key}: signal {item!r} is listed twice")
        seen.append(item)
    return tuple(seen)


def _threshold_function(key: str, value) -> str:
    if not isinstance(value, str) or value not in THRESHOLD_FUNCTIONS:
        raise SettingsError(f"{key}: unknown threshold function {value!r}; known: {', '.join(THRESHOLD_FUNCTIONS)}")
    return value


def _directory(key: str, value) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise SettingsError(f"{key}: expected a directory path, got {value!r}")
    return value


def _sample_size(key: str, value) -> int | None:
    if value is None:
        return None
    if not is_int(value) or value < 2:
        raise SettingsError(f"{key}: expected an integer >= 2 (samples per set) or null (every sample), got {value!r}")
    return int(value)


def _confidence(key: str, value) -> float:
    if not is_real(value) or not 0.5 <= value < 1:
        raise SettingsError(f"{key}: expected a number in [0.5, 1), e.g. 0.95, got {value!r}")
    return float(value)


def _delta(key: str, value) -> float:
    if not is_real(value) or not (math.isfinite(value) and 0 <= value < 1):
        raise SettingsError(f"{key}: expected a number in [0, 1), e.g. 1e-5, got {value!r}")
    return float(value)


_CHECKS = {
    "enabled": check_bool,
    "signals": _signals,
    "fpr_tolerance": check_fpr_tolerances,
    "interval": check_positive_int,
    "gradient_layer": check_optional_module,
    "threshold_function": _threshold_function,
    "batch_size": check_positive_int,
    "audit_global": check_bool,
    "update_attack": check_bool,
    "log_scale": check_bool,
    "report_dir": _directory,
    "confidence": _confidence,
    "epsilon_delta": _delta,
    "sample_size": _sample_size,
    "plugins": check_plugins,
}


def _validate(values: dict, prefix: str) -> dict:
    out = {name: _CHECKS[name](f"{prefix}.{name}", value) for name, value in values.items()}
    if out["threshold_function"] in LOSS_ONLY_FUNCTIONS and "logits" in out["signals"]:
        raise SettingsError(
            f"{prefix}.threshold_function: {out['threshold_function']!r} assumes a non-negative loss-like signal "
            f"where members are lower, so it cannot be used with the 'logits' signal "
            f"(remove 'logits' from {prefix}.signals or use linear_itp / gaussian)"
        )
    return out
