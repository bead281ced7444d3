"""The run's record: what the whole federation cost each party's data, as a pipeline or a compliance check reads it.

`RunRecord` is `run.json` in the run's report folder; each party's part is a `PartyRun`, which the party itself keeps
(audit.party_account) in its own report folder as `account.json` and which the run's record gathers. Their JSON form
is known here only: `to_json` and `from_json` name its keys, and a file written under another schema
(`SCHEMA_VERSION`) is refused with `RunRecordSchemaError` naming the file, never read with figures missing.

Per party: each round's verdict and what was sent (kept, withheld, dp_retrained, with the reasons), the DP account
(audit.run_account), the empirical summary, the final model's audit (its verdict is the party's headline), each
registered audit step's scalars of its last round (`steps`: a step's cross-round result lands there, under its
name, with no change to this file), the party's settings and library versions. For the run: its state
(audit.run_states), the planned rounds, the rounds whose reports were written, why it stopped (if it did), the run's
settings and versions.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import platform
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from audit.run_account import DPAccount, RoundRelease, Mechanism
from audit.run_states import FINISHED, RUN_STATES, describe_run

__all__ = ["SCHEMA_VERSION", "RUN_FILE", "ACCOUNT_FILE", "RunRecordSchemaError", "library_versions", "LeakSummary",
           "RoundEntry", "FinalModel", "Empirical", "PartyRun", "RunInfo", "RunRecord"]

# The version of run.json's and account.json's layout: raised whenever a field is added, removed or changes meaning.
SCHEMA_VERSION = 2
_VERSION_KEY = "schema_version"
RUN_FILE = "run.json"          # in the run's report folder (the demo's --log_dir, a federation's folder)
ACCOUNT_FILE = "account.json"  # in each party's own report folder


class RunRecordSchemaError(ValueError):
    """A run.json or account.json written under another schema version than this code reads."""

    def __init__(self, source: str, found: Any):
        self.source, self.found = source, found
        said = "no schema version" if found is None else f"schema version {found!r}"
        super().__init__(f"{source}: has {said}, this code reads schema version {SCHEMA_VERSION} (read it with the "
                         "code that wrote it, or run again)")


# The libraries whose versions a party's account records (installed distributions, read without importing them).
VERSIONED = ("torch", "numpy", "opacus", "privacy-meter", "scipy", "scikit-learn")


def library_versions(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Python's and the VERSIONED libraries' versions (those installed), and `extra` (e.g. the framework's)."""
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    out.update(extra or {})
    return out


def _check_version(data: Any, source: str) -> None:
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
    if data.get(_VERSION_KEY) != SCHEMA_VERSION:
        raise RunRecordSchemaError(source, data.get(_VERSION_KEY))


def _finite(value) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class LeakSummary:
    """One audit's leak verdict in short (audit.verdict.leak): detected or not (None: nothing tested), the headline
    figure's Holm-adjusted p-value, the family-wise epsilon lower bound with its ceiling, and the verdict in words."""

    detected: bool | None
    p_adjusted: float | None
    epsilon_lb: float | None
    ceiling: float | None
    text: str
    figure: str = ""  # the headline figure: "rmia / independent TPR at FPR 0.01 0.045 [0.012, 0.11]"

    @classmethod
    def of(cls, leak: Mapping | None) -> "LeakSummary | None":
        """From a record's `leak` (None: no verdict)."""
        if not isinstance(leak, Mapping):
            return None
        from audit.reporting.verdicts import headline_figure, leak_text

        epsilon = leak.get("epsilon") or {}
        headline = leak.get("headline") or {}
        return cls(leak.get("detected"), _finite(headline.get("p_adjusted")), _finite(epsilon.get("value")),
                   _finite(epsilon.get("ceiling")), leak_text(leak), headline_figure(headline) if headline else "")

    def short(self) -> str:
        """"leak detected: <figure>, p = 0.008 adjusted; ε ≥ 0.14" (or "no leak detected ...")."""
        if self.detected is None:
            return "no leak verdict (nothing tested)"
        said = "leak detected" if self.detected else "no leak detected"
        figure = f"{': ' if self.detected else ' (strongest: '}{self.figure}" if self.figure else ""
        p = f", p = {self.p_adjusted:.2g} adjusted" if self.p_adjusted is not None else ""
        close = ")" if self.figure and not self.detected else ""
        eps = f"; ε ≥ {self.epsilon_lb:.3g}" if self.epsilon_lb is not None else ""
        ceiling = f" (at most {self.ceiling:.3g} provable)" if self.ceiling is not None and eps else ""
        return f"{said}{figure}{p}{close}{eps}{ceiling}"

    def to_json(self) -> dict:
        return {"detected": self.detected, "p_adjusted": self.p_adjusted, "epsilon_lb": self.epsilon_lb,
                "ceiling": self.ceiling, "figure": self.figure, "text": self.text}

    @classmethod
    def from_json(cls, data) -> "LeakSummary | None":
        if data is None:
            return None
        return cls(data.get("detected"), _finite(data.get("p_adjusted")), _finite(data.get("epsilon_lb")),
                   _finite(data.get("ceiling")), str(data.get("text") or ""), str(data.get("figure") or ""))


@dataclass(frozen=True)
class RoundEntry:
    """One round of a party: whether it was audited, the gate's verdict (None: no gate record, sent as trained),
    what was sent and why, what tripped, the leak verdict of the trained update and of what was sent where that
    differs (a DP retrain), whether what was sent is over the gate's limits (sent anyway: report_only), and its part
    of the DP account (its mechanisms, its own epsilon, or why it has no bound)."""

    round: int
    audited: bool
    verdict: str | None
    sent: str
    reason: str | None = None
    tripped: dict = field(default_factory=dict)
    leak: LeakSummary | None = None
    sent_leak: LeakSummary | None = None
    over_limits: bool = False
    release: RoundRelease | None = None
    epsilon: float | None = None  # this round's own DP epsilon at the account's delta (None: no DP mechanism)

    def to_json(self) -> dict:
        return {"round": self.round, "audited": self.audited, "verdict": self.verdict, "sent": self.sent,
                "reason": self.reason, "tripped": self.tripped,
                "leak": None if self.leak is None else self.leak.to_json(),
                "sent_leak": None if self.sent_leak is None else self.sent_leak.to_json(),
                "over_limits": self.over_limits,
                "dp": {**(self.release or RoundRelease(self.round)).to_json(), "epsilon": _finite(self.epsilon)}}

    @classmethod
    def from_json(cls, data) -> "RoundEntry":
        dp = data.get("dp") or {}
        release = RoundRelease(int(data["round"]), tuple(Mechanism.from_json(m) for m in dp.get("mechanisms") or ()),
                               dp.get("unbounded"))
        return cls(round=int(data["round"]), audited=bool(data["audited"]), verdict=data.get("verdict"),
                   sent=str(data["sent"]), reason=data.get("reason"), tripped=dict(data.get("tripped") or {}),
                   leak=LeakSummary.from_json(data.get("leak")), sent_leak=LeakSummary.from_json(data.get("sent_leak")),
                   over_limits=bool(data.get("over_limits")), release=release, epsilon=_finite(dp.get("epsilon")))


@dataclass(frozen=True)
class FinalModel:
    """The final global model audited by the party against its own members: its leak verdict (every membership
    attack the plan enables that applies to a model, family-wise), the attacks, its accuracy on the party's
    non-members, and the gate's limits applied to it (`tripped`: limit -> {value, threshold}; `not_applicable`: the
    limits on figures the final audit has no counterpart of, e.g. the update attack's). `why`: when not audited."""

    audited: bool
    round: int | None = None
    leak: LeakSummary | None = None
    attacks: tuple[str, ...] = ()
    accuracy: float | None = None
    tripped: dict = field(default_factory=dict)
    not_applicable: tuple[str, ...] = ()
    why: str | None = None

    @property
    def over_limits(self) -> bool:
        return bool(self.tripped)

    def headline(self) -> str:
        """"the final model: leak detected (...), ε ≥ 0.14" or "the final model: not audited (why)"."""
        if not self.audited:
            return f"the final model: not audited ({self.why})"
        if self.leak is None:
            return "the final model: no leak verdict (nothing tested)"
        over = "; over the gate's limits: " + ", ".join(
            f"{name} {'missing' if t.get('value') is None else format(t['value'], '.3g')} > {t['threshold']:g}"
            for name, t in self.tripped.items()) if self.tripped else ""
        return f"the final model: {self.leak.short()}{over}"

    def to_json(self) -> dict:
        return {"audited": self.audited, "round": self.round,
                "leak": None if self.leak is None else self.leak.to_json(), "attacks": list(self.attacks),
                "accuracy": _finite(self.accuracy), "tripped": self.tripped,
                "not_applicable": list(self.not_applicable),
                "over_limits": self.over_limits, "why": self.why, "headline": self.headline()}

    @classmethod
    def from_json(cls, data) -> "FinalModel | None":
        if data is None:
            return None
        return cls(audited=bool(data["audited"]), round=data.get("round"), leak=LeakSummary.from_json(data.get("leak")),
                   attacks=tuple(data.get("attacks") or ()), accuracy=_finite(data.get("accuracy")),
                   tripped=dict(data.get("tripped") or {}), not_applicable=tuple(data.get("not_applicable") or ()),
                   why=data.get("why"))


@dataclass(frozen=True)
class Empirical:
    """What the per-round audits measured over the run, each figure labelled as what it is: how many rounds were
    audited and which detected a leak (of the trained update), and the largest family-wise epsilon lower bound of any
    round (`largest`: value, round, attack, delta, confidence, and `corrected_for` the rounds it was picked from), a
    lower bound on one round's training, not a budget composed over rounds."""

    rounds_audited: int = 0
    leak_rounds: tuple[int, ...] = ()
    largest: dict | None = None      # corrected for the rounds it was picked from (`corrected_for`), where known
    uncorrected: dict | None = None  # the largest of the rounds' own bounds, each at the audit's confidence alone

    def text(self) -> str:
        leaks = (f"the trained updates: leak detected in {len(self.leak_rounds)} of {self.rounds_audited} audited "
                 "rounds" if self.rounds_audited else "no round audited")
        largest, alone = self.largest or {}, self.uncorrected or {}
        if largest.get("value") is None:
            return leaks
        what = "a lower bound on one round, not a composed budget"
        if largest.get("corrected_for") and largest["value"]:
            return (f"{leaks}; largest per-round ε lower bound {largest['value']:.3g} (round {largest['round']}, "
                    f"corrected for picking it from {largest['corrected_for']} rounds; {what})")
        if largest.get("corrected_for") and alone.get("value"):
            return (f"{leaks}; largest per-round ε lower bound {alone['value']:.3g} (round {alone['round']}, that "
                    f"round's alone; 0 once corrected for picking it from {largest['corrected_for']} rounds; {what})")
        if largest["value"]:
            return (f"{leaks}; largest per-round ε lower bound {largest['value']:.3g} (round {largest['round']}, not "
                    f"corrected for picking it from the rounds; {what})")
        return f"{leaks}; no round's attacks proved an ε lower bound above 0"

    def to_json(self) -> dict:
        return {"rounds_audited": self.rounds_audited, "leak_rounds": list(self.leak_rounds),
                "largest_epsilon_lb": self.largest, "largest_epsilon_lb_uncorrected": self.uncorrected,
                "what": "per-round family-wise epsilon lower bounds of the trained updates: the largest is a lower "
                        "bound on that round's training, not a budget composed over rounds; corrected_for: the "
                        "rounds it was picked from (each round's bound at 1 - (1 - confidence) / rounds), the "
                        "uncorrected one holds for its round alone"}

    @classmethod
    def from_json(cls, data) -> "Empirical":
        return cls(int(data.get("rounds_audited") or 0), tuple(data.get("leak_rounds") or ()),
                   data.get("largest_epsilon_lb"), data.get("largest_epsilon_lb_uncorrected"))


@dataclass(frozen=True)
class PartyRun:
    """One party's account of the run (see the module docstring)."""

    party: str
    rounds: tuple[RoundEntry, ...] = ()
    dp: DPAccount | None = None
    empirical: Empirical = field(default_factory=Empirical)
    final_model: FinalModel | None = None
    steps: dict = field(default_factory=dict)       # step name -> {"round": r, "metrics": {name: value}}
    settings: dict = field(default_factory=dict)    # the party's gate, audit and mitigation settings
    versions: dict = field(default_factory=dict)    # the party's libraries

    @property
    def complete(self) -> bool:
        """Whether the party's run is over: its final model was audited (or said why not)."""
        return self.final_model is not None

    def sent_over_limits(self) -> list[int]:
        return [e.round for e in self.rounds if e.over_limits]

    def beyond_budget(self) -> list[str]:
        """Why the party's run is beyond the plan's limits (empty: within them): a sent update over the gate's
        limits, the final model over them, the DP total over the run budget."""
        out = []
        over = self.sent_over_limits()
        if over:
            out.append(f"update{'s' if len(over) > 1 else ''} sent over the gate's limits in round"
                       f"{'s' if len(over) > 1 else ''} {', '.join(map(str, over))}")
        if self.final_model is not None and self.final_model.over_limits:
            out.append("the final model is over the gate's limits (" + ", ".join(self.final_model.tripped) + ")")
        if self.dp is not None and self.dp.over_budget:
            out.append(f"{self.dp.text()}, over the run budget {self.dp.budget:g}")
        return out

    def line(self) -> str:
        """The party in one line: the final model's verdict first (the run's headline for it), then the DP total,
        what was sent, and what the rounds' audits measured."""
        counts: dict[str, int] = {}
        for entry in self.rounds:
            counts[entry.verdict or "sent as trained"] = counts.get(entry.verdict or "sent as trained", 0) + 1
        sent = ", ".join(f"{n} {what}" for what, n in counts.items()) or "no round"
        final = self.final_model.headline() if self.final_model is not None else "the final model: not audited yet"
        dp = self.dp.text() if self.dp is not None else "DP: no round yet"
        return f"{self.party}: {final}; {dp}; updates: {sent}; {self.empirical.text()}"

    def to_json(self, *, versioned: bool = False) -> dict:
        out = {_VERSION_KEY: SCHEMA_VERSION} if versioned else {}
        out.update(self._json)
        return out

    @cached_property
    def _json(self) -> dict:
        # Made once per account read: run.json, rewritten several times a round, holds every party's.
        return {"party": self.party, "rounds": [e.to_json() for e in self.rounds],
                "dp": None if self.dp is None else self.dp.to_json(), "empirical": self.empirical.to_json(),
                "final_model": None if self.final_model is None else self.final_model.to_json(),
                "steps": self.steps, "settings": self.settings, "versions": self.versions,
                "beyond_budget": self.beyond_budget(), "line": self.line()}

    @classmethod
    def from_json(cls, data, source: str = "party account", *, versioned: bool = False) -> "PartyRun":
        if versioned:
            _check_version(data, source)
        try:
            return cls(party=str(data["party"]), rounds=tuple(RoundEntry.from_json(e) for e in data["rounds"]),
                       dp=None if data.get("dp") is None else DPAccount.from_json(data["dp"]),
                       empirical=Empirical.from_json(data.get("empirical") or {}),
                       final_model=FinalModel.from_json(data.get("final_model")), steps=dict(data.get("steps") or {}),
                       settings=dict(data.get("settings") or {}), versions=dict(data.get("versions") or {}))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{source}: not a party account ({type(err).__name__}: {err})") from None

    @classmethod
    def read(cls, path) -> "PartyRun":
        """A party's account.json; RunRecordSchemaError or ValueError naming the file."""
        return cls.from_json(_load(path), str(path), versioned=True)


@dataclass(frozen=True)
class RunInfo:
    """The run-level part of run.json, what the run's driver knows of the run: its state (audit.run_states), the
    planned rounds, the rounds whose reports were written (`rounds_done`: rounds 0 .. rounds_done - 1; a round being
    audited when the run stopped is not counted), why it stopped (the signal or the failure's line; None while it runs
    or once it finished), its settings and versions. RunRecord is these fields and each party's account."""

    state: str
    rounds: int | None = None
    settings: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    rounds_done: int = 0
    reason: str | None = None

    def __post_init__(self):
        if self.state not in RUN_STATES:
            raise ValueError(f"run state {self.state!r}; one of {', '.join(RUN_STATES)}")
        if not (isinstance(self.rounds_done, int) and self.rounds_done >= 0
                and (self.rounds is None or (isinstance(self.rounds, int) and self.rounds_done <= self.rounds))):
            raise ValueError(f"run state: rounds {self.rounds!r}, rounds_done {self.rounds_done!r}: whole numbers, "
                             "0 <= rounds_done <= rounds")

    @property
    def info(self) -> "RunInfo":
        """The run-level fields alone (a RunRecord's without its parties)."""
        return RunInfo(**{f.name: getattr(self, f.name) for f in fields(RunInfo)})

    def round_written(self, rounds_done: int) -> "RunInfo":
        """With `rounds_done` rounds written (never fewer than already said, never more than planned)."""
        done = max(self.rounds_done, int(rounds_done))
        return replace(self, rounds_done=done if self.rounds is None else min(done, self.rounds))

    def ended(self, state: str, reason: str | None = None, rounds_done: int | None = None) -> "RunInfo":
        """How the run ended: FINISHED (every planned round written), INTERRUPTED or FAILED (`reason`)."""
        done = self.rounds_done if rounds_done is None else int(rounds_done)
        if state == FINISHED and self.rounds is not None:
            done = self.rounds
        elif self.rounds is not None:
            done = min(done, self.rounds)
        return replace(self, state=state, reason=reason, rounds_done=done)

    def describe(self) -> str:
        """How the run stands, in one sentence (audit.run_states.describe_run)."""
        return describe_run(self.state, self.rounds, self.rounds_done, self.reason)

    def _run_json(self) -> dict:
        return {"state": self.state, "rounds": self.rounds, "rounds_done": self.rounds_done, "reason": self.reason,
                "settings": self.settings, "versions": self.versions}

    @staticmethod
    def _run_fields(data) -> dict:
        return {"state": data["state"], "rounds": data.get("rounds"), "settings": dict(data.get("settings") or {}),
                "versions": dict(data.get("versions") or {}), "rounds_done": data.get("rounds_done", 0),
                "reason": data.get("reason")}


@dataclass(frozen=True)
class RunRecord(RunInfo):
    """run.json: the run's fields (RunInfo) and each party's account."""

    parties: dict[str, PartyRun] = field(default_factory=dict)

    def beyond_budget(self) -> dict[str, list[str]]:
        """Party -> why its run is beyond the plan's limits (only the parties that are)."""
        return {name: why for name, party in self.parties.items() if (why := party.beyond_budget())}

    def lines(self) -> list[str]:
        return [party.line() for party in self.parties.values()]

    def to_json(self) -> dict:
        return {_VERSION_KEY: SCHEMA_VERSION, **self._run_json(),
                "parties": {n: p.to_json() for n, p in self.parties.items()}, "beyond_budget": self.beyond_budget()}

    @classmethod
    def from_json(cls, data, source: str = RUN_FILE) -> "RunRecord":
        _check_version(data, source)
        try:
            parties = {str(n): PartyRun.from_json(p, f"{source}: parties.{n}") for n, p in data["parties"].items()}
            return cls(parties=parties, **RunInfo._run_fields(data))
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise ValueError(f"{source}: not a run record ({type(err).__name__}: {err})") from None

    @classmethod
    def read(cls, path) -> "RunRecord":
        """run.json at `path`; RunRecordSchemaError or ValueError naming the file."""
        return cls.from_json(_load(path), str(path))


def _load(path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
