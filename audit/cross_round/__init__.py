"""The aggregator's view across rounds, audited by the party itself: FedMIA's test on every update it sent against
the other parties' combined update (derived from the global models it receives), and source inference. Settings:
audit.config.cross_round_settings (torch-free); the step: audit.cross_round.step; docs/membership.md, "Across rounds"."""
