"""Canary audits: epsilon lower bounds from one training run, and the check of a DP claim. docs/canary.md.

one_run      Steinke et al.'s bound from counts (torch-free), its ceiling, the p-value of no leak, the bound at any level
fdp          the f-DP one-run bound (Mahloujifar et al.) of the same counts against a hypothesised trade-off curve
independent  the independent-canary bound (Clopper-Pearson at fixed thresholds against the claim's curve)
whitebox     the white-box estimate of a DP-SGD training's effective noise multiplier and clipping bound
tradeoff     trade-off curves: Gaussian DP, DP-SGD's (its privacy-loss distribution, composed by FFT)
claims       a claim as a family of mechanisms by noise multiplier, and the search for the least noise rejected
accountant   the accountant's epsilon of the audited mechanisms (opacus' RDP accountant)
inputs       input canaries from the party's population shard, and their inclusion draw
gradients    white-box gradient canaries inside a DP-SGD optimizer step
dp           the check of a party's DP training (dp_retrain, dp_fedavg) against its accountant's epsilon
clients      the aggregator's canary clients (Andrew et al. 2024): a user-level epsilon estimate of the global model
step         the audit step `canary` (a shadow local training with input canaries)
"""
