"""The check of a received global model before a party trains on it (docs/received-model.md).

A dishonest server can send a global model built so that the next update gives the party's samples away (an imprint
layer, trap weights, a fished classifier). Before training, the party compares what it received with what it knows:

- `architecture`: the plan's tensor names, shapes and dtypes (and finite values);
- `history`: each tensor's change since the previous global model against the largest honest change seen;
- `structure`: the known constructions' signatures (parallel rows, sparse ReLU support, a scaled classifier);
- `probe`: how many samples of one local batch the update would give away, against honest references;
- `check`: all of them, run as the BEFORE_TRAINING step `received_model` (audit.config.builtin_steps).

`settings` is torch-free (the plan reader imports it); the rest uses torch. Nothing here knows OpenFL.
"""
