"""The aggregator's round record: each collaborator's status (averaged or not), the reason, its gate and audit
metrics, and the audit metrics' mean and worst over the collaborators (audit.aggregator_report.writer writes it,
audit.aggregator_report.page shows it).

It reads only what the collaborators already send, scalar metrics, from the aggregator's TensorDB at the end
of each round (rows tagged (collaborator, 'metric') for that round), plus whether the tensors each one trained
hold NaN/Inf. The names it reads and the decision "averaged or not, and why" are audit.config.gate_contract's, the
same that src.aggregation.GatedWeightedAverage applies, so a collaborator reported `kept` is one whose update
is in the round's model:

    kept                  averaged (gate_kept 1, or no gate_kept sent: gating may be off, the reason says so)
    withheld              its gate withheld it (gate_kept 0), or its gate_kept is NaN/not a number (fail closed); among
                          them, the parties that rejected the round's global model before training (their verdict,
                          received_model_rejected 1: audit.before_training)
    left_out_non_finite   a tensor it sent holds NaN/Inf, whatever its gate said
    straggler             OpenFL's straggler policy ended the round without it
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import re
from typing import Any, Iterable, Mapping

from audit.config.gate_contract import (DP_RETRAINED, DP_VIOLATED, DP_VIOLATED_TEXT, GATE_EPSILON, GATE_KEPT,
                                        GATE_KEPT_NOT_FINITE, GATE_MISSING_PREFIX, GATE_RETRIES, GATE_THRESHOLD_PREFIX,
                                        GATE_TRIPPED_PREFIX, KEPT, LEFT_OUT_NON_FINITE, NO_GATE_METRIC,
                                        NON_FINITE_TENSORS, NON_FINITE_UPDATE, RECEIVED_MODEL_ALARM,
                                        RECEIVED_MODEL_REJECTED, STRAGGLER, WITHHELD, Decision, decide)
from audit.config.steps import is_audit_metric
from audit.config.vocabulary import (BOUNDS, LEAK_DETECTED, LEAK_EPSILON_CEILING, LEAK_EPSILON_LB, LEAK_P_VALUE,
                                     POPULATION_PREFIX, tpr_statistic)
from audit.config.resolution import resolvable
from audit.reporting.metric_labels import averageable, worse_when_lower

logger = logging.getLogger(__name__)

# The record's lists of collaborators by status (key -> status); "stragglers" predates the others.
STATUS_LISTS = {"kept": KEPT, "withheld": WITHHELD, "left_out_non_finite": LEFT_OUT_NON_FINITE,
                "stragglers": STRAGGLER}


def _finite_or_none(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def metrics_from_tensor_db(frame, round_num: int, collaborators: Iterable[str]) -> dict[str, dict[str, float]]:
    """Each collaborator's scalar metrics of `round_num` from an aggregator TensorDB frame.

    Rows whose tags are exactly {collaborator, 'metric'} (the train task's metrics) keep their name; other
    metric rows of the collaborator (e.g. validation accuracy tagged 'validate_agg') are named
    `<name>[<other tags>]` so that two tasks' `accuracy` do not overwrite each other.
    """
    names = set(collaborators)
    out: dict[str, dict[str, float]] = {}
    rows = frame[(frame["round"].astype(int) == int(round_num)) & frame["report"].astype(bool)]
    for tensor_name, tags, value in zip(rows["tensor_name"], rows["tags"], rows["nparray"]):
        tags = set(tags or ())
        if "metric" not in tags:
            continue
        owners = tags & names
        if len(owners) != 1:
            continue  # the aggregator's own averages carry no collaborator tag
        (col,) = owners
        extra = sorted(tags - {"metric", col})
        key = str(tensor_name) + (f"[{'+'.join(extra)}]" if extra else "")
        try:
            out.setdefault(col, {})[key] = float(value)
        except (TypeError, ValueError):
            logger.warning("round %d: %s sent a non-scalar metric %s; left out of the report", round_num, col, key)
    return out


def collaborator_entry(metrics: Mapping[str, float], *, straggler: bool, decision: Decision | None = None) -> dict:
    """Status, reason and the gate and audit metrics of one collaborator in one round.

    `decision` is audit.config.gate_contract's for this collaborator (src.aggregation.round_decisions, which also
    knows whether its tensors were finite); None decides from its metrics alone, as for finite tensors.
    """
    gate_reported = GATE_KEPT in metrics
    if decision is None:
        decision = decide(metrics.get(GATE_KEPT), finite_update=True)
    kept_value = _finite_or_none(metrics.get(GATE_KEPT))
    tripped = {  # 0.0 = sent but not tripped (see audit.config.gate_contract); NaN/Inf = tripped, value unknown
        name[len(GATE_TRIPPED_PREFIX):]: _finite_or_none(value)
        for name, value in sorted(metrics.items()) if name.startswith(GATE_TRIPPED_PREFIX) and value != 0.0
    }
    missing = sorted(name[len(GATE_MISSING_PREFIX):] for name, value in metrics.items()
                     if name.startswith(GATE_MISSING_PREFIX) and value == 1.0)
    causes = [
        "non-finite update (NaN/Inf)" if name == NON_FINITE_UPDATE else
        f"missing: {name}" if name in missing else
        f"{DP_VIOLATED_TEXT} (canary epsilon >= {fmt(value)})" if name == DP_VIOLATED else _compared(name, value, metrics)
        for name, value in tripped.items()
    ] + [f"missing: {name}" for name in missing if name not in tripped]
    retries = _finite_or_none(metrics.get(GATE_RETRIES))
    epsilon = _finite_or_none(metrics.get(GATE_EPSILON))
    thresholds = {name[len(GATE_THRESHOLD_PREFIX):]: _finite_or_none(value) for name, value in sorted(metrics.items())
                  if name.startswith(GATE_THRESHOLD_PREFIX) and _finite_or_none(value) is not None}

    received_model = _received_model_verdict(metrics)
    if straggler:
        status = STRAGGLER
        reason = ("did not report all its tasks in time; OpenFL's straggler policy ended the round without it, "
                  "so its update is not in this round's model")
    else:
        status = decision.status
        # a gate decides only where it holds a limit (a threshold, the epsilon budget among them)
        gated = bool(thresholds) or any(name.startswith(GATE_TRIPPED_PREFIX) and name[len(GATE_TRIPPED_PREFIX):]
                                        not in (NON_FINITE_UPDATE, DP_VIOLATED) for name in metrics)
        reason = _reason(decision, metrics.get(GATE_KEPT), causes, retries, gated=gated)
        if received_model == "rejected" and status == WITHHELD:
            reason = ("did not train: it rejected this round's global model before training (its checks' figures "
                      "stay in its own report)")
    return {
        "status": status,
        # The collaborators' vocabulary: a kept update its gate retrained with DP is dp_retrained.
        "verdict": DP_RETRAINED if status == KEPT and retries else status,
        "cause": STRAGGLER if straggler else decision.cause,
        "averaged": status == KEPT,
        "reason": reason,
        "received_model": received_model,
        "gate_reported": gate_reported,
        "gate_kept": kept_value,
        "gate_retries": retries,
        "gate_epsilon": epsilon,
        "tripped": tripped,
        "missing": missing,
        "thresholds": thresholds,
        # The party's leak verdict (audit.verdict.leak), as its scalars say it: None where it sent none.
        "leak": {"detected": None if (d := _finite_or_none(metrics.get(LEAK_DETECTED))) is None else d >= 0.5,
                 "p_value": _finite_or_none(metrics.get(LEAK_P_VALUE)),
                 "epsilon_lb": _finite_or_none(metrics.get(LEAK_EPSILON_LB)),
                 "epsilon_ceiling": _finite_or_none(metrics.get(LEAK_EPSILON_CEILING))},
        # Every audit step's metrics and the leak verdict's, by the registry's prefixes (audit.config.steps).
        "audit_metrics": {k: _finite_or_none(v) for k, v in sorted(metrics.items()) if is_audit_metric(k)},
        "other_metrics": {
            k: _finite_or_none(v) for k, v in sorted(metrics.items())
            if not is_audit_metric(k) and not k.startswith(("gate_", POPULATION_PREFIX))
        },
        "population": populations_sent(metrics),
    }


def _compared(name: str, value: float | None, metrics: Mapping[str, float]) -> str:
    """"mia_local_loss_exact_auc = 0.62", or where the gate compared an interval's bound (the party sends its estimate,
    not the bound): "mia_local_loss_exact_auc: its gate compared 0.6678 (a bound of the estimate 0.6005)"."""
    estimate = _finite_or_none(metrics.get(name))
    if value is None or estimate is None or math.isclose(estimate, value, rel_tol=1e-6, abs_tol=1e-9):
        return f"{name} = {fmt(value)}"
    return f"{name}: its gate compared {fmt(value)} (a bound of the estimate {fmt(estimate)})"


def _received_model_verdict(metrics: Mapping[str, float]) -> str | None:
    """What a collaborator's checks said of the global model it received: rejected (not trained on), alarm (reported
    only, trained on), passed; None when it sent no verdict."""
    rejected = _finite_or_none(metrics.get(RECEIVED_MODEL_REJECTED))
    alarm = _finite_or_none(metrics.get(RECEIVED_MODEL_ALARM))
    if rejected is None and alarm is None:
        return None
    if rejected:
        return "rejected"
    return "alarm" if alarm else "passed"


def populations_sent(metrics: Mapping[str, float]) -> dict[str, int]:
    """attack_name -> the population size a collaborator's attack set its thresholds on (population__<attack>)."""
    out = {}
    for name, value in metrics.items():
        n = _finite_or_none(value) if name.startswith(POPULATION_PREFIX) else None
        if n is not None and n >= 0:
            out[name[len(POPULATION_PREFIX):]] = int(n)
    return out


# <attack>_tpr_at_fpr_<tolerance>, or one of its bounds
_TPR_METRIC = re.compile(r"^(?P<attack>.+)_" + re.escape(tpr_statistic(1)[:-1]) + r"(?P<tolerance>[^_]+)"
                         r"(?:_(?:" + "|".join(BOUNDS) + r"))?$")


def unresolvable(entry: Mapping, metric: str) -> bool:
    """Whether a collaborator's `metric` is a TPR at an FPR tolerance its population cannot resolve (fewer than 1/t
    samples: the figure is the TPR at population FPR 0), from the population size it sent; False when it sent
    none (the party's own page still marks it)."""
    match = _TPR_METRIC.match(metric)
    n = (entry.get("population") or {}).get(match.group("attack")) if match else None
    if n is None:
        return False
    try:
        tolerance = float(match.group("tolerance"))
    except ValueError:
        return False
    return not resolvable(tolerance, n)


UNRESOLVED_NOTE = ("* Unresolvable: the collaborator's population (the size it sent) has fewer than 1/t samples, so "
                   "its threshold at FPR t flags none of it and the figure is its TPR at population FPR 0, not at "
                   "FPR t; a mean or worst value marked * includes such a figure.")


def _reason(decision: Decision, gate_kept, causes: list[str], retries: float | None, gated: bool = True) -> str:
    after = f" (after {retries:g} retries)" if retries else ""
    if decision.status == LEFT_OUT_NON_FINITE:
        said = "" if gate_kept is None else f"; its gate_kept was {_number(gate_kept)}"
        return f"left out of the average: a tensor it sent holds NaN/Inf{said}"
    if decision.cause == NO_GATE_METRIC:
        return "reported no gate_kept metric (gating may be off); averaged"
    if decision.cause == GATE_KEPT_NOT_FINITE:
        return f"gate_kept is not a finite number ({_number(gate_kept)}); treated as withheld, left out of the average"
    if decision.status == WITHHELD:
        return "update withheld: " + (", ".join(causes) if causes else "no tripped metric reported") + after
    if causes and retries:  # the trained update tripped; a DP retrain of it passed and was sent
        return (f"sent a DP retrain (try {retries:g} passed); the trained update tripped: " + ", ".join(causes))
    if causes:  # e.g. a gate that only reports
        return "sent although the gate tripped: " + ", ".join(causes)
    if not gated:
        return "no gate: averaged as trained"
    return "passed the gate" + (f" after {retries:g} retries" if retries else "")


def _number(value: Any) -> str:
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return repr(value)


def round_record(round_num: int, *, authorized: Iterable[str], stragglers: Iterable[str],
                 metrics: Mapping[str, Mapping[str, float]], decisions: Mapping[str, Decision] | None = None,
                 aggregator_logs: Mapping[str, Any] | None = None, canary_clients: Mapping | None = None) -> dict:
    """The report of one round (a JSON-able dict).

    `decisions`: each collaborator's audit.config.gate_contract decision as the average made it
    (src.aggregation.round_decisions on the same TensorDB); a collaborator without one is decided from its
    metrics as if its tensors were finite. `canary_clients`: the round's user-level epsilon estimate
    (audit.canary.clients.CanaryClients.estimate), when the aggregator inserts canary clients.
    """
    stragglers = set(stragglers)
    decisions = decisions or {}
    collaborators = {
        name: collaborator_entry(metrics.get(name, {}), straggler=name in stragglers, decision=decisions.get(name))
        for name in sorted(set(authorized) | set(metrics))
    }
    by_status = {key: [n for n, e in collaborators.items() if e["status"] == status]
                 for key, status in STATUS_LISTS.items()}
    # Each collaborator that reported a metric counts once (OpenFL's own averages, in aggregator_logs, are
    # weighted by data size and leave stragglers out).
    names = sorted({k for e in collaborators.values() for k, v in e["audit_metrics"].items() if v is not None})
    averaged = {}
    for name in names:
        sent = [(e["audit_metrics"][name], n) for n, e in collaborators.items()
                if e["audit_metrics"].get(name) is not None]
        lower = worse_when_lower(name)
        # For privacy the worst collaborator counts, in the metric's direction (a p-value's smallest, an AUC's
        # largest); a mean only where one means something (not of p-values, not of bounds).
        worst = min(sent) if lower else max(sent)
        averaged[name] = {"mean": sum(v for v, _ in sent) / len(sent) if averageable(name) else None,
                          "n": len(sent), "worst_value": worst[0], "worst": worst[1],
                          "worse": "lower" if lower else "higher"}
    # What a reader would not expect from the gates' verdicts alone.
    notes = [f"{n}: {e['reason']}" for n, e in collaborators.items()
             if e["cause"] in (NO_GATE_METRIC, GATE_KEPT_NOT_FINITE, NON_FINITE_TENSORS)]
    return {
        "round": int(round_num),
        "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "authorized_collaborators": sorted(set(authorized)),
        **by_status,  # kept (= the updates averaged), withheld, left_out_non_finite, stragglers
        # the parties that did not train on this round's global model, and those whose checks only reported an alarm
        "rejected_received_model": [n for n, e in collaborators.items() if e["received_model"] == "rejected"],
        "received_model_alarms": [n for n, e in collaborators.items() if e["received_model"] == "alarm"],
        "collaborators": collaborators,
        "averaged_audit_metrics": averaged,
        "aggregator_logs": {k: _finite_or_none(v) for k, v in sorted((aggregator_logs or {}).items())},
        "notes": notes,
        **({"canary_clients": dict(canary_clients)} if canary_clients else {}),
    }


def worst_value(summary: Mapping) -> float | None:
    """A metric's worst collaborator's value from a round record's `averaged_audit_metrics` entry (records written
    before the direction was kept have only `max`)."""
    return summary.get("worst_value", summary.get("max"))


def fmt(value: Any) -> str:
    """A value as the report shows it: floats to 4 significant digits, None empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
