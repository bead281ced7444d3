"""The received-model check in real in-process federations (OpenFL's Aggregator and Collaborators).

A dishonest server: the aggregator hands each party, in round 2, a global model it built from the round's honest one
with a published construction (tests/crafted_models.py). Every party rejects it before any training: its validation
does not run it, its training does not start, it sends back the global model it last accepted with gate_kept 0 and
the verdict, and the aggregator's report shows which parties rejected which round's model. In the FCNN federation a
sixth party gets the honest model and trains, so the rejecting parties must send the audit's names too (as NaN).

Honest servers: 20 rounds for each of three models (the plan's CNN and FCNN, a model with BatchNorm), with IID and
label-skewed parties (two; the second sends dp_fedavg-noised updates): no alarm at all.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import numpy as np
import pytest
from openfl.federated import PyTorchTaskRunner
from openfl.utilities import TensorKey
from torch import nn

import src.runner.models
import audit.party_audit as party_audit
from audit.config.audit_settings import AuditSettings
from crafted_models import class_fishing, imprint, layer_inputs, pass_through_convolution, trap_weights
from src.aggregator import AuditingAggregator
from report_drawing import pages_drawn_at_the_end, without_report_drawing  # noqa: F401  (a fixture)
from src.data.datasets import load_dataset
from workspace.in_process import run_in_process
from workspace.plan_file import collaborator_names

pytestmark = [pytest.mark.federation, pytest.mark.usefixtures("one_torch_thread")]

CRAFT_ROUND = 2
# Tiny and fast: the membership audit only in round 0, no RMIA; the received-model check every round.
LIGHT_AUDIT = {"interval": 1000, "signals": ["loss"], "audit_global": False, "update_attack": False,
               "rmia": {"enabled": False}}


def _public_digits() -> np.ndarray:
    """What a server of a digits federation holds: the public dataset (scaled as the parties scale it)."""
    x, _ = load_dataset("digits")
    return np.asarray(x, dtype=np.float32)


def _crafts(model: str) -> dict:
    """Per party, the construction the server sends it: (what, function of the honest state dict)."""
    public = _public_digits()
    template = src.runner.models.build_model(model, (1, 8, 8), 10)
    flat = public.reshape(len(public), -1).astype(np.float64)

    def fc1_inputs(state):
        return layer_inputs(template, state, "classifier.fc1", public)

    if model == "fcnn":
        return {
            "collaborator1": ("imprint, 32 bins", lambda s: imprint(s, "classifier.fc1", "classifier.fc2", flat, 32)),
            "collaborator2": ("imprint, 64 bins", lambda s: imprint(s, "classifier.fc1", "classifier.fc2", flat, 64)),
            "collaborator3": ("imprint, 128 bins", lambda s: imprint(s, "classifier.fc1", "classifier.fc2", flat, 128)),
            "collaborator4": ("trap weights", lambda s: trap_weights(s, "classifier.fc1", flat)),
            "collaborator5": ("class fishing", lambda s: class_fishing(s, "classifier.out", target=3)),
        }

    def through(s):
        return pass_through_convolution(s, "features.conv1")

    def shape(s):
        out = dict(s)
        out["classifier.fc1.weight"] = np.zeros((64, s["classifier.fc1.weight"].shape[1]), dtype=np.float32)
        return out

    def imprinted(bins):
        return lambda s: imprint(through(s), "classifier.fc1", "classifier.fc2", fc1_inputs(through(s)), bins)

    return {
        "collaborator1": ("pass-through + imprint, 32 bins", imprinted(32)),
        "collaborator2": ("pass-through + imprint, 64 bins", imprinted(64)),
        "collaborator3": ("pass-through + imprint, 128 bins", imprinted(128)),
        "collaborator4": ("pass-through + trap weights",
                          lambda s: trap_weights(through(s), "classifier.fc1", fc1_inputs(through(s)))),
        "collaborator5": ("a tensor of another shape", shape),
    }


def _crafting_server(monkeypatch, crafts: dict) -> dict:
    """AuditingAggregator.get_aggregated_tensor answering each party's requests for round CRAFT_ROUND's model with
    its construction, built from that round's honest global model; returns what was built, per party."""
    honest_answer = AuditingAggregator.get_aggregated_tensor
    built: dict = {}

    def answer(self, tensor_name, round_number, report, tags, require_lossless, requested_by):
        if round_number != CRAFT_ROUND or "model" not in tags or requested_by not in crafts:
            return honest_answer(self, tensor_name, round_number, report, tags, require_lossless, requested_by)
        if requested_by not in built:
            honest = {name.removeprefix("model."): self.tensor_db.get_tensor_from_cache(
                TensorKey(name, self.uuid, round_number, False, ("model",))) for name in self._tensor_names}
            crafted = crafts[requested_by][1](honest)
            built[requested_by] = {f"model.{n}": np.asarray(v, dtype=np.float32) for n, v in crafted.items()}
        key = TensorKey(tensor_name, self.uuid, round_number, report, tuple(tags))
        return self._nparray_to_named_tensor(key, built[requested_by][tensor_name], send_model_deltas=False,
                                             compress_lossless=True)

    monkeypatch.setattr(AuditingAggregator, "get_aggregated_tensor", answer)
    return built


def _trained_rounds(monkeypatch) -> list:
    """(party, round) of every local training that starts (OpenFL's PyTorchTaskRunner.train_task trains)."""
    seen: list = []
    train = PyTorchTaskRunner.train_task

    def spy(self, col_name, round_num, *args, **kwargs):
        seen.append((col_name, round_num))
        return train(self, col_name, round_num, *args, **kwargs)

    monkeypatch.setattr(PyTorchTaskRunner, "train_task", spy)
    return seen


def _verdicts(monkeypatch) -> dict:
    """(party, round) -> the details of every verdict the task runners' checks gave (audit.before_training); under
    ("received", party, round) the model the check was given."""
    seen: dict = {}
    check = party_audit.check_received

    def spy(received, *args, **kwargs):
        verdict = check(received, *args, **kwargs)
        seen[(kwargs["party"], kwargs["round_num"])] = verdict.details()
        seen[("received", kwargs["party"], kwargs["round_num"])] = dict(received)
        return verdict

    monkeypatch.setattr(party_audit, "check_received", spy)
    return seen


def _crafted_federation(tmp_path_factory, model: str, *, honest_party: bool = False):
    """Five parties each sent a construction in round CRAFT_ROUND; with `honest_party` a sixth gets the honest model
    and that round is audited, so that its parties send different audits (OpenFL needs the same names)."""
    # The tests read the reports' pages, no image (tests/report_drawing.py).
    with pytest.MonkeyPatch.context() as monkeypatch, pages_drawn_at_the_end(images=False):
        crafts = _crafts(model)
        built = _crafting_server(monkeypatch, crafts)
        trained = _trained_rounds(monkeypatch)
        verdicts = _verdicts(monkeypatch)
        audit = {**LIGHT_AUDIT, "interval": CRAFT_ROUND} if honest_party else LIGHT_AUDIT  # audits round 2
        overrides = {
            "tasks": {"train": {"kwargs": {"epochs": 1}}},
            "data_loader": {"settings": {"train_dataset_ratio": 0.2, "test_dataset_ratio": 0.1,
                                         "audit_dataset_ratio": 0.1}},
            "task_runner": {"settings": {"model": model, "audit": audit}},
        }
        result = run_in_process(tmp_path_factory.mktemp(f"crafted_{model}"), collaborators=6 if honest_party else 5,
                                rounds=CRAFT_ROUND + 1, overrides=overrides)
    return result, crafts, built, trained, verdicts


@pytest.fixture(scope="module")
def crafted_fcnn(tmp_path_factory):
    return _crafted_federation(tmp_path_factory, "fcnn", honest_party=True)


@pytest.fixture(scope="module")
def crafted_cnn(tmp_path_factory):
    return _crafted_federation(tmp_path_factory, "cnn")


def _record(result, party: str, round_num: int) -> dict:
    return json.loads((result.report_dir / party / f"round_{round_num:04d}" / "audit.json").read_text())


# The signature each construction must show among the alarms (whatever fired first).
SIGNATURES = {
    "imprint": "rows of classifier.fc1 are scaled copies of one direction",
    "trap weights": "live neurons of classifier.fc1",
    "class fishing": "largest class weight row of classifier.out",
    "a tensor of another shape": "architecture: classifier.fc1.weight has shape (64, 512), the plan's (128, 512)",
}


# Both named, not only fetched by name: they are then in the tests' fixture closure, which keeps every test of a
# crafted federation on one xdist worker, where it is built once (tests/conftest.py).
@pytest.mark.usefixtures("crafted_fcnn", "crafted_cnn")
@pytest.mark.parametrize("fixture", ["crafted_fcnn", "crafted_cnn"])
def test_every_construction_is_rejected_before_any_training(fixture, request):
    result, crafts, built, trained, verdicts = request.getfixturevalue(fixture)
    assert set(built) == set(crafts)  # the server did send every construction
    for party, (what, _craft) in crafts.items():
        assert (party, 0) in trained and (party, 1) in trained
        assert (party, CRAFT_ROUND) not in trained, f"{party} trained on {what}"
        record = _record(result, party, CRAFT_ROUND)
        gate = record["extra"]["gate"]
        assert gate["verdict"] == "withheld" and gate["reason"].startswith("received model rejected: "), gate
        checks = record["extra"]["received_model"]
        assert checks["rejected"] and checks["reason"] == gate["reason"]
        signature = next(v for k, v in SIGNATURES.items() if k in what)
        assert any(signature in alarm for alarm in checks["received_model"]["alarms"]), (what, checks)
        assert record["metrics"] == {"received_model_alarm": 1.0, "received_model_rejected": 1.0}
        # the honest rounds before passed the same checks (once per round: validation and training share them)
        assert [verdicts[(party, r)]["alarms"] for r in range(CRAFT_ROUND)] == [[]] * CRAFT_ROUND


# Both named, not only fetched by name: they are then in the tests' fixture closure, which keeps every test of a
# crafted federation on one xdist worker, where it is built once (tests/conftest.py).
@pytest.mark.usefixtures("crafted_fcnn", "crafted_cnn")
@pytest.mark.parametrize("fixture", ["crafted_fcnn", "crafted_cnn"])
def test_a_rejecting_party_sends_nothing_new_and_only_its_verdict(fixture, request):
    result, crafts, _built, _trained, _verdicts = request.getfixturevalue(fixture)
    metrics = result.collaborator_metrics
    sent_by_trained = {k.split("/", 2)[2] for k in metrics[CRAFT_ROUND] if k.startswith("collaborator6/train/")}
    sent_before = {k.split("/", 2)[2] for k in metrics[CRAFT_ROUND - 1] if k.startswith("collaborator1/train/")}
    for party in crafts:
        round_metrics = metrics[CRAFT_ROUND]
        assert round_metrics[f"{party}/train/received_model_rejected"] == 1.0
        assert round_metrics[f"{party}/train/gate_kept"] == 0.0
        # the rejected model was never run on the validation set; what it sent back was
        assert math.isnan(round_metrics[f"{party}/aggregated_model_validation/accuracy"])
        assert math.isfinite(round_metrics[f"{party}/locally_tuned_model_validation/accuracy"])
        sent = {k for k in metrics[CRAFT_ROUND] if k.startswith(f"{party}/train/")}
        # the scalars of any round (those a trained party sends this round): no figure of the check
        assert {k.split("/", 2)[2] for k in sent} == (sent_by_trained or sent_before)
    start, end = result.global_weights(CRAFT_ROUND), result.global_weights(CRAFT_ROUND + 1)
    honest = [p for p in collaborator_names(len(result.collaborators)) if p not in crafts]
    if not honest:  # every party left out: the round's model is the one it started from
        assert all(np.array_equal(start[name], end[name]) for name in start)
    else:  # the honest party's update alone was averaged, and it sent the same names (its audit's among them)
        (party,) = honest
        assert metrics[CRAFT_ROUND][f"{party}/train/gate_kept"] == 1.0
        assert not all(np.array_equal(start[name], end[name]) for name in start)
        audit_names = [k for k in metrics[CRAFT_ROUND] if k.startswith(f"{party}/train/mia_")]
        assert audit_names and all(math.isnan(metrics[CRAFT_ROUND][k.replace(party, p)]) for k in audit_names
                                   for p in crafts)
    # the aggregator holds only scalars of the check
    db = result.aggregator.tensor_db.tensor_db
    rows = db[db["tensor_name"].str.startswith("received_model_")]
    assert len(rows) and all(np.asarray(a).size == 1 for a in rows["nparray"])


def test_the_aggregator_page_shows_who_rejected_which_round(crafted_fcnn):
    result, crafts, _built, _trained, _verdicts = crafted_fcnn
    report = json.loads((result.aggregator_report_dir / f"round_{CRAFT_ROUND:04d}.json").read_text())
    assert report["rejected_received_model"] == sorted(crafts) and report["kept"] == ["collaborator6"]
    assert all("rejected this round's global model" in report["collaborators"][p]["reason"] for p in crafts)
    earlier = json.loads((result.aggregator_report_dir / f"round_{CRAFT_ROUND - 1:04d}.json").read_text())
    assert earlier["rejected_received_model"] == [] and earlier["received_model_alarms"] == []
    page = (result.aggregator_report_dir / "index.html").read_text()
    assert "Received global model: checks before training" in page and "rejected the received model" in page


def test_the_rejecting_partys_report_says_why(crafted_cnn):
    result, _crafts, _built, _trained, _verdicts = crafted_cnn
    page = (result.report_dir / "collaborator5" / "index.html").read_text()
    assert "received model rejected: architecture: classifier.fc1.weight has shape (64, 512)" in page


def _scalars(global_out: dict) -> dict:
    return {key.tensor_name: float(value) for key, value in global_out.items() if "metric" in key.tags}


def test_tensors_named_otherwise_are_rejected_by_the_task_runner(crafted_cnn, monkeypatch):
    """OpenFL requests each tensor by the plan's name, so through it a server cannot rename one; another transport
    could. Handed a model that lacks one of the plan's tensors and holds one the plan does not have, the task runner
    rejects it before training and sends back the model it last accepted, in the plan's names and shapes."""
    result, _crafts, _built, _trained, verdicts = crafted_cnn
    runner = result.runner("collaborator1")
    trained = _trained_rounds(monkeypatch)
    received = dict(result.global_weights(CRAFT_ROUND + 1))
    received["model.classifier.output.weight"] = received.pop("model.classifier.out.weight")
    global_out, local_out = runner.train_task("collaborator1", CRAFT_ROUND + 1, received, epochs=1)
    assert trained == []
    reason = runner.last_record.extra["gate"]["reason"]
    assert reason == ("received model rejected: architecture: unexpected tensor 'classifier.output.weight' (did you "
                      "mean 'classifier.out.weight'?) (and 1 more)")
    assert runner.last_record.extra["received_model"]["received_model"]["architecture"]["problems"][1] == \
        "missing tensor 'classifier.out.weight'"
    scalars = _scalars(global_out)
    assert scalars["gate_kept"] == 0.0 and scalars["received_model_rejected"] == 1.0
    accepted = {f"model.{name}": value for name, value in  # round 2's model was rejected too
                verdicts[("received", "collaborator1", CRAFT_ROUND - 1)].items()}
    sent = {key.tensor_name: value for key, value in global_out.items() if "trained" in key.tags}
    assert set(sent) == set(accepted) and all(np.array_equal(sent[n], accepted[n]) for n in sent)


def test_report_only_records_the_alarm_and_trains(crafted_cnn, monkeypatch):
    result, _crafts, built, _trained, _verdicts = crafted_cnn
    runner = result.runner("collaborator3")
    report_only = runner.audit_settings.to_dict()
    report_only["received_model"]["action"] = "report_only"
    monkeypatch.setattr(runner.audit, "settings", AuditSettings.from_mapping(report_only))
    trained = _trained_rounds(monkeypatch)
    global_out, _local = runner.train_task("collaborator3", CRAFT_ROUND + 1, dict(built["collaborator3"]), epochs=1)
    assert trained == [("collaborator3", CRAFT_ROUND + 1)]
    record = runner.last_record
    assert record.extra["received_model"]["alarms"] and not record.extra["received_model"]["rejected"]
    assert record.extra["gate"]["verdict"] == "kept"
    scalars = _scalars(global_out)
    assert scalars["received_model_alarm"] == 1.0 and scalars["received_model_rejected"] == 0.0
    assert scalars["gate_kept"] == 1.0
    # written to the party's report although the audit skips this round
    assert (result.report_dir / "collaborator3" / f"round_{CRAFT_ROUND + 1:04d}" / "audit.json").is_file()


# ---------------------------------------------------------------------------------------------- honest servers

class BatchNormNet(nn.Module):
    """A small CNN with BatchNorm after its convolution and its first dense layer (running statistics move every
    round; num_batches_tracked is an int64 buffer OpenFL sends as float32)."""

    FIRST_DENSE_LAYER = "classifier.fc1"

    def __init__(self, input_shape, num_classes):
        super().__init__()
        c, h, w = input_shape
        self.features = nn.Sequential(OrderedDict(
            conv1=nn.Conv2d(c, 8, 3, padding=1), bn1=nn.BatchNorm2d(8), act1=nn.ReLU(), pool1=nn.MaxPool2d(2),
            flatten=nn.Flatten()))
        self.classifier = nn.Sequential(OrderedDict(
            fc1=nn.Linear(8 * (h // 2) * (w // 2), 32), bn2=nn.BatchNorm1d(32), act1=nn.ReLU(),
            out=nn.Linear(32, num_classes)))

    def forward(self, x):
        return self.classifier(self.features(x))


HONEST_ROUNDS = 20


def _honest_federation(tmp_path_factory, model: str, alpha):
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setitem(src.runner.models._CLASSES, "batchnorm_cnn", BatchNormNet)
        verdicts = _verdicts(monkeypatch)
        overrides = {
            "tasks": {"train": {"kwargs": {"epochs": 1}}},
            # the check runs in whichever task first receives the round's model: here the training
            "assigner": {"settings": {"task_groups": [{"name": "learning", "percentage": 1.0, "tasks": ["train"]}]}},
            "data_loader": {"settings": {"train_dataset_ratio": 0.15, "test_dataset_ratio": 0.05,
                                         "audit_dataset_ratio": 0.05, "dirichlet_alpha": alpha}},
            "task_runner": {"settings": {
                # the received-model check is the subject: the dp_fedavg updates' own canary check is left out
                "model": model, "audit": {**LIGHT_AUDIT, "canary": {"dp_check": False}},
                "per_collaborator": {"collaborator2": {"mitigation": {"method": "dp_fedavg", "clip": 1.0,
                                                                      "sigma": 0.05}}}}},
        }
        result = run_in_process(tmp_path_factory.mktemp(f"honest_{model}_{alpha}"), collaborators=2,
                                rounds=HONEST_ROUNDS, overrides=overrides)
    return result, verdicts


@pytest.mark.parametrize("alpha", [None, 0.3], ids=["iid", "skewed"])
@pytest.mark.parametrize("model", ["cnn", "fcnn", "batchnorm_cnn"])
@pytest.mark.usefixtures("without_report_drawing")  # the verdicts and metrics are the subject, not the pages
def test_no_false_alarm_over_twenty_honest_rounds(model, alpha, tmp_path_factory):
    result, verdicts = _honest_federation(tmp_path_factory, model, alpha)
    parties = collaborator_names(2)
    verdicts = {key: v for key, v in verdicts.items() if key[0] != "received"}
    assert set(verdicts) == {(p, r) for p in parties for r in range(HONEST_ROUNDS)}
    for (party, round_num), verdict in sorted(verdicts.items()):
        assert verdict["alarms"] == [] and not verdict["rejected"], (party, round_num, verdict["alarms"])
        checks = verdict["received_model"]
        if round_num >= 1:  # judged against the earlier rounds, not skipped
            assert checks["history"]["judged"] > 0, (party, round_num)
        assert checks["probe"]["judged"]
    # the aggregator saw the same: every party, every round, no alarm, every update averaged
    for round_num, metrics in enumerate(result.collaborator_metrics):
        for party in parties:
            assert metrics[f"{party}/train/received_model_alarm"] == 0.0
            assert metrics[f"{party}/train/gate_kept"] == 1.0
    noised = json.loads((result.report_dir / "collaborator2" / "round_0000" / "audit.json").read_text())
    assert noised["extra"]["mitigation"]["method"] == "dp_fedavg"  # collaborator2 sent noised updates
