"""The scalar names collaborators send and the aggregator reads: one definition for both sides (torch-free)."""

GATE_KEPT = "gate_kept"            # 1.0 if the update was sent, 0.0 if its gate withheld it
GATE_RETRIES = "gate_retries"      # DP retrains before the decision
GATE_EPSILON = "gate_epsilon"      # the round's DP epsilon (0.0 without a DP retrain)
GATE_TRIPPED_PREFIX = "gate_tripped__"  # + metric: the value that tripped the gate, 0.0 if it did not
NON_FINITE_UPDATE = "non_finite_update"  # the pseudo-metric of an update holding NaN/Inf
