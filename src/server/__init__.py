"""The aggregator's parts (the aggregator OpenFL loads stays at `src.aggregator`, the gated average at
`src.aggregation`: the plan names both): its settings, its gRPC server's address, its TensorDB, its model files and
the aggregator-side deanonymization audit (its per-round report is the auditor's: audit.aggregator_report).
"""
