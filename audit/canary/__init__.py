"""Canary audits: epsilon lower bounds from one training run (Steinke, Nasr, Jagielski 2023). docs/canary.md.

one_run     the bound from counts (torch-free), its ceiling, the p-value of no leak, the bound at any level
accountant  the accountant's epsilon of the audited mechanisms (opacus' RDP accountant)
inputs      input canaries from the party's population shard, and their inclusion draw
gradients   white-box gradient canaries inside a DP-SGD optimizer step
dp          the check of a party's DP training (dp_retrain, dp_fedavg) against its accountant's epsilon
clients     the aggregator's canary clients (Andrew et al. 2024): a user-level epsilon estimate of the global model
step        the audit step `canary` (a shadow local training with input canaries)
"""
