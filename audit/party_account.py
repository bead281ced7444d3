"""A party's account of the run as its audit (audit.party_audit) keeps it: each round's verdict and what was sent, the
DP account and run budget (audit.run_account), the empirical summary, the final model's audit, each step's last
scalars; written after every round and the final audit to the party's own report folder (`account.json`, a
audit.run_record.PartyRun), from which the run's record (run.json) is gathered.

The party itself is the one that knows what it sent every round, audited or not (a round the audit skips has no
round record), so the account is kept here, in the process that decides, not read back from the round records.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

from audit.config.gate import GatePolicy
from audit.config.gate_contract import KEPT, WITHHELD, sent_to_aggregator
from audit.config.steps import AFTER_TRAINING, registered
from audit.config.vocabulary import FINAL, LEAK_EPSILON_LB, LOWER, UPPER
from audit.gate_flow import SEND_RETRAINED, SEND_TRAINED
from audit.reporting.atomic_io import atomic_write_json
from audit.round_record import RoundRecord
from audit.run_account import Mechanism, RoundRelease, RunBudget, compose, dp_account, dp_fedavg_mechanism
from audit.run_record import (ACCOUNT_FILE, Empirical, FinalModel, LeakSummary, PartyRun, RoundEntry,
                              library_versions)

__all__ = ["PartyAccount", "update_release", "final_model_limits"]

def update_release(mitigation) -> Mechanism | None:
    """The DP mechanism of an update sent with `mitigation` (audit.config.mitigation_settings.Mitigation): dp_fedavg
    with noise; None for every other (no DP bound: sent as trained, with noise but no clipping, or a data
    mitigation)."""
    if mitigation is not None and mitigation.method == "dp_fedavg" and mitigation.sigma > 0:
        return dp_fedavg_mechanism(mitigation.sigma)
    return None


def _unbounded_why(mitigation) -> str:
    method = getattr(mitigation, "method", "none")
    if method == "noise":
        return "sent with Gaussian noise but no clipping: no sensitivity, no DP bound"
    if method == "dp_fedavg":
        return "sent with dp_fedavg without noise (sigma 0): clipped only, no DP bound"
    if method not in (None, "none"):
        return f"sent as trained (with the {method} data mitigation), without DP"
    return "sent as trained, without DP"


def final_model_limits(policy: GatePolicy, metrics: Mapping[str, float]) -> tuple[dict, tuple[str, ...]]:
    """The gate's limits applied to the final model's audit (`metrics`: its record's): each threshold on a
    population attack of the trained or received model (mia_local_*, mia_global_*) meets the same figure of the final
    model (mia_final_*), one on an RMIA attack with trained references the final model's RMIA of that kind, the
    epsilon budget its family-wise epsilon lower bound; the values compared as the gate compares (its `bound`).
    Returns (limit -> {value, threshold} for those it exceeds, the limits with no counterpart in the final audit)."""
    mapped: dict[str, float] = {}
    applicable: dict[str, float] = {}
    not_applicable = []
    for name, limit in policy.limits.items():
        counterpart = _final_counterpart(name)
        if counterpart is None or counterpart not in metrics:
            not_applicable.append(name)
            continue
        applicable[name] = limit
        for suffix in ("", f"_{LOWER}", f"_{UPPER}"):
            if counterpart + suffix in metrics:
                mapped[name + suffix] = metrics[counterpart + suffix]
    if not applicable:
        return {}, tuple(not_applicable)
    sub = GatePolicy(action=policy.action, bound=policy.bound,
                     thresholds={k: v for k, v in applicable.items() if k != LEAK_EPSILON_LB},
                     epsilon_budget=applicable.get(LEAK_EPSILON_LB))
    verdict = sub.decide(mapped)
    tripped = {name: {"value": value if math.isfinite(value) else None, "threshold": threshold}
               for name, (value, threshold) in verdict.tripped.items()}
    return tripped, tuple(not_applicable)


def _final_counterpart(name: str) -> str | None:
    if name == LEAK_EPSILON_LB:
        return name
    for kind in ("local", "global"):
        prefix = f"mia_{kind}_"
        if name.startswith(prefix):
            return f"mia_{FINAL}_" + name[len(prefix):]
    if name.startswith("rmia_") and not name.startswith("rmia_global_"):
        return name
    return None


class PartyAccount:
    """One party's account across the run (see the module docstring). `settings`: what the party audits and gates
    with (recorded); `delta`: the DP account's delta (the gate's dp.delta); `budget`: gate.run_epsilon_budget."""

    def __init__(self, party: str, *, delta: float, budget: float | None, settings: Mapping, versions: Mapping):
        self.party, self.delta = party, float(delta)
        self.budget = None if budget is None else RunBudget(float(budget), self.delta)
        self.settings, self.versions = dict(settings), dict(versions)
        self.entries: list[RoundEntry] = []
        self.releases: list[RoundRelease] = []
        self.bounds: list[dict] = []  # per audited round: its family-wise epsilon lower bound (and the run-corrected)
        self.steps: dict = {}
        self.final: FinalModel | None = None

    # ------------------------------------------------------------------ rounds
    def add_round(self, round_num: int, *, outcome, record: RoundRecord | None, mitigation,
                  audited: bool) -> RoundEntry:
        """One round as the gate decided it (audit.gate_flow.GateOutcome) with its record (None: not audited and
        nothing to record) and the mitigation the update was sent with."""
        sends = outcome.sends
        why = None
        if sends == SEND_TRAINED and update_release(mitigation) is None:
            why = _unbounded_why(mitigation)
        release = RoundRelease(int(round_num), tuple(outcome.releases), why)
        if self.budget is not None:
            self.budget.spend(release.mechanisms)
        if sends == SEND_TRAINED:
            method = getattr(mitigation, "method", "none")
            sent = "the trained update" + ("" if method in (None, "none") else f" ({method})")
        elif sends == SEND_RETRAINED:
            sent = f"DP retrain try {outcome.retries}"
        else:
            sent = "the received global weights (nothing of the party's data)"
        sent_leak = None
        if sends == SEND_RETRAINED and outcome.tries:
            sent_leak = LeakSummary.of(outcome.tries[-1].leak)
        elif sends == SEND_TRAINED and record is not None:
            sent_leak = LeakSummary.of(record.leak)
        entry = RoundEntry(
            round=int(round_num), audited=bool(audited and record is not None and record.leak is not None),
            verdict=outcome.verdict, sent=sent, reason=outcome.reason,
            tripped=outcome.gate_verdict.to_dict()["tripped"],
            leak=LeakSummary.of(record.leak if record is not None else None), sent_leak=sent_leak,
            over_limits=bool(outcome.verdict == KEPT and outcome.gate_verdict.tripped),
            release=release, epsilon=compose(release.mechanisms, self.delta) if release.mechanisms else None)
        self._keep(entry, release)
        if record is not None and record.leak:
            self._bound(int(round_num), record.leak)
            self._steps(int(round_num), record)
        return entry

    def add_rejected_round(self, round_num: int, reason: str) -> RoundEntry:
        """A round whose received model was rejected: not trained on, an earlier model sent back."""
        entry = RoundEntry(round=int(round_num), audited=False, verdict=WITHHELD,
                           sent="nothing new: an earlier global model (the received one was rejected)", reason=reason,
                           release=RoundRelease(int(round_num)))
        self._keep(entry, entry.release)
        return entry

    def _keep(self, entry: RoundEntry, release: RoundRelease) -> None:
        self.entries = [e for e in self.entries if e.round != entry.round] + [entry]
        self.releases = [r for r in self.releases if r.round != release.round] + [release]

    def _bound(self, round_num: int, leak: Mapping) -> None:
        epsilon = leak.get("epsilon") or {}
        if epsilon.get("value") is None:
            return
        run = epsilon.get("run") or {}
        self.bounds = [b for b in self.bounds if b["round"] != round_num] + [{
            "round": round_num, "value": float(epsilon["value"]), "attack": epsilon.get("attack"),
            "delta": epsilon.get("delta"), "confidence": epsilon.get("confidence"),
            "run_value": run.get("value"), "run_attack": run.get("attack"), "rounds": run.get("rounds")}]

    def _steps(self, round_num: int, record: RoundRecord) -> None:
        """Each registered step's scalars of this round (the estimates: what leaves the party), under its name."""
        for audit_step in registered(AFTER_TRAINING):
            mine = {k: v for k, v in record.metrics.items()
                    if k.startswith(audit_step.metric_prefix) and sent_to_aggregator(k)}
            if mine:
                self.steps[audit_step.name] = {"round": round_num, "metrics": mine}

    # ------------------------------------------------------------------ the final model
    def add_final(self, record: RoundRecord | None, *, policy: GatePolicy | None, accuracy: float | None,
                  round_num: int, why: str | None = None) -> FinalModel:
        """The final model's audit (`record`; None: not audited, `why`), held to `policy`'s limits."""
        if record is None or not record.leak:
            self.final = FinalModel(audited=False, round=round_num, why=why or "the audit produced no verdict")
            return self.final
        tripped, not_applicable = final_model_limits(policy, record.metrics) if policy is not None else ({}, ())
        self.final = FinalModel(audited=True, round=int(round_num), leak=LeakSummary.of(record.leak),
                                attacks=tuple(key.label() for key in record.attacks), accuracy=accuracy,
                                tripped=tripped, not_applicable=not_applicable)
        return self.final

    # ------------------------------------------------------------------ the account
    def empirical(self) -> Empirical:
        audited = [e for e in self.entries if e.audited]
        leaks = tuple(e.round for e in audited if e.leak is not None and e.leak.detected)
        if not self.bounds:
            return Empirical(len(audited), leaks, None)
        def largest(key: str, attack: str, corrected_for) -> dict:
            best = max(self.bounds, key=lambda b: (float(b[key]), -b["round"]))
            return {"value": float(best[key]), "round": best["round"], "attack": best[attack],
                    "delta": best.get("delta"), "confidence": best.get("confidence"),
                    "corrected_for": corrected_for(best)}

        uncorrected = largest("value", "attack", lambda _: None)
        if all(b.get("run_value") is not None for b in self.bounds):  # each round's bound at 1 - (1 - c) / R
            return Empirical(len(audited), leaks, largest("run_value", "run_attack", lambda b: b.get("rounds")),
                             uncorrected)
        return Empirical(len(audited), leaks, uncorrected, uncorrected)

    def run(self) -> PartyRun:
        entries = tuple(sorted(self.entries, key=lambda e: e.round))
        account = dp_account(sorted(self.releases, key=lambda r: r.round), self.delta,
                             None if self.budget is None else self.budget.budget)
        return PartyRun(party=self.party, rounds=entries, dp=account, empirical=self.empirical(),
                        final_model=self.final, steps=dict(self.steps), settings=self.settings,
                        versions=self.versions)

    def write(self, report_root) -> Path:
        """The account as account.json in the party's report folder (atomically)."""
        return atomic_write_json(Path(report_root) / self.party / ACCOUNT_FILE, self.run().to_json(versioned=True))

