"""audit.membership.signal_cache: a round's signals computed once per model state and set label, and the validation
tasks that read their accuracy off them instead of running the model again."""

import copy

import numpy as np
import pytest
import torch
from openfl.federated.task.runner_pt import PyTorchTaskRunner
from torch import nn

import audit.membership.signal_cache as cache_module
from audit.membership.signal_cache import SignalCache, state_fingerprint
from audit.membership.signals import compute_signals
from audit.round_audit import SETS, AuditSets
from report_drawing import without_report_drawing  # noqa: F401  (a fixture)
from workspace.in_process import run_in_process

NAMES = ["loss", "logits", "gradient_norm"]


def tabular_model(seed=0):
    """A tabular MLP with a BatchNorm (eval mode: running statistics)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, 4))
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.3, 0.3)
        model[1].running_var.uniform_(0.5, 1.5)
    return model


def tabular_sets(seed=1):
    rng = np.random.default_rng(seed)
    return AuditSets(*[(rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 4, n)) for n in (9, 7, 11)])


@pytest.fixture
def counted(monkeypatch):
    """Counts compute_signals calls made through the cache."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return compute_signals(*args, **kwargs)

    monkeypatch.setattr(cache_module, "compute_signals", counting)
    return calls


def test_values_are_compute_signals_bit_for_bit(counted):
    model, sets = tabular_model(), tabular_sets()
    values, seconds, reused = SignalCache().signals(model, sets, NAMES, layer=None, batch_size=4)
    for set_name in SETS:
        x, y = sets.tensors(set_name)
        want = compute_signals(model, x, y, NAMES, batch_size=4)
        for name in NAMES:
            assert np.array_equal(values[name][set_name], want[name])
    assert reused == dict.fromkeys(SETS, False) and len(counted) == 3
    assert set(seconds) == set(NAMES) and all(s >= 0 for s in seconds.values())


def test_same_weights_in_another_module_are_reused(counted):
    cache, model, sets = SignalCache(), tabular_model(), tabular_sets()
    first, _, _ = cache.signals(model, sets, NAMES, layer=None, batch_size=4)
    again, _, reused = cache.signals(copy.deepcopy(model), sets, ["loss"], layer=None, batch_size=4)
    assert reused == dict.fromkeys(SETS, True) and len(counted) == 3
    assert all(np.array_equal(again["loss"][s], first["loss"][s]) for s in SETS)


@pytest.mark.parametrize("change", ["weights", "buffer", "batch_size", "layer", "other_label", "new_signal", "round"])
def test_anything_that_can_change_a_value_is_computed_afresh(counted, change):
    cache, model, sets = SignalCache(), tabular_model(), tabular_sets()
    cache.start_round(0)
    cache.signals(model, sets, ["loss", "logits"], layer=None, batch_size=4)
    kwargs = {"layer": None, "batch_size": 4}
    names = ["loss", "logits"]
    if change == "weights":
        with torch.no_grad():
            model[0].weight[0, 0] += 1e-6
    elif change == "buffer":
        model[1].running_var[0] += 1e-3
    elif change == "batch_size":
        kwargs["batch_size"] = 5
    elif change == "layer":
        kwargs["layer"] = "3"
    elif change == "other_label":  # new AuditSets (as the data mitigation makes): a label of their own
        sets = AuditSets(sets.members, (sets.nonmembers[0].copy(), sets.nonmembers[1]), sets.population)
    elif change == "new_signal":
        names = ["loss", "gradient_norm"]
    elif change == "round":
        cache.start_round(1)
    values, _, reused = cache.signals(model, sets, names, **kwargs)
    assert not any(reused.values())
    for set_name in SETS:
        x, y = sets.tensors(set_name)
        want = compute_signals(model, x, y, names, **kwargs)
        assert all(np.array_equal(values[n][set_name], want[n]) for n in names)


def test_accuracy_is_the_share_of_right_predictions_of_those_weights():
    cache, model, sets = SignalCache(), tabular_model(), tabular_sets()
    x, y = sets.nonmembers
    assert cache.accuracy(model, sets, "nonmembers") is None  # nothing computed yet
    cache.signals(model, sets, ["gradient_norm", "loss"], layer=None, batch_size=3)
    with torch.no_grad():
        want = float((model.eval()(torch.as_tensor(x)).argmax(1).numpy() == y).mean())
    assert cache.accuracy(copy.deepcopy(model), sets, "nonmembers") == want
    other = AuditSets(sets.members, sets.nonmembers, sets.population)  # other sets (a label of their own)
    assert cache.accuracy(model, other, "nonmembers") is None
    assert cache.accuracy(tabular_model(seed=5), sets, "nonmembers") is None  # other weights


def test_a_hit_for_the_same_model_state_and_set_label_a_miss_once_the_model_changes(counted):
    """The cache's key is explicit: the model's state (its fingerprint, whatever module holds it) and the set's label
    and name. The same label with other array objects (a caller's copies) is a hit; weights changed in place
    (the task runner loads every round's weights into one module) are a miss, and so is another label."""
    cache, model, sets = SignalCache(), tabular_model(), tabular_sets()
    cache.signals(model, sets, ["loss"], layer=None, batch_size=4)
    assert len(counted) == 3 and len(cache) == 3
    copied = AuditSets(*[(x.copy(), y.copy()) for x, y in (sets.members, sets.nonmembers, sets.population)],
                       label=sets.label)
    _, _, reused = cache.signals(model, copied, ["loss"], layer=None, batch_size=4)
    assert reused == dict.fromkeys(SETS, True) and len(counted) == 3
    with torch.no_grad():
        model[3].bias[0] += 0.5
    values, _, reused = cache.signals(model, sets, ["loss"], layer=None, batch_size=4)
    assert not any(reused.values()) and len(counted) == 6 and len(cache) == 6
    x, y = sets.tensors("members")
    assert np.array_equal(values["loss"]["members"], compute_signals(model, x, y, ["loss"], batch_size=4)["loss"])
    relabelled = sets.labelled("other")
    _, _, reused = cache.signals(model, relabelled, ["loss"], layer=None, batch_size=4)
    assert not any(reused.values()) and len(counted) == 9


def test_a_sample_is_labelled_by_its_source_size_and_seed():
    sets = tabular_sets()
    assert sets.sampled(5, seed=3).label == sets.sampled(5, seed=3).label != sets.sampled(5, seed=4).label
    assert sets.sampled(100, seed=3) is sets  # nothing to draw: the sets themselves
    assert AuditSets(sets.members, sets.nonmembers, sets.population).label != sets.label


def test_gradient_norm_alone_without_a_forward_pass_gives_no_accuracy():
    """The general gradient path returns no outputs: the validation then runs its own loop."""
    cache, model, sets = SignalCache(), tabular_model(), tabular_sets()
    cache.signals(model, sets, ["gradient_norm"], layer=None, batch_size=4)
    assert cache.accuracy(model, sets, "nonmembers") is None


def test_fingerprint_sees_names_values_and_buffers():
    model = tabular_model()
    base = state_fingerprint(model)
    assert state_fingerprint(copy.deepcopy(model)) == base
    changed = copy.deepcopy(model)
    changed[1].num_batches_tracked += 1
    assert state_fingerprint(changed) != base
    renamed = nn.Sequential(*list(model.children())[:3], nn.Identity(), list(model.children())[3])
    assert state_fingerprint(renamed) != base  # same tensors under other names


def test_weights_fingerprint_is_the_same_for_a_models_state_and_the_arrays_a_party_receives():
    """weights_fingerprint: a model's tensors and numpy copies of them (what a party receives) give one fingerprint;
    one bit (-0.0 against 0.0), the dtype, the shape or the order changes it; bfloat16 tensors and an Embedding's
    weights are read by their bytes."""
    import numpy as np
    import torch

    from audit.model_io import weights_fingerprint

    model = nn.Sequential(nn.Embedding(7, 3), nn.Flatten(), nn.Linear(6, 2))
    named = list(model.state_dict().items())
    base = weights_fingerprint(named)
    arrays = [(k, v.detach().numpy().copy()) for k, v in named]
    assert weights_fingerprint(arrays) == base
    zero = [(k, np.zeros_like(v)) for k, v in arrays]
    negative_zero = [(k, -np.zeros_like(v)) for k, v in arrays]
    assert weights_fingerprint(zero) != weights_fingerprint(negative_zero)
    assert weights_fingerprint([(k, v.astype(np.float64)) for k, v in arrays]) != base
    assert weights_fingerprint([(k, v.reshape(-1)) for k, v in arrays]) != base
    assert weights_fingerprint(arrays[::-1]) != base
    half = [(k, v.to(torch.bfloat16)) for k, v in named]
    assert weights_fingerprint(half) == weights_fingerprint([(k, v.clone()) for k, v in half])
    nudged = [(k, v.clone()) for k, v in half]
    nudged[0][1].view(torch.int16)[0, 0] += 1  # one bit of a bfloat16 weight
    assert weights_fingerprint(nudged) != weights_fingerprint(half)


# ---------------------------------------------------------------- the task runner's validation tasks

# RMIA against the received model only: it reads its outputs off the cache as every kind does; the trained
# references (fine_tuned, independent) compute their own and would only add their trainings here.
RMIA = {"references": ["global"]}
DIGITS = {
    "tasks": {"train": {"kwargs": {"epochs": 1}}},
    "data_loader": {"settings": {"dataset": "digits", "seed": 2}},
    "task_runner": {"settings": {"seed": 2, "audit": {"interval": 2, "rmia": RMIA}}},
}


class NoCache(SignalCache):
    """Every audit computes its signals afresh (with OpenFL's own validation loop: the task runner before the cache)."""

    def signals(self, *args, **kwargs):
        self._entries.clear()
        return super().signals(*args, **kwargs)


def _run(tmp_path, monkeypatch, shared: bool, overrides=DIGITS):
    import audit.party_audit as party_audit_module
    import src.taskrunner as taskrunner_module

    loops, computed = [], []
    real_loop = PyTorchTaskRunner.validate_
    monkeypatch.setattr(PyTorchTaskRunner, "validate_", lambda self, loader: loops.append(1) or real_loop(self, loader))
    monkeypatch.setattr(cache_module, "compute_signals",
                        lambda *a, **k: computed.append(1) or compute_signals(*a, **k))
    if not shared:
        monkeypatch.setattr(party_audit_module, "SignalCache", NoCache)
        monkeypatch.setattr(taskrunner_module.AuditedTaskRunner, "validate_", PyTorchTaskRunner.validate_)
    result = run_in_process(tmp_path, collaborators=2, rounds=3, overrides=overrides)
    monkeypatch.undo()
    return result, len(loops), len(computed)


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")  # the metrics and counts are the subject, not the pages
def test_validation_reads_the_audits_signals_with_the_same_metrics(tmp_path, monkeypatch):
    plain, plain_loops, plain_computed = _run(tmp_path / "plain", monkeypatch, shared=False)
    shared, shared_loops, shared_computed = _run(tmp_path / "shared", monkeypatch, shared=True)
    # Every validation accuracy, audit metric and training loss is the same, round by round.
    assert shared.collaborator_metrics == plain.collaborator_metrics
    # Rounds 0 and 2 are audited: there the 2 validations per collaborator read the audit's predictions; round 1
    # (no audit) computes the accuracy in the audit's batches, never OpenFL's loop (which the plain run uses: the
    # same accuracies). Each model's three sets are computed once either way (the received model's during its
    # validation when shared). The final model's audit (after round 2) computes its three sets once per party.
    assert plain_loops == 2 * 2 * 3 and shared_loops == 0
    assert plain_computed == shared_computed == 2 * 2 * 2 * 3 + 2 * 3
    record = shared.runner("collaborator1").last_record
    assert record.timings["audit_in_validation_s"] > 0


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")  # the metrics and counts are the subject, not the pages
def test_a_sampled_audit_leaves_validation_on_every_sample(tmp_path, monkeypatch):
    """With audit.sample_size 100 (the digits shards: 90 members, 404 non-members = the validation set, 404
    population) the audit's non-members are a sample, so the validation accuracy cannot be read off them: every
    validation is computed on all 404, and every metric is the one a run with OpenFL's own loop and no cache gives."""
    sampled = {**DIGITS, "task_runner": {"settings": {"seed": 2, "audit": {"interval": 2, "sample_size": 100,
                                                                            "rmia": RMIA}}}}
    plain, plain_loops, _ = _run(tmp_path / "plain", monkeypatch, shared=False, overrides=sampled)
    shared, shared_loops, shared_computed = _run(tmp_path / "shared", monkeypatch, shared=True, overrides=sampled)
    assert shared.collaborator_metrics == plain.collaborator_metrics
    assert plain_loops == 2 * 2 * 3 and shared_loops == 0
    # the sampled sets' signals are still computed once per model (the final model's audit: three sets per party)
    assert shared_computed == 2 * 2 * 2 * 3 + 2 * 3
    record = shared.runner("collaborator1").last_record
    assert record.sizes == {"members": 90, "nonmembers": 100, "population": 100}
    assert record.sampling["sets"]["nonmembers"] == {"audited": 100, "of": 404}


def conv_model(seed=0):
    """A small CNN with a strided convolution and BatchNorm: its signals' forward is the layer-wise gradient path's."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 3, 3, stride=2, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(3 * 4 * 4, 4))


def image_sets(seed=1):
    rng = np.random.default_rng(seed)
    return AuditSets(*[(rng.normal(size=(n, 1, 8, 8)).astype(np.float32), rng.integers(0, 4, n)) for n in (30, 25, 40)])


@pytest.mark.parametrize("make_model, make_sets", [(tabular_model, tabular_sets), (conv_model, image_sets)],
                         ids=["tabular", "conv"])
def test_rmia_reads_the_models_outputs_off_the_round_signals(monkeypatch, make_model, make_sets):
    """RMIA's Pr(x | target) and Pr(x | global) come from the outputs the membership step's signals took (no forward
    pass of its own), and its metrics are those of its own forward passes, bit for bit."""
    import audit.membership.rmia_step as rmia_step
    from audit.config.audit_settings import AuditSettings
    from audit.round_audit import audit_round

    received, sets = make_model(0), make_sets()
    local = make_model(0)
    with torch.no_grad():
        for p in local.parameters():
            p.add_(0.1 * torch.randn(p.shape))
    settings = AuditSettings(signals=("loss", "gradient_norm"), fpr_tolerance=(0.1,), batch_size=16,
                             sections={"rmia": {"references": ["global"]}})
    forwards = []
    own_logits = rmia_step._logits
    monkeypatch.setattr(rmia_step, "_logits", lambda *a: forwards.append(1) or own_logits(*a))

    def audit(cache):
        return audit_round(local, received, sets, settings, party="p", round_num=0, seed=0, signal_cache=cache)

    alone = audit(None)
    assert len(forwards) == 2 * len(SETS)  # both models on every set
    forwards.clear()
    shared = audit(SignalCache())
    assert forwards == []
    rmia_metrics = {k: v for k, v in alone.metrics.items() if k.startswith("rmia_")}
    assert rmia_metrics and {k: shared.metrics[k] for k in rmia_metrics} == rmia_metrics
    assert shared.metrics == alone.metrics


@pytest.mark.parametrize("make_model, make_sets", [(tabular_model, tabular_sets), (conv_model, image_sets)],
                         ids=["tabular", "conv"])
def test_the_memos_outputs_are_a_plain_forward_pass_bit_for_bit(make_model, make_sets):
    import audit.membership.rmia_step as rmia_step

    model, sets, cache = make_model(3), make_sets(4), SignalCache()
    assert cache.logits(model, sets, batch_size=16) == {}
    cache.signals(model, sets, ["logits", "gradient_norm"], layer=None, batch_size=16)
    assert cache.logits(model, sets, batch_size=8) == {}  # another batch size: other kernels' last bits
    found = cache.logits(model, sets, batch_size=16)
    assert set(found) == set(SETS)
    for set_name in SETS:
        assert np.array_equal(found[set_name], rmia_step._logits(model, getattr(sets, set_name)[0], 16))
    cache.start_round(1)
    assert cache.logits(model, sets, batch_size=16) == {}
