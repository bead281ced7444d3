"""Fidel: reconstruction of a round's training samples from the first dense layer's update.

- attack: dW_i / db_i reconstructions, their matching to the samples, FastICA un-mixing, the result and its image grid;
- decoder: for CNNs, a decoder from activation maps back to pixels, fitted on population data;
- step: the Fidel step of a round's audit (settings: audit.config.fidel_settings).
"""
