"""What the demo (cifar10_PM.py) shows while it runs and when it ends: tqdm progress bars over rounds and phases on a
terminal (a line per round elsewhere) and the tutorial's summary lines. The summary per round (verdicts, TPR, Fidel,
deanonymization) is workspace.run_summary's, shared with `python -m workspace run`."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from workspace.progress import eta_seconds

__all__ = ["PHASE_NAMES", "Progress", "print_summary", "latest_record", "print_attack_summary"]


PHASE_NAMES = {
    "aggregated_model_validation": "validate global model",
    "train": "train",
    "audit": "audit",
    "locally_tuned_model_validation": "validate local model",
    "final_model_audit": "audit the final model",
}


class Progress:
    """tqdm bars on stderr: one over the rounds (ETA of the run) and one over the phases of the current round
    (each collaborator's validate / train / audit / validate; ETA of the round). `phase(col, phase, round)` is
    the in-process runner's `on_task` hook, and is also called when an audit starts (its `on_audit_start`).

    Bars only where stderr is a terminal: elsewhere (a log file, CI) each redraw would be one more line of the log;
    there a round's end prints one line with the ETA instead."""

    def __init__(self, rounds: int, collaborators: int, interval: int, *, enabled: bool = True, stream=None):
        self.rounds, self.collaborators, self.interval = rounds, collaborators, max(1, interval)
        self.stream = stream or sys.stderr
        self.on_terminal = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.enabled = enabled and self.on_terminal
        self.lines = enabled and not self.on_terminal  # a line per round instead of bars
        self.round_seconds: list[float] = []
        self._round_began = time.monotonic()
        self.rounds_bar = self.phase_bar = None
        self.round: int | None = None
        self.pending = False  # a phase has started and is not counted yet

    def __enter__(self):
        from tqdm import tqdm

        self._tqdm = tqdm
        self._round_began = time.monotonic()
        self.rounds_bar = tqdm(total=self.rounds, desc="rounds", unit="round", position=0, file=self.stream,
                               disable=not self.enabled, dynamic_ncols=True)
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.end_round()
        elif self.phase_bar is not None:  # a round cut short is not done: no line claims it
            self.phase_bar.close()
            self.phase_bar, self.pending = None, False
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
            final = round_num >= self.rounds  # the round after the last: each party audits the final model
            self.phase_bar = self._tqdm(
                total=self.collaborators if final else 3 * self.collaborators + audits,
                # rounds are numbered from 0, as in the reports, TensorBoard and the summary; "of" counts them
                desc="final model" if final else f"round {round_num} ({round_num + 1} of {self.rounds})", unit="phase",
                position=1, leave=False, file=self.stream, disable=not self.enabled, dynamic_ncols=True)
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
        if self.round is not None and self.round >= self.rounds:  # the final model's audit: no training round
            if self.lines:
                self.stream.write(f"final model audited in {time.monotonic() - self._round_began:.1f} s\n")
                self.stream.flush()
            return
        self.rounds_bar.update(1)
        now = time.monotonic()
        self.round_seconds.append(now - self._round_began)
        self._round_began = now
        if self.lines:
            done = len(self.round_seconds)
            eta = eta_seconds(self.round_seconds, done, self.rounds, 0.0)
            self.stream.write(f"round {done - 1} done ({done} of {self.rounds}) in {self.round_seconds[-1]:.1f} s"
                              + (f", ETA {eta:.0f} s" if eta else "") + "\n")
            self.stream.flush()


def print_summary(result) -> None:
    """The tutorial's closing lines: averages over rounds and collaborators."""
    def average(suffix):
        values = [v for per_round in result.collaborator_metrics for k, v in per_round.items() if k.endswith(suffix)]
        return sum(values) / len(values) if values else float("nan")

    print(f"Average aggregated model validation values = {average('aggregated_model_validation/accuracy'):.4f}")
    print(f"Average training loss = {average('train/cross_entropy'):.4f}")
    print(f"Average local model validation values = {average('locally_tuned_model_validation/accuracy'):.4f}")


def latest_record(report_dir: Path, name: str):
    """The party's newest readable round record (audit.round_record.RoundRecord, as
    audit.reporting.records.load_round_records reads it), or None."""
    from audit import load_round_records

    records = load_round_records(Path(report_dir) / name)
    return records[-1] if records else None


def print_attack_summary(report_dir: Path, names) -> None:
    """Per collaborator, its latest audited round: every attack's exact AUC and TPR at each FPR tolerance with their
    intervals and counts, and the epsilon lower bound it proves (unresolvable tolerances marked)."""
    from audit import readings

    for name in names:
        record = latest_record(report_dir, name)
        if record is None or not record.attacks:
            continue
        settings = record.settings  # as the audit stated them, typed (audit's RecordSettings)
        tols = sorted(settings.fpr_tolerance)
        level = "unstated" if settings.confidence is None else f"{100 * settings.confidence:g}%"
        delta = "unstated" if settings.epsilon_delta is None else f"{settings.epsilon_delta:g}"
        print(f"\n{name}, round {record.round}: membership inference with {level} intervals; epsilon "
              f"lower bounds at delta {delta}")
        attacks = readings.series_keys([record])
        width = max(len(f"{model} / {signal}") for model, signal in attacks) + 2
        print(f"  {'attack':<{width}}{'exact AUC':<22}" + "".join(f"{f'TPR @ FPR {t:g}':<32}" for t in tols)
              + "eps >= (alone)")
        unresolved = {}
        for model, signal in attacks:
            res = record.attack(model, signal)
            cells = [readings.fmt_interval(readings.exact_auc_of(res), *readings.exact_auc_band(res), digits=3)]
            for t in tols:
                rates = readings.rates_at(res, t)
                if rates is None:
                    cells.append("–")
                    continue
                tpr = rates["tpr"]
                mark = ""
                if rates.get("resolvable") is False:  # below 1/t population samples (audit.config.resolution)
                    mark = "*"
                    unresolved.setdefault(t, {}).setdefault(rates.get("n_population"), []).append(
                        f"{model} / {signal}")
                cells.append(f"{readings.fmt_interval(tpr['rate'], tpr['lower'], tpr['upper'], digits=3)} "
                             f"{tpr['k']}/{tpr['n']}{mark}")
            print(f"  {model + ' / ' + signal:<{width}}{cells[0]:<22}" + "".join(f"{c:<32}" for c in cells[1:])
                  + f"{readings.epsilon_lb_of(res):.2f}")
        for t, sizes in sorted(unresolved.items()):
            # each attack's own population (RMIA's independent references train on part of it: fewer are left)
            ordered = sorted(sizes, key=lambda n: -len(sizes[n]))
            said = f"{ordered[0]} population samples" + "".join(
                f" ({n} for {', '.join(sizes[n])})" for n in ordered[1:])
            print(f"  * FPR {t:g}: {said} cannot resolve it (a threshold flags none of them below 1/n); it needs "
                  f"{math.ceil(1 / t)}")
        print("  eps >= (alone): each attack's own epsilon lower bound, not corrected for the other attacks; the "
              "verdict's ε below is corrected for all of them")
