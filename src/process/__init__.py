"""What every participant's process does for itself, collaborator or aggregator: the status events it writes for the
tooling, its metrics per round, and the memory it gives back (freed heap, torch's unused CUDA pages).
"""
