"""Federated training with a per-round privacy audit, in one process, on this workspace's OpenFL plan.

Accepts the command line of OpenFL's Privacy Meter tutorial (cifar10_PM.py) and runs the same plan and
tasks as `fx` does, with OpenFL's real Aggregator and Collaborator objects (workspace/in_process.py).
Reports land in --log_dir, with copies of the plots under the tutorial's file names
(`<col>_roc_at_<round>.png`, `<col>_auc.png`, `<col>_tpr_at_<fpr>.png`; workspace/tutorial_outputs.py).
`--model alexnet` is the tutorial's net (`--layer_number 10` is its `features[10]`).
`--dataset digits` runs offline on scikit-learn's bundled digits. Progress bars (rounds, and the phases of
the current round: validate, train, audit) with ETAs go to stderr; the summary lines to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

from audit.config.gate_contract import GATE_WITHHELD

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:  # run as a script from elsewhere, or imported by the tests
    sys.path.insert(0, str(ROOT))

from audit.config.gate import BOUND_CHOICES  # noqa: E402  (torch-free: --help stays light)
from audit.config.rmia_settings import REFERENCE_KINDS, RMIASettings  # noqa: E402
from audit.config.vocabulary import GATE_ACTIONS, MODELS  # noqa: E402


def str2bool(text: str) -> bool:
    """argparse's type=bool turns any non-empty string, "False" included, into True."""
    value = str(text).strip().lower()
    if value in {"true", "t", "yes", "y", "1"}:
        return True
    if value in {"false", "f", "no", "n", "0"}:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (True/False), got {text!r}")


class GateArgument(argparse.Action):
    """`--gate ACTION METRIC=THRESHOLD ...` -> {"action": ..., "thresholds": {metric: float}}.

    Checks the syntax here; whether the metrics exist and the thresholds are in range depends on the audit
    settings (--signals, --fpr_tolerance, --fidel), so `parse_args` checks that with audit.config.gate.GatePolicy.
    """

    def __call__(self, parser, namespace, values, option_string=None):
        action, *items = values
        if action not in GATE_ACTIONS:
            parser.error(f"{option_string}: unknown action {action!r}; choose one of {', '.join(GATE_ACTIONS)}")
        if not items:
            parser.error(f"{option_string} {action}: give at least one METRIC=THRESHOLD, "
                         f"e.g. {option_string} {action} mia_local_loss_auc=0.6")
        thresholds = {}
        for item in items:
            name, sep, text = item.partition("=")
            name = name.strip()
            if not sep or not name:
                parser.error(f"{option_string}: {item!r} is not METRIC=THRESHOLD (e.g. mia_local_loss_auc=0.6)")
            if name in thresholds:
                parser.error(f"{option_string}: metric {name!r} is given twice")
            try:
                thresholds[name] = float(text)
            except ValueError:
                parser.error(f"{option_string}: the threshold of {name} is not a number: {text!r}")
        setattr(namespace, self.dest, {"action": action, "thresholds": thresholds})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # The tutorial's flags, with its defaults.
    p.add_argument("--audit_dataset_ratio", type=float, default=0.2, help="population (audit) share of the data")
    p.add_argument("--test_dataset_ratio", type=float, default=0.4, help="non-member share of the data")
    p.add_argument("--train_dataset_ratio", type=float, default=0.4, help="member (training) share of the data")
    p.add_argument("--signals", nargs="+", default=["loss", "gradient_norm", "logits"],
                   help="membership signals: loss logits gradient_norm")
    p.add_argument("--fpr_tolerance", nargs="+", type=float, default=[0.1, 0.5, 0.9],
                   help="FPR tolerances at which TPR is reported")
    p.add_argument("--log_dir", default="test_debug", help="report folder (relative paths go under reports/)")
    p.add_argument("--comm_round", type=int, default=30, help="federated rounds")
    p.add_argument("--auditing_interval", type=int, default=1, help="audit every N rounds")
    p.add_argument("--is_features", "--is_feature", dest="is_features", type=str2bool, default=True,
                   help="gradient norm w.r.t. one layer (True) or all parameters (False)")
    p.add_argument("--layer_number", type=int, default=None,
                   help="index of that layer in the model's `features` block (default: the first layer with parameters)")
    p.add_argument("--optimizer_type", choices=["SGD", "Adam"], default="SGD")
    # This project's flags.
    p.add_argument("--dataset", choices=["cifar10", "digits"], default="cifar10")
    p.add_argument("--data-dir", dest="data_dir", default="data", help="where CIFAR-10 is (torchvision layout)")
    p.add_argument("--collaborators", type=int, default=2)
    p.add_argument("--model", choices=MODELS, default="cnn",
                   help="cnn, fcnn (the Fidel paper's) or alexnet (the tutorial's Net, ~23.3M parameters)")
    p.add_argument("--learning_rate", type=float, default=None, help="default: 0.005 for SGD, 0.001 for Adam")
    p.add_argument("--local_epochs", type=int, default=1, help="local epochs per round (the tutorial: 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--log_scale", type=str2bool, default=True,
                   help="ROC plots with log-log axes, to show the low-FPR region (default True; False: linear)")
    p.add_argument("--rmia", type=str2bool, nargs="?", const=True, default=True,
                   help="also run RMIA, the relative membership-inference attack with reference models (default True)")
    p.add_argument("--rmia_references", nargs="+", choices=REFERENCE_KINDS, default=list(RMIASettings.references),
                   help="RMIA's reference models: global (the received model), fine_tuned (K trained from it), "
                        "independent (K that never saw the party's data); one attack each (default: global "
                        "independent)")
    p.add_argument("--reference_models", type=int, default=RMIASettings.reference_models,
                   help="K, RMIA's reference models per trained kind (each costs about one local training a round)")
    p.add_argument("--confidence", type=float, default=0.95,
                   help="confidence level of every interval and of the epsilon lower bounds")
    p.add_argument("--epsilon_delta", type=float, default=1e-5, help="delta of the empirical epsilon lower bounds")
    p.add_argument("--deanon", type=str2bool, nargs="?", const=True, default=False,
                   help="also run the deanonymization audits: each collaborator's self-audit (metrics deanon_*) and "
                        "the aggregator's attack on the real updates (its report's deanon/ folder)")
    p.add_argument("--dirichlet_alpha", type=float, default=None,
                   help="label skew of the collaborators' data (Dirichlet alpha; default IID, as the tutorial)")
    p.add_argument("--fidel", type=str2bool, nargs="?", const=True, default=False,
                   help="also run the Fidel reconstruction audit of each update")
    p.add_argument("--gate", nargs="+", action=GateArgument, default=None, metavar=("ACTION", "METRIC=THRESHOLD"),
                   help="gate leaky updates: ACTION is withhold, dp_retrain or report_only; an update is gated if an "
                        "audit metric is above its threshold, e.g. --gate withhold mia_local_loss_auc=0.6 "
                        "(task_runner.settings.gate)")
    p.add_argument("--gate_bound", choices=BOUND_CHOICES, default=None,
                   help="which value of a metric --gate compares with its threshold: upper (the plan's default: the "
                        "update passes only if its leakage is significantly below), lower (gated only if significantly "
                        "above) or point (the estimate)")
    p.add_argument("--verbose", action="store_true", help="show OpenFL's own log lines")
    p.add_argument("--no_progress", action="store_true", help="no progress bars")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with --gate's metric names and thresholds checked against the audit it configures."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_fpr_tolerance(args.fpr_tolerance)
        check_audit_flags(args)
    except ValueError as err:
        parser.error(str(err))
    if args.gate_bound is not None and args.gate is None:
        parser.error("--gate_bound: it says how --gate compares; give --gate ACTION METRIC=THRESHOLD too")
    if args.gate is not None:
        try:
            gate_policy(args)
        except ValueError as err:
            parser.error(str(err))
    return args


def check_fpr_tolerance(tolerances) -> None:
    """--fpr_tolerance checked as the plan's audit.fpr_tolerance is (each in (0, 1), no two giving one metric name),
    before any work; ValueError naming --fpr_tolerance."""
    _workspace_on_path()
    from audit.config.audit_settings import AuditSettings

    try:
        AuditSettings.from_mapping({"fpr_tolerance": list(tolerances)}, prefix="audit")
    except ValueError as err:
        raise ValueError(str(err).replace("audit.fpr_tolerance:", "--fpr_tolerance:", 1)) from None


# The audit flags and the plan keys they set, for error messages that name the flag.
_AUDIT_FLAGS = {"audit.rmia.references": "--rmia_references", "audit.rmia.reference_models": "--reference_models",
                "audit.confidence": "--confidence", "audit.epsilon_delta": "--epsilon_delta"}


def audit_flags(args) -> dict:
    """The plan's audit keys the RMIA, interval and epsilon flags set."""
    return {"confidence": args.confidence, "epsilon_delta": args.epsilon_delta,
            "rmia": {"enabled": args.rmia, "references": list(dict.fromkeys(args.rmia_references)),
                     "reference_models": args.reference_models}}


def check_audit_flags(args) -> None:
    """--rmia_references, --reference_models, --confidence, --epsilon_delta checked as the plan's keys are, before
    any work; ValueError naming the flag."""
    _workspace_on_path()
    from audit.config.audit_settings import AuditSettings

    try:
        AuditSettings.from_mapping(audit_flags(args), prefix="audit")
    except ValueError as err:
        text = str(err)
        for key, flag in _AUDIT_FLAGS.items():
            if text.startswith(key + ":"):
                raise ValueError(flag + text[len(key):]) from None
        raise


def gate_policy(args):
    """audit.config.gate.GatePolicy of --gate for the audit the other flags configure (on plan/plan.yaml's audit settings);
    ValueError naming --gate and the offending metric or value."""
    import yaml

    _workspace_on_path()
    from audit.config.gate import GatePolicy, SettingsError
    from audit.config.audit_settings import AuditSettings

    plan = yaml.safe_load((ROOT / "plan" / "plan.yaml").read_text())
    audit = dict(plan["task_runner"]["settings"].get("audit") or {})
    # The audit keys that decide which metrics exist; the others keep the plan's values.
    flags = audit_flags(args)
    audit.update(signals=list(dict.fromkeys(args.signals)), fpr_tolerance=list(args.fpr_tolerance),
                 interval=args.auditing_interval, fidel={**(audit.get("fidel") or {}), "enabled": args.fidel},
                 deanon={**(audit.get("deanon") or {}), "enabled": args.deanon},
                 rmia={**(audit.get("rmia") or {}), **flags.pop("rmia")}, **flags)
    settings = AuditSettings.from_mapping(audit, prefix="audit")
    gate = dict(args.gate) if args.gate_bound is None else {**args.gate, "bound": args.gate_bound}
    try:
        return GatePolicy.from_mapping(gate, audit_settings=settings, prefix="--gate")
    except SettingsError as err:
        # "--gate.thresholds.<metric>: ..." -> "--gate: <metric>: ..."
        raise ValueError(str(err).replace("--gate.thresholds.", "--gate: ", 1)) from None


def _workspace_on_path() -> None:
    """This workspace first on sys.path: its `src`, `audit` and `workspace` packages win over any others."""
    if not sys.path or sys.path[0] != str(ROOT):
        sys.path.insert(0, str(ROOT))


def feature_layer(model_name: str, dataset: str, layer_number: int | None) -> str | None:
    """The module name of `features[layer_number]` (the tutorial's --layer_number), or None for all parameters.

    Without a number: the first layer of `features` that has parameters, if any.
    """
    from src.data import dataset_info
    from src.models import build_model

    info = dataset_info(dataset)
    children = list(build_model(model_name, info.input_shape, info.num_classes).features.named_children())
    with_params = [i for i, (_, m) in enumerate(children) if any(True for _ in m.parameters())]
    if layer_number is None:
        return f"features.{children[with_params[0]][0]}" if with_params else None
    if not 0 <= layer_number < len(children) or layer_number not in with_params:
        described = ", ".join(f"{i}={name}" for i, (name, _) in enumerate(children))
        raise ValueError(f"--layer_number: features[{layer_number}] of model {model_name!r} is not a layer with "
                         f"parameters; its layers: {described}; layers with parameters: {with_params}")
    return f"features.{children[layer_number][0]}"


def overrides_from_args(args) -> dict:
    gradient_layer = feature_layer(args.model, args.dataset, args.layer_number) if args.is_features else None
    lr = args.learning_rate if args.learning_rate is not None else (0.005 if args.optimizer_type == "SGD" else 0.001)
    overrides = {
        "tasks": {"train": {"kwargs": {"epochs": args.local_epochs}}},
        "data_loader": {"settings": {
            "dataset": args.dataset,
            "data_dir": args.data_dir,
            "train_dataset_ratio": args.train_dataset_ratio,
            "test_dataset_ratio": args.test_dataset_ratio,
            "audit_dataset_ratio": args.audit_dataset_ratio,
            "dirichlet_alpha": args.dirichlet_alpha,
            "seed": args.seed,
        }},
        # One process holds every party's TensorDB: keep one round of tensors in each (OpenFL's default) instead of
        # the plan's 2. Nothing here reads an older round (the aggregator's report and callbacks read the round that
        # ends, before OpenFL cleans up); for the tutorial's AlexNet the second round costs ~0.85 GB.
        "aggregator": {"settings": {"deanon": {"enabled": args.deanon}, "db_store_rounds": 1}},
        "collaborator": {"settings": {"db_store_rounds": 1}},
        "task_runner": {"settings": {
            "device": args.device,
            "model": args.model,
            "optimizer": args.optimizer_type,
            "learning_rate": lr,
            "seed": args.seed,
            "audit": {
                "signals": list(dict.fromkeys(args.signals)),
                "fpr_tolerance": list(args.fpr_tolerance),
                "interval": args.auditing_interval,
                "gradient_layer": gradient_layer,
                "log_scale": args.log_scale,
                "report_dir": str(args.report_dir),
                "fidel": {"enabled": args.fidel},
                "deanon": {"enabled": args.deanon},
                **audit_flags(args),
            },
        }},
    }
    if args.gate is not None:  # merged into the plan's gate: its dp settings stay
        overrides["task_runner"]["settings"]["gate"] = {"action": args.gate["action"],
                                                         "thresholds": dict(args.gate["thresholds"])}
        if args.gate_bound is not None:
            overrides["task_runner"]["settings"]["gate"]["bound"] = args.gate_bound
    return overrides


def main(argv=None) -> int:
    args = parse_args(argv)
    log_dir = Path(args.log_dir)
    args.report_dir = (log_dir if log_dir.is_absolute() else ROOT / "reports" / log_dir).resolve()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("openfl").setLevel(logging.ERROR)

    _workspace_on_path()
    from src.data import DatasetUnavailableError
    from src.dataloader import clear_dataset_cache
    from workspace.in_process import run_in_process

    from workspace.in_process import collaborator_names
    from workspace.tutorial_outputs import write_tutorial_outputs

    start = time.perf_counter()
    names = collaborator_names(args.collaborators)
    progress = Progress(args.comm_round, args.collaborators, args.auditing_interval, enabled=not args.no_progress)

    def on_round_end(round_num, _logs):
        progress.end_round()
        write_tutorial_outputs(args.report_dir, names)  # after each round: a crash keeps earlier rounds' files

    pool_cached = [True]

    def on_task(col, phase, round_num):
        if pool_cached:
            # Every collaborator is built before its first task and holds a copy of its own shards: drop the loaders'
            # shared cache of the whole dataset (0.74 GB of float32 for CIFAR-10). A data mitigation reloads it once.
            pool_cached.clear()
            clear_dataset_cache()
        progress.phase(col, phase, round_num)

    try:
        overrides = overrides_from_args(args)
        with progress:
            result = run_in_process(
                args.report_dir / "_run", collaborators=args.collaborators, rounds=args.comm_round,
                overrides=overrides, on_task=on_task, on_round_end=on_round_end,
                on_audit_start=lambda col, round_num: progress.phase(col, "audit", round_num),
            )
    except DatasetUnavailableError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # bad settings: the message names the setting
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_tutorial_outputs(args.report_dir, names)

    print_summary(result)
    print_attack_summary(result.report_dir, names)
    if args.gate is not None:
        print_gate_summary(result.report_dir, result.aggregator_report_dir, names, args.comm_round, args.gate)
    print(f"\nfinished {args.comm_round} rounds in {time.perf_counter() - start:.1f}s")
    print(f"reports: {result.report_dir}  (open {result.report_dir / 'index.html'})")
    if result.aggregator_report_dir is not None:
        print(f"aggregator report (kept/gated per round): {result.aggregator_report_dir / 'index.html'}")
    return 0


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
        unresolved = set()
        for model, signal in attacks:
            res = record["attacks"][model][signal]
            cells = [fmt_interval(exact_auc_of(res), *exact_auc_band(res), digits=3)]
            for t in tols:
                rates = rates_at(res, t)
                if rates is None:
                    cells.append("–")
                    continue
                tpr = rates["tpr"]
                mark = "†" if rates.get("resolvable") is False else ""
                if mark:
                    unresolved.add((t, rates.get("n_population")))
                cells.append(f"{fmt_interval(tpr['rate'], tpr['lower'], tpr['upper'], digits=3)} "
                             f"{tpr['k']}/{tpr['n']}{mark}")
            print(f"  {model + ' / ' + signal:<{width}}{cells[0]:<22}" + "".join(f"{c:<32}" for c in cells[1:])
                  + f"{epsilon_lb_of(res):.2f}")
        for t, n in sorted(unresolved):
            print(f"  † FPR {t:g}: {n} population samples cannot resolve it (a threshold flags none of them below "
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


if __name__ == "__main__":
    sys.exit(main())
