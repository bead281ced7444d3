"""The data loader's plan settings (`data_loader.settings`, src.dataloader.AuditDataLoader), declared once.

Torch- and OpenFL-free, so that the plan reference (tools/plan_reference.py) and the tooling read them at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from audit import boolean, choice, integer, optional, path, setting, to_dict
from src.data.split import ALPHA, COUNT, RATIO, validate_split_settings
from src.data.datasets import DATASETS

__all__ = ["PREFIX", "DataLoaderSettings"]

PREFIX = "data_loader.settings"


@dataclass(frozen=True)
class DataLoaderSettings:
    """Each collaborator's member / non-member / population shards of one dataset (the split, src.data.split)."""

    batch_size: int = setting(32, integer(min=1), "training batch size")
    dataset: str = setting("digits", choice(DATASETS, "dataset", fold=True),
                           "digits is bundled with scikit-learn; the others are read in torchvision's layout")
    data_dir: str | None = setting(None, optional(path("folder"), "data, relative to the workspace"),
                                   "where the dataset's files are (not digits)")
    collaborator_count: int = setting(2, COUNT, "shards the pool is dealt into (data_path is the 1-based shard)")
    train_dataset_ratio: float = setting(0.4, RATIO, "members' share of the pool")
    test_dataset_ratio: float = setting(0.4, RATIO, "non-members' share of the pool (also the validation set)")
    audit_dataset_ratio: float = setting(0.2, RATIO, "population's share of the pool (the attacks' reference data); "
                                                     "the three shares sum to at most 1")
    dirichlet_alpha: float | None = setting(None, ALPHA, "label skew across the collaborators (Dirichlet alpha)")
    seed: int = setting(0, integer(min=0), "seed of the split and of the training batches' order")
    download: bool = setting(False, boolean(), "fetch torchvision's archives (md5-checked) when the files are missing")
    devices_per_user: int = setting(1, COUNT, "collaborators per user, sharing its label mix; divides "
                                              "collaborator_count")

    @staticmethod
    def validate(values: Mapping, key: str, given) -> None:
        """The shares fit in the pool, and the collaborators are whole users' devices."""
        validate_split_settings(values["train_dataset_ratio"], values["test_dataset_ratio"],
                                values["audit_dataset_ratio"], values["collaborator_count"],
                                values["dirichlet_alpha"], prefix=f"{key}.",
                                devices_per_user=values["devices_per_user"])

    def to_dict(self) -> dict:
        return to_dict(self)
