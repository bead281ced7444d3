"""The words the plan, the audit, the gate, the aggregator and the demo share: one definition each (torch-free).

Every module that needs one of these names imports it from here; nothing spells them again. Metric names are built
by the functions below, so the gate's list of metrics, the reports and the aggregator read the same strings.
"""

from __future__ import annotations

__all__ = [
    "SIGNALS", "MEMBER_IF_LOWER", "THRESHOLD_FUNCTIONS", "LOSS_ONLY_FUNCTIONS", "OPTIMIZERS", "MODELS",
    "GATE_ACTIONS", "MODEL_KINDS", "tolerance_name", "tolerance_name_clash", "mia_metric", "tpr_statistic",
]

# Per-sample membership signals (audit.membership.signals computes them) and their direction: members tend to have a
# low loss and small gradients, but a high (confident) true-class logit margin.
SIGNALS = ("loss", "logits", "gradient_norm")
MEMBER_IF_LOWER = {"loss": True, "logits": False, "gradient_norm": True}

# Privacy Meter's threshold functions (privacy_meter.hypothesis_test), by the names plans use.
THRESHOLD_FUNCTIONS = ("linear_itp", "logit_rescale", "gaussian", "min_linear_logit")
# These fit a Gaussian to log(e^-l / (1 - e^-l)): only defined for a non-negative, loss-like signal where members
# are lower.
LOSS_ONLY_FUNCTIONS = frozenset({"logit_rescale", "min_linear_logit"})

# The local training recipe: optimisers the task runner, the DP retrain and the shadow trainings build alike.
OPTIMIZERS = ("SGD", "Adam")

# The workspace's models (src.models builds them; the demo offers them without importing torch).
MODELS = ("cnn", "fcnn", "alexnet")

# What the gate does with an update over its thresholds.
GATE_ACTIONS = ("withhold", "dp_retrain", "report_only")

# The membership audit's models: the locally trained one, the received global one, and the update between them.
MODEL_KINDS = ("local", "global", "update")


def tolerance_name(tolerance: float) -> str:
    """The text an FPR tolerance is named by in metric names, JSON keys and file names ("0.1", "0.001", "1e-05")."""
    return f"{float(tolerance):g}"


def tolerance_name_clash(tolerances) -> str | None:
    """Why two of `tolerances` cannot both be reported (they have one `tolerance_name`, so their metrics and JSON
    entries would overwrite each other), naming both; None if all names differ."""
    named: dict[str, float] = {}
    for tol in tolerances:
        name = tolerance_name(tol)
        if name in named:
            if named[name] == tol:
                return f"{tol!r} is listed twice"
            return (f"{named[name]!r} and {tol!r} both give the metric name suffix _tpr_at_fpr_{name} (tolerances "
                    f"must differ within 6 significant digits)")
        named[name] = tol
    return None


def mia_metric(model: str, signal: str, statistic: str) -> str:
    """mia_<model>_<signal>_<statistic>, e.g. mia_local_loss_auc, mia_update_loss_reduction_tpr_at_fpr_0.1."""
    return f"mia_{model}_{signal}_{statistic}"


def tpr_statistic(tolerance: float) -> str:
    return f"tpr_at_fpr_{tolerance_name(tolerance)}"
