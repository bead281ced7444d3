"""Federated training with a per-round privacy audit, in one process, on this workspace's OpenFL plan.

Accepts the command line of OpenFL's Privacy Meter tutorial (cifar10_PM.py) and runs the same plan and
tasks as `fx` does, with OpenFL's real Aggregator and Collaborator objects (workspace/in_process.py).
Reports land in --log_dir. `--dataset digits` runs offline on scikit-learn's bundled digits.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def str2bool(text: str) -> bool:
    """argparse's type=bool turns any non-empty string, "False" included, into True."""
    value = str(text).strip().lower()
    if value in {"true", "t", "yes", "y", "1"}:
        return True
    if value in {"false", "f", "no", "n", "0"}:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (True/False), got {text!r}")


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
    p.add_argument("--model", choices=["cnn", "fcnn"], default="cnn")
    p.add_argument("--learning_rate", type=float, default=None, help="default: 0.005 for SGD, 0.001 for Adam")
    p.add_argument("--local_epochs", type=int, default=1, help="local epochs per round (the tutorial: 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--log_scale", type=str2bool, default=False, help="ROC plots with log-scale axes")
    p.add_argument("--fidel", type=str2bool, nargs="?", const=True, default=False,
                   help="also run the Fidel reconstruction audit of each update")
    p.add_argument("--verbose", action="store_true", help="show OpenFL's own log lines")
    return p


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
    return {
        "tasks": {"train": {"kwargs": {"epochs": args.local_epochs}}},
        "data_loader": {"settings": {
            "dataset": args.dataset,
            "data_dir": args.data_dir,
            "train_dataset_ratio": args.train_dataset_ratio,
            "test_dataset_ratio": args.test_dataset_ratio,
            "audit_dataset_ratio": args.audit_dataset_ratio,
            "seed": args.seed,
        }},
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
                "fidel": args.fidel,
            },
        }},
    }


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    log_dir = Path(args.log_dir)
    args.report_dir = (log_dir if log_dir.is_absolute() else ROOT / "reports" / log_dir).resolve()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("openfl").setLevel(logging.ERROR)

    sys.path.insert(0, str(ROOT))
    from src.data import DatasetUnavailableError
    from workspace.in_process import run_in_process

    start = time.perf_counter()

    def on_task(col, task, round_num):
        print(f"round {round_num + 1}/{args.comm_round}  {col}: {task} ...", flush=True)

    try:
        overrides = overrides_from_args(args)
        result = run_in_process(
            args.report_dir / "_run", collaborators=args.collaborators, rounds=args.comm_round,
            overrides=overrides, on_task=on_task,
        )
    except DatasetUnavailableError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # bad settings: the message names the setting
        print(f"error: {err}", file=sys.stderr)
        return 2

    print_summary(result)
    print(f"\nfinished {args.comm_round} rounds in {time.perf_counter() - start:.1f}s")
    print(f"reports: {result.report_dir}  (open {result.report_dir / 'index.html'})")
    if result.aggregator_report_dir is not None:
        print(f"aggregator report (kept/gated per round): {result.aggregator_report_dir / 'index.html'}")
    return 0


def print_summary(result) -> None:
    """The tutorial's closing lines: averages over rounds and collaborators."""
    def average(suffix):
        values = [v for per_round in result.collaborator_metrics for k, v in per_round.items() if k.endswith(suffix)]
        return sum(values) / len(values) if values else float("nan")

    print(f"Average aggregated model validation values = {average('aggregated_model_validation/accuracy'):.4f}")
    print(f"Average training loss = {average('train/cross_entropy'):.4f}")
    print(f"Average local model validation values = {average('locally_tuned_model_validation/accuracy'):.4f}")
    last = result.collaborator_metrics[-1] if result.collaborator_metrics else {}
    for key in sorted(k for k in last if k.endswith("_auc")):
        print(f"last round {key} = {last[key]:.4f}")


if __name__ == "__main__":
    sys.exit(main())
