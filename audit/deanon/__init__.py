"""Deanonymization: could an update be traced back to the user who sent it (Orekondy et al.)?

- crowd: the synthetic users a party's update must hide among; representation: what of an update the attacks see;
- attacks: the re-identification (MLP, SVM, kNN) and matching (Siamese) attacks;
- self_audit: a party's audit of its own update; step: it as a step of the round's audit;
- server: the aggregator-side audit of real updates; mitigation: the user-side mitigations.
Settings are in audit.config (deanon_settings, mitigation_settings); shadow updates train with audit.training.
"""
