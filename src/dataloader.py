"""OpenFL data loader for the audited federation (``data_loader.template: src.dataloader.AuditDataLoader``).

Plan settings (``data_loader.settings``, declared in :mod:`src.data.loader_settings`), all optional::

    batch_size: 32
    dataset: digits            # digits | cifar10 | cifar100 | mnist | fashionmnist (src.data.datasets)
    data_dir: null             # torchvision's layout; default "data" (relative to the workspace); not digits
    collaborator_count: 2
    train_dataset_ratio: 0.4   # members
    test_dataset_ratio: 0.4    # non-members (also the validation set)
    audit_dataset_ratio: 0.2   # population (audit / reference data)
    dirichlet_alpha: null      # null = IID; a number > 0 = label skew (see src.data.split)
    seed: 0                    # split shuffle and train-batch order
    download: false            # datasets read from data_dir; never downloads unless true
    devices_per_user: 1        # FL devices (collaborators) per user; divides collaborator_count

``data_path`` (from ``plan/data.yaml``) is the 1-based shard number "1".."collaborator_count".
Every collaborator computes the same seeded split of the whole pool and keeps its own shard:
members = its train shard (``X_train``), non-members = its test shard (``X_valid``, the
validation set), population = its population shard.  ``fx plan initialize`` builds the
loader with ``data_path=None``: nothing is loaded then, but the feature shape and class
count are known.

``devices_per_user: d`` (the deanonymization paper's shadow-device protocol): each user
owns d devices whose data follow the same user-specific label mix.  The split is made for
``collaborator_count // d`` users (IID or Dirichlet, same seed), then each user's sets are
dealt to its devices (see :func:`src.data.split.split_indices`).  Shard s (1-based) is device
``(s - 1) % d`` of user ``(s - 1) // d`` (0-based), exposed as ``loader.user`` /
``loader.device``; ``loader.dirichlet_alpha`` tells how skewed the partition is.  d = 1
(default) is the plain split.

Unknown settings raise SettingsError naming the key (a typo such as ``dirichlet_alph`` would otherwise
silently change the experiment).
"""

from __future__ import annotations

import logging
import math
import numbers
import threading
from pathlib import Path

import numpy as np
from openfl.federated import PyTorchDataLoader

from audit import integer, parse
from src.data.split import COUNT, SPLIT_SETS, PartyData, split_indices, user_of_party
from src.data.datasets import dataset_info, load_dataset
from src.data.loader_settings import PREFIX, DataLoaderSettings
from src.plan.checks import plan_being_built
from src.plan.paths import check_collaborator_paths, workspace_of

logger = logging.getLogger(__name__)

__all__ = ["AuditDataLoader", "NumpyBatches", "clear_dataset_cache"]

# (dataset name, resolved data dir or None, split settings) -> _Arranged; shared by all loaders of a process.
_DATASET_CACHE: dict[tuple, "_Arranged"] = {}
_CACHE_LOCK = threading.Lock()


def clear_dataset_cache() -> None:
    """Forget the datasets loaded in this process (the loaders keep the views of their own sets)."""
    with _CACHE_LOCK:
        _DATASET_CACHE.clear()


class _Arranged:
    """One split's samples in one array of uint8 pixels (audit.scaled_pixels.ScaledPixels: read as float32), party
    after party, each party's train, test and population set one after another: every loader's sets are views of it
    (row slices), so a process holds one copy of the samples the split uses, a quarter of their float32 size,
    whatever the number of collaborators in it, and no copy of the whole dataset."""

    def __init__(self, x: np.ndarray, y: np.ndarray, parts: list[dict[str, np.ndarray]], pool_size: int):
        self.x, self.y, self.parts = x, y, parts
        self.blocks: list[dict[str, slice]] = []  # per party: set name -> its rows in x
        self.position = np.full(pool_size, -1, dtype=np.int64)  # pool index -> row in x (-1: not used)
        row = 0
        for part in parts:
            block = {}
            for name in SPLIT_SETS:
                block[name] = slice(row, row + len(part[name]))
                self.position[part[name]] = np.arange(row, row + len(part[name]))
                row += len(part[name])
            self.blocks.append(block)


def _cached_dataset(name: str, data_dir, download: bool, split: dict) -> _Arranged:
    key_dir = None if name == "digits" else str(Path("data" if data_dir is None else data_dir).expanduser().resolve())
    key = (name, key_dir, tuple(sorted(split.items())))
    with _CACHE_LOCK:  # held while loading, so concurrent collaborators load once
        if key not in _DATASET_CACHE:
            found = {}

            def arrange(y):  # the split needs only the labels: the pixels are then picked in the split's order
                found["pool_size"] = len(y)
                found["parts"] = split_indices(y, **split)
                return np.concatenate([part[s] for part in found["parts"] for s in SPLIT_SETS])

            x, y = load_dataset(name, key_dir, download=download, arrange=arrange)
            _DATASET_CACHE[key] = _Arranged(x, y, found["parts"], found["pool_size"])
        return _DATASET_CACHE[key]


class NumpyBatches:
    """Re-iterable batches ``(x float32, y int64)`` over fixed index order; has ``len()``."""

    def __init__(self, x: np.ndarray, y: np.ndarray, idxs: np.ndarray, batch_size: int, num_batches: int):
        self._x, self._y, self._idxs = x, y, idxs
        self.batch_size = batch_size
        self.num_batches = num_batches

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        for i in range(self.num_batches):
            sel = self._idxs[i * self.batch_size : (i + 1) * self.batch_size]
            yield self._x[sel], self._y[sel]


class AuditDataLoader(PyTorchDataLoader):
    """Per-collaborator member / non-member / population shards for OpenFL's PyTorch task runner.

    Attributes after construction with a shard: ``X_train``/``y_train`` (members),
    ``X_valid``/``y_valid`` (non-members), ``X_population``/``y_population``;
    ``shard`` (1-based, None in init mode), ``train_sizes`` (every shard's member count),
    ``dataset``, ``info`` (DatasetInfo),
    ``dirichlet_alpha`` (None = IID), ``devices_per_user``, ``user`` / ``device`` (0-based
    user of the shard and its device number within that user; None in init mode).
    """

    def __init__(self, data_path=None, **settings):
        parsed = parse(DataLoaderSettings, settings, PREFIX)  # data_loader.settings, each key checked by name
        built = plan_being_built()
        if built is not None and built.collaborator is not None:  # a plan from the aggregator: its data_dir stays
            check_collaborator_paths(built.config, workspace_of(built.files))  # in the workspace (src.plan.paths)
        batch_size, dataset, data_dir, seed = parsed.batch_size, parsed.dataset, parsed.data_dir, parsed.seed
        collaborator_count, devices_per_user = parsed.collaborator_count, parsed.devices_per_user

        super().__init__(batch_size, random_seed=seed)
        self.dataset = dataset
        self.info = dataset_info(dataset)
        self.data_dir = data_dir
        self.collaborator_count = collaborator_count
        self.train_dataset_ratio = parsed.train_dataset_ratio
        self.test_dataset_ratio = parsed.test_dataset_ratio
        self.audit_dataset_ratio = parsed.audit_dataset_ratio
        self.dirichlet_alpha = parsed.dirichlet_alpha
        self.seed = seed
        self.download = parsed.download
        self.devices_per_user = devices_per_user
        self.feature_shape = list(self.info.input_shape)
        self.num_classes = self.info.num_classes
        self.X_population = None
        self.y_population = None
        self.train_sizes = None
        self.shard = None
        self.user = None
        self.device = None
        self._train_rng = None
        self._arranged = None

        if data_path is None:
            logger.info("AuditDataLoader: data_path=None, initialising for model creation only (no data loaded)")
            return

        self.shard = self._parse_data_path(data_path, collaborator_count)
        self.user, self.device = user_of_party(self.shard - 1, devices_per_user)
        split = dict(n_parties=collaborator_count, train_ratio=self.train_dataset_ratio,
                     test_ratio=self.test_dataset_ratio, audit_ratio=self.audit_dataset_ratio, seed=seed,
                     dirichlet_alpha=self.dirichlet_alpha, devices_per_user=devices_per_user)
        self._arranged = _cached_dataset(dataset, data_dir, self.download, split)
        parts = self._arranged.parts
        # The whole federation's population set (every party's population shard): public reference data of the
        # global distribution, the background deanonymization mitigations draw from (get_background). Only its
        # pool indices are kept; the samples are copied out when asked for.
        self.background_index = np.sort(np.concatenate([p["population"] for p in parts]))
        self.population_index = parts[self.shard - 1]["population"]
        # Every party's training-set size (shard order): the weights of the aggregator's average, which every party
        # can compute from the same split (audit.cross_round derives the other parties' combined update from them).
        self.train_sizes = tuple(len(p["train"]) for p in parts)
        # Views of the process's one arranged array (the other parties' sets are its other rows).
        x, y, block = self._arranged.x, self._arranged.y, self._arranged.blocks[self.shard - 1]
        self.X_train, self.y_train = x.rows(block["train"]), y[block["train"]]
        self.X_valid, self.y_valid = x.rows(block["test"]), y[block["test"]]
        self.X_population, self.y_population = x.rows(block["population"]), y[block["population"]]
        # One generator per (seed, shard), advanced by every get_train_loader() call (epoch):
        # the same plan + seed gives the same sequence of batches.
        self._train_rng = np.random.default_rng([seed, self.shard])
        logger.info(
            "AuditDataLoader: %s shard %d/%d (user %d, device %d of %d): %d members, %d non-members, "
            "%d population (alpha=%s, seed=%d)",
            dataset,
            self.shard,
            collaborator_count,
            self.user,
            self.device,
            devices_per_user,
            len(self.y_train),
            len(self.y_valid),
            len(self.y_population),
            self.dirichlet_alpha,
            seed,
        )

    @staticmethod
    def _parse_data_path(data_path, collaborator_count) -> int:
        allowed = f"allowed: 1..{collaborator_count} (the 1-based shard number from plan/data.yaml)"
        try:
            if isinstance(data_path, bool):
                raise ValueError
            if isinstance(data_path, numbers.Integral):
                shard = int(data_path)
            else:
                shard = int(str(data_path).strip())
        except (TypeError, ValueError):
            raise ValueError(f"data_path: {data_path!r} is not an integer shard number; {allowed}") from None
        if not 1 <= shard <= collaborator_count:
            raise ValueError(f"data_path: shard {data_path!r} is out of range; {allowed}")
        return shard

    def _require_shard(self, what: str) -> None:
        if self.shard is None:
            raise RuntimeError(
                f"AuditDataLoader.{what}: no data loaded (built with data_path=None for model "
                "initialisation); give a shard number as data_path"
            )

    # ------------------------------------------------------------------ OpenFL API
    def get_feature_shape(self) -> list:
        """[C, H, W] of one sample (known without loading data)."""
        return list(self.feature_shape)

    def get_num_classes(self) -> int:
        return self.num_classes

    def get_train_loader(self, batch_size=None, num_batches=None):
        """Shuffled member batches; each call is one epoch drawn from the (seed, shard) generator.

        ``num_batches`` beyond one epoch continues with further permutations.
        """
        self._require_shard("get_train_loader")
        batch_size = self.batch_size if batch_size is None else COUNT(f"{PREFIX}.batch_size", batch_size)
        n = len(self.y_train)
        if num_batches is None:
            num_batches = math.ceil(n / batch_size)
            idxs = self._train_rng.permutation(n)
        else:
            num_batches = integer(min=0)(f"{PREFIX}.num_batches", num_batches)
            epochs = max(1, math.ceil(num_batches * batch_size / n))
            idxs = np.concatenate([self._train_rng.permutation(n) for _ in range(epochs)])
        return NumpyBatches(self.X_train, self.y_train, idxs, batch_size, num_batches)

    def get_valid_loader(self, batch_size=None):
        """The party's test (non-member) shard, in order."""
        self._require_shard("get_valid_loader")
        batch_size = self.batch_size if batch_size is None else COUNT(f"{PREFIX}.batch_size", batch_size)
        n = len(self.y_valid)
        return NumpyBatches(self.X_valid, self.y_valid, np.arange(n), batch_size, math.ceil(n / batch_size))

    def get_train_data_size(self) -> int:
        self._require_shard("get_train_data_size")
        return int(self.X_train.shape[0])

    def get_valid_data_size(self) -> int:
        self._require_shard("get_valid_data_size")
        return int(self.X_valid.shape[0])

    # ------------------------------------------------------------------ audit API
    def get_background(self) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) of the federation's whole population set, in `background_index` order (pool indices).

        A party's own population shard follows its label mix (see src.data.split); a mitigation that blends a user into
        the crowd needs data of the global distribution instead."""
        self._require_shard("get_background")
        rows = self._arranged.position[self.background_index]
        return self._arranged.x[rows], self._arranged.y[rows]

    def get_audit_sets(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{"members": train shard, "nonmembers": test shard, "population": population shard}``."""
        self._require_shard("get_audit_sets")
        return {
            "members": (self.X_train, self.y_train),
            "nonmembers": (self.X_valid, self.y_valid),
            "population": (self.X_population, self.y_population),
        }

    def get_party_data(self) -> PartyData:
        self._require_shard("get_party_data")
        return PartyData(
            train_x=self.X_train,
            train_y=self.y_train,
            test_x=self.X_valid,
            test_y=self.y_valid,
            population_x=self.X_population,
            population_y=self.y_population,
        )
