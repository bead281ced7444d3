"""Federated training with a per-round privacy audit, in one process, on this workspace's OpenFL plan.

Accepts the command line of OpenFL's Privacy Meter tutorial (cifar10_PM.py) and runs the same plan and
tasks as `fx` does, with OpenFL's real Aggregator and Collaborator objects (workspace/in_process.py).
Reports land in --log_dir, with copies of the plots under the tutorial's file names
(`<col>_roc_at_<round>.png`, `<col>_auc.png`, `<col>_tpr_at_<fpr>.png`; workspace/tutorial_outputs.py).
`--model alexnet` is the tutorial's net (`--layer_number 10` is its `features[10]`).
`--dataset digits` runs offline on scikit-learn's bundled digits. Progress bars (rounds, and the phases of
the current round: validate, train, audit) with ETAs go to stderr when it is a terminal (else a line per round); the
summary lines to stdout.
`--dataset mnist --model fcnn --fidel` is the Fidel paper's MNIST setting (torchvision's MNIST/raw in --data-dir).
With TENSORBOARD=1 in the environment every party's metrics also go to TensorBoard event files in
<log_dir>/_run/logs, as `fx` runs write them (`tensorboard --logdir <log_dir>/_run/logs`).
"""

# One file though above 400 lines: it is the tutorial's one script, its command line (most of the file) included;
# the work is the workspace's (workspace/in_process.py, workspace/plan_file.py). The docstring is --help's text.

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:  # run as a script from elsewhere, or imported by the tests
    sys.path.insert(0, str(ROOT))

import src  # noqa: E402,F401  (first: on a machine without a GPU it keeps triton out, see src/__init__.py)
from audit import (AuditSettings, BOUND_CHOICES, GATE_ACTIONS, REFERENCE_KINDS, RMIASettings, SIGNALS,  # noqa: E402
                   did_you_mean)
from src.data.datasets import DATASETS  # noqa: E402  (numpy only)
from src.runner.model_names import ModelChoices  # noqa: E402  (torch-free)
from workspace.arguments import NEAREST, SuggestingParser  # noqa: E402
from workspace.report_folder import RUN_FOLDER, LogDirClaim, check_log_dir, resolve_log_dir  # noqa: E402,F401
from workspace.run_lock import FolderBusyError  # noqa: E402

PLAN = ROOT / "plan" / "plan.yaml"  # the plan every run starts from
REPORTS = ROOT / "reports"  # where a relative --log_dir goes


def str2bool(text: str) -> bool:
    """argparse's type=bool turns any non-empty string, "False" included, into True."""
    value = str(text).strip().lower()
    if value in {"true", "t", "yes", "y", "1"}:
        return True
    if value in {"false", "f", "no", "n", "0"}:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (True/False), got {text!r}"
                                     + did_you_mean(str(text), ("True", "False"), count=NEAREST))


class GateArgument(argparse.Action):
    """`--gate ACTION METRIC=THRESHOLD ...` -> {"action": ..., "thresholds": {metric: float}}.

    Checks the syntax here; whether the metrics exist and the thresholds are in range depends on the audit
    settings (--signals, --fpr_tolerance, --fidel), so `parse_args` checks that with the auditor's GatePolicy.
    """

    def __call__(self, parser, namespace, values, option_string=None):
        action, *items = values
        if action not in GATE_ACTIONS:
            parser.error(f"{option_string}: unknown action {action!r}; choose one of {', '.join(GATE_ACTIONS)}"
                         + did_you_mean(action, GATE_ACTIONS, count=NEAREST))
        thresholds = {}
        for item in items:
            name, sep, text = item.partition("=")
            name = name.strip()
            if not sep or not name:
                parser.error(f"{option_string}: {item!r} is not METRIC=THRESHOLD (e.g. mia_local_loss_exact_auc=0.6)")
            if name in thresholds:
                parser.error(f"{option_string}: metric {name!r} is given twice")
            try:
                thresholds[name] = float(text)
            except ValueError:
                parser.error(f"{option_string}: the threshold of {name} is not a number: {text!r}")
        setattr(namespace, self.dest, {"action": action, "thresholds": thresholds})


def whole_number(minimum: int):
    """argparse type: an integer >= minimum (argparse names the flag in its error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
        return value
    return parse


def sample_size(text: str) -> int | None:
    """argparse type: samples per set (a whole number >= 2) or `all` (every sample: None)."""
    if text.strip().lower() == "all":
        return None
    try:
        return whole_number(2)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 2 or all, got {text!r}"
                                         + did_you_mean(text, ("all",), count=NEAREST)) from None


def positive_number(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


class Parser(SuggestingParser):
    """Errors in one line that names the flag (argparse's usage block is --help's), with the nearest choices."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}  (see --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows every flag's default, and the description as written."""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(description=__doc__, formatter_class=HelpFormatter)
    # The tutorial's flags, with its defaults.
    p.add_argument("--audit_dataset_ratio", type=float, default=0.2, help="population (audit) share of the data")
    p.add_argument("--test_dataset_ratio", type=float, default=0.4, help="non-member share of the data")
    p.add_argument("--train_dataset_ratio", type=float, default=0.4, help="member (training) share of the data")
    p.add_argument("--signals", nargs="+", default=["loss", "gradient_norm", "logits"],
                   help=f"membership signals, any of: {' '.join(SIGNALS)}")
    p.add_argument("--fpr_tolerance", nargs="+", type=float, default=[0.1, 0.5, 0.9],
                   help="FPR tolerances at which TPR is reported, each in (0, 1)")
    p.add_argument("--log_dir", default="test_debug",
                   help="report folder (relative paths go under reports/); must be new or empty, see --replace_log_dir")
    p.add_argument("--replace_log_dir", action="store_true",
                   help="if --log_dir holds an earlier run's reports, delete them first (nothing else is replaced)")
    p.add_argument("--comm_round", type=whole_number(1), default=30, help="federated rounds")
    p.add_argument("--auditing_interval", type=whole_number(1), default=1, help="audit every N rounds")
    p.add_argument("--is_features", "--is_feature", dest="is_features", type=str2bool, default=True,
                   help="gradient norm w.r.t. one layer (True) or all parameters (False)")
    p.add_argument("--layer_number", type=whole_number(0), default=None,
                   help="index of that layer in the model's `features` block (none: the first layer with parameters)")
    p.add_argument("--optimizer_type", choices=["SGD", "Adam"], default="SGD", help="local optimiser")
    # This project's flags.
    p.add_argument("--dataset", choices=DATASETS, default="cifar10",
                   help="the data: digits (bundled with scikit-learn) or CIFAR-10, CIFAR-100, MNIST, Fashion-MNIST "
                        "(read from --data-dir)")
    p.add_argument("--data-dir", dest="data_dir", default="data",
                   help="root of torchvision's layout: cifar-10-batches-py/, cifar-100-python/, MNIST/raw/, "
                        "FashionMNIST/raw/")
    p.add_argument("--download", type=str2bool, nargs="?", const=True, default=False,
                   help="download --dataset into --data-dir if it is not there (the archives torchvision fetches, "
                        "md5-checked; needs the network)")
    p.add_argument("--collaborators", type=whole_number(1), default=2, help="number of collaborators (data shards)")
    p.add_argument("--model", choices=ModelChoices(), default="cnn", metavar="MODEL",
                   help="cnn, fcnn (the Fidel paper's), alexnet (the tutorial's Net, ~23.3M parameters) or a "
                        "torchvision classifier, untrained, fitted to the dataset's images; one of: %(choices)s")
    p.add_argument("--learning_rate", type=positive_number, default=None,
                   help="local learning rate (none: 0.005 for SGD, 0.001 for Adam)")
    p.add_argument("--local_epochs", type=whole_number(1), default=1, help="local epochs per round (the tutorial: 1)")
    p.add_argument("--seed", type=whole_number(0), default=0, help="seed of the split, the model and the training")
    p.add_argument("--device", default="cpu", help="torch device of the training and the audit, e.g. cpu, cuda:0")
    p.add_argument("--log_scale", type=str2bool, default=True,
                   help="ROC plots with log-log axes, to show the low-FPR region (False: linear)")
    p.add_argument("--rmia", type=str2bool, nargs="?", const=True, default=True,
                   help="also run RMIA, the relative membership-inference attack with reference models")
    p.add_argument("--rmia_references", nargs="+", choices=REFERENCE_KINDS, default=list(RMIASettings.references),
                   help="RMIA's reference models: global (the received model), fine_tuned (K trained from it), "
                        "independent (K that never saw the party's data); one attack each")
    p.add_argument("--reference_models", type=whole_number(1), default=RMIASettings.reference_models,
                   help="K, RMIA's reference models per trained kind (each costs about one local training a round)")
    p.add_argument("--confidence", type=float, default=0.95,
                   help="confidence level of every interval and of the epsilon lower bounds, in (0, 1)")
    p.add_argument("--epsilon_delta", type=float, default=1e-5, help="delta of the empirical epsilon lower bounds")
    p.add_argument("--audit_sample_size", type=sample_size, default=AuditSettings.sample_size, metavar="N|all",
                   help="samples per set (members, non-members, population) the membership audits use: a random "
                        "sample per collaborator, the same every round; all: every sample (default "
                        f"{AuditSettings.sample_size}; docs/membership.md, \"Audit sampling\")")
    p.add_argument("--deanon", type=str2bool, nargs="?", const=True, default=False,
                   help="also run the deanonymization audits: each collaborator's self-audit (metrics deanon_*) and "
                        "the aggregator's attack on the real updates (its report's deanon/ folder)")
    p.add_argument("--dirichlet_alpha", type=float, default=None,
                   help="label skew of the collaborators' data (Dirichlet alpha > 0; none: IID, as the tutorial)")
    p.add_argument("--cross_round", type=str2bool, nargs="?", const=True, default=False,
                   help="also run the cross-round attack: every update a collaborator sent, against the other "
                        "collaborators' combined update, over the rounds so far (FedMIA), and source inference "
                        "(metrics cross_round_*; task_runner.settings.audit.cross_round)")
    p.add_argument("--fidel", type=str2bool, nargs="?", const=True, default=False,
                   help="also run the Fidel reconstruction audit of each update")
    p.add_argument("--gate", nargs="+", action=GateArgument, default=None, metavar=("ACTION", "METRIC=THRESHOLD"),
                   help="gate leaky updates: ACTION is withhold, dp_retrain or report_only; an update is gated if an "
                        "audit metric is above its threshold, e.g. --gate withhold mia_local_loss_exact_auc=0.6, or "
                        "(with --epsilon_budget) if the audit proves more epsilon than the budget "
                        "(task_runner.settings.gate)")
    p.add_argument("--epsilon_budget", type=float, default=None, metavar="EPSILON",
                   help="gate an update when the family-wise epsilon lower bound its audit proves (at --epsilon_delta) "
                        "exceeds this budget (task_runner.settings.gate.epsilon_budget); the action is --gate's, "
                        "else the plan's"),
    p.add_argument("--run_epsilon_budget", type=float, default=None, metavar="EPSILON",
                   help="the most DP epsilon each party's releases may compose to over the run (opacus' RDP accountant "
                        "at the gate's dp.delta; task_runner.settings.gate.run_epsilon_budget): a release that would "
                        "cross it is withheld, and only DP releases are sent (with --gate dp_retrain)")
    p.add_argument("--gate_bound", choices=BOUND_CHOICES, default=None,
                   help="which value of a metric --gate compares with its threshold: upper (the plan's default: the "
                        "update passes only if its leakage is significantly below), lower (gated only if significantly "
                        "above) or point (the estimate)")
    p.add_argument("--verbose", action="store_true", help="show OpenFL's own log lines")
    p.add_argument("--no_progress", action="store_true", help="no progress bars")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, every value checked before any work and named by its flag: the ratios, --signals,
    --fpr_tolerance, --device, and --gate's metric names and thresholds against the audit it configures."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.signals = list(dict.fromkeys(args.signals))  # the tutorial's lists may repeat a signal
    try:
        _workspace_on_path()
        from src.data.split import validate_split_settings

        validate_split_settings(args.train_dataset_ratio, args.test_dataset_ratio, args.audit_dataset_ratio,
                                args.collaborators, args.dirichlet_alpha, prefix="--")
        check_count_flags(args)
        args.audit_settings = audit_settings(args)
        from src.runner.devices import check_device

        check_device("--device", args.device)
        if args.gate_bound is not None and args.gate is None:
            raise ValueError("--gate_bound: it says how --gate compares; give --gate ACTION METRIC=THRESHOLD too")
        if args.gate is not None and not args.gate["thresholds"] and args.epsilon_budget is None:
            raise ValueError(f"--gate {args.gate['action']}: give at least one METRIC=THRESHOLD (e.g. "
                             "mia_local_loss_exact_auc=0.6) or --epsilon_budget")
        if args.gate is not None or args.epsilon_budget is not None or args.run_epsilon_budget is not None:
            gate_policy(args, args.audit_settings)
    except ValueError as err:
        parser.error(str(err))
    return args


def check_count_flags(args) -> None:
    """--comm_round, --collaborators, --audit_sample_size, --local_epochs and --reference_models against what the data,
    the time and this machine allow (src.plan.bounds), before anything is loaded; ValueError naming the flag and the
    limit."""
    _workspace_on_path()
    from src.plan import bounds as plan_bounds
    from src.plan.checks import task_names
    from workspace.plan_file import read_plan

    plan_bounds.check_rounds("--comm_round", args.comm_round, tasks=len(task_names(read_plan(PLAN))),
                             collaborators=args.collaborators)
    ratios = {"train_dataset_ratio": args.train_dataset_ratio, "test_dataset_ratio": args.test_dataset_ratio,
              "audit_dataset_ratio": args.audit_dataset_ratio}
    plan_bounds.check_collaborators("--collaborators", args.collaborators, dataset=args.dataset, ratios=ratios,
                                    prefix="--")
    plan_bounds.check_sample_size("--audit_sample_size", args.audit_sample_size, dataset=args.dataset)
    # The trainings of a round, on the plan's other settings with these flags: --local_epochs and --reference_models
    plan = read_plan(PLAN)
    runner = plan["task_runner"]["settings"]
    audit = dict(runner.get("audit") or {})
    audit["rmia"] = {**(audit.get("rmia") or {}), **audit_flags(args)["rmia"]}
    audit["deanon"] = {**(audit.get("deanon") or {}), "enabled": args.deanon}
    config = {"tasks": {"train": {"function": "train_task", "kwargs": {"epochs": args.local_epochs}}},
              "task_runner": {"settings": {**runner, "audit": audit}}}
    data = {**(plan["data_loader"].get("settings") or {}), **ratios, "dataset": args.dataset,
            "collaborator_count": args.collaborators}
    plan_bounds.check_training_counts(config, data, names={
        "tasks.train.kwargs.epochs": "--local_epochs",
        "task_runner.settings.audit.rmia.reference_models": "--reference_models"})


# The audit flags and the plan keys they set, for error messages that name the flag.
_AUDIT_FLAGS = {"audit.signals": "--signals", "audit.fpr_tolerance": "--fpr_tolerance",
                "audit.rmia.references": "--rmia_references", "audit.rmia.reference_models": "--reference_models",
                "audit.confidence": "--confidence", "audit.epsilon_delta": "--epsilon_delta",
                "audit.sample_size": "--audit_sample_size"}


def audit_flags(args) -> dict:
    """The plan's audit keys the RMIA, interval and epsilon flags set."""
    return {"confidence": args.confidence, "epsilon_delta": args.epsilon_delta, "sample_size": args.audit_sample_size,
            "rmia": {"enabled": args.rmia, "references": list(dict.fromkeys(args.rmia_references)),
                     "reference_models": args.reference_models}}


def audit_settings(args):
    """The audit the flags configure, on plan/plan.yaml's audit settings, parsed once: --signals, --fpr_tolerance (known
    signals; each tolerance in (0, 1), no two giving one metric name), --rmia_references, --reference_models,
    --confidence, --epsilon_delta checked as the plan's keys are, before any work; ValueError naming the flag."""
    _workspace_on_path()
    from audit import AuditSettings
    from workspace.plan_file import read_plan

    audit = dict(read_plan(PLAN)["task_runner"]["settings"].get("audit") or {})
    flags = audit_flags(args)  # the audit keys the flags set; the others keep the plan's values
    audit.update(signals=list(args.signals), fpr_tolerance=list(args.fpr_tolerance),
                 interval=args.auditing_interval, fidel={**(audit.get("fidel") or {}), "enabled": args.fidel},
                 deanon={**(audit.get("deanon") or {}), "enabled": args.deanon},
                 cross_round={**(audit.get("cross_round") or {}), "enabled": args.cross_round},
                 rmia={**(audit.get("rmia") or {}), **flags.pop("rmia")}, **flags)
    try:
        return AuditSettings.from_mapping(audit, prefix="audit")
    except ValueError as err:
        text = str(err)
        for key, flag in _AUDIT_FLAGS.items():
            if text.startswith(key + ":"):
                raise ValueError(flag + text[len(key):]) from None
        raise


def gate_policy(args, settings):
    """The auditor's GatePolicy of --gate for the audit the other flags configure (`settings`, audit_settings(args));
    ValueError naming --gate and the offending metric or value."""
    _workspace_on_path()
    from audit import GatePolicy, SettingsError

    try:
        return GatePolicy.from_mapping(gate_flags(args), audit_settings=settings, prefix="--gate")
    except SettingsError as err:
        # "--gate.thresholds.<metric>: ..." -> "--gate: <metric>: ..."; the other keys in the words of their flags
        text = str(err).replace("--gate.thresholds.", "--gate: ", 1).replace("--gate.bound: ", "--gate_bound ")
        raise ValueError(text.replace("--gate.epsilon_budget", "--epsilon_budget").replace(
            "--gate.run_epsilon_budget", "--run_epsilon_budget")) from None


def gate_flags(args) -> dict:
    """The plan's gate keys --gate, --gate_bound and --epsilon_budget set (merged into the plan's gate: its dp
    settings, and its action when only a budget is given, stay)."""
    gate = {} if args.gate is None else {"action": args.gate["action"], "thresholds": dict(args.gate["thresholds"])}
    if args.gate_bound is not None:
        gate["bound"] = args.gate_bound
    if args.epsilon_budget is not None:
        gate["epsilon_budget"] = args.epsilon_budget
    if args.run_epsilon_budget is not None:
        gate["run_epsilon_budget"] = args.run_epsilon_budget
    return gate


def _workspace_on_path() -> None:
    """This workspace first on sys.path: its `src`, `audit` and `workspace` packages win over any others."""
    if not sys.path or sys.path[0] != str(ROOT):
        sys.path.insert(0, str(ROOT))


def feature_layer(model_name: str, dataset: str, layer_number: int | None) -> str | None:
    """The module name of `features[layer_number]` (the tutorial's --layer_number), or None for all parameters.

    `features` is the model's feature extractor (src.runner.models.feature_layers: its `features` block, or for a model
    without one, such as torchvision's ResNets, its top-level layers). Without a number: its first layer that has
    parameters, if any.
    """
    from src.data.datasets import dataset_info
    from src.runner.models import build_model, feature_layers

    info = dataset_info(dataset)
    try:
        children = feature_layers(build_model(model_name, info.input_shape, info.num_classes))
    except ValueError as err:  # a model that cannot take the dataset's images
        raise ValueError(f"--model: {err} (--dataset {dataset})") from None
    with_params = [i for i, (_, m) in enumerate(children) if any(True for _ in m.parameters())]
    if layer_number is None:
        return children[with_params[0]][0] if with_params else None
    if not 0 <= layer_number < len(children) or layer_number not in with_params:
        described = ", ".join(f"{i}={name}" for i, (name, _) in enumerate(children))
        raise ValueError(f"--layer_number: features[{layer_number}] of model {model_name!r} is not a layer with "
                         f"parameters; its layers: {described}; layers with parameters: {with_params}")
    return children[layer_number][0]


def overrides_from_args(args) -> dict:
    gradient_layer = feature_layer(args.model, args.dataset, args.layer_number) if args.is_features else None
    lr = args.learning_rate if args.learning_rate is not None else (0.005 if args.optimizer_type == "SGD" else 0.001)
    overrides = {
        "tasks": {"train": {"kwargs": {"epochs": args.local_epochs}}},
        "data_loader": {"settings": {
            "dataset": args.dataset,
            "data_dir": str(Path(args.data_dir).expanduser().resolve()),  # as the checks read it, from here
            "train_dataset_ratio": args.train_dataset_ratio,
            "test_dataset_ratio": args.test_dataset_ratio,
            "audit_dataset_ratio": args.audit_dataset_ratio,
            "dirichlet_alpha": args.dirichlet_alpha,
            "seed": args.seed,
            "download": args.download,
        }},
        # One process holds every party's TensorDB: keep one round of tensors in each (OpenFL's default) instead of
        # the plan's 2. Nothing here reads an older round (the aggregator's report and callbacks read the round that
        # ends, before OpenFL cleans up); a round of the tutorial's AlexNet is several copies of its 93 MB.
        # The aggregator's report beside the collaborators': the run index (--log_dir/index.html) links them all.
        "aggregator": {"settings": {"deanon": {"enabled": args.deanon}, "db_store_rounds": 1,
                                    "report_dir": str(args.report_dir / "aggregator")}},
        "collaborator": {"settings": {"db_store_rounds": 1}},
        "task_runner": {"settings": {
            "device": args.device,
            "model": args.model,
            "optimizer": args.optimizer_type,
            "learning_rate": lr,
            "seed": args.seed,
            "audit": {
                "signals": list(args.signals),
                "fpr_tolerance": list(args.fpr_tolerance),
                "interval": args.auditing_interval,
                "gradient_layer": gradient_layer,
                "log_scale": args.log_scale,
                "report_dir": str(args.report_dir),
                "fidel": {"enabled": args.fidel},
                "deanon": {"enabled": args.deanon},
                "cross_round": {"enabled": args.cross_round},
                **audit_flags(args),
            },
        }},
    }
    if args.gate is not None or args.epsilon_budget is not None or args.run_epsilon_budget is not None:
        # merged into the plan's gate: its dp settings stay
        overrides["task_runner"]["settings"]["gate"] = gate_flags(args)
    return overrides


def check_deanon_sizes(args, config) -> list[str]:
    """--deanon: each collaborator's shards, as the run's data loader cuts them, give the self-audit its crowd (every
    crowd user needs private samples and a prior from the party's population shard). A population shard too small
    for the plan's crowd sizes the audit to it (audit.deanon.self_audit.audit_sizes): returns the notes that say how,
    one per distinct sizing, naming its collaborators. A shard too small for any crowd fails before anything is
    written, naming the flags that set the sizes (ValueError). Loads the dataset, which the run then reuses
    (src.dataloader keeps it for the loaders)."""
    if not args.deanon:
        return []
    from audit import audit_sizes
    from src.dataloader import AuditDataLoader

    settings = args.audit_settings.sections["deanon"]  # the plan's, with the flags (parse_args)
    if not settings.enabled:
        return []
    loader_settings = config["data_loader"]["settings"]
    notes: dict[str, list[str]] = {}
    for shard, name in enumerate(collaborator_names_of(args), 1):
        loader = AuditDataLoader(data_path=str(shard), **loader_settings)
        members, nonmembers, population = len(loader.y_train), len(loader.y_valid), len(loader.y_population)
        try:
            sizes = audit_sizes(members, nonmembers, population, settings)
        except ValueError:
            skew = (f", split by --dirichlet_alpha {args.dirichlet_alpha}" if args.dirichlet_alpha is not None
                    else "")
            raise ValueError(
                f"--deanon: {name}'s population shard ({population} samples: --audit_dataset_ratio "
                f"{args.audit_dataset_ratio} of --dataset {args.dataset}{skew}) cannot give 2 crowd users one private "
                "and one prior sample each; raise --audit_dataset_ratio") from None
        if sizes.crowd_note is not None:
            notes.setdefault(sizes.crowd_note, []).append(name)
    return [f"--deanon ({', '.join(names)}): the deanonymization self-audit is {note}"
            if note.startswith("sized") else f"--deanon ({', '.join(names)}): {note}" for note, names in notes.items()]


def collaborator_names_of(args) -> list[str]:
    from workspace.plan_file import collaborator_names

    return collaborator_names(args.collaborators)


def flag_notes(args, typed: set[str]) -> list[str]:
    """One line for each flag the run overrides or does not use, so that nothing is silently ignored: `typed`, the
    flags given on the command line (dest names); defaults are named only where they change what the user may
    expect (--is_features True on a model with no layer with parameters in `features`)."""
    notes = []
    gradient = "gradient_norm" in args.signals
    if args.is_features and gradient:
        try:
            layer = feature_layer(args.model, args.dataset, args.layer_number)
        except ValueError:
            layer = "?"  # parse_args reports it
        if layer is None:
            notes.append(f"--is_features True: model {args.model}'s `features` block has no layer with parameters, "
                         "so the gradient norm is taken over all parameters (as with --is_features False)")
    if "layer_number" in typed and args.layer_number is not None and (not args.is_features or not gradient):
        why = "--is_features False (all parameters)" if gradient else "--signals has no gradient_norm"
        notes.append(f"--layer_number {args.layer_number}: not used: {why}")
    if "is_features" in typed and not gradient:
        notes.append(f"--is_features {args.is_features}: not used: --signals has no gradient_norm")
    if not args.rmia:
        unused = [f for f, dest in (("--rmia_references", "rmia_references"),
                                    ("--reference_models", "reference_models")) if dest in typed]
        if unused:
            notes.append(f"{' and '.join(unused)}: not used: --rmia False")
    if args.dataset == "digits":
        unused = [f for f, dest in (("--data-dir", "data_dir"), ("--download", "download")) if dest in typed]
        if unused:
            notes.append(f"{' and '.join(unused)}: not used: --dataset digits is bundled with scikit-learn")
    if args.auditing_interval >= args.comm_round and args.comm_round > 1:
        notes.append(f"--auditing_interval {args.auditing_interval} with --comm_round {args.comm_round}: only "
                     "round 0 is audited")
    if "gate_bound" in typed and args.gate is not None and not args.gate["thresholds"]:
        notes.append(f"--gate_bound {args.gate_bound}: not used: the gate has no METRIC=THRESHOLD (an "
                     "--epsilon_budget compares the epsilon lower bound itself)")
    return notes


def typed_flags(argv) -> set[str]:
    """The dest names of the flags given on the command line (abbreviations included): the parser again, with
    every default suppressed."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_known_args(argv)[0]))


def main(argv=None) -> int:
    """The demo; its exit code: 0 finished, 1 failed during the run, 2 a bad flag or setting, 130 / 143 interrupted
    (Ctrl-C / SIGTERM), each said in one line."""
    from workspace.interrupts import DemoSignals, Interrupted

    code = None
    try:
        with DemoSignals() as signals:
            code = _main(argv, signals)
    except Interrupted as stop:
        # Before the run started: nothing of it was made. After the demo's end: a signal that came during an import
        # in its last moments (workspace.interrupts), raised as the signal handling ends.
        print(f"\ninterrupted ({stop}) " + ("before the run started; nothing was written" if code is None else
                                           "as the demo ended"), file=sys.stderr)
        return 128 + stop.signum
    return code


def _main(argv, signals) -> int:
    args = parse_args(argv)
    try:
        args.report_dir = resolve_log_dir(args.log_dir, REPORTS)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("openfl").setLevel(logging.ERROR)

    _workspace_on_path()
    from src.data.datasets import DatasetUnavailableError, check_available
    from workspace.demo_run import run_demo
    from workspace.in_process import tensorboard_enabled
    from workspace.plan_file import check_run_plan, collaborator_names, run_plan_config

    start = time.perf_counter()
    names = collaborator_names(args.collaborators)
    # The folder's lock first (one demo per folder), then every check before anything else is made or deleted: the
    # folder, the data, the plan file and every setting of the plan the flags give (as `fx plan initialize` checks it,
    # and the tasks, the aggregator's settings). A refused or interrupted start gives the folder back as it found it.
    claim = LogDirClaim(args.report_dir)
    try:
        claim.acquire()
        check_log_dir(args.report_dir, args.replace_log_dir)
        tensorboard = tensorboard_enabled()
        check_available(args.dataset, args.data_dir, download=args.download)
        overrides = overrides_from_args(args)
        run_dir = args.report_dir / RUN_FOLDER
        config = run_plan_config(run_dir, collaborators=args.collaborators, rounds=args.comm_round,
                                 overrides=overrides, plan_path=PLAN)
        check_run_plan(config, names)
        sizing = check_deanon_sizes(args, config)
        claim.replace_contents()
    except (DatasetUnavailableError, ValueError, FolderBusyError) as err:  # it names the flag, the key or the file
        claim.undo()
        text = str(err).replace("task_runner.settings.gate.run_epsilon_budget", "--run_epsilon_budget")
        gate_key = "task_runner.settings.gate.thresholds."  # set by --gate: named so
        print(f"error: {'--gate: ' + text[len(gate_key):] if text.startswith(gate_key) else text}", file=sys.stderr)
        return 2
    except BaseException:
        claim.undo()
        raise
    try:
        for note in [*flag_notes(args, typed_flags(argv)), *sizing]:
            print(f"note: {note}", file=sys.stderr)
        return run_demo(args, names=names, run_dir=run_dir, plan=PLAN, overrides=overrides, signals=signals,
                        start=start, tensorboard=tensorboard)
    finally:
        claim.release()


if __name__ == "__main__":
    sys.exit(main())
