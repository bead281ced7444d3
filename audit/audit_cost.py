"""Whether a round's audit cost much more than the local training it audits, and which setting would cut it.

Read off the round record's timings (audit.round_audit: `audit_s`, one `<step>_s` per audit step, the membership
step's `signals_s` per model and signal; the party's audit adds `train_s`). The party's audit logs the note once per
collaborator (audit.party_audit) and writes it as a status event, which `python -m workspace run` relays.
"""

from __future__ import annotations

import math

from audit.round_record import RoundRecord

__all__ = ["COST_FACTOR", "MIN_AUDIT_S", "COST_NOTE_MARK", "audit_cost_note"]

# "More than a few times the training": below this the audit is part of the price of a round; above it the user
# should know that the audit, not the training, sets the pace, and what to turn down.
COST_FACTOR = 3.0
MIN_AUDIT_S = 1.0  # an audit under a second per round is not what anyone waits for, whatever the ratio
IN_VALIDATION = "audit_in_validation_s"  # a timing of the membership step, not a step of its own
COST_NOTE_MARK = "the audit took"  # the note's fixed words

PLAN_PREFIX = "task_runner.settings.audit"
# Per audit step: the settings that make it cheaper (plan key under task_runner.settings.audit; the demo's flag).
STEP_ADVICE = {
    "fidel": "audit.fidel.enabled: false (--fidel false)",
    # the RMIA step (audit.membership.rmia_step): its reference models are trained like the local model, each round
    "rmia": "audit.rmia.interval (RMIA every N audited rounds), fewer audit.rmia.reference_models (each one trains "
            "like the local model), a smaller audit.sample_size (the references train on the population sample), or "
            "audit.rmia.enabled: false",
    "deanon": "audit.deanon.interval (self-audit every N audited rounds), fewer audit.deanon.shadows_per_user or "
              "audit.deanon.crowd_users (each user trains that many shadow updates), or audit.deanon.enabled: false",
}


def _seconds(value) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) and f >= 0 else math.nan


def _signal_seconds(timings: dict) -> dict[str, float]:
    """Signal -> seconds over every model the membership step scored it on."""
    out: dict[str, float] = {}
    for per_signal in (timings.get("signals_s") or {}).values():
        if isinstance(per_signal, dict):
            for signal, seconds in per_signal.items():
                s = _seconds(seconds)
                if not math.isnan(s):
                    out[signal] = out.get(signal, 0.0) + s
    return out


def _membership_advice(timings: dict, settings: dict) -> str:
    signals = _signal_seconds(timings)
    costliest = max(signals, key=signals.get) if signals else None
    parts = []
    if costliest == "gradient_norm":
        layer = settings.get("gradient_layer")
        if layer:  # already over one layer: a smaller one, or none
            parts.append(f"gradient_norm is its costliest signal ({signals['gradient_norm']:.1f} s, over "
                         f"audit.gradient_layer {layer}): a layer with fewer parameters in audit.gradient_layer "
                         "(--layer_number), or drop it from audit.signals (--signals)")
        else:
            parts.append(f"gradient_norm is its costliest signal ({signals['gradient_norm']:.1f} s, over every "
                         "parameter): audit.gradient_layer (the norm over one layer; --is_features True) or drop it "
                         "from audit.signals (--signals)")
    elif costliest is not None:
        parts.append(f"fewer audit.signals (--signals; {costliest} took {signals[costliest]:.1f} s)")
    if settings.get("audit_global", True):
        parts.append("audit.audit_global: false (the received model is scored too)")
    parts.append(f"a smaller audit.sample_size (--audit_sample_size; now {settings.get('sample_size', 'null')}: "
                 "samples per set; the intervals widen as it shrinks)")
    return "; ".join(parts)


def audit_cost_note(record: RoundRecord, *, factor: float = COST_FACTOR,
                    min_audit_s: float = MIN_AUDIT_S) -> str | None:
    """One sentence when the record's audit took more than `factor` times its training (and at least `min_audit_s`),
    naming the costliest step and the settings that cut it (every key under task_runner.settings); None otherwise or
    without both timings."""
    timings = record.timings
    audit_s, train_s = _seconds(timings.get("audit_s")), _seconds(timings.get("train_s"))
    if math.isnan(audit_s) or math.isnan(train_s) or audit_s <= factor * max(train_s, 1e-9) or audit_s < min_audit_s:
        return None
    steps = {key[:-2]: _seconds(value) for key, value in timings.items()
             if key.endswith("_s") and key not in ("audit_s", "train_s", IN_VALIDATION)
             and not math.isnan(_seconds(value))}
    # The received model's membership signals, computed while it was validated (audit.party_audit), are membership's.
    if not math.isnan(in_validation := _seconds(timings.get(IN_VALIDATION))) and in_validation > 0:
        steps["membership"] = steps.get("membership", 0.0) + in_validation
    costliest = max(steps, key=steps.get) if steps else None
    settings = record.settings
    advice = ["audit.interval (audit every N rounds; cifar10_PM.py --auditing_interval)"]
    if costliest == "membership":
        advice.append(_membership_advice(timings, settings))
    elif costliest == "fidel" and (settings.get("fidel") or {}).get("decoder"):
        advice.append("audit.fidel.decoder: false (the decoder is fitted each round)")
        advice.append(STEP_ADVICE["fidel"])
    elif costliest is not None:
        advice.append(STEP_ADVICE.get(costliest, f"the audit.{costliest} settings"))
    where = f"; most of it {costliest} ({steps[costliest]:.2f} s)" if costliest is not None else ""
    return (f"{record.party} round {record.round}: {COST_NOTE_MARK} {audit_s:.2f} s, "
            f"{audit_s / max(train_s, 1e-9):.1f}x the local training ({train_s:.2f} s){where}. To spend less "
            f"(keys under {PLAN_PREFIX[:-len('.audit')]}): " + "; ".join(a for a in advice if a) + ". Said once.")
