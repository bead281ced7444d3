"""The audit's settings (`task_runner.settings.audit`): defaults, validation of a plan's mapping, the round schedule.

The membership audit's keys are the section's own (signals, fpr_tolerance, ...); every other audit step has its own
sub-section (`audit.fidel`, `audit.deanon`, and any registered plug-in, see audit.config.steps), parsed by that step.
Every error is a SettingsError whose message starts with the full dotted key of the offending setting (e.g.
"task_runner.settings.audit.fpr_tolerance: ..."), so a bad plan entry can be found at once. Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Integral
from types import MappingProxyType

from audit.config.fields import (SettingsError, boolean, check_fields, choice, choices, custom, declared, integer,
                                 module_name, optional, parse, path, real, reject_unknown, setting, to_dict)
from audit.config.plugins import check_plugins
from audit.config.steps import check_declared_metrics, registered
from audit.config.tolerances import FPR_TOLERANCES, FprTolerances
from audit.config.vocabulary import LOSS_ONLY_FUNCTIONS, SIGNALS, THRESHOLD_FUNCTIONS

__all__ = ["AuditSettings", "DEFAULT_SAMPLE_SIZE"]

# Samples per set the membership audits use by default: their cost stays a fraction of a local epoch however large
# the sets (docs/membership.md, "Audit sampling"; benchmarks/README.md has the cost and the interval widths it gives).
DEFAULT_SAMPLE_SIZE = 1000

# Keys of earlier plans that moved into a step's section: old key -> its place now.
_MOVED = {"fidel_layer": "fidel.layer", "fidel_threshold": "fidel.threshold", "fidel_decoder": "fidel.decoder"}


@dataclass(frozen=True)
class AuditSettings:
    """The membership audit's settings, and every registered audit step's section (`rmia`, `fidel`, `deanon`, ...)."""

    enabled: bool = setting(True, boolean(), "audit at all")
    signals: tuple[str, ...] = setting(("loss", "logits", "gradient_norm"), choices(SIGNALS, "signal", one_ok=True),
                                       "per-sample membership signals")
    fpr_tolerance: FprTolerances = setting(FprTolerances((0.001, 0.01, 0.1, 0.5)), FPR_TOLERANCES,
                                               "TPR is reported at each FPR tolerance")
    interval: int = setting(1, integer(min=1), "audit rounds where round % interval == 0")
    gradient_layer: str | None = setting(None, optional(module_name(), "all parameters"),
                                         "module whose parameters the gradient-norm signal is taken over")
    threshold_function: str = setting("linear_itp", choice(THRESHOLD_FUNCTIONS, "threshold function"),
                                      "Privacy Meter's threshold function: the ROC's thresholds")
    batch_size: int = setting(256, integer(min=1), "batch size for computing signals")
    audit_global: bool = setting(True, boolean(), "also audit the received global model")
    update_attack: bool = setting(True, boolean(), "run the update-based attack")
    log_scale: bool = setting(True, boolean(), "log-log ROC axes and log-scaled TPR plots (the low-FPR region)")
    confidence: float = setting(0.95, real(ge=0.5, lt=1),
                                "level of every interval (AUC, TPR, FPR, advantage) and of the epsilon lower bounds")
    epsilon_delta: float = setting(1e-5, real(ge=0, lt=1), "delta of the empirical epsilon lower bounds")
    report_dir: str = setting("reports", path("directory"), "where the collaborator's reports go")
    # The membership audits (signals, population, update and RMIA attacks) on at most this many samples of each set
    # (members, non-members, population): a random sample per party, the same every round; None = every sample.
    # Their intervals are over the sampled counts, so they cover the sampling (docs/membership.md, "Audit sampling").
    sample_size: int | None = setting(DEFAULT_SAMPLE_SIZE,
                                      optional(integer(min=2, note="samples per set"), "every sample"),
                                      "samples per set (members, non-members, population) the membership audits "
                                      "use at most, a random sample per party")
    # Modules or .py files that register plug-in audit steps (audit.config.plugins), imported before the sections.
    plugins: tuple[str, ...] = setting((), custom("a list of module names or .py paths", check_plugins),
                                       "modules or .py files that register plug-in audit steps, imported before "
                                       "the audit's sections are read")
    # Every registered step's section (audit.config.steps): name -> its settings; a plan mapping or None is parsed by
    # the step, missing sections get the step's defaults. Read them as attributes: settings.fidel, settings.deanon.
    sections: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self):
        # Direct construction is validated too; values are normalised (lists -> tuples, ints -> floats).
        self.validate(check_fields(self, "audit"), "audit")
        object.__setattr__(self, "sections", MappingProxyType(_parse_sections(self.sections, "audit")))

    @staticmethod
    def validate(values: Mapping, key: str, given=frozenset()) -> None:
        """The threshold functions that fit a loss-like signal cannot take the logits signal."""
        function = values["threshold_function"]
        if function in LOSS_ONLY_FUNCTIONS and "logits" in values["signals"]:
            raise SettingsError(
                f"{key}.threshold_function: {function!r} assumes a non-negative loss-like signal where members are "
                f"lower, so it cannot be used with the 'logits' signal (remove 'logits' from {key}.signals or use "
                f"linear_itp / gaussian)"
            )

    def __getattr__(self, name: str):
        # Only called for names that are not fields: a step's section, e.g. settings.deanon.
        sections = self.__dict__.get("sections", {})
        if name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__!r} has no setting or section {name!r}")

    @classmethod
    def plan_sections(cls) -> dict[str, type]:
        """Every registered step's section name -> its settings class (the type of its defaults)."""
        return {s.section: type(s.parse(s.section, None)) for s in registered() if s.section is not None}

    @classmethod
    def from_mapping(cls, mapping: Mapping | None, *, prefix: str = "audit") -> "AuditSettings":
        """Settings from a plan's mapping (None or {} -> defaults); unknown keys and bad values are errors."""
        if not isinstance(mapping, Mapping) and mapping is not None:
            raise SettingsError(f"{prefix}: expected a mapping of settings, got {type(mapping).__name__}")
        mapping = mapping or {}
        # The plug-ins first: they register the sections the rest of the mapping may name.
        check_plugins(f"{prefix}.plugins", mapping.get("plugins"))
        for key in mapping:
            if key in _MOVED:
                raise SettingsError(f"{prefix}.{key}: moved to {prefix}.{_MOVED[key]}")
        section_names = [s.section for s in registered() if s.section is not None]
        reject_unknown(prefix, mapping, [f.name for f in declared(cls)] + section_names)
        core = parse(cls, {k: v for k, v in mapping.items() if k not in section_names}, prefix)
        sections = {k: v for k, v in mapping.items() if k in section_names}
        settings = dataclasses.replace(core, sections=_parse_sections(sections, prefix))
        for audit_step in registered():  # a step reports only its own metrics: a plug-in's declaration is checked now
            if audit_step.enabled(settings):
                key = prefix if audit_step.section is None else f"{prefix}.{audit_step.section}"
                check_declared_metrics(audit_step, audit_step.metric_names(audit_step.settings_of(settings), settings),
                                       key)
        return settings

    def to_dict(self) -> dict:
        """JSON-able dict; from_mapping(to_dict()) gives back equal settings."""
        out = to_dict(self)
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
