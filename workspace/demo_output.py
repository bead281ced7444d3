"""What the demo (cifar10_PM.py) shows while it runs and when it ends: tqdm progress bars over rounds and phases, the
tutorial's summary lines, and each round's gate verdicts with the updates the aggregator averaged."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from audit.config.gate_contract import GATE_WITHHELD

__all__ = ["PHASE_NAMES", "Progress", "print_summary", "gate_verdicts", "averaged_summary", "print_gate_summary"]


PHASE_NAMES = {
    "aggregated_model_validation": "validate global model",
    "train": "train",
    "audit": "audit",
    "locally_tuned_model_validation": "validate local model",
}


class Progress:
    """tqdm bars on stderr: one over the rounds (ETA of the run) and one over the phases of the current round
    (each collaborator's validate / train / audit / validate; ETA of the round). `phase(col, phase, round)` is
    the in-process runner's `on_task` hook, and is also called when an audit starts (its `on_audit_start`)."""

    def __init__(self, rounds: int, collaborators: int, interval: int, *, enabled: bool = True):
        self.rounds, self.collaborators, self.interval = rounds, collaborators, max(1, interval)
        self.enabled = enabled
        self.rounds_bar = self.phase_bar = None
        self.round: int | None = None
        self.pending = False  # a phase has started and is not counted yet

    def __enter__(self):
        from tqdm import tqdm

        self._tqdm = tqdm
        self.rounds_bar = tqdm(total=self.rounds, desc="rounds", unit="round", position=0, file=sys.stderr,
                               disable=not self.enabled, dynamic_ncols=True)
        return self

    def __exit__(self, *exc):
        self.end_round()
        if self.rounds_bar is not None:
            self.rounds_bar.close()
        return False

    def phase(self, col: str, phase: str, round_num: int) -> None:
        if self.rounds_bar is None:
            return
        if self.round != round_num:
            self.end_round()
            self.round = round_num
            audits = self.collaborators if round_num % self.interval == 0 else 0
            self.phase_bar = self._tqdm(
                total=3 * self.collaborators + audits, desc=f"round {round_num + 1}/{self.rounds}", unit="phase",
                position=1, leave=False, file=sys.stderr, disable=not self.enabled, dynamic_ncols=True)
        elif self.pending:
            self._count()
        self.pending = True
        self.phase_bar.set_postfix_str(f"{col}: {PHASE_NAMES.get(phase, phase)}")

    def _count(self) -> None:
        if self.phase_bar.n >= self.phase_bar.total:  # an extra phase (e.g. a DP retrain's re-audit)
            self.phase_bar.total += 1
        self.phase_bar.update(1)

    def end_round(self) -> None:
        if self.phase_bar is None:
            return
        if self.pending:
            self._count()
        self.phase_bar.close()
        self.phase_bar, self.pending = None, False
        self.rounds_bar.update(1)


def print_summary(result) -> None:
    """The tutorial's closing lines: averages over rounds and collaborators."""
    def average(suffix):
        values = [v for per_round in result.collaborator_metrics for k, v in per_round.items() if k.endswith(suffix)]
        return sum(values) / len(values) if values else float("nan")

    print(f"Average aggregated model validation values = {average('aggregated_model_validation/accuracy'):.4f}")
    print(f"Average training loss = {average('train/cross_entropy'):.4f}")
    print(f"Average local model validation values = {average('locally_tuned_model_validation/accuracy'):.4f}")


def latest_record(report_dir: Path, name: str) -> dict | None:
    rounds = sorted((Path(report_dir) / name).glob("round_*/audit.json"))
    return json.loads(rounds[-1].read_text()) if rounds else None


def print_attack_summary(report_dir: Path, names) -> None:
    """Per collaborator, its latest audited round: every attack's exact AUC and TPR at each FPR tolerance with their
    intervals and counts, and the epsilon lower bound it proves (unresolvable tolerances marked)."""
    from audit.reporting.readings import (epsilon_lb_of, exact_auc_band, exact_auc_of, fmt_interval, ordered_models,
                                          rates_at)

    for name in names:
        record = latest_record(report_dir, name)
        if record is None or not record["attacks"]:
            continue
        settings = record.get("settings") or {}
        tols = sorted(float(t) for t in settings.get("fpr_tolerance", []))
        level = settings.get("confidence", 0.95)
        print(f"\n{name}, round {record['round']}: membership inference with {100 * level:g}% intervals; epsilon "
              f"lower bounds at delta {settings.get('epsilon_delta', 0):g}")
        attacks = [(model, signal) for model in ordered_models(record["attacks"])
                   for signal in sorted(record["attacks"][model])]
        width = max(len(f"{model} / {signal}") for model, signal in attacks) + 2
        print(f"  {'attack':<{width}}{'exact AUC':<22}" + "".join(f"{f'TPR @ FPR {t:g}':<32}" for t in tols)
              + "eps >=")
        unresolved = {}
        for model, signal in attacks:
            res = record["attacks"][model][signal]
            cells = [fmt_interval(exact_auc_of(res), *exact_auc_band(res), digits=3)]
            for t in tols:
                rates = rates_at(res, t)
                if rates is None:
                    cells.append("–")
                    continue
                tpr = rates["tpr"]
                mark = ""
                if rates.get("resolvable") is False:  # below 1/t population samples (audit.membership.resolution)
                    mark = "*"
                    unresolved[t] = rates.get("n_population")
                cells.append(f"{fmt_interval(tpr['rate'], tpr['lower'], tpr['upper'], digits=3)} "
                             f"{tpr['k']}/{tpr['n']}{mark}")
            print(f"  {model + ' / ' + signal:<{width}}{cells[0]:<22}" + "".join(f"{c:<32}" for c in cells[1:])
                  + f"{epsilon_lb_of(res):.2f}")
        for t, n in sorted(unresolved.items()):
            print(f"  * FPR {t:g}: {n} population samples cannot resolve it (a threshold flags none of them below "
                  f"1/{n}); it needs {math.ceil(1 / t)}")


def gate_verdicts(report_dir: Path, names, rounds: int) -> list[dict[str, dict | None]]:
    """Per round, collaborator -> the gate's part of its round record (`extra.gate`), or None for a round without
    a record (not audited, hence not gated)."""
    out = []
    for r in range(rounds):
        per_col = {}
        for name in names:
            path = Path(report_dir) / name / f"round_{r:04d}" / "audit.json"
            per_col[name] = json.loads(path.read_text()).get("extra", {}).get("gate") if path.is_file() else None
        out.append(per_col)
    return out


def averaged_summary(record: dict) -> str:
    """What the aggregator averaged in a round, from its report's record (the decision GatedWeightedAverage
    applied: audit.config.gate_contract), and who was left out and why when not by its own gate's verdict."""
    entries = record.get("collaborators") or {}
    averaged = [name for name, entry in entries.items() if entry.get("averaged")]
    text = f"averaged: {', '.join(averaged) if averaged else 'none (global model unchanged)'}"
    # A withheld verdict is on the line already; the aggregator's own reasons (NaN/Inf tensors, an unreadable
    # verdict, the straggler policy) are not.
    others = [f"{name} {entry['status']}" for name, entry in entries.items()
              if not entry.get("averaged") and entry.get("cause") != GATE_WITHHELD]
    return text + (f" (left out: {', '.join(others)})" if others else "")


def print_gate_summary(report_dir: Path, aggregator_report_dir: Path | None, names, rounds: int, gate: dict) -> None:
    """Per round: each collaborator's verdict (kept, dp_retrained, withheld) and what tripped the gate, from its
    round record, and the updates the aggregator averaged, from its report."""
    limits = ", ".join(f"{name} > {value:g}" for name, value in gate["thresholds"].items())
    print(f"\ngate: {gate['action']} if {limits}")
    for r, per_col in enumerate(gate_verdicts(report_dir, names, rounds)):
        parts = []
        for name, verdict in per_col.items():
            if verdict is None:
                parts.append(f"{name} kept (not audited)")
                continue
            text = f"{name} {verdict['verdict']}"
            tripped = verdict.get("tripped") or {}
            if tripped:
                text += " (" + ", ".join(
                    f"{metric} = {'nan' if t['value'] is None else format(t['value'], '.4f')} > {t['threshold']:g}"
                    for metric, t in tripped.items()) + ")"
            if verdict.get("retries"):
                text += f" after {verdict['retries']} DP retrain(s), epsilon {verdict['epsilon']:.3g}"
            parts.append(text)
        line = f"round {r}: " + "; ".join(parts)
        agg_file = None if aggregator_report_dir is None else Path(aggregator_report_dir) / f"round_{r:04d}.json"
        if agg_file is not None and agg_file.is_file():
            line += " | " + averaged_summary(json.loads(agg_file.read_text()))
        print(line)
