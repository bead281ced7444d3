"""The aggregator-side deanonymization audit: the paper's honest-but-curious server, on the real updates.

Orekondy et al. (seeds 000/001) ask whether a server that sees anonymous model updates can tell whose they are.
The server of a federation knows more than the paper's adversary: it sees every round's updates together with
the sender. This module measures what that knowledge buys it: once a few rounds are stored, the attacks of
`audit.deanon.attacks` are trained on the earlier rounds' updates, labelled by collaborator, and asked to name
the owners of this round's updates as if they had arrived anonymously (e.g. behind a shuffler or a secure
aggregation front end that strips the sender).

- `UpdateHistory` keeps, per round and collaborator, the update's representation (`audit.deanon.representation.
  update_vector`: one layer's `trained - received`, flattened, L2-normalised, float64; 650 numbers = 5 KB for
  the last layer of our CNN). A withheld update (trained == received) has no direction and is skipped, not
  stored as a zero vector (a zero vector would be one more "user" that every attack finds trivially).
- `evaluate_round` runs, from the round where `min_history_rounds` earlier rounds are stored:
  closed world (every collaborator known): re-identification (MLP, SVM, kNN) trained on the earlier rounds and
  tested on this round: mean AP, chance AP (`random_ranking_ap`), AP over chance, top-1, top-5; Siamese
  matching trained on pairs of earlier updates and tested on pairs (this round's update, an earlier update).
  open world (the paper's Section 6, "User Split"), with >= 3 collaborators: a seeded, fixed split into seen /
  holdout (about a third) / unseen; the MLP is trained on the earlier rounds' seen users by name and holdout users
  as one "unseen" class and tested on this round's seen and unseen users (unseen users' truth: "unseen"); the
  Siamese matcher is trained on seen and holdout users and tested on pairs (this round's update of an unseen
  user, an earlier update of an unseen user or this round's update of a seen user: none of them trained on).
  It returns a JSON-able dict of scalars (no update vectors).
- `DeanonReportWriter` writes `round_NNNN.json`, `summary.csv` and `ap_over_chance.png` into a folder, the summaries
  rebuilt from the round files on disk.

OpenFL-free: src/server/deanon_callback.py feeds it from the aggregator's TensorDB.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from audit.deanon.attacks import KNN_K, match, reidentify, single_threaded
from audit.deanon.representation import normalise_rows, update_vector
from audit.config.deanon_settings import ATTACKS, REID_ATTACKS

__all__ = ["UpdateHistory", "evaluate_round", "open_world_split", "clean_record",
           "BUILDING_HISTORY", "EVALUATED", "SKIPPED", "UNSEEN", "OPEN_WORLD_REID_ATTACK", "MATCH_ATTACK"]

logger = logging.getLogger(__name__)

BUILDING_HISTORY, EVALUATED, SKIPPED = "building_history", "evaluated", "skipped"
UNSEEN = "unseen"                  # the open world's extra class
OPEN_WORLD_REID_ATTACK = "mlp"     # the paper's open-world re-identification attack
MATCH_ATTACK = "siamese"
MIN_OPEN_WORLD_COLLABORATORS = 3   # one seen, one holdout, one unseen at least

WITHHELD = "withheld: the trained weights equal the received global weights (zero update), nothing to attack"
NON_FINITE = "non-finite update (NaN/Inf): not stored"


# ------------------------------------------------------------------------------------------- history
class UpdateHistory:
    """Per round and collaborator, the L2-normalised update vector of the audited layer (float64, 1-D).

    Also remembers, per round, why a collaborator's update was not stored (withheld, non-finite, ...).
    All vectors must have the same length (one layer of one model).
    """

    def __init__(self):
        self._updates: dict[int, dict[str, np.ndarray]] = {}
        self._skipped: dict[int, dict[str, str]] = {}
        self.dimension: int | None = None

    def add(self, round_num: int, collaborator: str, received: Mapping, trained: Mapping,
            names: Iterable[str]) -> bool:
        """Store `update_vector(received, trained, names)`; False (and the reason kept) if it was skipped."""
        names = list(names)
        missing = [n for n in names if n not in received or n not in trained]
        if missing:
            return self.skip(round_num, collaborator, f"tensors {missing} missing from the received or trained weights")
        delta = np.concatenate([np.asarray(trained[n], dtype=np.float64).ravel()
                                - np.asarray(received[n], dtype=np.float64).ravel() for n in names])
        if not np.all(np.isfinite(delta)):
            return self.skip(round_num, collaborator, NON_FINITE)
        if not np.any(delta):
            return self.skip(round_num, collaborator, WITHHELD)
        return self.add_vector(round_num, collaborator, update_vector(received, trained, names))

    def add_vector(self, round_num: int, collaborator: str, vector) -> bool:
        """Store an update vector (normalised here if it is not); a zero or non-finite vector is skipped."""
        vector = np.asarray(vector, dtype=np.float64)
        if vector.ndim != 1 or vector.size == 0:
            raise ValueError(f"round {round_num}, {collaborator}: expected a non-empty 1-D update vector, "
                             f"got shape {vector.shape}")
        if self.dimension is not None and vector.size != self.dimension:
            raise ValueError(f"round {round_num}, {collaborator}: update vector of length {vector.size}, the history "
                             f"holds vectors of length {self.dimension} (one layer of one model)")
        if not np.all(np.isfinite(vector)):
            return self.skip(round_num, collaborator, NON_FINITE)
        if not np.any(vector):
            return self.skip(round_num, collaborator, WITHHELD)
        self.dimension = vector.size
        self._skipped.get(round_num, {}).pop(collaborator, None)
        self._updates.setdefault(int(round_num), {})[str(collaborator)] = normalise_rows(vector[None, :])[0]
        return True

    def skip(self, round_num: int, collaborator: str, reason: str) -> bool:
        self._updates.get(round_num, {}).pop(collaborator, None)
        self._skipped.setdefault(int(round_num), {})[str(collaborator)] = str(reason)
        return False

    def rounds(self) -> list[int]:
        """Rounds with at least one stored update, ascending."""
        return sorted(r for r, updates in self._updates.items() if updates)

    def round_updates(self, round_num: int) -> dict[str, np.ndarray]:
        """collaborator -> update vector of `round_num` (a new dict; the vectors are the stored ones)."""
        return dict(sorted(self._updates.get(round_num, {}).items()))

    def skipped(self, round_num: int) -> dict[str, str]:
        """collaborator -> why its update of `round_num` was not stored."""
        return dict(sorted(self._skipped.get(round_num, {}).items()))

    def collaborators(self, up_to_round: int | None = None) -> list[str]:
        """Every collaborator with a stored update (in rounds <= up_to_round, if given)."""
        return sorted({c for r, updates in self._updates.items() if up_to_round is None or r <= up_to_round
                       for c in updates})

    def stack(self, rounds: Iterable[int], collaborators: Iterable[str] | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """(vectors, owners) of the given rounds (and collaborators), in round then name order."""
        wanted = None if collaborators is None else set(collaborators)
        xs, owners = [], []
        for r in sorted(set(rounds)):
            for name, vector in self.round_updates(r).items():
                if wanted is None or name in wanted:
                    xs.append(vector)
                    owners.append(name)
        x = np.stack(xs) if xs else np.empty((0, self.dimension or 0))
        return x, np.array(owners, dtype=object)

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for updates in self._updates.values() for v in updates.values())

    def __len__(self) -> int:
        return sum(len(updates) for updates in self._updates.values())


# ------------------------------------------------------------------------------------------- evaluation
def open_world_split(collaborators: Iterable[str], seed: int) -> dict[str, list[str]]:
    """A seeded split of the collaborators into seen / holdout / unseen (sorted lists).

    As in the paper, about a third are holdout users (the adversary knows them, and they teach it what "someone
    else" looks like); the rest is halved between unseen (the adversary has no prior for them) and seen. At least
    one of each: needs >= 3 collaborators. The same names and seed give the same split in every round.
    """
    names = sorted(set(map(str, collaborators)))
    n = len(names)
    if n < MIN_OPEN_WORLD_COLLABORATORS:
        raise ValueError(f"open world needs at least {MIN_OPEN_WORLD_COLLABORATORS} collaborators "
                         f"(seen, holdout, unseen), got {n}")
    order = [names[i] for i in np.random.default_rng(seed).permutation(n)]
    n_holdout = min(max(1, round(n / 3)), n - 2)
    n_unseen = max(1, (n - n_holdout) // 2)
    holdout, unseen, seen = order[:n_holdout], order[n_holdout:n_holdout + n_unseen], order[n_holdout + n_unseen:]
    return {"seen": sorted(seen), "holdout": sorted(holdout), "unseen": sorted(unseen)}


def _unseen_label(names: Iterable[str]) -> str:
    label, names = UNSEEN, set(names)
    while label in names:  # a collaborator called "unseen" keeps its own name
        label = f"<{label}>"
    return label


def clean_record(value: Any) -> Any:
    """JSON-able copy: numpy scalars to Python, NaN/Inf to None (the report files are strict JSON)."""
    if isinstance(value, Mapping):
        return {str(k): clean_record(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_record(v) for v in value]
    if isinstance(value, np.ndarray):
        return [clean_record(v) for v in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


def _reid(train_x, train_users, test_x, test_users, attack: str, seed: int) -> dict:
    result = reidentify(train_x, train_users, test_x, test_users, attack, seed=seed)
    return {**result.to_dict(), "per_user_chance": {str(u): float(v) for u, v in result.per_user_chance.items()},
            "train_updates": len(train_users), "test_updates": len(test_users)}


def _match(train_x, train_users, test_x, test_users, ref_x, ref_users, seed: int) -> dict:
    result = match(train_x, train_users, test_x, test_users, ref_x, ref_users, seed=seed)
    return {**result.to_dict(), "train_updates": len(train_users), "test_updates": len(test_users),
            "reference_updates": len(ref_users)}


def _run(results: dict, errors: dict, attack: str, fn, *args) -> None:
    """results[attack] = fn(*args); a failing attack is recorded in errors and does not stop the others."""
    try:
        results[attack] = fn(*args)
    except Exception as err:  # noqa: BLE001 - one attack's failure (e.g. too few pairs) is reported, not raised
        errors[attack] = f"{type(err).__name__}: {err}"
        logger.warning("deanonymization %s failed: %s", attack, err)


def evaluate_round(history: UpdateHistory, round_num: int, *, attacks: Iterable[str] = ATTACKS,
                   min_history_rounds: int = 2, seed: int = 0) -> dict:
    """The deanonymization audit of round `round_num` against the earlier rounds stored in `history`.

    Status "building_history" while fewer than `min_history_rounds` earlier rounds hold updates, "skipped" (with
    a reason) if this round or the history has too few collaborators, else "evaluated" with the closed-world and
    open-world results (see the module docstring). Returns a JSON-able dict, no update vectors.
    """
    start = time.perf_counter()
    attacks = tuple(attacks)
    unknown = [a for a in attacks if a not in ATTACKS]
    if unknown:
        raise ValueError(f"unknown attacks {unknown}; known: {', '.join(ATTACKS)}")
    if isinstance(min_history_rounds, bool) or not isinstance(min_history_rounds, (int, np.integer)) \
            or min_history_rounds < 1:
        raise ValueError(f"min_history_rounds: expected an integer >= 1, got {min_history_rounds!r}")
    round_num = int(round_num)
    earlier = [r for r in history.rounds() if r < round_num]
    current = history.round_updates(round_num)
    record: dict[str, Any] = {
        "round": round_num,
        "status": EVALUATED,
        "reason": None,
        "attacks": list(attacks),
        "min_history_rounds": int(min_history_rounds),
        "seed": int(seed),
        "history_rounds": earlier,
        "collaborators": sorted(current),
        "skipped_updates": history.skipped(round_num),
        "dimension": history.dimension,
        "train_updates": 0,
        "test_updates": len(current),
        "closed_world": None,
        "open_world": None,
    }
    train_x, train_users = history.stack(earlier)
    record["train_updates"] = len(train_users)
    trained_on = sorted(set(train_users.tolist()))
    if len(earlier) < min_history_rounds:
        record.update(status=BUILDING_HISTORY, reason=(
            f"building history: {len(earlier)} earlier round(s) with updates stored, the attacks train on "
            f"{min_history_rounds}"))
    elif len(current) < 2:
        record.update(status=SKIPPED, reason=(
            f"{len(current)} update(s) this round: naming the owner among fewer than 2 updates means nothing"))
    elif len(trained_on) < 2:
        record.update(status=SKIPPED, reason=(
            f"the earlier rounds hold updates of {len(trained_on)} collaborator(s); the attacks need 2"))
    if record["status"] != EVALUATED:
        record["seconds"] = time.perf_counter() - start
        return clean_record(record)

    test_users = np.array(list(current), dtype=object)
    test_x = np.stack(list(current.values()))
    with warnings.catch_warnings(), single_threaded():
        # sklearn's MLP/SVM warn that a few dozen samples did not "converge"; the scores are what matters here.
        warnings.simplefilter("ignore")
        record["closed_world"] = _closed_world(train_x, train_users, test_x, test_users, attacks, seed)
        record["open_world"] = _open_world(history, earlier, current, round_num, attacks, seed)
    record["seconds"] = time.perf_counter() - start
    return clean_record(record)


def _closed_world(train_x, train_users, test_x, test_users, attacks, seed) -> dict:
    out: dict[str, Any] = {"collaborators": sorted(set(train_users.tolist()) | set(test_users.tolist())),
                           "reidentification": {}, "matching": {}, "errors": {}, "notes": []}
    for attack in attacks:
        if attack in REID_ATTACKS:
            _run(out["reidentification"], out["errors"], attack, _reid, train_x, train_users, test_x, test_users,
                 attack, seed)
    if "knn" in attacks and len(train_users) <= KNN_K:
        out["notes"].append(
            f"knn: k = min({KNN_K}, training updates) = {len(train_users)} takes every training update as a "
            "neighbour, so all of this round's updates get the same scores (the class frequencies); tied scores "
            "give an AP below chance")
    if MATCH_ATTACK in attacks:
        # pairs (this round's update, an earlier update): the earlier updates are the ones the server has labelled
        _run(out["matching"], out["errors"], MATCH_ATTACK, _match, train_x, train_users, test_x, test_users,
             train_x, train_users, seed)
    return out


def _open_world(history: UpdateHistory, earlier: list[int], current: Mapping[str, np.ndarray], round_num: int,
                attacks, seed) -> dict:
    names = history.collaborators(up_to_round=round_num)
    if len(names) < MIN_OPEN_WORLD_COLLABORATORS:
        return {"status": SKIPPED, "reason": (
            f"{len(names)} collaborator(s) with updates: the open world needs at least "
            f"{MIN_OPEN_WORLD_COLLABORATORS} (one seen, one holdout, one unseen)")}
    split = open_world_split(names, seed)
    unseen_label = _unseen_label(names)
    seen, holdout, unseen = set(split["seen"]), set(split["holdout"]), set(split["unseen"])
    out: dict[str, Any] = {"status": EVALUATED, "reason": None, "split": split, "unseen_label": unseen_label,
                           "reidentification": {}, "matching": {}, "errors": {}, "notes": []}

    # The adversary's prior: the earlier updates of seen users (by name) and holdout users (as "unseen").
    prior_x, prior_owner = history.stack(earlier, seen | holdout)
    prior_label = np.array([o if o in seen else unseen_label for o in prior_owner], dtype=object)
    # Anonymous: this round's updates of seen and unseen users (holdout users only train).
    test = {c: v for c, v in current.items() if c in seen or c in unseen}
    test_owner = np.array(list(test), dtype=object)
    test_x = np.stack(list(test.values())) if test else np.empty((0, history.dimension or 0))
    test_label = np.array([o if o in seen else unseen_label for o in test_owner], dtype=object)
    out["train_updates"], out["test_updates"] = len(prior_label), len(test_label)

    if OPEN_WORLD_REID_ATTACK in attacks:
        if len(test_label) == 0:
            out["errors"][OPEN_WORLD_REID_ATTACK] = "no update of a seen or unseen collaborator this round"
        elif len(set(prior_label.tolist())) < 2:
            out["errors"][OPEN_WORLD_REID_ATTACK] = "the earlier rounds lack updates of seen or holdout collaborators"
        else:
            _run(out["reidentification"], out["errors"], OPEN_WORLD_REID_ATTACK, _reid, prior_x, prior_label,
                 test_x, test_label, OPEN_WORLD_REID_ATTACK, seed)
    else:
        out["notes"].append(f"open-world re-identification uses the {OPEN_WORLD_REID_ATTACK} attack, not selected")

    if MATCH_ATTACK in attacks:
        # Trained, as in the paper, on pairs of the seen and holdout users' earlier updates. Tested on pairs that
        # involve an unseen user: (this round's update of an unseen user, a reference update), the references
        # being the unseen users' earlier updates (same user: positives) and this round's updates of the seen users
        # (negatives). No reference was in the training set: pairing a novel update with a memorised one (the seen
        # users' earlier updates) would make the negatives recognisable for the wrong reason (on updates with no
        # owner signal at all, such pairs gave AP ~1.2x chance). Same-round negatives may look more alike than the
        # cross-round positives (all updates of a round start from the same model): if anything an underestimate.
        anon = {c: v for c, v in current.items() if c in unseen}
        unseen_x, unseen_owner = history.stack(earlier, unseen)
        seen_now = {c: v for c, v in current.items() if c in seen}
        ref_x = np.concatenate([unseen_x, *([np.stack(list(seen_now.values()))] if seen_now else [])])
        ref_owner = np.array([*unseen_owner.tolist(), *seen_now], dtype=object)
        if not anon:
            out["errors"][MATCH_ATTACK] = "no update of an unseen collaborator this round"
        else:
            _run(out["matching"], out["errors"], MATCH_ATTACK, _match, prior_x, prior_owner,
                 np.stack(list(anon.values())), np.array(list(anon), dtype=object), ref_x, ref_owner, seed)
    else:
        out["notes"].append(f"open-world matching uses the {MATCH_ATTACK} attack, not selected")
    return out


# ------------------------------------------------------------------------------------------- report files
