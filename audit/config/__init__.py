"""Everything the plan, the gate and the aggregator share, and nothing that needs torch.

- `vocabulary`: the shared words (signals, optimisers, gate actions, metric names): one definition each.
- `fields`: the one settings idiom: each field's default, check and doc declared once, `parse`, and the one
  `SettingsError` (its message starts with the dotted plan key); `reference`: the plan reference's rows, read off
  the declarations.
- `steps`: the registry of audit steps (after training, or before it: the received-model check); `builtin_steps`
  declares membership, RMIA, Fidel, deanonymization, the canary audit and the received-model check, registered here,
  on the package's import, so that every reader of the registry finds them first (the registry itself imports no
  step); `attack_key`: the key of a membership attack, from which its metric names derive.
- `audit_settings`, `rmia_settings`, `fidel_settings`, `deanon_settings`, `canary_settings`,
  `received_model_settings`, `mitigation_settings`: the plan's audit sections; `per_collaborator`: one
  collaborator's overrides; `resolution`: which FPR tolerances a population can resolve.
- `gate`: the gate's policy and verdict; `gate_contract`: the scalar names collaborators send the aggregator.
To add a setting to an audit, declare it in that audit's settings class (README.md here says how); to add an audit,
see `steps`.
"""

from audit.config import builtin_steps  # noqa: E402,F401  (registers the built-in steps)
