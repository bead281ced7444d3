"""The received-model check (audit.before_training, audit/received_model/) without a federation: its plan section in
the registry, each check on models and data the suite does not otherwise use (a tabular MLP with BatchNorm and
Dropout, synthetic data), the probe's inversions against their analytic answers, the statistics against scipy's
reference implementation, and a round sequence's verdicts and memory."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy.stats import binomtest
from sklearn.datasets import make_classification
from torch import nn

from audit.before_training import KeptWeights, check_received
from audit.config.audit_settings import AuditSettings
from audit.config.fields import SettingsError
from audit.config.gate import GatePolicy, audit_metric_names
from audit.config.steps import AFTER_TRAINING, BEFORE_TRAINING, registered
from audit.received_model.architecture import check_architecture
from audit.received_model.check import STORE_KEY
from audit.received_model.history import HistoryState, change_norms, judge_changes
from audit.received_model.probe import capture_linear_layers, clopper_pearson, leakage_probe, mcnemar_greater
from audit.received_model.structure import class_weight_ratio, parallel_rows, relu_support
from audit.round_audit import AuditSets, audit_round
from crafted_models import class_fishing, imprint, trap_weights
from rounding import assert_same_float64

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FEATURES, CLASSES, BATCH = 12, 4, 32


@pytest.fixture(scope="module")
def tabular():
    """Synthetic tabular data scaled to [0, 1] per feature (non-negative, as pixels: trap weights assume it)."""
    x, y = make_classification(n_samples=600, n_features=FEATURES, n_informative=8, n_classes=CLASSES,
                               random_state=3)
    x = (x - x.min(axis=0)) / (x.max(axis=0) - x.min(axis=0))
    return x.astype(np.float32), y.astype(np.int64)


def mlp(seed: int = 0, dropout: float = 0.1) -> nn.Module:
    """Linear -> ReLU -> Dropout -> Linear -> BatchNorm -> ReLU -> Linear: not one of the plan's models."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 48), nn.ReLU(), nn.Dropout(dropout), nn.Linear(48, 24),
                         nn.BatchNorm1d(24), nn.ReLU(), nn.Linear(24, CLASSES))


def state_of(model: nn.Module) -> dict:
    return {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}


def settings(**received_model) -> AuditSettings:
    return AuditSettings.from_mapping({"received_model": received_model} if received_model else None)


# ---------------------------------------------------------------------------------------------- the registry


def test_the_check_is_a_before_training_step_on_by_default_and_parsed_like_the_others():
    step = next(s for s in registered() if s.name == "received_model")
    assert step.phase == BEFORE_TRAINING and step not in registered(AFTER_TRAINING)
    defaults = AuditSettings().received_model
    assert defaults.enabled and defaults.action == "reject"
    parsed = AuditSettings.from_mapping({"received_model": {"action": "report_only", "max_change_ratio": None}})
    assert parsed.received_model.action == "report_only" and parsed.received_model.max_change_ratio is None
    assert AuditSettings.from_mapping(parsed.to_dict()) == parsed
    for bad, key in (({"action": "warn"}, "action"), ({"probe_margin": 1.5}, "probe_margin"),
                     ({"parallel_rows": 1}, "parallel_rows"), ({"probe_alpha": None}, "probe_alpha"),
                     ({"max_change_ratio": 0.5}, "max_change_ratio"), ({"paralel_rows": 4}, "paralel_rows")):
        with pytest.raises(SettingsError, match=rf"^task_runner\.settings\.audit\.received_model\.{key}: "):
            AuditSettings.from_mapping({"received_model": bad}, prefix="task_runner.settings.audit")
    with pytest.raises(SettingsError, match=r"received_model: is a section"):
        AuditSettings.from_mapping({"received_model": False})


def test_the_gate_after_training_does_not_watch_the_verdict_and_audit_round_does_not_run_it(tabular):
    assert "received_model_alarm" not in audit_metric_names(AuditSettings())
    with pytest.raises(SettingsError, match="received_model_alarm: unknown metric"):
        GatePolicy.from_mapping({"thresholds": {"received_model_alarm": 0.5}}, audit_settings=AuditSettings())
    x, y = tabular
    sets = AuditSets(members=(x[:60], y[:60]), nonmembers=(x[60:120], y[60:120]), population=(x[120:], y[120:]))
    only = AuditSettings.from_mapping({"signals": ["loss"], "rmia": {"enabled": False}})
    record = audit_round(mlp(), mlp(), sets, only, party="p", round_num=0)
    assert "received_model" not in record.extra and "received_model_alarm" not in record.metrics


# ---------------------------------------------------------------------------------------------- architecture


def test_architecture_names_every_mismatch_and_accepts_what_openfl_transports():
    model = mlp()
    sent = {name: value.astype(np.float32) for name, value in state_of(model).items()}  # OpenFL sends float32
    sent["4.num_batches_tracked"] = np.array(7.5, dtype=np.float32)  # an honest average of unequal step counts
    assert check_architecture(sent, model).passed
    bad = dict(sent)
    bad.pop("6.bias")
    bad["6.weigth"] = sent["6.weight"]
    bad["0.weight"] = np.zeros((47, FEATURES), dtype=np.float32)
    bad["3.bias"] = sent["3.bias"].astype(np.float64)
    bad["4.running_var"] = np.full(24, np.nan, dtype=np.float32)
    bad["4.num_batches_tracked"] = np.array(1e30, dtype=np.float32)
    problems = check_architecture(bad, model).problems
    assert problems == (
        "unexpected tensor '6.weigth' (did you mean '6.weight'?)",
        "0.weight has shape (47, 12), the plan's (48, 12)",
        "3.bias has dtype float64, the plan's float32 (or the transport's float32)",
        "4.running_var holds NaN/Inf",
        "4.num_batches_tracked holds values a int64 tensor cannot (received as float32)",
        "missing tensor '6.bias'",
    )


# ---------------------------------------------------------------------------------------------- the probe


def imprint_model(x: np.ndarray, bins: int):
    """An imprint block on raw features (Fowl et al.): returns the model and the samples alone in their bin."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(FEATURES, bins), nn.ReLU(), nn.Linear(bins, 16), nn.ReLU(), nn.Linear(16, CLASSES))
    state = imprint(model.state_dict(), "0", "2", x.astype(np.float64), bins, seed=5)
    model.load_state_dict(state)
    direction = state["0.weight"][0].double().numpy()
    thresholds = -state["0.bias"][:bins].double().numpy()
    return model, direction, thresholds


def test_the_probe_reads_back_exactly_the_samples_alone_in_an_imprint_bin(tabular):
    """The analytic answer: a sample is read back iff no other sample of the batch shares its bin (between two
    consecutive thresholds), except in the lowest bin, below every threshold, which no neuron sees."""
    x, y = tabular
    for bins in (8, 32, 96):
        model, direction, thresholds = imprint_model(x[BATCH:], bins)
        batch_x, batch_y = x[:BATCH], y[:BATCH]
        measured = batch_x.astype(np.float64) @ direction
        bin_of = np.searchsorted(np.sort(thresholds), measured, side="right")
        counts = np.bincount(bin_of, minlength=bins + 1)
        alone = (counts[bin_of] == 1) & (bin_of > 0)
        tensors = {n: t.detach().clone() for n, t in model.state_dict().items()}
        result = leakage_probe(model, tensors, batch_x, batch_y)
        assert result.first_layer == "0"
        np.testing.assert_array_equal(result.revealed, alone)
        assert result.count == alone.sum() > 0


def test_a_neuron_one_sample_alone_moves_gives_that_sample(tabular):
    """The first 10 neurons point at samples 0..9, their biases halfway between that sample's score and the next
    highest: a neuron fires for its sample alone when that sample scores highest, and then gives it as dW_i / db_i.
    The other neurons never fire. The samples read back are exactly those (computed from the pre-activations)."""
    x, y = tabular
    batch_x, batch_y = x[:BATCH], y[:BATCH]
    model = mlp(dropout=0.0)
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.fill_(-1e3)
        for i in range(10):
            direction = batch_x[i] - batch_x.mean(axis=0)
            scores = np.sort(batch_x @ direction)
            model[0].weight[i] = torch.as_tensor(direction)
            model[0].bias[i] = -float(scores[-1] + scores[-2]) / 2
    pre = batch_x @ model[0].weight.detach().numpy().T + model[0].bias.detach().numpy()
    fires = pre > 0
    expected = np.zeros(BATCH, dtype=bool)
    for i in np.flatnonzero(fires.sum(axis=0) == 1):
        expected[np.argmax(fires[:, i])] = True
    assert expected.sum() >= 5
    tensors = {n: t.detach().clone() for n, t in model.state_dict().items()}
    np.testing.assert_array_equal(leakage_probe(model, tensors, batch_x, batch_y).revealed, expected)


def test_the_probe_leaves_model_generator_and_received_tensors_as_they_were(tabular):
    x, y = tabular
    model = mlp(dropout=0.9)
    model[4].eval()  # a frozen BatchNorm inside a model in train mode keeps its flag
    before = copy.deepcopy(model.state_dict())
    received = {n: t.detach().clone() for n, t in mlp(seed=4).state_dict().items()}
    received_copy = {n: t.clone() for n, t in received.items()}
    rng_before = torch.get_rng_state()
    first = leakage_probe(model, received, x[:BATCH], y[:BATCH], all_layers=True)
    assert torch.equal(torch.get_rng_state(), rng_before)  # Dropout off: nothing drawn
    assert all(torch.equal(model.state_dict()[n], before[n]) for n in before)
    assert model.training and model[2].training and not model[4].training
    assert all(torch.equal(received[n], received_copy[n]) for n in received)  # BatchNorm's statistics moved a copy
    again = leakage_probe(model, received, x[:BATCH], y[:BATCH], all_layers=True)
    assert first.layers == again.layers and np.array_equal(first.revealed, again.revealed)
    # with Dropout at 0.9 on, most neurons would look moved by few samples; off, the support is the ReLUs'
    tensors = {n: t.detach().clone() for n, t in mlp(seed=4).state_dict().items()}
    assert relu_support(capture_linear_layers(model, tensors, x[:BATCH], y[:BATCH])[0])["mean_support"] > 0.3
    assert [layer["layer"] for layer in first.layers] == ["0", "3", "6"]
    assert first.layers[0]["space"] == "input" and first.layers[1]["space"] == "activation"


def small_cnn(inplace: bool) -> nn.Module:
    """Conv -> BatchNorm -> ReLU -> Linear -> ReLU (in place or not) -> Linear: images, not the suite's models."""
    torch.manual_seed(5)
    return nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 6 * 6, 20),
                         nn.ReLU(inplace=inplace), nn.Linear(20, 5))


@pytest.mark.numerics
def test_the_probe_step_gives_autograds_gradients_without_any_parameter_gradient():
    """gamma, dW and db of each linear layer against a plain backward of the same step on a copy that runs no
    in-place ReLU; the probe itself gives no parameter a gradient (and so keeps no activation before the first
    linear layer), and an in-place ReLU after a linear layer does not change what its gamma is. In float64, where the
    probe and the plain backward differ by rounding alone (tests/rounding.py)."""
    rng = np.random.default_rng(2)
    x = rng.random((16, 3, 8, 8))
    y = rng.integers(0, 5, 16)
    model = small_cnn(inplace=True).double()
    tensors = {n: t.detach().clone() for n, t in model.state_dict().items()}
    captures = capture_linear_layers(model, tensors, x, y, invert="all")
    assert all(p.grad is None for p in model.parameters())
    assert not any(t.requires_grad for t in tensors.values())

    reference = small_cnn(inplace=False).double()
    reference.load_state_dict(tensors)
    reference.train()
    outputs = {}
    for index in (4, 6):
        reference[index].register_forward_hook(lambda m, a, out, i=index: outputs.__setitem__(i, out) or
                                               out.retain_grad())
    loss = nn.functional.cross_entropy(reference(torch.as_tensor(x)), torch.as_tensor(y))
    loss.backward()
    assert [c.name for c in captures] == ["4", "6"]
    for capture, index in zip(captures, (4, 6)):
        assert_same_float64(capture.gamma, outputs[index].grad)
        assert_same_float64(capture.dw, reference[index].weight.grad)
        assert_same_float64(capture.db, reference[index].bias.grad)
    assert np.any(captures[0].gamma == 0) and np.any(captures[0].gamma != 0)  # the ReLU cut some, not all


@pytest.mark.parametrize("megabytes", [1, pytest.param(34, marks=pytest.mark.slow)])  # memory to 32 MB, then disk
def test_kept_weights_give_back_the_values_and_hold_no_copy_while_writing_to_disk(megabytes):
    """The last accepted model, kept across rounds: the same bytes back, unmoved by later writes to the caller's
    arrays; a large one goes to disk straight from the caller's (read-only, as a received buffer is) arrays, with no
    model-sized copy in memory on the way and no warning."""
    import tracemalloc
    import warnings

    rng = np.random.default_rng(1)
    n = megabytes * 2**20 // 4
    weights = {"fc.weight": rng.standard_normal(n - 7, dtype=np.float32), "fc.bias": np.arange(7, dtype=np.int64)}
    original = {name: a.copy() for name, a in weights.items()}
    weights["fc.weight"].flags.writeable = False
    tracemalloc.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            kept = KeptWeights(weights, round_num=3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    on_disk = megabytes > 32
    assert (peak < 0.1 * n * 4) if on_disk else (peak >= n * 4)  # the in-memory one is a copy
    weights["fc.weight"].flags.writeable = True
    weights["fc.weight"][:5] = 0
    weights["fc.bias"][:] = -1
    back = kept.load()
    assert kept.round_num == 3 and set(back) == set(original)
    assert all(back[k].dtype == original[k].dtype and back[k].tobytes() == original[k].tobytes() for k in original)


def test_mcnemar_and_clopper_pearson_against_scipy():
    rng = np.random.default_rng(0)
    for _ in range(200):
        a, b = rng.random(32) < rng.random(), rng.random(32) < rng.random()
        only_a, only_b = int(np.sum(a & ~b)), int(np.sum(b & ~a))
        expected = 1.0 if only_a == 0 else binomtest(only_a, only_a + only_b, 0.5, alternative="greater").pvalue
        assert mcnemar_greater(a, b) == pytest.approx(expected, rel=1e-9, abs=1e-15)
    for k, n in ((0, 32), (5, 32), (32, 32), (1, 2)):
        low, high = clopper_pearson(k, n)
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert (low, high) == pytest.approx((ci.low, ci.high), abs=1e-12)


# ---------------------------------------------------------------------------------------------- structure


def test_structural_figures_on_honest_and_crafted_layers(tabular):
    x, y = tabular
    honest = mlp()
    assert parallel_rows(honest[0].weight, honest[0].bias)["rows"] == 1
    crafted, _, _ = imprint_model(x[BATCH:], 24)
    rows = parallel_rows(crafted[0].weight, crafted[0].bias)
    assert rows == {"rows": 24, "distinct_offsets": 24, "of": 24}
    zero = torch.zeros(5, 3)
    assert parallel_rows(zero, None)["rows"] == 0
    # a layer large enough to be compared in a random projection first: the same answers
    torch.manual_seed(0)
    large = torch.randn(2048, 600)
    assert parallel_rows(large, None)["rows"] == 1
    large[100:140] = torch.randn(600) * torch.linspace(0.5, 3.0, 40)[:, None]  # 40 scaled copies of one direction
    large[7] = -large[100]  # a sign flip is still the same direction
    assert parallel_rows(large, torch.arange(2048.0))["rows"] == 41
    assert class_weight_ratio(honest[6].weight) < 3
    fished = class_fishing({k: v for k, v in honest.state_dict().items()}, "6", target=2)
    assert class_weight_ratio(fished["6.weight"]) == float("inf")
    tensors = {n: t.detach().clone() for n, t in honest.state_dict().items()}
    layers = capture_linear_layers(honest, tensors, x[:BATCH], y[:BATCH])
    support = relu_support(layers[0])
    assert 0.3 < support["mean_support"] < 0.8 and support["isolating"] < 0.1
    assert relu_support(capture_linear_layers(honest, tensors, x[:8], y[:8])[0]) is None  # too few samples to say
    trapped = trap_weights({k: v for k, v in honest.state_dict().items()}, "0", x[BATCH:].astype(np.float64),
                           rate=0.02)
    trap_layers = capture_linear_layers(honest, {k: torch.as_tensor(np.array(v)) for k, v in trapped.items()},
                                        x[:BATCH], y[:BATCH])
    trap_support = relu_support(trap_layers[0])
    assert trap_support["mean_support"] < 0.1 and trap_support["isolating"] > 0.3


# ---------------------------------------------------------------------------------------------- history


def test_history_judges_each_tensor_against_the_honest_envelope():
    received = {"w": np.ones((3, 3), dtype=np.float32), "b": np.zeros(3, dtype=np.float32),
                "n": np.array(4, dtype=np.int64)}
    sent = {"w": received["w"] + 0.1, "b": received["b"] + np.float32(0.2), "n": np.array(5)}
    state = HistoryState()
    state.remember(received, sent, 0, None)
    assert state.own_update == pytest.approx({"w": 0.3, "b": np.sqrt(3) * 0.2})  # integer tensors are not judged
    nxt = {"w": received["w"] + 0.05, "b": received["b"] + np.float32(2.0)}
    change = change_norms(nxt, received)
    judged = judge_changes(change, state)
    assert judged["tensor"] == "b" and judged["ratio"] == pytest.approx(10.0, rel=1e-5)
    state.remember(nxt, nxt, 1, change)  # a round that moved b by 2*sqrt(3) widens its envelope
    assert judge_changes({"b": 2 * np.sqrt(3)}, state)["ratio"] == pytest.approx(1.0)
    assert judge_changes({"new": 1.0}, state)["ratio"] is None  # nothing honest moved it yet: not judged


def test_change_norms_hold_one_float64_copy_and_give_the_one_expression_values(monkeypatch):
    """Each tensor's norm is bit for bit np.sqrt(np.dot(d64, d)) of d = new - old in float32 or wider (float16,
    float32, float64 and mixed; sizes across the chunks the difference is taken in), while memory holds one float64
    copy of the difference, not it and the difference in its own dtype and a second float64 copy (numpy reports
    its arrays to tracemalloc)."""
    import tracemalloc

    import audit.received_model.history as history

    def one_expression(a, b):
        d = np.subtract(a, b, dtype=np.result_type(a, b, np.float32)).ravel()
        return float(np.sqrt(np.dot(d.astype(np.float64, copy=False), d)))

    rng = np.random.default_rng(5)
    monkeypatch.setattr(history, "_DIFF_CHUNK", 1000)
    for dtypes in [(np.float32, np.float32), (np.float16, np.float16), (np.float64, np.float32),
                   (np.float16, np.float64)]:
        for shape in [(), (7,), (1000,), (3, 1001), (64, 65, 3)]:
            a = rng.normal(size=shape).astype(dtypes[0])
            b = (a + rng.normal(scale=rng.uniform(1e-4, 2), size=shape)).astype(dtypes[1])
            assert change_norms({"t": a}, {"t": b}) == {"t": one_expression(a, b)}, (dtypes, shape)
    monkeypatch.undo()
    n = 2**22
    a = rng.normal(size=n).astype(np.float32)
    b = a + np.float32(0.01)
    tracemalloc.start()
    try:
        change_norms({"t": a}, {"t": b})
        _, ours = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        one_expression(a, b)
        _, expression = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the float64 difference and one chunk of it in float32, against 4 + 8 + 8 bytes a value
    assert 8 * n <= ours <= 8 * n + 4 * history._DIFF_CHUNK + 4096 and expression >= 20 * n, (ours, expression)


def test_parallel_rows_holds_a_large_layer_and_its_cosines_once_each():
    """The rows' unit copy is divided in place and the cosines' absolute values taken in place (numpy reports its
    arrays to tracemalloc): one copy of the rows and one of the cosines, not two of each; the same group is found
    (four rows made parallel among 2,048)."""
    import tracemalloc

    rng = np.random.default_rng(8)
    n = 2048
    weight = rng.normal(size=(n, n)).astype(np.float32)
    weight[[3, 70, 900, 2000]] = weight[5] * np.array([[2.0], [-0.5], [3.0], [0.25]], dtype=np.float32)
    weight, bias = torch.from_numpy(weight), torch.from_numpy(rng.normal(size=n).astype(np.float32))
    tracemalloc.start()
    try:
        found = parallel_rows(weight, bias)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found == {"rows": 5, "distinct_offsets": 5, "of": n}
    layer = n * n * 4
    assert peak < 2.4 * layer, peak / layer  # the rows' copy, the cosines and their comparison's booleans


# ---------------------------------------------------------------------------------------------- a round sequence


def test_a_sequence_of_rounds_accepts_honest_models_and_rejects_a_crafted_one(tabular):
    """Round 0 the plan's model, round 1 an honest step from it, round 2 trap weights: rejected, and the last accepted
    model stays round 1's; report_only records the same alarm without rejecting."""
    x, y = tabular
    members = (x[:200], y[:200])
    template = mlp()
    plan_initial = lambda: mlp()  # noqa: E731  (the plan's model from its seed)
    store: dict = {}
    kwargs = dict(party="p", seed=3, plan_initial=plan_initial, store=store)
    round0 = state_of(mlp())
    verdict = check_received(round0, template, members, BATCH, settings(), round_num=0, **kwargs)
    assert verdict.metrics() == {"received_model_alarm": 0.0, "received_model_rejected": 0.0}
    assert verdict.details()["received_model"]["probe"]["judged"]  # against the plan's initial model
    trained = copy.deepcopy(mlp())
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.05)
    for start in range(0, 200, BATCH):
        optimizer.zero_grad()
        nn.functional.cross_entropy(trained(torch.as_tensor(x[start:start + BATCH])),
                                    torch.as_tensor(y[start:start + BATCH])).backward()
        optimizer.step()
    verdict.remember(state_of(trained))
    round1 = state_of(trained)  # a one-party federation's honest average: its own update
    verdict = check_received(round1, template, members, BATCH, settings(), round_num=1, **kwargs)
    assert not verdict.alarms and verdict.previous.round_num == 0
    assert verdict.details()["received_model"]["history"]["ratio"] == pytest.approx(1.0, rel=1e-4)
    verdict.remember(round1)
    crafted = {k: np.asarray(v) for k, v in trap_weights(round1, "0", x[200:].astype(np.float64), rate=0.02).items()}
    for action, rejected in (("report_only", False), ("reject", True)):
        trial = copy.deepcopy(store)
        verdict = check_received(crafted, template, members, BATCH, settings(action=action), round_num=2,
                                 **{**kwargs, "store": trial})
        assert verdict.alarms and verdict.rejected == rejected
        assert verdict.metrics() == {"received_model_alarm": 1.0, "received_model_rejected": float(rejected)}
        alarms = verdict.details()["received_model"]["alarms"]
        assert any("live neurons of 0" in a for a in alarms) and any(a.startswith("leakage probe") for a in alarms)
        assert (verdict.reason or "").startswith("received model rejected: ") == rejected
    assert trial["_before_training"]["accepted"].round_num == 1  # the rejected model is not remembered
    assert set(store[STORE_KEY].references) == {"plan initial model", "round 0", "round 1"}


def test_the_probe_alone_rejects_the_strong_constructions(tabular):
    """With every other figure switched off (null thresholds), the leakage probe still rejects imprint layers with
    many bins and trap weights: it needs no knowledge of the construction."""
    x, y = tabular
    members = (x[:200], y[:200])
    template = mlp(dropout=0.0)
    probe_only = settings(max_change_ratio=None, parallel_rows=None, min_support=None, max_isolating=None,
                          class_weight_ratio=None)
    base = {n: t.detach() for n, t in mlp(dropout=0.0).state_dict().items()}
    public = x[200:].astype(np.float64)
    for name, crafted in (("imprint", imprint(base, "0", "3", public, 48)),
                          ("trap", trap_weights(base, "0", public, rate=0.02))):
        store: dict = {}
        verdict = check_received({k: np.asarray(v) for k, v in crafted.items()}, template, members, BATCH,
                                 probe_only, party="p", round_num=0, seed=0, plan_initial=lambda: mlp(dropout=0.0),
                                 store=store)
        assert verdict.rejected and verdict.reason.startswith("received model rejected: leakage probe: "), name


class TokenBag(nn.Module):
    """Token ids -> Embedding -> mean over positions -> Linear -> ReLU -> Linear (integer inputs)."""

    def __init__(self, vocab: int = 40):
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.hidden = nn.Linear(8, 16)
        self.out = nn.Linear(16, 3)

    def forward(self, tokens):
        return self.out(torch.relu(self.hidden(self.emb(tokens).mean(dim=1))))


def test_token_inputs_and_a_set_smaller_than_the_batch():
    """Integer inputs reach the Embedding as they are; with 6 members (a probe batch of 6) the sparsity figures are not
    judged and the probe cannot be significant, but an imprint in the dense layer is still rejected by its rows."""
    rng = np.random.default_rng(1)
    tokens, labels = rng.integers(0, 40, size=(6, 5)), rng.integers(0, 3, size=6)
    torch.manual_seed(2)
    model = TokenBag()
    plan_initial = lambda: copy.deepcopy(model)  # noqa: E731
    verdict = check_received(state_of(model), model, (tokens, labels), BATCH, settings(), party="p", round_num=0,
                             seed=0, plan_initial=plan_initial, store={})
    details = verdict.details()["received_model"]
    assert not verdict.alarms and details["probe"]["batch"] == 6 and details["probe"]["first_layer"] == "hidden"
    assert details["structure"]["support"] == {"hidden": None}  # 6 samples: too few to say
    with torch.no_grad():
        features = model.emb(torch.as_tensor(rng.integers(0, 40, size=(200, 5)))).mean(dim=1).double().numpy()
    crafted = imprint(model.state_dict(), "hidden", "out", features, 12)
    verdict = check_received({k: np.asarray(v) for k, v in crafted.items()}, model, (tokens, labels), BATCH,
                             settings(), party="p", round_num=0, seed=0, plan_initial=plan_initial, store={})
    assert verdict.rejected and "12 of 16 rows of hidden are scaled copies" in verdict.reason


def test_the_aggregator_report_reads_the_verdicts_alone(tmp_path):
    """From the scalars alone: who rejected the round's model (not trained on, left out of the average), whose check
    only reported an alarm (trained, averaged), who passed, and who sent no verdict."""
    from audit.aggregator_report.writer import AggregatorReportWriter
    from audit.aggregator_report.record import round_record

    metrics = {
        "rejecter": {"gate_kept": 0.0, "received_model_alarm": 1.0, "received_model_rejected": 1.0},
        "reporter": {"gate_kept": 1.0, "received_model_alarm": 1.0, "received_model_rejected": 0.0},
        "passer": {"gate_kept": 1.0, "received_model_alarm": 0.0, "received_model_rejected": 0.0},
        "silent": {"gate_kept": 1.0},
    }
    record = round_record(4, authorized=list(metrics), stragglers=[], metrics=metrics)
    assert record["rejected_received_model"] == ["rejecter"] and record["received_model_alarms"] == ["reporter"]
    assert record["withheld"] == ["rejecter"] and record["kept"] == ["passer", "reporter", "silent"]
    entries = record["collaborators"]
    assert entries["rejecter"]["reason"].startswith("did not train: it rejected this round's global model")
    assert [entries[n]["received_model"] for n in ("passer", "silent")] == ["passed", None]
    AggregatorReportWriter(tmp_path).write_round(record)  # the record and the summaries, now
    rows = (tmp_path / "decisions.csv").read_text().splitlines()
    assert rows[0].endswith(",received_model") and any(r.startswith("4,rejecter,") and r.endswith(",rejected")
                                                        for r in rows)
    page = (tmp_path / "index.html").read_text()
    assert "Received global model: checks before training" in page and "1 of 1 rounds' global models" in page


def test_the_verdict_lets_the_received_weights_go_once_the_round_is_remembered(tabular):
    """The party keeps its last verdict until its next round's check; the received weights in it, a whole model, go
    when the round is remembered, and the history still learns from them."""
    import gc
    import weakref

    x, y = tabular
    store: dict = {}
    received = {k: np.array(v) for k, v in state_of(mlp()).items()}
    held = [weakref.ref(a) for a in received.values()]
    verdict = check_received(received, mlp(), (x[:200], y[:200]), BATCH, settings(), party="p", round_num=0, seed=3,
                             plan_initial=lambda: mlp(), store=store)
    del received
    gc.collect()
    assert all(r() is not None for r in held)  # before the round ends: remember still needs them
    verdict.remember(state_of(mlp(seed=1)))
    gc.collect()
    assert all(r() is None for r in held)
    assert store[STORE_KEY].history.own_round == 0 and store[STORE_KEY].history.own_update  # learnt all the same
