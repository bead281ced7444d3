"""The words the plan, the audit, the gate, the aggregator and the demo share: one definition each (torch-free).

Every module that needs one of these names imports it from here; nothing spells them again. Metric names are built
by the functions below, so the gate's list of metrics, the reports and the aggregator read the same strings.
"""

from __future__ import annotations

__all__ = [
    "SIGNALS", "MEMBER_IF_LOWER", "THRESHOLD_FUNCTIONS", "LOSS_ONLY_FUNCTIONS", "OPTIMIZERS",
    "GATE_ACTIONS", "MODEL_KINDS", "FINAL", "AUC", "EXACT_AUC", "EPSILON_LB", "ADVANTAGE", "LOWER", "UPPER", "BOUNDS",
    "tolerance_name", "tolerance_name_clash", "MIA_PREFIX", "mia_metric", "tpr_statistic", "bounded", "attack_statistics",
    "RMIA", "rmia_metric", "CROSS_ROUND", "attack_metric", "LEAK_PREFIX", "LEAK_DETECTED", "LEAK_P_VALUE",
    "LEAK_EPSILON_LB", "LEAK_EPSILON_CEILING", "LEAK_METRICS", "FINAL_MODEL_PREFIX", "FINAL_MODEL_ACCURACY",
    "SIGNALS_FILE", "RMIA_SCORES_FILE", "FIDEL_GRID_FILE", "CANARY_FILE", "CROSS_ROUND_FILE",
    "attack_name", "POPULATION_PREFIX", "population_name",
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

# What the gate does with an update over its thresholds.
GATE_ACTIONS = ("withhold", "dp_retrain", "report_only")

# The membership audit's models: the locally trained one, the received global one, and the update between them; and
# the final global model after the last round (audited once, against the party's members: audit.round_audit).
FINAL = "final"
MODEL_KINDS = ("local", "global", "update", FINAL)


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


MIA_PREFIX = "mia_"  # the membership step's metrics


def mia_metric(model: str, signal: str, statistic: str) -> str:
    """mia_<model>_<signal>_<statistic>, e.g. mia_local_loss_auc, mia_update_loss_reduction_tpr_at_fpr_0.1."""
    return f"{MIA_PREFIX}{model}_{signal}_{statistic}"


def tpr_statistic(tolerance: float) -> str:
    return f"tpr_at_fpr_{tolerance_name(tolerance)}"


# What each membership attack reports, per model and signal (the suffix of mia_<model>_<signal>_<statistic>):
AUC = "auc"                # Privacy Meter's grid AUC
EXACT_AUC = "exact_auc"    # members vs non-members over every threshold, with its interval (auc_bounds)
EPSILON_LB = "epsilon_lb"  # the empirical epsilon lower bound (a lower confidence bound itself: no interval)
ADVANTAGE = "advantage"    # max |TPR - FPR|, with its DKW interval
# A statistic's confidence bounds are reported beside it as <statistic>_lower and <statistic>_upper.
LOWER, UPPER = "lower", "upper"
BOUNDS = (LOWER, UPPER)


def bounded(statistic: str, bound: str) -> str:
    """<statistic>_<bound>, e.g. exact_auc_upper, tpr_at_fpr_0.01_lower."""
    if bound not in BOUNDS:
        raise ValueError(f"bound: {bound!r}; choose one of {', '.join(BOUNDS)}")
    return f"{statistic}_{bound}"


def attack_statistics(tolerances) -> list[str]:
    """The statistics one membership attack reports, in this order: the grid AUC, the exact AUC and its bounds,
    TPR at each FPR tolerance and its bounds, the epsilon lower bound, the advantage and its bounds. The metric
    names the steps declare and those they produce are both built from this list."""
    out = [AUC, EXACT_AUC, bounded(EXACT_AUC, LOWER), bounded(EXACT_AUC, UPPER)]
    for tolerance in tolerances:
        tpr = tpr_statistic(tolerance)
        out += [tpr, bounded(tpr, LOWER), bounded(tpr, UPPER)]
    return out + [EPSILON_LB, ADVANTAGE, bounded(ADVANTAGE, LOWER), bounded(ADVANTAGE, UPPER)]


# RMIA (audit.membership.rmia_step): one attack per kind of reference models, named rmia_<references>_<statistic>.
RMIA = "rmia"


def rmia_metric(references: str, statistic: str) -> str:
    """rmia_<references>_<statistic>, e.g. rmia_global_exact_auc, rmia_fine_tuned_tpr_at_fpr_0.01_upper."""
    return f"{RMIA}_{references}_{statistic}"


# The cross-round attack (audit.cross_round): the party's sent updates of every round against the other parties'
# combined update, named cross_round_<signal>_<statistic> (the step's own prefix).
CROSS_ROUND = "cross_round"
# Model kinds whose attacks are named by the kind itself (<model>_<signal>_<statistic>), under their step's prefix.
_SELF_NAMED = (RMIA, CROSS_ROUND)


def attack_metric(model: str, signal: str, statistic: str) -> str:
    """The metric name of one membership attack's statistic as the round record keys its attacks (model kind ->
    signal): rmia_<references>_<statistic> for RMIA (model kind RMIA), cross_round_<signal>_<statistic> for the
    cross-round attack, mia_<model>_<signal>_<statistic> otherwise."""
    return f"{attack_name(model, signal)}_{statistic}"


def attack_name(model: str, signal: str) -> str:
    """What every metric of one membership attack starts with: mia_<model>_<signal>, rmia_<references> or
    cross_round_<signal>."""
    return f"{model}_{signal}" if model in _SELF_NAMED else f"{MIA_PREFIX}{model}_{signal}"


# The population size each membership attack set its thresholds on, sent beside the audit metrics (a count, not an
# audit figure: no step's metric) so that the aggregator can mark the TPR figures a party's population cannot resolve
# (audit.config.resolution), as the party's own report marks them: population__<attack_name>.
POPULATION_PREFIX = "population__"


def population_name(attack: str) -> str:
    return POPULATION_PREFIX + attack


# The built-in steps' private files in a party's round folder (per-sample data; the steps declare them,
# audit.config.steps `private_files`):
SIGNALS_FILE = "signals.npz"          # per-sample signals, `<model>_<signal>_<set>` (members, nonmembers, population)
RMIA_SCORES_FILE = "rmia_scores.npz"  # per-sample RMIA scores, `<reference kind>_<set>`
FIDEL_GRID_FILE = "fidel_grid.png"    # Fidel's reconstructions beside the members they reveal
CANARY_FILE = "canary.npz"            # the canaries' labels, inclusion and scores (audit.canary.step)
CROSS_ROUND_FILE = "cross_round.npz"  # the cross-round attack's per-sample signals and scores (audit.cross_round.step)

# The round's leak verdict (audit.verdict.leak), computed from every step's evidence in every audited round:
LEAK_PREFIX = "leak_"
LEAK_DETECTED = "leak_detected"                # 1 when an attack beats chance after the family-wise correction
LEAK_P_VALUE = "leak_p_value"                  # the headline figure's Holm-adjusted p-value
LEAK_EPSILON_LB = "leak_epsilon_lb"            # the family-wise epsilon lower bound (what an epsilon budget meets)
LEAK_EPSILON_CEILING = "leak_epsilon_ceiling"  # the largest epsilon lower bound this round's counts could prove
LEAK_METRICS = (LEAK_DETECTED, LEAK_P_VALUE, LEAK_EPSILON_LB, LEAK_EPSILON_CEILING)
# What a party sends after auditing the final global model (audit.party_audit.final_model): the leak verdict's scalars
# under this prefix (final_model_leak_detected, ...), and the final model's accuracy on its non-members.
FINAL_MODEL_PREFIX = "final_model_"
FINAL_MODEL_ACCURACY = FINAL_MODEL_PREFIX + "accuracy"
