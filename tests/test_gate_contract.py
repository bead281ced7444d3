"""audit.config.gate_contract.decide: whether a collaborator's update is averaged this round, and why not."""

import numpy as np
import pytest

from audit.config.gate_contract import (GATE_KEPT_NOT_FINITE, GATE_WITHHELD, KEPT, LEFT_OUT_NON_FINITE, NO_GATE_METRIC,
                                 NON_FINITE_TENSORS, PASSED, WITHHELD, decide)


@pytest.mark.parametrize("gate_kept, finite, status, cause", [
    (1.0, True, KEPT, PASSED),
    (np.array(1.0, dtype=np.float32), True, KEPT, PASSED),  # as it comes out of the TensorDB
    (0.5, True, KEPT, PASSED),
    (0.49, True, WITHHELD, GATE_WITHHELD),
    (0.0, True, WITHHELD, GATE_WITHHELD),
    (None, True, KEPT, NO_GATE_METRIC),                      # a runner without the gate
    (float("nan"), True, WITHHELD, GATE_KEPT_NOT_FINITE),    # an unreadable verdict fails closed
    (np.array(np.nan), True, WITHHELD, GATE_KEPT_NOT_FINITE),
    (float("inf"), True, WITHHELD, GATE_KEPT_NOT_FINITE),
    ("kept", True, WITHHELD, GATE_KEPT_NOT_FINITE),
    (np.ones(2), True, WITHHELD, GATE_KEPT_NOT_FINITE),     # not a scalar
    (1.0, False, LEFT_OUT_NON_FINITE, NON_FINITE_TENSORS),  # NaN/Inf tensors, whatever the gate said
    (0.0, False, LEFT_OUT_NON_FINITE, NON_FINITE_TENSORS),
    (None, False, LEFT_OUT_NON_FINITE, NON_FINITE_TENSORS),
])
def test_decision(gate_kept, finite, status, cause):
    decision = decide(gate_kept, finite_update=finite)
    assert (decision.status, decision.cause, decision.averaged) == (status, cause, status == KEPT)


def test_interval_bounds_stay_with_the_party():
    from audit.config.gate_contract import sent_to_aggregator

    assert sent_to_aggregator("mia_local_loss_exact_auc") and sent_to_aggregator("rmia_global_epsilon_lb")
    assert sent_to_aggregator("mia_local_loss_tpr_at_fpr_0.01") and sent_to_aggregator("deanon_ap_over_chance")
    assert not sent_to_aggregator("mia_local_loss_exact_auc_lower")
    assert not sent_to_aggregator("rmia_independent_tpr_at_fpr_0.01_upper")
