"""Canary audits: epsilon lower bounds from one training run (Steinke, Nasr, Jagielski 2023).

one_run    the bound from counts (torch-free), its ceiling, the p-value of "no leak"
inputs     input canaries from the party's population shard, and their inclusion draw
gradients  white-box gradient canaries inside a DP-SGD optimizer step
dp         the check of a party's DP training against its accountant's epsilon
step       the audit step `canary` (a shadow local training with input canaries)
"""
