"""The privacy auditor: a library that knows nothing of OpenFL.

Everything outside this package imports these names and nothing else (`from audit import PartyAudit`); the modules
behind them are the package's own business. Each name's module is imported when the name is first read, so `import
audit` and the settings below stay torch-free. docs/library.md shows the auditor in a plain PyTorch training loop.

The flow of one round (an FL framework's client calls it; nothing here calls back):
    data -> received-model check (check_received) -> local training -> audit steps (audit_round) -> gate
    (GatePolicy.decide; PartyAudit runs the whole flow: withhold or DP-retrain) -> report (ReportWriter)
Packages, one family each: config/ (torch-free: the shared vocabulary, the settings of every plan section, the gate's
policy, the registry of audit steps), membership/, fidel/, deanon/, canary/, received_model/ (one audit family each),
verdict/ (against chance, family-wise), reporting/ (the party's report), aggregator_report/ (the aggregator's).
"""

from audit._lazy import exports

_NAMES = {
    # ------------------------------------------------------------ the party's audit of its rounds
    "PartyAudit": "audit.party_audit", "RoundPlan": "audit.party_audit", "RoundOutcome": "audit.party_audit",
    # ------------------------------------------------------------ one round's audit
    "audit_round": "audit.round_audit", "AuditSets": "audit.round_audit", "AuditContext": "audit.round_audit",
    "LocalTraining": "audit.round_audit", "StepResult": "audit.round_audit", "SentUpdate": "audit.round_audit",
    "TrainingRecipe": "audit.training", "DPTraining": "audit.dp_training",
    "check_received": "audit.before_training",
    "population_attack": "audit.membership.population_attack",
    # ------------------------------------------------------------ the round record
    "RoundRecord": "audit.round_record", "RecordSchemaError": "audit.round_record",
    "validate_party_name": "audit.round_record",
    "AttackKey": "audit.config.attack_key",
    "RecordSettings": "audit.record_parts", "GateEntry": "audit.record_parts",
    "load_round_records": "audit.reporting.records", "load_round_files": "audit.reporting.records",
    "round_file_name": "audit.reporting.records",
    # ------------------------------------------------------------ the run's account and record (run.json)
    "audit_final_model": "audit.round_audit",
    "RunRecord": "audit.run_record", "PartyRun": "audit.run_record", "RunRecordSchemaError": "audit.run_record",
    "RUN_FILE": "audit.run_record", "ACCOUNT_FILE": "audit.run_record", "library_versions": "audit.run_record",
    "Mechanism": "audit.run_account", "compose": "audit.run_account", "dp_account": "audit.run_account",
    "RunBudget": "audit.run_account",
    "RunInfo": "audit.run_record", "write_run_file": "audit.reporting.run_file",
    "read_run_file": "audit.reporting.run_file", "redraw_index": "audit.reporting.html",
    "RUNNING": "audit.run_states", "FINISHED": "audit.run_states", "INTERRUPTED": "audit.run_states",
    "FAILED": "audit.run_states", "RUN_STATES": "audit.run_states", "ENDED_EARLY": "audit.run_states",
    "describe_run": "audit.run_states",
    # ------------------------------------------------------------ settings (torch-free)
    "AuditSettings": "audit.config.audit_settings", "FprTolerances": "audit.config.tolerances",
    "GatePolicy": "audit.config.gate",
    "GateVerdict": "audit.config.gate", "BOUND_CHOICES": "audit.config.gate", "MAX_DP_RETRIES": "audit.config.gate",
    "Mitigation": "audit.config.mitigation_settings", "RMIASettings": "audit.config.rmia_settings",
    "REFERENCE_KINDS": "audit.config.rmia_settings", "REFERENCE_DISK_SHARE": "audit.config.rmia_settings", "FidelSettings": "audit.config.fidel_settings",
    "DeanonSettings": "audit.config.deanon_settings", "CanarySettings": "audit.config.canary_settings",
    "PER_COLLABORATOR": "audit.config.per_collaborator", "parse_per_collaborator": "audit.config.per_collaborator",
    "check_gate_resolution": "audit.config.per_collaborator",
    "check_plugins": "audit.config.plugins", "reference_rows": "audit.config.reference",
    # the shared words (audit.config.vocabulary: metric names are built there)
    "SIGNALS": "audit.config.vocabulary", "OPTIMIZERS": "audit.config.vocabulary",
    "GATE_ACTIONS": "audit.config.vocabulary", "BOUNDS": "audit.config.vocabulary",
    "POPULATION_PREFIX": "audit.config.vocabulary",
    "DEANON_ATTACKS": "audit.config.deanon_settings:ATTACKS",
    "DEANON_ATTACK_CHOICES": "audit.config.deanon_settings:ATTACK_CHOICES",
    "FIDEL_THRESHOLD": "audit.config.fidel_settings:DEFAULT_THRESHOLD",
    # the settings idiom (audit/config/README.md): declare a setting once, with its default, check and doc
    "SettingsError": "audit.config.fields", "Mismatch": "audit.config.fields", "setting": "audit.config.fields",
    "subsection": "audit.config.fields", "section": "audit.config.fields", "parse": "audit.config.fields",
    "to_dict": "audit.config.fields", "reject_unknown": "audit.config.fields", "did_you_mean": "audit.config.fields",
    "is_int": "audit.config.fields", "is_real": "audit.config.fields", "boolean": "audit.config.fields",
    "integer": "audit.config.fields", "real": "audit.config.fields", "choice": "audit.config.fields",
    "choices": "audit.config.fields", "optional": "audit.config.fields", "either": "audit.config.fields",
    "literal": "audit.config.fields", "text": "audit.config.fields", "path": "audit.config.fields",
    "module_name": "audit.config.fields", "mapping": "audit.config.fields", "anything": "audit.config.fields",
    "custom": "audit.config.fields",
    # ------------------------------------------------------------ the registry of audit steps
    "AuditStep": "audit.config.steps", "register": "audit.config.steps", "unregister": "audit.config.steps",
    "registered": "audit.config.steps", "step": "audit.config.steps", "is_audit_metric": "audit.config.steps",
    "METRICS": "audit.config.steps", "StepContractError": "audit.config.steps",
    # ------------------------------------------------------------ the gate's contract with the aggregator
    "Decision": "audit.config.gate_contract", "decide": "audit.config.gate_contract",
    "GATE_KEPT": "audit.config.gate_contract", "GATE_WITHHELD": "audit.config.gate_contract",
    "RUN_BUDGET": "audit.config.gate_contract",
    # ------------------------------------------------------------ the verdict: against chance; what counts detect
    "leak_verdict": "audit.verdict.leak", "LeakVerdict": "audit.verdict.leak", "Evidence": "audit.verdict.leak",
    "smallest_detectable_auc": "audit.verdict.chance", "smallest_detectable_tpr": "audit.verdict.chance",
    "largest_certifiable_epsilon": "audit.verdict.chance",
    # ------------------------------------------------------------ reports
    "ReportWriter": "audit.reporting.party", "write_index": "audit.reporting.html",
    "HistogramPanel": "audit.reporting.panels", "read_npz": "audit.reporting.panels",
    "flush_reports": "audit.reporting.background:flush", "render_queue": "audit.reporting.background",
    "atomic_write_json": "audit.reporting.atomic_io", "atomic_write_text": "audit.reporting.atomic_io",
    "atomic_write_bytes": "audit.reporting.atomic_io", "atomic_write_stream": "audit.reporting.atomic_io",
    "atomic_savefig": "audit.reporting.atomic_io", "remove_unfinished_writes": "audit.reporting.atomic_io",
    "remove_leftover_temps": "audit.reporting.atomic_io", "is_temp_name": "audit.reporting.atomic_io",
    "cancel_drawing": "audit.reporting.background:cancel",
    "epsilon_status": "audit.reporting.verdicts", "leak_status": "audit.reporting.verdicts",
    "sent_leak_status": "audit.reporting.verdicts", "AS_TRAINED": "audit.reporting.verdicts",
    "EPSILON_ZERO_SHORT": "audit.reporting.verdicts", "NOTHING_SENT": "audit.reporting.verdicts",
    "dp_spent_text": "audit.reporting.verdicts", "epsilon_zero_note": "audit.reporting.verdicts",
    "gate_reason": "audit.reporting.verdicts", "sent_of": "audit.reporting.verdicts",
    # ------------------------------------------------------------ the aggregator's side
    "AggregatorReportWriter": "audit.aggregator_report.writer",
    "aggregator_round": "audit.aggregator_report.record:round_record",
    "metrics_from_tensor_db": "audit.aggregator_report.record", "withheld_warning": "audit.aggregator_report.page",
    "CanaryClients": "audit.canary.clients", "UpdateHistory": "audit.deanon.server",
    "evaluate_deanon_round": "audit.deanon.server:evaluate_round", "DeanonReportWriter": "audit.deanon.server_report",
    # ------------------------------------------------------------ models and data
    "ScaledPixels": "audit.scaled_pixels", "model_with_tensors": "audit.spill",
    # ------------------------------------------------------------ one audit's parts, for those who measure them
    "loss_signal": "audit.membership.signals", "gradient_norm_signal": "audit.membership.signals",
    "gradient_parameter_names": "audit.membership.gradient_norms",
    "layerwise_targets": "audit.membership.layerwise_norms", "auc_bounds": "audit.membership.auc_bounds",
    "clopper_pearson": "audit.membership.uncertainty",
    "fidel_audit": "audit.fidel.attack", "train_decoder": "audit.fidel.decoder", "save_reveal_grid": "audit.fidel.grid",
    "reconstruct": "audit.fidel.layers", "count_revealed": "audit.fidel.scoring",
    "pearson_matrix": "audit.fidel.scoring",
    "reidentify": "audit.deanon.attacks", "match": "audit.deanon.attacks",
    "deanon_self_audit": "audit.deanon.self_audit", "audit_sizes": "audit.deanon.self_audit",
    "MIN_CROWD": "audit.deanon.self_audit", "DEANON_SELF": "audit.deanon.self_audit:SELF",
    "shadow_training": "audit.canary.step", "counts_from_scores": "audit.canary.one_run",
    "audit_dp_training": "audit.canary.dp", "dp_sgd_epsilon": "audit.canary.dp",
    # the canary audit's tests of a DP claim (docs/canary.md "Using the figures elsewhere")
    "dp_sgd_tests": "audit.canary.dp", "CanaryCounts": "audit.canary.one_run",
    "ClaimFamily": "audit.canary.claims:Family", "dp_sgd_family": "audit.canary.claims",
    "gaussian_family": "audit.canary.claims", "gdp_family": "audit.canary.claims",
    "least_rejected_noise": "audit.canary.claims", "fdp_bound": "audit.canary.fdp",
    "fdp_rejects": "audit.canary.fdp:rejects", "ThresholdCounts": "audit.canary.independent",
    "threshold_counts": "audit.canary.independent", "null_thresholds": "audit.canary.independent",
    "independent_bound": "audit.canary.independent", "CANARY_FPR_TARGETS": "audit.canary.independent:FPR_TARGETS",
    "StepStatistics": "audit.canary.whitebox", "whitebox_estimate": "audit.canary.whitebox:estimate",
    "GaussianDP": "audit.canary.tradeoff", "subsampled_gaussian": "audit.canary.tradeoff",
    "gdp_epsilon": "audit.canary.tradeoff", "curve_epsilon": "audit.canary.tradeoff",
    "epsilon_lower_bound": "audit.canary.one_run", "one_run_p_value": "audit.canary.one_run:p_value",
    "one_run_no_leak_p_value": "audit.canary.one_run:no_leak_p_value",
    "one_run_ceiling": "audit.canary.one_run:ceiling", "gaussian_epsilon": "audit.canary.dp",
    "update_mechanism_epsilon": "audit.canary.dp",
    "capture_linear_layers": "audit.received_model.probe", "leakage_probe": "audit.received_model.probe",
}

# Modules read as namespaces (`readings.tpr_at(...)`), each one's own __all__ its public part.
_MODULES = {
    "readings": "audit.reporting.readings",               # figures read off a round record's attacks
    "canary_vocabulary": "audit.config.canary_settings",  # the canaries' constructions, scores, gradient kinds
    "cross_round_attack": "audit.cross_round.attack",      # FedMIA's test over rounds on per-sample signals
}

__all__, __getattr__, __dir__ = exports(globals(), _NAMES, _MODULES)
