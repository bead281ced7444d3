"""The aggregator's per-round privacy report, from the scalars the collaborators send (README.md)."""
