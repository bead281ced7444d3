"""Membership inference: was a sample in this round's training data?

- signals: per-sample loss, logit margin and gradient norm of a classifier (a new signal: add it here and to
  audit.config.vocabulary.SIGNALS with its direction);
- population_attack: Privacy Meter's population attack and the update attack on precomputed signals;
- step: the membership step of a round's audit (which models and signals are attacked; its metrics).
A new attack on these signals goes in its own module here and is called from `step` (or registered as its own step,
audit.config.steps).
"""
