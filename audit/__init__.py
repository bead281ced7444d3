"""The privacy auditor: a library that knows nothing of OpenFL.

The flow of one round (the task runner in src/ calls it; nothing here calls back):
    data -> received-model check (before_training.check_received) -> local training -> audit steps
    (round_audit.audit_round) -> gate (gate_flow.run_gate) -> report (reporting)
Packages, one family each:
- config/      torch-free: the shared vocabulary, the settings of every plan section, the gate's policy, the registry
               of audit steps (config/steps.py says how to add one);
- membership/  membership inference: per-sample signals, Privacy Meter's population attack, the update attack;
- fidel/       reconstruction of training samples from the first dense layer's update;
- deanon/      deanonymization of updates: the crowd, shadow updates, attacks, the self-audit, the server side,
               mitigations;
- received_model/  the check of a received global model before training on it (architecture, history, the
               signatures of models built to extract data, a direct leakage probe);
- reporting/   the party's report: atomic files, round records, plots, HTML.
Modules: training (many small local trainings at once: shadow updates, reference models), round_audit (the loop over
the enabled steps), before_training (the loop over the checks of the received model, and their verdict), gate_flow
(audit, decide, withhold or DP-retrain, as a typed outcome).
"""
