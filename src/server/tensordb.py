"""The aggregator's TensorDB: OpenFL's answers, without a pandas query per tensor.

OpenFL 1.9's `TensorDB` keeps every tensor in a pandas DataFrame: each `cache_tensor` is a `pd.concat` of the whole
frame, each lookup five boolean masks over every row, and each aggregation by a function that reads the history
(`src.aggregation.GatedWeightedAverage`, OpenFL's adaptive aggregations) an `iterrows` over the whole frame. Its
`clean_up` keeps every reported (metric) row of every round, so all of this grows with the rounds, and these frame
operations become most of the aggregator's end of round.

`IndexedTensorDB` keeps the same rows in a list, in insertion order, with a dict from a row's key to its first row
(OpenFL's lookups take the first match), and answers every OpenFL method from them. The DataFrame
(`tensor_db`, which callbacks such as the aggregator's report read) is built from the rows when it is read and
kept until the next write; assigning a frame replaces the rows. A frame read from it is a snapshot: writing into
it does not change the database (as with OpenFL's, whose every write replaces the frame). OpenFL's
experimental "privileged" aggregation functions get OpenFL's own code path on a frame, which then stays the store.

tests/test_aggregator_tensordb.py drives this class and OpenFL's TensorDB with the same operations and compares
every answer.
"""

from __future__ import annotations

from typing import Dict, Iterator, Optional

import numpy as np
import pandas as pd
from openfl.databases import TensorDB
from openfl.databases.utilities import ROUND_PLACEHOLDER
from openfl.utilities import LocalTensor, TensorKey, change_tags

COLUMNS = ("tensor_name", "origin", "round", "report", "tags", "nparray")
# The column types of OpenFL's frame once rows are in it (its empty frame's int32 round becomes int64 on concat).
DTYPES = {"tensor_name": "string", "origin": "string", "round": "int64", "report": "bool", "tags": "object",
          "nparray": "object"}


class Row(dict):
    """One row of the history given to aggregation functions: the columns OpenFL's `_iterate` gives (round,
    nparray, tensor_name, tags), by key (`row["round"]`, as OpenFL's functions read them) or attribute."""

    __slots__ = ()

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _key(tensor_name, origin, fl_round, report, tags):
    """The lookup key of a row: equal (and equally hashed) keys are the rows pandas' `==` masks match (str == str,
    1 == 1.0 == np.int64(1), False == 0, a tuple of tags == the same tuple). OpenFL's keys are TensorKeys, hashable
    (they are dict keys in cache_tensor)."""
    return (tensor_name, origin, fl_round, report, tags)


class IndexedTensorDB(TensorDB):
    """OpenFL's TensorDB with the rows in a list and a dict index; the DataFrame is built when read."""

    def __init__(self) -> None:
        super().__init__()  # the lock, and OpenFL's empty frame, which the tensor_db setter turns into rows

    @classmethod
    def convert(cls, db: TensorDB) -> "IndexedTensorDB":
        """Turn OpenFL's TensorDB `db` into an IndexedTensorDB in place, keeping its rows: the same object, so every
        holder of it (OpenFL's callbacks get the aggregator's TensorDB when the aggregator is built) sees the change."""
        if isinstance(db, cls):
            return db
        frame = db.__dict__.pop("tensor_db")
        db.__class__ = cls
        db._adopt(frame)
        return db

    # ------------------------------------------------------------ storage
    def _adopt(self, frame: pd.DataFrame) -> None:
        self._set_rows([tuple(r) for r in frame[list(COLUMNS)].itertuples(index=False, name=None)])

    def _set_rows(self, rows: list[tuple]) -> None:
        index: dict = {}
        for i, row in enumerate(rows):
            index.setdefault(_key(*row[:5]), i)  # the first row wins, as iloc[0] on OpenFL's mask
        # One assignment: a reader in another gRPC thread (a model download during clean_up) sees the rows and the
        # index of one state, never new positions into an old list. Appends (cache_tensor) add the row first.
        self._store = (rows, index)
        self._frame: pd.DataFrame | None = None

    @property
    def tensor_db(self) -> pd.DataFrame:
        frame = self._frame
        if frame is None:
            rows, columns = list(self._store[0]), {}
            for c, name in enumerate(COLUMNS):
                if DTYPES[name] == "object":  # element by element: equal-shaped arrays must stay one object each
                    values = np.empty(len(rows), dtype=object)
                    for i, row in enumerate(rows):
                        values[i] = row[c]
                    columns[name] = pd.Series(values, dtype=object)
                else:
                    columns[name] = pd.Series([row[c] for row in rows], dtype=DTYPES[name])
            frame = pd.DataFrame(columns)
            self._frame = frame
            self._bind_convenience_methods()
        return frame

    @tensor_db.setter
    def tensor_db(self, frame: pd.DataFrame) -> None:
        self._adopt(frame)

    def _bind_convenience_methods(self):
        if self.__dict__.get("_frame") is not None:
            super()._bind_convenience_methods()

    def _find(self, tensor_name, origin, fl_round, report, tags):
        """The array of the first row with this key, or None."""
        rows, index = self._store
        i = index.get(_key(tensor_name, origin, fl_round, report, tags))
        return None if i is None else rows[i][5]

    def cache_tensor(self, tensor_key_dict: Dict[TensorKey, np.ndarray]) -> None:
        with self.mutex:
            rows, index = self._store
            for tensor_key, nparray in tensor_key_dict.items():
                tensor_name, origin, fl_round, report, tags = tensor_key
                rows.append((tensor_name, origin, fl_round, report, tags, nparray))
                index.setdefault(_key(tensor_name, origin, fl_round, report, tags), len(rows) - 1)
            self._frame = None

    def clean_up(self, remove_older_than: int = 1) -> None:
        if remove_older_than < 0:
            return
        with self.mutex:
            rows = self._store[0]
            rounds = np.array([int(row[2]) for row in rows], dtype=np.int64)
            if rounds.size == 0:  # OpenFL's max() of nothing is NaN: every comparison false, report rows stay
                kept = [row for row in rows if row[3]]
            else:
                current_round = rounds.max()
                if current_round == ROUND_PLACEHOLDER:
                    current_round = np.sort(np.unique(rounds))[-2]
                kept = [row for row, r in zip(rows, rounds) if r > current_round - remove_older_than or bool(row[3])]
            self._set_rows(kept)

    def drop_reports_before(self, fl_round: int) -> int:
        """Drop the report (metric) rows of the rounds before `fl_round`; returns how many went. OpenFL's clean_up
        keeps them for the whole run, so the store, and every scan of it (an aggregation function's history, the
        frame a callback reads), grows with the rounds."""
        with self.mutex:
            rows = self._store[0]
            kept = [row for row in rows if not (bool(row[3]) and int(row[2]) < fl_round)]
            if len(kept) != len(rows):
                self._set_rows(kept)
        return len(rows) - len(kept)

    def drop_model_copies(self, fl_round: int, origin: str) -> int:
        """Drop the rows of round `fl_round` from `origin` tagged ('aggregated',) or ('aggregated', 'delta'); returns
        their bytes. OpenFL's end of round stores the next model three times over (the aggregate, the delta from the
        previous model, and the model the collaborators get), each its own array; only a collaborator that asks for
        delta updates ever reads the first two. For collaborators that do not (use_delta_updates: false), they are
        two models' worth of memory held through the whole next round."""
        copies = {("aggregated",), ("aggregated", "delta")}
        with self.mutex:
            kept, dropped = [], 0
            for row in self._store[0]:
                if row[2] == fl_round and row[1] == origin and not row[3] and tuple(row[4]) in copies:
                    dropped += getattr(row[5], "nbytes", 0)
                    continue
                kept.append(row)
            self._set_rows(kept)
        return dropped

    # ------------------------------------------------------------ queries
    def get_tensor_from_cache(self, tensor_key: TensorKey) -> Optional[np.ndarray]:
        found = self._find(*tensor_key)
        return None if found is None else np.asarray(found)

    def get_tensors_by_filter(self, custom_filter=None) -> dict:
        tensor_dict = {}
        for row in list(self._store[0]):
            values = dict(zip(COLUMNS, row))
            if custom_filter is not None and not custom_filter(values):
                continue
            key = TensorKey(tensor_name=row[0], origin=row[1], round_number=row[2], report=row[3], tags=row[4])
            tensor_dict[key] = np.asarray(row[5])
        return tensor_dict

    def get_aggregated_tensor(self, tensor_key: TensorKey, collaborator_weight_dict: dict, aggregation_function):
        """OpenFL's TensorDB.get_aggregated_tensor, step for step, with the index for its lookups."""
        if getattr(aggregation_function, "_privileged", False):
            # It is given the frame itself and may write into it: OpenFL's code on a frame from now on.
            frame = self.tensor_db
            self.__class__ = TensorDB
            for name in ("_store", "_frame"):
                self.__dict__.pop(name, None)
            self.tensor_db = frame
            return self.get_aggregated_tensor(tensor_key, collaborator_weight_dict, aggregation_function)

        if len(collaborator_weight_dict) != 0:
            assert np.abs(1.0 - sum(collaborator_weight_dict.values())) < 0.01, (
                f"Collaborator weights do not sum to 1.0: {collaborator_weight_dict}"
            )
        tensor_name, origin, fl_round, report, tags = tensor_key
        found = self._find(tensor_name, origin, fl_round, report, tags)
        if found is not None:
            return np.asarray(found), {}  # sic: OpenFL returns a pair here, the array alone below

        agg_tensor_dict = {}
        for col in collaborator_weight_dict:
            new_tags = change_tags(tags, add_field=col)
            found = self._find(tensor_name, origin, fl_round, report, new_tags)
            if found is None:
                tk = TensorKey(tensor_name, origin, report, fl_round, new_tags)
                print(f"No results for collaborator {col}, TensorKey={tk}")  # as OpenFL
                return None
            agg_tensor_dict[col] = found
        local_tensors = [LocalTensor(col_name=col, tensor=agg_tensor_dict[col], weight=collaborator_weight_dict[col])
                         for col in collaborator_weight_dict]
        agg_nparray = aggregation_function(local_tensors, self._iterate(), tensor_name, fl_round, tags)
        self.cache_tensor({tensor_key: agg_nparray})
        return np.asarray(agg_nparray)

    def _iterate(self, order_by: str = "round", ascending: bool = False) -> Iterator[Row]:
        """The history as OpenFL's `_iterate` gives it (columns round, nparray, tensor_name, tags; by `order_by`,
        newest round first), as Row mappings instead of pandas Series: an iterrows over the whole frame for every
        aggregated tensor was the largest single cost. Rows of the same round come in insertion order (pandas'
        default sort leaves their order unspecified)."""
        position = COLUMNS.index(order_by)
        rows = sorted(list(self._store[0]), key=lambda row: row[position], reverse=not ascending)
        for row in rows:
            yield Row(round=row[2], nparray=row[5], tensor_name=row[0], tags=row[4])

