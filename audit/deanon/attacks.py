"""The deanonymization attacks of Orekondy et al. (seeds 000/001) on update vectors, and their scores.

Re-identification: a classifier trained on updates labelled by their owner (the adversary's prior knowledge)
names the owner of an anonymous update. The paper's MLP (one hidden layer of 128, ReLU, SGD lr 0.01, momentum
0.9), a linear SVM and kNN (k=10), all scikit-learn. Scored as in the paper: per-user average precision of the
anonymous updates ranked by that user's score, its mean over users, the chance level of each user's AP (the
expected AP of a random ranking), their ratio ("AP over chance"), top-1 and top-5 accuracy.

Matching: a Siamese network (twin FC-128 encoders, L1 distance, FC-1 sigmoid; BCE, RMSProp 1e-3) scores whether
two updates come from one user, so it also works on users the adversary never saw; scored by AP on balanced pairs.

An "open world" re-identification simply has an "unseen" label among the classes (see audit.deanon.server,
which builds it from held-out users).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.metrics import average_precision_score
from sklearn.neighbors import KNeighborsClassifier
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC

from audit.config.deanon_settings import ATTACKS, REID_ATTACKS

__all__ = ["REID_ATTACKS", "ATTACKS", "ReidResult", "MatchResult", "reidentify", "match", "balanced_pairs",
           "random_ranking_ap", "single_threaded"]

KNN_K = 10


@contextmanager
def single_threaded():
    """BLAS, OpenMP and torch limited to one thread for the duration (restored afterwards).

    The attacks train on a few dozen vectors: thread start-up and, on a busy machine (the aggregator's host, or
    an in-process federation), threads waiting for each other cost far more than they save.
    """
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        torch.set_num_threads(before)


def random_ranking_ap(positives: int, total: int) -> float:
    """Expected average precision of a random ranking of `total` items of which `positives` are positive.

    The chance level of an AP. With many items per user it is about the positives' share (the paper's 1/U), but
    with few it is well above: one positive among 11 has expected AP H_11 / 11 = 0.27, not 0.09. Derivation: a
    positive sits at each rank k with probability 1/total, and then the expected precision at k is
    (1 + (positives - 1)(k - 1)/(total - 1)) / k.
    """
    if not 0 < positives <= total:
        raise ValueError(f"random_ranking_ap: need 0 < positives <= total, got {positives}, {total}")
    if total == 1:
        return 1.0
    harmonic = float(np.sum(1.0 / np.arange(1, total + 1)))
    return (harmonic + (positives - 1) / (total - 1) * (total - harmonic)) / total


def _classifier(attack: str, n_train: int, seed: int):
    if attack == "mlp":
        # The paper's optimiser; scaling first because unit-norm updates spread over thousands of inputs have
        # tiny coordinates, which plain SGD at lr 0.01 would barely move from.
        return make_pipeline(StandardScaler(), MLPClassifier(
            hidden_layer_sizes=(128,), activation="relu", solver="sgd", learning_rate_init=0.01, momentum=0.9,
            nesterovs_momentum=False, batch_size=min(32, n_train), max_iter=300, random_state=seed))
    if attack == "svm":
        return make_pipeline(StandardScaler(), LinearSVC(C=1.0, random_state=seed))
    if attack == "knn":
        # Updates are unit vectors, so Euclidean neighbours are cosine neighbours. Distance weights: plain vote
        # fractions tie a lot, and average precision scores ties pessimistically (below chance on pure noise).
        return KNeighborsClassifier(n_neighbors=min(KNN_K, n_train), weights="distance")
    raise ValueError(f"unknown re-identification attack {attack!r}; choose one of {', '.join(REID_ATTACKS)}")


def _scores(clf, x: np.ndarray, n_classes: int) -> np.ndarray:
    """(n, n_classes) scores, higher = more likely that owner."""
    if hasattr(clf, "predict_proba"):
        return clf.predict_proba(x)
    scores = clf.decision_function(x)
    if n_classes == 2 and scores.ndim == 1:  # binary LinearSVC gives one column, for classes_[1]
        scores = np.stack([-scores, scores], axis=1)
    return scores


@dataclass
class ReidResult:
    """A re-identification attack's scores on the anonymous updates (`users` are its label order)."""

    attack: str
    users: list
    per_user_ap: dict            # user -> AP over the anonymous updates ranked by that user's score
    per_user_chance: dict        # user -> the expected AP of a random ranking (random_ranking_ap)
    top1: float
    top5: float
    scores: np.ndarray = field(repr=False)   # (n_test, n_users)
    truth: np.ndarray = field(repr=False)    # (n_test,) true labels

    @property
    def mean_ap(self) -> float:
        return float(np.mean(list(self.per_user_ap.values())))

    @property
    def chance_ap(self) -> float:
        return float(np.mean(list(self.per_user_chance.values())))

    @property
    def ap_over_chance(self) -> float:
        return self.mean_ap / self.chance_ap

    def rank_of(self, user) -> float:
        """Mean rank (1 = first) of `user` among the owners guessed for its own anonymous updates."""
        col = self.users.index(user)
        rows = np.flatnonzero(self.truth == user)
        if rows.size == 0:
            raise ValueError(f"no anonymous update of {user!r}")
        return float(np.mean([1 + np.sum(self.scores[r] > self.scores[r, col]) for r in rows]))

    def to_dict(self) -> dict:
        return {
            "attack": self.attack, "mean_ap": self.mean_ap, "chance_ap": self.chance_ap,
            "ap_over_chance": self.ap_over_chance, "top1": self.top1, "top5": self.top5,
            "per_user_ap": {str(u): float(v) for u, v in self.per_user_ap.items()},
        }


def reidentify(train_x, train_users, test_x, test_users, attack: str, *, seed: int = 0) -> ReidResult:
    """Train `attack` on (train_x, train_users) and score it on the anonymous (test_x, test_users).

    Users' APs are averaged over the users that own at least one anonymous update; a test update whose owner
    is not among the training labels counts as a miss for top-1/top-5 and is no user's positive.
    """
    train_x, test_x = np.asarray(train_x, dtype=np.float64), np.asarray(test_x, dtype=np.float64)
    train_users, test_users = np.asarray(train_users), np.asarray(test_users)
    users = sorted(set(train_users.tolist()))
    if len(users) < 2:
        raise ValueError(f"re-identification needs updates of at least 2 users, got {len(users)}")
    clf = _classifier(attack, len(train_x), seed)
    clf.fit(train_x, train_users)
    classes = list(clf.classes_)
    scores = _scores(clf, test_x, len(classes))
    per_user_ap, per_user_chance = {}, {}
    for col, user in enumerate(classes):
        positive = test_users == user
        if positive.any():
            per_user_ap[user] = float(average_precision_score(positive, scores[:, col]))
            per_user_chance[user] = random_ranking_ap(int(positive.sum()), len(positive))
    if not per_user_ap:
        raise ValueError("no anonymous update belongs to a user the attack was trained on")
    order = np.argsort(-scores, axis=1, kind="stable")
    truth_col = np.array([classes.index(u) if u in classes else -1 for u in test_users.tolist()])
    top1 = float(np.mean(order[:, 0] == truth_col))
    top5 = float(np.mean([t in row[:5] for t, row in zip(truth_col, order)]))
    return ReidResult(attack, classes, per_user_ap, per_user_chance, top1, top5, scores, test_users)


# ------------------------------------------------------------------------------------------ matching
class SiameseMatcher(torch.nn.Module):
    """The paper's matching network: shared FC-128 x2 encoder, |e_i - e_j|, FC-1 (a logit; sigmoid in the loss)."""

    def __init__(self, dim: int, hidden: int = 128):
        super().__init__()
        self.encoder = torch.nn.Sequential(
            torch.nn.Linear(dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU())
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.head(torch.abs(self.encoder(a) - self.encoder(b))).squeeze(-1)


def balanced_pairs(left_users, right_users, rng: np.random.Generator, *, max_pairs: int = 4000,
                   exclude_self: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index pairs (i into left, j into right) with as many same-user pairs as different-user ones.

    Same-user pairs are all of them (or a random `max_pairs // 2`); as many different-user pairs are drawn at
    random. `exclude_self` drops i == j (left and right are the same updates).
    """
    left_users, right_users = np.asarray(left_users), np.asarray(right_users)
    same = left_users[:, None] == right_users[None, :]
    if exclude_self:
        np.fill_diagonal(same, False)
    pos = np.argwhere(same)
    diff = np.argwhere(left_users[:, None] != right_users[None, :])
    n = min(len(pos), len(diff), max_pairs // 2)
    if n == 0:
        raise ValueError("matching needs same-user and different-user pairs")
    pos = pos[rng.choice(len(pos), n, replace=False)]
    neg = diff[rng.choice(len(diff), n, replace=False)]
    pairs = np.concatenate([pos, neg])
    labels = np.concatenate([np.ones(n), np.zeros(n)])
    return pairs[:, 0], pairs[:, 1], labels


@dataclass
class MatchResult:
    ap: float
    chance_ap: float
    pairs: int

    @property
    def ap_over_chance(self) -> float:
        return self.ap / self.chance_ap

    def to_dict(self) -> dict:
        return {"ap": self.ap, "chance_ap": self.chance_ap, "ap_over_chance": self.ap_over_chance,
                "pairs": self.pairs}


def match(train_x, train_users, test_x, test_users, reference_x, reference_users, *, seed: int = 0,
          epochs: int = 30, batch_size: int = 128) -> MatchResult:
    """Train the Siamese matcher on balanced pairs of training updates; score it on balanced pairs
    (anonymous update, reference update), reference being updates the adversary knows the owner of."""
    rng = np.random.default_rng(seed)
    train_x = torch.as_tensor(np.asarray(train_x), dtype=torch.float32)
    i, j, y = balanced_pairs(train_users, train_users, rng, exclude_self=True)
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = SiameseMatcher(train_x.shape[1])
    optimizer = torch.optim.RMSprop(net.parameters(), lr=1e-3)
    target = torch.as_tensor(y, dtype=torch.float32)
    i, j = torch.as_tensor(i), torch.as_tensor(j)
    net.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(target), generator=gen).split(batch_size):
            optimizer.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                net(train_x[i[batch]], train_x[j[batch]]), target[batch])
            loss.backward()
            optimizer.step()
    ti, tj, ty = balanced_pairs(test_users, reference_users, rng)
    test_x = torch.as_tensor(np.asarray(test_x), dtype=torch.float32)
    reference_x = torch.as_tensor(np.asarray(reference_x), dtype=torch.float32)
    net.eval()
    with torch.no_grad():
        scores = net(test_x[torch.as_tensor(ti)], reference_x[torch.as_tensor(tj)]).numpy()
    return MatchResult(ap=float(average_precision_score(ty, scores)), pairs=len(ty),
                       chance_ap=random_ranking_ap(int(ty.sum()), len(ty)))
