"""The round's decision in plain terms: does any attack beat chance (family-wise), and what epsilon the audit proves.

- `chance`: one-sided tests of an attack's figures against chance, Holm's correction, what given counts can detect;
- `leak`: the evidence steps hand in, and the round's leak verdict built from all of it.
Torch-free and OpenFL-free, like the rest of `audit`.
"""
