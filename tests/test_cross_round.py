"""The cross-round attack (audit.cross_round): the other parties' combined update a party derives from the global
model equals the aggregator's under the plan's aggregation (the real GatedWeightedAverage, a tabular model and a CNN
with BatchNorm, to a tolerance derived from float32 arithmetic); what the party knows of its weight; the attack on a
party whose members it trains on over several rounds detects them, through the real audit; under the null (members
the model never saw) the verdict with the step on is wrong at most at its level; the private state is bounded and
0600; every round it cannot attack says why."""

from __future__ import annotations

import copy
import math
import os
import stat

import numpy as np
import pytest
import torch
from openfl.utilities import LocalTensor
from scipy.stats import binom
from torch import nn

from audit.config.audit_settings import AuditSettings
from audit.config.gate_contract import GATE_KEPT
from audit.config.per_collaborator import parse_per_collaborator
from audit.config.steps import registered, step
from audit.config.vocabulary import CROSS_ROUND, CROSS_ROUND_FILE
from audit.cross_round.attack import combined_scores, round_statistic, source_inference
from audit.cross_round.others import average_weight, left_out_alone, others_model, others_state
from audit.config.cross_round_settings import CrossRoundSettings, cross_round_settings
from audit.cross_round.state import STORE_KEY
from audit.cross_round.step import after_sending
from audit.cross_round.views import page_section, summary
from audit.round_audit import AuditSets, SentUpdate, audit_round
from report_drawing import without_report_drawing  # noqa: F401  (a fixture)
from src.aggregation import GatedWeightedAverage

pytestmark = pytest.mark.usefixtures("one_torch_thread")

U = 2.0 ** -24  # float32's unit roundoff


def _gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u): the relative error bound of n float32 roundings in a row (Higham, ch. 3)."""
    return n * U / (1 - n * U)


# ------------------------------------------------------------------------------------------ models and data

FEATURES, CLASSES = 6, 3


def _tabular_model():
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def _cnn():
    """A CNN with BatchNorm (running statistics and an integer batch count among its buffers) on 8x8 images."""
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, CLASSES))


def _tabular(rng, n):
    """Tabular data whose label one feature tells only weakly, one categorical column, noise: a model fits its
    training samples by memorising them."""
    y = rng.integers(0, CLASSES, size=n)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    x[:, 0] += 0.5 * y.astype(np.float32)
    x[:, 2] = rng.integers(0, 4, size=n)
    return x, y


def _perturbed(model, rng, scale=0.05):
    """A party's update: the model's every floating tensor moved by its own noise (BatchNorm's variances kept
    positive), in float32."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, tensor in (*out.named_parameters(), *out.named_buffers()):
            if tensor.is_floating_point():
                noise = torch.as_tensor(rng.normal(scale=scale, size=tuple(tensor.shape)), dtype=tensor.dtype)
                tensor.copy_(tensor.abs() + noise.abs() if "running_var" in name else tensor + noise)
    return out


def _aggregate(updates: dict[str, nn.Module], sizes: dict[str, int], withheld=()) -> dict[str, np.ndarray]:
    """The aggregator's average, tensor by tensor, by the plan's aggregation function (src.aggregation.
    GatedWeightedAverage) with OpenFL's normalised data-size weights; `withheld` sent gate_kept 0."""
    function = GatedWeightedAverage()
    total = sum(sizes.values())
    rows = [{"round": 0, "tensor_name": GATE_KEPT, "tags": (c, "metric"), "nparray": np.array(0.0)} for c in withheld]
    names = next(iter(updates.values())).state_dict()
    return {name: function.call([LocalTensor(c, m.state_dict()[name].detach().numpy(), sizes[c] / total)
                                 for c, m in updates.items()], rows, name, 0, ("trained",)) for name in names}


def _holding(template: nn.Module, state: dict) -> nn.Module:
    model = copy.deepcopy(template)
    model.load_state_dict({k: torch.as_tensor(np.asarray(v)).to(model.state_dict()[k].dtype) for k, v in state.items()})
    return model


# ------------------------------------------------------------------------------------------ the derivation


@pytest.mark.parametrize("build", [_tabular_model, _cnn], ids=["tabular", "cnn"])
@pytest.mark.parametrize("withheld", [(), ("c",)], ids=["all-averaged", "one-withheld"])
def test_the_others_update_the_party_derives_is_the_aggregators(build, withheld):
    """Three parties of different sizes; the global model from the plan's aggregation function. The party 'a' knows
    its update and its weight among the parties averaged: (G - w L_a) / (1 - w) is the others' weighted average to
    within the aggregator's float32 rounding (each term rounded, then summed: gamma_{K+1} sum_k w_k |L_k|, divided
    by 1 - w) and the one rounding of the result to float32. A weight one sample off is outside that tolerance."""
    rng = np.random.default_rng(7)
    torch.manual_seed(7)
    base = build()
    sizes = {"a": 37, "b": 53, "c": 61}
    updates = {c: _perturbed(base, rng) for c in sizes}
    received = _holding(base, _aggregate(updates, sizes, withheld))
    kept = {c: n for c, n in sizes.items() if c not in withheld}
    total = sum(kept.values())
    weights = {c: n / total for c, n in kept.items()}
    w = weights["a"]
    derived = others_state(received, updates["a"], w)
    wrong = others_state(received, updates["a"], (kept["a"] - 1) / (total - 1))
    for name, got in derived.items():
        if not got.is_floating_point():  # an integer buffer (the batch count) is taken as received
            assert torch.equal(got, received.state_dict()[name])
            continue
        locals_ = {c: updates[c].state_dict()[name].double() for c in kept}
        reference = sum(weights[c] * locals_[c] for c in kept if c != "a") / (1 - w)
        spread = sum(weights[c] * locals_[c].abs() for c in kept)
        tolerance = (1 + U) * _gamma(len(kept) + 1) * spread / (1 - w) + U * reference.abs()
        assert bool(((got.double() - reference).abs() <= tolerance).all()), name
        assert got.dtype == updates["a"].state_dict()[name].dtype
        if name.endswith("weight") and got.ndim > 1:  # a planted error: the tolerance is tight enough to see it
            assert not bool(((wrong[name].double() - reference).abs() <= tolerance).all()), name


def test_with_two_parties_a_left_out_other_shows_as_the_received_model_being_the_partys_own():
    rng = np.random.default_rng(1)
    torch.manual_seed(1)
    base = _tabular_model()
    updates = {"a": _perturbed(base, rng), "b": _perturbed(base, rng)}
    alone = _holding(base, _aggregate(updates, {"a": 30, "b": 40}, withheld=("b",)))
    both = _holding(base, _aggregate(updates, {"a": 30, "b": 40}))
    assert left_out_alone(alone, updates["a"]) and not left_out_alone(both, updates["a"])
    derived = others_model(both, updates["a"], 30 / 70)  # a model holding it, the two inputs unchanged
    assert torch.allclose(derived[0].weight, updates["b"][0].weight, rtol=0, atol=1e-5)
    assert torch.equal(both[0].weight, _holding(base, _aggregate(updates, {"a": 30, "b": 40}))[0].weight)


# ------------------------------------------------------------------------------------------ what the party knows


def _collaborators(gate=None, per_collaborator=None, mitigation=None):
    return parse_per_collaborator(per_collaborator, gate=gate, audit_settings=AuditSettings(), mitigation=mitigation)


class _Data:
    """The workspace loader's attributes the weight is read from."""

    def __init__(self, sizes, shard, own=None):
        self.train_sizes, self.shard = tuple(sizes), shard
        self.X_train = np.zeros((sizes[shard - 1] if own is None else own, 2), dtype=np.float32)


def test_the_partys_weight_from_the_plans_data_split_its_weights_or_why_it_is_unknown():
    settings = CrossRoundSettings(enabled=True)
    known = average_weight("collaborator2", _Data((40, 60, 100), 2), _collaborators(), settings)
    assert (known.value, known.parties, known.unknown) == (60 / 200, 3, None)
    # the plan names the weights: they win over the split
    named = average_weight("p", None, _collaborators(), CrossRoundSettings(weights={"p": 1.0, "q": 3.0}))
    assert (named.value, named.parties) == (0.25, 2)
    withhold = {"action": "withhold", "bound": "point", "thresholds": {"mia_local_loss_auc": 0.7}}
    cases = {
        "rule": (CrossRoundSettings(aggregation="other"), _Data((40, 60), 1), _collaborators(), "not a weighted"),
        "missing": (CrossRoundSettings(weights={"q": 1.0}), None, _collaborators(), "no weight for p"),
        "no sizes": (settings, object(), _collaborators(), "set cross_round.weights"),
        "alone": (settings, _Data((40,), 1), _collaborators(), "no other party"),
        "mitigation": (settings, _Data((40, 60, 80), 1), _collaborators(mitigation={"method": "rand_aug",
                                                                                    "alpha": 0.5}), "rand_aug"),
        "gates": (settings, _Data((40, 60, 80), 1), _collaborators(gate=withhold), "another party's gate"),
        "named gate": (settings, _Data((40, 60, 80), 1),
                       _collaborators(per_collaborator={"q": {"gate": withhold}}), "another party's gate"),
    }
    for case, (settings_, data, collaborators, said) in cases.items():
        found = average_weight("p", data, collaborators, settings_)
        assert found.value is None and said in found.unknown, case
    # with two parties a withheld other shows in the received model (test above): the gate does not make it unknown;
    # and the party's own gate is its own business (it knows its decision)
    assert average_weight("p", _Data((40, 60), 1), _collaborators(gate=withhold), settings).value == 0.4
    own_only = _collaborators(per_collaborator={"p": {"gate": withhold}})
    assert average_weight("p", _Data((40, 60, 80), 1), own_only, settings).value == 40 / 180
    # a data mitigation that keeps the size (replacing samples) leaves the weights known; the party's own size is
    # what it reports
    same = _collaborators(mitigation={"method": "bkg_repl", "alpha": 0.5})
    assert average_weight("p", _Data((40, 60), 1, own=40), same, settings).value == 0.4


def test_the_settings_name_their_keys_and_the_step_starts_in_round_one():
    with pytest.raises(ValueError, match=r"audit\.cross_round\.rounds_kep: .*did you mean rounds_kept"):
        cross_round_settings("audit.cross_round", {"rounds_kep": 3})
    with pytest.raises(ValueError, match=r"audit\.cross_round\.weights\.p: expected a finite number > 0"):
        cross_round_settings("audit.cross_round", {"weights": {"p": 0}})
    with pytest.raises(ValueError, match=r"audit\.cross_round\.rounds_kept"):
        cross_round_settings("audit.cross_round", {"rounds_kept": 0})
    settings = cross_round_settings("audit.cross_round", {"enabled": True})
    assert not settings.due(0) and settings.due(1)
    names = settings.metric_names([0.01, 0.1])
    assert all(n.startswith(CROSS_ROUND + "_") for n in names)  # its own prefix, which no other step shares
    assert step(CROSS_ROUND).metric_prefix == CROSS_ROUND + "_"
    assert [s.name for s in registered()].count(CROSS_ROUND) == 1


# ------------------------------------------------------------------------------------------ through the real audit


class _Federation:
    """Three parties of a tabular task, FedAvg through the plan's aggregation function; party 'a' is audited each
    round by the real audit with the step (its store and its after_sending hook as the party's audit drives them).
    `memorise`: 'a' trains on its members (many epochs); else on other samples of the same distribution, so its
    audit's "members" are samples no model saw (the null)."""

    def __init__(self, seed: int, *, memorise: bool, settings: AuditSettings, epochs: int = 40, n: int = 40):
        self.rng = np.random.default_rng(seed)
        torch.manual_seed(seed)
        self.settings, self.epochs = settings, epochs
        members, nonmembers, population = (_tabular(self.rng, n) for n in (n, n, 4 * n))
        self.sets = AuditSets(members, nonmembers, population, label=f"test-{seed}")
        self.train = {"a": members if memorise else _tabular(self.rng, n), "b": _tabular(self.rng, n),
                      "c": _tabular(self.rng, n)}
        self.sizes = {c: len(y) for c, (_, y) in self.train.items()}
        self.global_model, self.store, self.records = _tabular_model(), {}, []
        self.collaborators = _collaborators()

    def _local(self, party):
        model = copy.deepcopy(self.global_model)
        optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
        x, y = (torch.as_tensor(a) for a in self.train[party])
        for _ in range(self.epochs):
            optimiser.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimiser.step()
        return model

    def round(self, round_num: int, *, withheld=()):
        updates = {c: self._local(c) for c in self.sizes}
        self.records.append(audit_round(updates["a"], self.global_model, self.sets, self.settings, party="a",
                                        round_num=round_num, store=self.store, steps=(step(CROSS_ROUND),)))
        sent = SentUpdate("a", round_num, updates["a"], "a" not in withheld, None, self.collaborators)
        after_sending(self.store, sent, self.settings.cross_round)
        self.global_model = _holding(self.global_model, _aggregate(updates, self.sizes, withheld))
        return self.records[-1]


def _settings(confidence=0.95, **cross_round):
    return AuditSettings.from_mapping({
        "confidence": confidence, "fpr_tolerance": [0.05, 0.25], "signals": ["loss"],
        "cross_round": {"enabled": True, "signal": "loss", "weights": {"a": 1, "b": 1, "c": 1}, **cross_round}})


@pytest.mark.slow
def test_through_the_real_audit_a_party_that_trains_on_its_members_every_round_is_detected():
    federation = _Federation(0, memorise=True, settings=_settings(), epochs=100)
    for round_num in range(4):
        record = federation.round(round_num)
    assert record.extra[CROSS_ROUND]["rounds"] == [0, 1, 2]
    attack = record.attack(CROSS_ROUND, "loss")
    assert attack.exact_auc > 0.65
    found = {f["attack"] for f in record.leak["significant"]}
    assert record.leak["detected"] and f"{CROSS_ROUND} / loss" in found
    source = record.extra[CROSS_ROUND]["source"]
    assert source["rate"] > source["nonmember_rate"] and source["interval"][0] > source["chance"]
    assert record.metrics["cross_round_rounds"] == 3.0
    assert {"cross_round_loss_exact_auc", "cross_round_source_rate", "leak_detected"} <= set(record.metrics)
    line = summary(record)
    assert line.startswith("over 3 rounds (0-2), the aggregator could tell a's members with TPR ")
    assert "at FPR 0.05" in line and "chance 0.33" in line
    page = "".join(page_section(record, "round_0003", set()))
    assert "Across rounds: every update sent" in page and "with 3 parties the party compares" in page
    assert page.count("<tr><td>") == 3 and "attacked: weight 0.333 of 3 parties" in page


@pytest.mark.slow
def test_through_the_real_audit_the_verdict_is_wrong_at_most_at_its_level_when_nothing_leaks():
    """The null: party 'a' never trained on its audit's members (members, non-members and population one
    distribution). Three rounds attacked, the step alone in the verdict (its AUC, its TPR at two tolerances and the
    source test, Holm-corrected). At family-wise level 0.2, "leak detected" comes at most that often (binomial
    allowance at 1%)."""
    runs, detected = 40, 0
    for seed in range(runs):
        federation = _Federation(100 + seed, memorise=False, settings=_settings(confidence=0.8), epochs=10, n=30)
        for round_num in range(4):
            record = federation.round(round_num)
        assert record.leak["tests"] == 4
        detected += bool(record.leak["detected"])
    assert detected <= binom.isf(0.01, runs, 0.2), detected


def test_each_round_it_cannot_attack_says_why_and_reports_no_figure():
    settings = _settings()
    federation = _Federation(3, memorise=True, settings=settings, epochs=5)
    federation.round(0, withheld=("a",))  # its own update withheld: round 1 cannot attack round 0
    first = federation.round(1)
    log = first.extra[CROSS_ROUND]["log"]
    assert log[-1]["round"] == 0 and log[-1]["status"] == "skipped" and "not averaged" in log[-1]["reason"]
    assert first.attack(CROSS_ROUND, "loss") is None and first.metrics["cross_round_rounds"] == 0.0
    assert not any(k.startswith("cross_round_loss") for k in first.metrics)
    assert summary(first).startswith("cross-round attack: no round attacked yet (round 0: the party's update")
    assert "skipped: the party&#x27;s update of this round was not averaged" in "".join(page_section(first, "r", set()))
    second = federation.round(2)
    assert second.extra[CROSS_ROUND]["rounds"] == [1]
    # a robust aggregation: nothing is derived, every round says so
    robust = _Federation(3, memorise=True, settings=_settings(aggregation="other"), epochs=5)
    robust.round(0)
    said = robust.round(1).extra[CROSS_ROUND]["log"][-1]
    assert said["status"] == "skipped" and "not a weighted average" in said["reason"]
    # the step's state held nothing but the pending update: no round was attacked
    assert robust.store[STORE_KEY].history.nbytes == 0


@pytest.mark.slow
def test_the_private_state_is_bounded_by_the_rounds_kept_and_written_0600(tmp_path):
    federation = _Federation(5, memorise=True, settings=_settings(rounds_kept=2), epochs=3, n=20)
    sizes = federation.sets.sizes()
    per_round = sum(sizes.values()) * (2 * 1 * 4 + 8)  # own and others' loss (float32), the evidence (float64)
    seen = []
    for round_num in range(6):
        record = federation.round(round_num)
        state = federation.store[STORE_KEY]
        if round_num:
            seen.append(state.history.nbytes)
            assert record.extra[CROSS_ROUND]["state"] == {"bytes": state.history.nbytes, "bound_bytes": 2 * per_round,
                                                          "dtype": "float32"}
            assert len(state.log) <= 2
    assert seen == [per_round, 2 * per_round, 2 * per_round, 2 * per_round, 2 * per_round]
    assert record.extra[CROSS_ROUND]["rounds"] == [3, 4]
    os.umask(0o022)
    for write in record.private:
        write(tmp_path)
    mode = stat.S_IMODE(os.stat(tmp_path / CROSS_ROUND_FILE).st_mode)
    assert mode == 0o600
    with np.load(tmp_path / CROSS_ROUND_FILE) as saved:  # this round's signals and the scores: no earlier round's
        assert sorted(saved.files) == sorted([f"round_4_{w}_loss_{s}" for w in ("own", "others")
                                              for s in ("members", "nonmembers", "population")]
                                             + [f"score_{s}" for s in ("members", "nonmembers", "population")])
    assert all(np.isscalar(v) or isinstance(v, float) for v in record.metrics.values())


def test_the_statistic_and_the_source_rule_on_hand_made_signals():
    """Members two units better under their own update every round, non-members and population not: the combined
    score separates them; the source rule names the party for a member whose summed loss is lower under its own."""
    rng = np.random.default_rng(0)
    own = {s: rng.normal(size=(3, 50)) for s in ("members", "nonmembers", "population")}
    others = {s: own[s] + rng.normal(size=(3, 50)) for s in own}
    others["members"] = others["members"] + 2.0
    rounds = [{s: round_statistic(own[s][i], others[s][i], "loss") for s in own} for i in range(3)]
    scores = combined_scores(rounds)
    assert scores["members"].mean() > 0.8 > scores["nonmembers"].mean()
    assert np.all((0 <= scores["population"]) & (scores["population"] <= 1))
    found = source_inference(own, others, parties=4)
    assert found.members_own == int(np.sum(own["members"].sum(0) < others["members"].sum(0)))
    assert found.chance == 0.25 and found.rate > found.nonmember_rate
    assert round_statistic(np.array([1.0]), np.array([3.0]), "logits")[0] == -2.0  # members higher on the margin
    assert math.isclose(round_statistic(np.array([1.0]), np.array([3.0]), "loss")[0], 2.0)


# ------------------------------------------------------------------------------------------ the party's own audit


@pytest.mark.slow
def test_the_partys_audit_hands_the_step_what_it_sent_and_the_next_round_attacks_it(tmp_path,
                                                                                      without_report_drawing):
    """audit.party_audit.PartyAudit driven by hand for two rounds (no OpenFL): after round 0's gate the step learns
    the sent update and the party's weight from the data split; round 1's audit derives the other party's update from
    the received global model (the plan's aggregation of both) and attacks round 0; with a gate that withholds, the
    next round says the update was not averaged."""
    from audit.party_audit import PartyAudit

    rng = np.random.default_rng(4)
    (x_train, y_train), (x_valid, y_valid), (x_pop, y_pop) = (_tabular(rng, n) for n in (30, 30, 60))
    data = type("Data", (), {})()
    data.X_train, data.y_train, data.X_valid, data.y_valid = x_train, y_train, x_valid, y_valid
    data.X_population, data.y_population, data.batch_size, data.dirichlet_alpha = x_pop, y_pop, 16, None
    data.shard, data.train_sizes = 1, (30, 45)  # the workspace's loader says every party's size
    data.get_audit_sets = lambda: {"members": (x_train, y_train), "nonmembers": (x_valid, y_valid),
                                   "population": (x_pop, y_pop)}

    def party_audit(gate):
        return PartyAudit(audit={"signals": ["loss"], "fpr_tolerance": [0.1], "rmia": {"enabled": False},
                                 "cross_round": {"enabled": True}, "report_dir": str(tmp_path / str(bool(gate)))},
                          gate=gate, per_collaborator=None, mitigation=None, prefix="task_runner.settings", seed=1,
                          data=data, optimizer=("Adam", 0.01, 0.0), party="alice")

    def rounds(party):
        torch.manual_seed(3)
        model, other = _tabular_model(), _tabular(rng, 45)
        party.use_model(model, _tabular_model, (FEATURES,), "cpu")
        records = []
        for round_num in range(2):
            received = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
            verdict = party.check_received("alice", round_num, received)
            start = copy.deepcopy(model)
            plan = party.before_training("alice", round_num, 2, verdict, received_model=lambda: copy.deepcopy(start))
            for local, (x, y) in ((model, (x_train, y_train)), (bob := copy.deepcopy(start), other)):
                optimiser = party.make_optimizer(local, plan.learning_rate)
                for _ in range(20):
                    optimiser.zero_grad()
                    nn.functional.cross_entropy(local(torch.as_tensor(x)), torch.as_tensor(y)).backward()
                    optimiser.step()
            trained = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
            outcome = party.after_training(trained, received, train_loss=0.5, train_seconds=0.1)
            records.append(outcome.record)
            kept = () if outcome.scalars["gate_kept"] else ("alice",)
            model.load_state_dict(_holding(model, _aggregate({"alice": copy.deepcopy(model), "bob": bob},
                                                             {"alice": 30, "bob": 45}, kept)).state_dict())
        return records

    records = rounds(party_audit(None))
    assert records[1].extra[CROSS_ROUND]["rounds"] == [0]
    assert records[1].extra[CROSS_ROUND]["log"] == [{"round": 0, "status": "attacked", "weight": 30 / 75,
                                                     "parties": 2}]
    assert 0.0 <= records[1].metrics["cross_round_logits_exact_auc"] <= 1.0  # the default signal, the margin
    withheld = rounds(party_audit({"action": "withhold", "bound": "point", "thresholds": {"mia_local_loss_auc": 0.0}}))
    said = withheld[1].extra[CROSS_ROUND]["log"][-1]
    assert said["status"] == "skipped" and "not averaged" in said["reason"]


def test_a_plan_whose_train_task_does_not_average_with_weights_is_refused_unless_the_step_says_so():
    from src.plan.checks import check_cross_round

    def plan(template, **section):
        return {"task_runner": {"settings": {"audit": {"cross_round": {"enabled": True, **section}}}},
                "tasks": {"learn": {"function": "train_task", "aggregation_type": {"template": template}},
                          "check": {"function": "validate_task"}}}

    robust = "openfl.interface.aggregation_functions.GeometricMedian"
    with pytest.raises(ValueError, match=r"^task_runner\.settings\.audit\.cross_round\.aggregation: weighted_average, "
                                         r"but tasks\.learn\.aggregation_type is .*GeometricMedian: set "
                                         r"cross_round\.aggregation: other"):
        check_cross_round(plan(robust))
    check_cross_round(plan(robust, aggregation="other"))  # said: every round is skipped, with the reason
    check_cross_round(plan("src.aggregation.GatedWeightedAverage"))
    check_cross_round({**plan(robust), "tasks": {"learn": {"function": "train_task"}}})  # OpenFL's default average
    built = plan(robust)  # a plan OpenFL has built holds the function object itself
    built["tasks"]["learn"]["aggregation_type"] = GatedWeightedAverage()
    check_cross_round(built)
    built["tasks"]["learn"]["aggregation_type"] = object()
    with pytest.raises(ValueError, match=r"aggregation_type is builtins\.object"):
        check_cross_round(built)
    check_cross_round(plan(robust, enabled=False))
