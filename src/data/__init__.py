"""The data the collaborators train and audit on: the datasets, each collaborator's split, the loader's settings.

The data loader OpenFL loads stays at `src.dataloader` (the plan names it). Nothing here imports OpenFL.
"""
