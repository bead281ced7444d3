"""Everything the plan, the gate and the aggregator share, and nothing that needs torch.

- `vocabulary`: the shared words (signals, optimisers, models, gate actions, metric names): one definition each.
- `fields`: the one settings idiom: each field's default, check and doc declared once, `parse`, and the one
  `SettingsError` (its message starts with the dotted plan key); `reference`: the plan reference's rows, read off
  the declarations.
- `steps`: the registry of audit steps (after training, or before it: the received-model check); `builtin_steps`
  declares membership, RMIA, Fidel, deanonymization and the received-model check (audit.received_model).
- `audit_settings`, `fidel_settings`, `deanon_settings`, `mitigation_settings`: the plan's audit sections.
- `gate`: the gate's policy and verdict; `gate_contract`: the scalar names collaborators send the aggregator.
To add a setting to an audit, declare it in that audit's settings class (README.md here says how); to add an audit,
see `steps`.
"""
