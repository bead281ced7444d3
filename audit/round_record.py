"""A party's round record: what its audit found in one round, as every consumer reads it.

`RoundRecord` is built by the audit (audit.round_audit), completed by the gate and the party (audit.party_record),
stored as the round folder's ``audit.json`` and read back by the party's report, the demo and the tools. Its JSON form
is known here only: `to_json` and `from_json` are the one place that names the JSON keys, and a record written under
another schema (`SCHEMA_VERSION`) is refused with `RecordSchemaError`, never read with figures missing.

Membership attacks are keyed by `AttackKey` (audit.config.attack_key: the model kind and the signal, or RMIA and its
reference kind), from which their metric names, report names and population names derive. The
private part (`private`: the steps' writers of per-sample files for the party's own round folder) lives in memory only
and is never part of the JSON.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from audit.config.attack_key import AttackKey
from audit.config.fields import is_int
from audit.record_parts import GateEntry, RecordSettings

__all__ = ["SCHEMA_VERSION", "AttackKey", "attack_keys", "RoundRecord", "RecordSchemaError", "validate_structure",
           "validate_record", "validate_party_name", "check_jsonable", "is_finite_number"]

# The version of the record's JSON layout: raised whenever a field is added, removed or changes its meaning, so that a
# reader never takes a missing figure of an older record for a measured one.
SCHEMA_VERSION = 1
_VERSION_KEY = "schema_version"


class RecordSchemaError(ValueError):
    """A round record written under another schema version than this code reads."""

    def __init__(self, source: str, found: Any):
        self.source, self.found = source, found
        said = "no schema version (written before versions)" if found is None else f"schema version {found!r}"
        super().__init__(f"{source}: round record has {said}, this code reads schema version {SCHEMA_VERSION} "
                         "(read it with the code that wrote it, or audit the round again)")


def attack_keys(attacks: Mapping) -> dict[AttackKey, Any]:
    """Attacks keyed by AttackKey: given so (a step's StepResult.attacks), or nested model -> signal -> result (the
    JSON's layout) and flattened."""
    out: dict[AttackKey, Any] = {}
    for key, value in attacks.items():
        if isinstance(key, AttackKey):
            out[key] = value
        else:
            out.update({AttackKey(str(key), str(signal)): result for signal, result in value.items()})
    return out


@dataclass
class RoundRecord:
    """One party's round: the audit's attacks and metrics, its timings and sizes, the steps' details (`extra`), the
    round's leak verdict. `attacks` hold AttackResult objects as the audit made them, or their JSON dicts (what
    `AttackResult.to_dict` gives) once read back; `metrics` are flat finite scalars, the only part that may leave the
    party (audit.party_record.sent_scalars)."""

    party: str
    round: int
    seed: int | None = None
    # The audit's settings as stated (AuditSettings.to_dict), their tolerances, confidence and delta typed
    # (audit.record_parts); a mapping given is read into one.
    settings: RecordSettings = field(default_factory=RecordSettings)
    timings: dict = field(default_factory=dict)           # seconds: <step>_s, audit_s, train_s, ...
    attacks: dict[AttackKey, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)   # the membership audits' set sizes
    extra: dict = field(default_factory=dict)             # each step's details by its name; gate, received_model, ...
    sampling: dict | None = None                          # the audit sets' sampling; None: a round without an audit
    leak: dict | None = None                              # the leak verdict (audit.verdict.leak); None: not audited
    # In memory only, never in the JSON: the steps' writers of the party's private files for its round folder.
    private: tuple[Callable, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self):
        self.settings = RecordSettings.from_mapping(self.settings)
        if self.extra.get("gate") is not None:
            self.extra["gate"] = GateEntry.from_mapping(self.extra["gate"])

    @property
    def gate(self) -> GateEntry | None:
        """The gate's entry of the round (`extra["gate"]`, typed); None for a round the gate did not see. An entry
        put in as a mapping is read into a GateEntry once, here."""
        entry = self.extra.get("gate")
        if entry is not None and not isinstance(entry, GateEntry):
            entry = self.extra["gate"] = GateEntry.from_mapping(entry)
        return entry

    # ------------------------------------------------------------------ attacks
    def models(self) -> list[str]:
        """The model kinds of its attacks, in the order they were added."""
        return list(dict.fromkeys(key.model for key in self.attacks))

    def attacks_of(self, model: str) -> dict[str, Any]:
        """signal -> result of one model kind's attacks."""
        return {key.signal: result for key, result in self.attacks.items() if key.model == model}

    def attack(self, model: str, signal: str) -> Any:
        return self.attacks.get(AttackKey(model, signal))

    def add_attacks(self, attacks: Mapping) -> None:
        """A step's attacks: AttackKey -> result, or nested model -> signal -> result."""
        self.attacks.update(attack_keys(attacks))

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        """The record as audit.json holds it (JSON-able; attack results as their dicts); never the private part."""
        nested: dict[str, dict] = {}
        for key, result in self.attacks.items():
            nested.setdefault(key.model, {})[key.signal] = result.to_dict() if hasattr(result, "to_dict") else result
        extra = {name: entry.to_dict() if isinstance(entry, GateEntry) else entry for name, entry in self.extra.items()}
        out = {_VERSION_KEY: SCHEMA_VERSION, "party": self.party, "round": self.round, "seed": self.seed,
               "settings": self.settings.to_dict(), "timings": self.timings, "attacks": nested, "metrics": self.metrics,
               "sizes": self.sizes, "extra": extra}
        if self.sampling is not None:
            out["sampling"] = self.sampling
        if self.leak is not None:
            out["leak"] = self.leak
        return out

    @classmethod
    def read(cls, path) -> "RoundRecord":
        """The record stored at `path` (an audit.json); RecordSchemaError or ValueError naming the file."""
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")), str(path))

    @classmethod
    def from_json(cls, data: Any, source: str = "round record") -> "RoundRecord":
        """The record `to_json` gave. RecordSchemaError when it was written under another schema; ValueError naming
        the field when its shape is wrong. `source` names it in the message (e.g. the file's path)."""
        if isinstance(data, Mapping) and data.get(_VERSION_KEY) != SCHEMA_VERSION:
            raise RecordSchemaError(source, data.get(_VERSION_KEY))
        try:
            validate_structure(data)
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise ValueError(f"{source}: record.{unknown[0]} is not a field of a round record (fields: "
                             f"{', '.join(sorted(_KEYS - {_VERSION_KEY}))})")
        try:
            return cls(party=data["party"], round=data["round"], seed=data.get("seed"),
                       settings=dict(data.get("settings") or {}), timings=dict(data.get("timings") or {}),
                       attacks=attack_keys(data["attacks"]), metrics=dict(data["metrics"]),
                       sizes=dict(data.get("sizes") or {}), extra=dict(data.get("extra") or {}),
                       sampling=data.get("sampling"), leak=data.get("leak"))
        except ValueError as err:  # a typed part (the tolerances, the gate's entry) that is malformed
            raise ValueError(f"{source}: {err}") from None


_KEYS = frozenset({_VERSION_KEY, "party", "round", "seed", "settings", "timings", "attacks", "metrics", "sizes",
                   "extra", "sampling", "leak"})


# ---------------------------------------------------------------------- validation of the JSON form
_SAFE_PARTY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._@+-]{0,127}$")


def is_finite_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def _sub(where: str, key: str) -> str:
    return f"{where}.{key}" if key.isidentifier() else f"{where}[{key!r}]"


def validate_party_name(party: object) -> str:
    """Return ``party`` if it is a safe single path component, else raise ValueError."""
    if not isinstance(party, str) or not _SAFE_PARTY_RE.match(party) or ".." in party:
        raise ValueError(
            f"party name {party!r} is not a safe path component "
            "(letters, digits, '_', '.', '-', '@', '+'; no '/', no '..', not starting with '.'; <= 128 chars)"
        )
    return party


def validate_structure(record: object) -> None:
    """Cheap shape checks of a record's JSON form, shared by writing and loading; raises ValueError naming the field."""
    if not isinstance(record, Mapping):
        raise ValueError(f"record must be a dict, got {type(record).__name__}")
    if "party" not in record:
        raise ValueError("record.party is missing")
    if not isinstance(record["party"], str):
        raise ValueError(f"record.party must be a str, got {type(record['party']).__name__}")
    try:
        validate_party_name(record["party"])
    except ValueError as e:
        raise ValueError(f"record.party: {e}") from None
    if "round" not in record:
        raise ValueError("record.round is missing")
    if not is_int(record["round"]) or record["round"] < 0:
        raise ValueError(f"record.round must be an int >= 0, got {record['round']!r}")
    if "seed" in record and record["seed"] is not None and not is_int(record["seed"]):
        raise ValueError(f"record.seed must be an int or None, got {record['seed']!r}")
    for key in ("settings", "timings", "extra", "sizes"):
        if key in record and record[key] is not None and not isinstance(record[key], Mapping):
            raise ValueError(f"record.{key} must be a dict, got {type(record[key]).__name__}")
    for key in ("sampling", "leak"):
        if key in record and record[key] is not None and not isinstance(record[key], Mapping):
            raise ValueError(f"record.{key} must be a dict or None, got {type(record[key]).__name__}")

    if "attacks" not in record:
        raise ValueError("record.attacks is missing")
    attacks = record["attacks"]
    if not isinstance(attacks, Mapping):
        raise ValueError(f"record.attacks must be a dict (model -> signal -> result), got {type(attacks).__name__}")
    for model, per_signal in attacks.items():
        where = _sub("record.attacks", str(model))
        if not isinstance(model, str):
            raise ValueError(f"{where}: model names must be str, got {model!r}")
        if not isinstance(per_signal, Mapping):
            raise ValueError(f"{where} must be a dict (signal -> result), got {type(per_signal).__name__}")
        for signal, result in per_signal.items():
            w = _sub(where, str(signal))
            if not isinstance(signal, str):
                raise ValueError(f"{w}: signal names must be str, got {signal!r}")
            _validate_attack(result, w)

    if "metrics" not in record:
        raise ValueError("record.metrics is missing")
    metrics = record["metrics"]
    if not isinstance(metrics, Mapping):
        raise ValueError(f"record.metrics must be a dict of numbers, got {type(metrics).__name__}")
    for name, value in metrics.items():
        if not isinstance(name, str):
            raise ValueError(f"record.metrics: names must be str, got {name!r}")
        if not is_finite_number(value):
            raise ValueError(f"{_sub('record.metrics', name)} must be a finite number, got {value!r}")


def _validate_attack(result: object, where: str) -> None:
    if not isinstance(result, Mapping):
        raise ValueError(f"{where} must be an attack-result dict, got {type(result).__name__}")
    for key in ("auc", "exact_auc"):
        auc = result.get(key)
        if auc is not None and not is_finite_number(auc):
            raise ValueError(f"{where}.{key} must be a finite number or None, got {auc!r}")
    has_fpr, has_tpr = "fpr" in result, "tpr" in result
    if has_fpr != has_tpr:
        raise ValueError(f"{where}: 'fpr' and 'tpr' must be given together")
    if has_fpr:
        lengths = []
        for key in ("fpr", "tpr"):
            values = result[key]
            if not isinstance(values, (list, tuple, np.ndarray)):
                raise ValueError(f"{where}.{key} must be a list, got {type(values).__name__}")
            for i, v in enumerate(values):
                if v is None:
                    continue
                if not is_finite_number(v) or not 0.0 <= float(v) <= 1.0:
                    raise ValueError(f"{where}.{key}[{i}] must be a rate in [0, 1] (or None), got {v!r}")
            lengths.append(len(values))
        if lengths[0] != lengths[1]:
            raise ValueError(f"{where}: fpr and tpr lengths differ ({lengths[0]} != {lengths[1]})")
    tpr_at = result.get("tpr_at_fpr")
    if tpr_at is not None and not isinstance(tpr_at, Mapping):
        raise ValueError(f"{where}.tpr_at_fpr must be a dict, got {type(tpr_at).__name__}")


def check_jsonable(value: Any, where: str) -> None:
    """Strict-JSON check (no NaN/Infinity, str keys) naming the first offending field."""
    if value is None or isinstance(value, (str, bool)):
        return
    if isinstance(value, numbers.Integral):
        return
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)):
            raise ValueError(f"{where} must be finite (strict JSON has no NaN/Infinity), got {value!r}")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where} has a non-str key {k!r} (JSON object keys are strings)")
            check_jsonable(v, _sub(where, k))
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_jsonable(v, f"{where}[{i}]")
        return
    if isinstance(value, (np.ndarray, np.generic)):
        check_jsonable(value.tolist(), where)
        return
    raise ValueError(f"{where} is not JSON-serialisable ({type(value).__name__})")


def validate_record(record: RoundRecord | Mapping, party: str | None = None) -> dict:
    """The record's JSON form, validated: ValueError naming the offending field if it is not a valid round record
    (RecordSchemaError for a JSON form under another schema). With ``party`` given, the record must be its."""
    data = (record if isinstance(record, RoundRecord) else RoundRecord.from_json(record, "record")).to_json()
    validate_structure(data)
    if party is not None and data["party"] != party:
        raise ValueError(f"record.party is {data['party']!r} but this report is for party {party!r}")
    check_jsonable(data, "record")
    return data
