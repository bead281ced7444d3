"""The gate's flow for one round: audit the update, decide, and when it is gated withhold it or retrain it with DP.

`run_gate` is the whole flow, without OpenFL or torch: the caller passes the audits and the DP retraining as
callables and then sends what the returned `GateOutcome` says (`outcome.sends`). The outcome is typed and carries
everything the round record (`outcome.record_entry`) and the aggregator's scalars (`outcome.scalars`) are made from.

Order of the flow (each step only when the one before did not decide):
1. an update holding NaN/Inf is withheld whatever the policy (the record audits what is then sent: the received
   weights, so the metric names match the other rounds');
2. a round the audit schedule skips is not gated: there is nothing to compare;
3. the trained update is audited and the policy decides; passed or `report_only` keeps it;
4. `dp_retrain`: DP-SGD retrains from the received weights, each try re-audited with the noise multiplier doubled,
   until one passes (`dp_retrained`) or the retries run out (`withheld`); `withhold` withholds at once.
A DP training whose canary audit (audit.canary.dp) proves an epsilon above its accountant's is withheld at once
(reason DP_VIOLATED, "DP guarantee violated by the audit"): the update sent by a DP mitigation (`dp_audit` of
run_gate) after step 1, a DP retrain (`Retrained.dp_audit`) in step 4. More noise would not mend a broken DP training.

A watched metric the audit did not produce trips the gate like a value above its limit (audit.config.gate: fail
closed); the reason is then "missing: <metric>".

A run budget (`gate.run_epsilon_budget`, audit.run_account.RunBudget) is checked before each release, from the
release's parameters alone: the trained update (a dp_fedavg update's mechanism; a plain update has no bound, which
no budget admits) is gated when sending it would take the party's composed DP epsilon over the budget, whatever the
action (reason RUN_BUDGET); `dp_retrain` then retrains it with DP, and a try that would cross the budget is not run:
the round is withheld. The update that would cross the budget is exactly the one withheld. `GateOutcome.releases`
are the DP mechanisms of the round that compose (audit.run_account: every try run, and the trained update's
mechanism unless the budget refused it before the gate looked at it).

Each DP try reports, beside the accountant's epsilon, the empirical epsilon lower bound its audit proves (the leak
verdict's family-wise bound, audit.verdict.leak): an accountant's epsilon below it would be a bug in the DP training
or its accounting (tests/test_epsilon_soundness.py checks it never is).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from audit.config.gate import GatePolicy, GateVerdict, non_finite_tensors
from audit.config.gate_contract import (DP_RETRAINED, DP_VIOLATED, GATE_EPSILON, GATE_KEPT, GATE_RETRIES, KEPT,
                                        NON_FINITE_UPDATE, RUN_BUDGET, VERDICTS, WITHHELD, missing_name,
                                        threshold_name, tripped_name)
from audit.record_parts import GateEntry
from audit.round_record import RoundRecord
from audit.run_account import BudgetCheck, Mechanism, RunBudget

__all__ = ["KEPT", "DP_RETRAINED", "WITHHELD", "VERDICTS", "OVER_THRESHOLD", "DP_VIOLATED", "RUN_BUDGET", "Retrained",
           "DPTry", "GateOutcome", "run_gate", "rejected_before_training", "empirical_epsilon", "dp_violation"]

OVER_THRESHOLD = "over_threshold"

# What the caller sends for each verdict.
SEND_TRAINED, SEND_RETRAINED, SEND_RECEIVED = "trained", "retrained", "received"


@dataclass(frozen=True)
class Retrained:
    """One DP retrain, as the caller's `retrain(attempt, noise_multiplier)` returns it."""

    state: Any                # the retrained weights; opaque to the flow, handed back to the caller's audit and send
    train_loss: float         # mean training loss of its last epoch (NaN if it saw no batch)
    noise_multiplier: float
    steps: int
    epsilon: float            # the accountant's epsilon after this try: composed over the round's tries
    non_finite: bool          # the retrained weights hold NaN/Inf
    dp_audit: Mapping | None = None  # the canary audit of this DP training (audit.canary.dp.DPAudit.to_dict())
    sample_rate: float = 0.0  # its Poisson sampling rate (what its accountant is told)

    def mechanism(self, attempt: int) -> Mechanism:
        """This DP training as the run's account composes it (audit.run_account)."""
        return Mechanism(self.noise_multiplier, self.sample_rate, self.steps, f"dp_retrain try {attempt}")


def dp_violation(dp_audit: Mapping | None, verdict: GateVerdict) -> GateVerdict | None:
    """`verdict` gated by a DP training whose canary audit found its bound above the accountant's epsilon (the bound
    as the tripped value, the claim as its threshold), whatever the thresholds; None when it did not, or was not
    audited."""
    if not dp_audit or not dp_audit.get("violated"):
        return None
    proof = (float(dp_audit["epsilon_lb"]), float(dp_audit["claimed_epsilon"]))
    return GateVerdict(passed=False, tripped={**verdict.tripped, DP_VIOLATED: proof}, missing=verdict.missing,
                       bound=verdict.bound, compared=verdict.compared)


def empirical_epsilon(record: RoundRecord | None) -> dict | None:
    """The epsilon lower bound an audit record proves: its leak verdict's family-wise bound (audit.verdict.leak: each
    attack's bound at a level corrected for their number, the largest kept), which attack gave it, and the delta,
    confidence and number of attacks it holds over. None when the record has none."""
    epsilon = ((record.leak if record is not None else None) or {}).get("epsilon") or {}
    value = epsilon.get("value")
    if value is None or not math.isfinite(float(value)):
        return None
    return {"value": float(value), "attack": epsilon.get("attack"), "delta": epsilon.get("delta"),
            "confidence": epsilon.get("confidence"), "bounds": epsilon.get("sources"),
            "ceiling": epsilon.get("ceiling")}


@dataclass(frozen=True)
class DPTry:
    attempt: int
    retrained: Retrained
    verdict: GateVerdict
    metrics: Mapping[str, float]
    empirical_epsilon: Mapping | None = None  # `empirical_epsilon` of this try's audit
    leak: Mapping | None = None               # this try's leak verdict (audit.verdict.leak), as its record holds it

    def to_dict(self) -> dict:
        loss = self.retrained.train_loss
        return {"attempt": self.attempt, "noise_multiplier": self.retrained.noise_multiplier,
                "steps": self.retrained.steps, "sample_rate": self.retrained.sample_rate,
                "train_loss": loss if math.isfinite(loss) else None,
                "epsilon": self.retrained.epsilon, "empirical_epsilon": self.empirical_epsilon,
                "dp_audit": None if self.retrained.dp_audit is None else dict(self.retrained.dp_audit),
                **self.verdict.to_dict(), "metrics": dict(self.metrics), "leak": self.leak}


@dataclass(frozen=True)
class GateOutcome:
    """What the gate decided this round and why."""

    verdict: str                         # KEPT, DP_RETRAINED or WITHHELD
    gate_verdict: GateVerdict            # the policy's verdict on the trained update (non-finite: always gated)
    record: RoundRecord | None           # the round's audit record; None: not audited and nothing withheld
    reason: str | None = None            # NON_FINITE_UPDATE, DP_VIOLATED, OVER_THRESHOLD, "missing: <metrics>", None
    tries: tuple[DPTry, ...] = ()
    epsilon: float = 0.0                 # the round's DP epsilon over every try (0.0 without a DP retrain)
    non_finite_tensors: tuple[str, ...] = ()
    retrained: Retrained | None = None   # the try that passed (verdict DP_RETRAINED)
    releases: tuple[Mechanism, ...] = ()  # the round's DP mechanisms that compose (module docstring)
    budget: BudgetCheck | None = None    # the run budget's check that gated the round, if one did

    @property
    def retries(self) -> int:
        return len(self.tries)

    @property
    def sends(self) -> str:
        """SEND_TRAINED, SEND_RETRAINED (`retrained.state`) or SEND_RECEIVED (the received global weights)."""
        return {KEPT: SEND_TRAINED, DP_RETRAINED: SEND_RETRAINED, WITHHELD: SEND_RECEIVED}[self.verdict]

    def record_entry(self, policy: GatePolicy) -> GateEntry:
        """The gate's part of the round record (`RoundRecord.extra["gate"]`): what it states, typed from the policy
        and this outcome."""
        out = {
            "verdict": self.verdict,
            "action": policy.action,
            "reason": self.reason,
            **self.gate_verdict.to_dict(),
            "thresholds": policy.limits,  # the epsilon budget as the limit of leak_epsilon_lb
            "epsilon_budget": policy.epsilon_budget,
            "retries": self.retries,
            "epsilon": self.epsilon,
            "delta": policy.dp.delta if self.retries else None,
            # What the audit of the trained update proves; each try's, beside the accountant's epsilon, is in tries.
            "empirical_epsilon": empirical_epsilon(self.record),
            "tries": [t.to_dict() for t in self.tries],
            "audited": bool(self.record is not None and self.record.attacks),
        }
        if self.non_finite_tensors:
            out["non_finite_tensors"] = list(self.non_finite_tensors)
        if self.retrained is not None and math.isfinite(self.retrained.train_loss):
            out["dp_train_loss"] = self.retrained.train_loss
        if policy.run_epsilon_budget is not None:
            out["run_epsilon_budget"] = policy.run_epsilon_budget
        if self.budget is not None:
            out["run_budget"] = {"allowed": self.budget.allowed, "total": _finite_or_none(self.budget.total),
                                 "spent": self.budget.spent, "budget": self.budget.budget,
                                 "text": self.budget.reason()}
        out["releases"] = [m.to_json() for m in self.releases]
        return GateEntry(out, verdict=self.verdict, action=policy.action, reason=self.reason,
                         thresholds=out["thresholds"], epsilon_budget=policy.epsilon_budget, tripped=out["tripped"],
                         missing=tuple(out["missing"]), retries=self.retries, epsilon=self.epsilon,
                         tries=tuple(out["tries"]))

    def scalars(self, watched: tuple[str, ...], thresholds: Mapping[str, float] | None = None) -> dict[str, float]:
        """The scalars the aggregator gets (names: the contract with src.aggregation and its report). `watched`:
        every metric any gate of the plan watches, so every collaborator sends the same names each round (OpenFL's
        aggregator fails when a metric is missing from some collaborators); NON_FINITE_UPDATE always. `thresholds`: this
        party's gate limits (GatePolicy.limits), sent per watched metric (NaN for one its gate does not watch) for the
        aggregator's report; per watched metric also whether this round lacked it (1.0: the gate failed closed)."""
        out = {
            GATE_KEPT: 0.0 if self.verdict == WITHHELD else 1.0,
            GATE_RETRIES: float(self.retries),
            GATE_EPSILON: float(self.epsilon),
        }
        tripped = self.gate_verdict.tripped
        for name in (*watched, *(n for n in (NON_FINITE_UPDATE, DP_VIOLATED) if n not in watched)):
            out[tripped_name(name)] = float(tripped[name][0]) if name in tripped else 0.0
        if thresholds is not None:
            out.update({threshold_name(name): float(thresholds.get(name, math.nan)) for name in watched})
        missing = set(self.gate_verdict.missing)
        out.update({missing_name(name): float(name in missing) for name in watched})
        return out


def run_gate(
    policy: GatePolicy,
    trained: Mapping[str, Any],
    *,
    audited: bool,
    audit_trained: Callable[[], RoundRecord],
    audit_received: Callable[[], RoundRecord],
    empty_record: Callable[[], RoundRecord],
    retrain: Callable[[int, float], Retrained],
    audit_retrained: Callable[[Retrained], RoundRecord],
    dp_audit: Mapping | None = None,
    budget: RunBudget | None = None,
    update_release: Mechanism | None = None,
    plan_try: Callable[[int, float], Mechanism] | None = None,
) -> GateOutcome:
    """Run the flow of the module docstring for one round's update.

    trained: the update's tensors (name -> array), checked for NaN/Inf. audited: whether the audit schedule has
    this round. audit_trained / audit_received / audit_retrained: the round's audit record of the trained model,
    of the received weights, of a DP retrain. empty_record: the record of a round withheld without an audit.
    retrain(attempt, noise_multiplier): one DP-SGD retrain from the received weights (attempt is 1-based).
    dp_audit: the canary audit of the DP mitigation that made `trained` (None: no DP mitigation, or not audited).
    budget: the party's run budget (None: none); update_release: the DP mechanism that made `trained` (None: it was
    trained without one); plan_try(attempt, noise_multiplier): a DP retrain try's mechanism before it runs (needed
    with a budget and dp_retrain).
    """
    update = (update_release,) if update_release is not None else ()
    bad = non_finite_tensors(trained)
    if bad:
        record = audit_received() if audited else empty_record()
        return GateOutcome(WITHHELD, GateVerdict.non_finite(), record, reason=NON_FINITE_UPDATE,
                           non_finite_tensors=tuple(bad), releases=update)
    if dp_violation(dp_audit, GateVerdict(passed=True)) is not None:
        record = audit_trained() if audited else empty_record()
        verdict = policy.decide(record.metrics) if audited else GateVerdict(passed=True)
        return GateOutcome(WITHHELD, dp_violation(dp_audit, verdict), record, reason=DP_VIOLATED, releases=update)
    # The run budget reads the release's parameters only, before anything looks at the update's output.
    refused = None
    if budget is not None:
        check = budget.check(update if update_release is not None else None)
        refused = None if check.allowed else check
    if refused is not None:
        update = ()  # refused before the gate looked at it: its output decides nothing
    if not audited:
        if refused is not None:
            return GateOutcome(WITHHELD, _budget_verdict(GateVerdict(passed=True), refused), empty_record(),
                               reason=RUN_BUDGET, budget=refused)
        return GateOutcome(KEPT, GateVerdict(passed=True), None, releases=update)

    record = audit_trained()
    verdict = policy.decide(record.metrics)
    if refused is not None:
        verdict = _budget_verdict(verdict, refused)
    reason = None if verdict.passed else verdict.reason or (RUN_BUDGET if refused is not None and len(
        verdict.tripped) == 1 else OVER_THRESHOLD)
    if verdict.passed or (policy.action == "report_only" and refused is None):
        return GateOutcome(KEPT, verdict, record, reason=reason, releases=update)
    tries: list[DPTry] = []
    if policy.action == "dp_retrain":
        for attempt in range(1, policy.dp.max_retries + 1):
            noise = policy.dp.noise_for_try(attempt)
            ran = (*update, *(t.retrained.mechanism(t.attempt) for t in tries))
            if budget is not None:
                if plan_try is None:
                    raise ValueError("run_gate: a run budget with dp_retrain needs plan_try (a try's mechanism)")
                check = budget.check((*ran, plan_try(attempt, noise)))
                if not check.allowed:  # this try would cross the budget: not run, the round is withheld
                    return GateOutcome(WITHHELD, _budget_verdict(verdict, check), record, reason=RUN_BUDGET,
                                       tries=tuple(tries), epsilon=tries[-1].retrained.epsilon if tries else 0.0,
                                       releases=ran, budget=check)
            result = retrain(attempt, noise)
            violated = dp_violation(result.dp_audit, verdict)
            if violated is not None:  # the try's own verdict: its DP training alone (it is not audited)
                tries.append(DPTry(attempt, result, dp_violation(result.dp_audit, GateVerdict(passed=False)), {}))
                return GateOutcome(WITHHELD, violated, record, reason=DP_VIOLATED, tries=tuple(tries),
                                   epsilon=result.epsilon, releases=(*ran, result.mechanism(attempt)))
            if result.non_finite:
                try_verdict, metrics, proven, leak = GateVerdict.non_finite(), {}, None, None
            else:
                try_record = audit_retrained(result)
                metrics, proven, leak = try_record.metrics, empirical_epsilon(try_record), try_record.leak
                try_verdict = policy.decide(metrics)
            tries.append(DPTry(attempt, result, try_verdict, metrics, proven, leak))
            if try_verdict.passed:
                return GateOutcome(DP_RETRAINED, verdict, record, reason=reason, tries=tuple(tries),
                                   epsilon=result.epsilon, retrained=result,
                                   releases=(*ran, result.mechanism(attempt)))
    epsilon = tries[-1].retrained.epsilon if tries else 0.0
    return GateOutcome(WITHHELD, verdict, record, reason=reason, tries=tuple(tries), epsilon=epsilon,
                       releases=(*update, *(t.retrained.mechanism(t.attempt) for t in tries)),
                       budget=refused)


def _budget_verdict(verdict: GateVerdict, check: BudgetCheck) -> GateVerdict:
    """`verdict` gated by the run budget too: the total the release would make against the budget."""
    return GateVerdict(passed=False, tripped={**verdict.tripped, RUN_BUDGET: (check.total, check.budget)},
                       missing=verdict.missing, bound=verdict.bound, compared=verdict.compared)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def rejected_before_training(reason: str, record: RoundRecord) -> GateOutcome:
    """The outcome of a round whose received global model a check rejected before training (audit.before_training):
    nothing was trained or audited, and the caller sends nothing new (a model the server already has) with gate_kept
    0, so the average leaves it out. `reason`: "received model rejected: <check>: <figure>"."""
    return GateOutcome(WITHHELD, GateVerdict(passed=False), record, reason=reason)
