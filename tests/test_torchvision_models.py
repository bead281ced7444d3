"""torchvision's classifiers as the plan's model: the names (torchvision's registry), the fitting to a dataset's small
images, and every audit on them with BatchNorm in the net: the membership signals (per-sample gradient norms against
per-sample autograd), RMIA's reference training (torch.func copies against separate trainings, each copy's own
BatchNorm statistics), Fidel (the first dense layer), the deanonymization self-audit (the last layer), the whole
round audit, and the DP retrain (BatchNorm frozen, opacus on the rest). Tiny images (3x32x32, the smallest a ResNet
takes), few samples, one thread."""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from audit.config.audit_settings import AuditSettings
from src.runner.model_names import MODELS, TORCHVISION_LEFT_OUT, WORKSPACE_MODELS
from audit.deanon.representation import last_layer
from audit.fidel.layers import find_first_dense_layer
from audit.membership.gradient_norms import gradient_norms, gradient_parameter_names
from audit.model_io import module_mode
from audit.round_audit import AuditSets, LocalTraining, audit_round
from audit.training import TrainingRecipe, _train_chunk
from rounding import assert_same_float64
from src.runner.models import build_model, feature_layers
from test_odd_models import (DEANON, all_at_once_orders, assert_self_audit_leaves_models_unchanged, assert_unchanged,
                             check_record, delta, state_of, train_one)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CIFAR = (3, 32, 32)
MNIST = (1, 28, 28)


def images(n: int, shape=CIFAR, classes: int = 10, seed: int = 0):
    """A faint class pattern under noise (something to learn), float32 in [-1, 1] as CIFAR's are read."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    patterns = rng.normal(0, 1, (classes, *shape))
    x = np.clip(0.4 * patterns[y] + rng.normal(0, 0.6, (n, *shape)), -1, 1).astype(np.float32)
    return x, y.astype(np.int64)


def model(name: str, shape=CIFAR, classes: int = 10, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(name, shape, classes)


def has_batchnorm(net: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())


# ------------------------------------------------------------------------------------------ names and fitting


def test_the_names_are_torchvisions_registry_less_the_families_left_out():
    registry = torchvision.models.list_models(module=torchvision.models)
    assert MODELS[:len(WORKSPACE_MODELS)] == WORKSPACE_MODELS
    offered = MODELS[len(WORKSPACE_MODELS):]
    assert list(offered) == [n for n in registry if not n.startswith(tuple(TORCHVISION_LEFT_OUT))]
    assert {"resnet18", "resnet34", "resnet50", "mobilenet_v3_small", "efficientnet_b0", "vgg11_bn"} <= set(offered)
    assert not any(n.startswith(("vit_", "maxvit_")) or n in ("googlenet", "inception_v3") for n in offered)
    assert MODELS.count("alexnet") == 1  # the workspace's (the tutorial's net), not torchvision's
    with pytest.raises(ValueError, match=r"unknown model 'resnet81'; did you mean resnet18"):
        build_model("resnet81", CIFAR, 10)
    with pytest.raises(ValueError, match=r"dropout: not a setting of model 'resnet18'; allowed: \(none\)"):
        build_model("resnet18", CIFAR, 10, dropout=0.5)


@pytest.mark.parametrize("name,shape,classes", [("resnet18", CIFAR, 100), ("resnet18", MNIST, 10),
                                                ("mobilenet_v3_small", MNIST, 10), ("efficientnet_b0", CIFAR, 10),
                                                ("vgg11_bn", CIFAR, 10)])
@pytest.mark.slow
def test_a_torchvision_classifier_fitted_to_small_images(name, shape, classes):
    """The first convolution takes the dataset's channels, with stride 1 on images under 64 pixels; everything else
    is torchvision's (the same modules, BatchNorm included); eval and train forwards give logits; same seed, same
    weights; no in-place activation."""
    net = model(name, shape, classes)
    with torch.device("meta"):  # its modules and shapes, without initialising its weights (VGG's: 129M values)
        reference = torchvision.models.get_model(name, weights=None, num_classes=classes)
    first = next(m for m in net.modules() if isinstance(m, nn.Conv2d))
    assert first.in_channels == shape[0] and first.stride == (1, 1)
    assert [type(m) for m in net.modules()] == [type(m) for m in reference.modules()]
    assert has_batchnorm(net)
    same = [(n, p.shape) for n, p in net.named_parameters()] == [(n, p.shape) for n, p in reference.named_parameters()]
    assert same == (shape[0] == 3)  # only the first convolution's weight differs, for 1-channel images
    assert not any(getattr(m, "inplace", False) for m in net.modules())
    again = model(name, shape, classes)
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), again.state_dict().values()))
    x = torch.as_tensor(images(3, shape, classes)[0])
    assert net.eval()(x).shape == (3, classes) and net.train()(x[:1]).shape == (1, classes)


@pytest.mark.slow
def test_large_images_keep_torchvisions_stride_and_small_ones_that_cannot_fit_fail_in_one_line():
    net = model("resnet18", (3, 64, 64))
    assert net.conv1.stride == (2, 2) and net.conv1.in_channels == 3
    with pytest.raises(ValueError) as err:  # 8x8 digits: a 1x1 map in the last stages, BatchNorm of one value
        build_model("resnet18", (1, 8, 8), 10)
    assert str(err.value).startswith("model 'resnet18' cannot take inputs of shape 1x8x8: Expected more than 1 value "
                                     "per channel when training") and "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"model 'vgg11_bn' cannot take inputs of shape 1x28x28"):
        build_model("vgg11_bn", MNIST, 10)  # five max-pools: 28 -> 0


def test_feature_layers_are_the_features_block_or_the_top_level_layers():
    assert [n for n, _ in feature_layers(model("resnet18"))][:4] == ["conv1", "bn1", "relu", "maxpool"]
    assert feature_layers(model("mobilenet_v3_small"))[0][0] == "features.0"
    assert feature_layers(build_model("cnn", CIFAR, 10))[0][0] == "features.conv1"


# ------------------------------------------------------------------------------------------ the audits


def autograd_norms(net, x, y, names):
    """Per-sample gradient norms one sample at a time with plain autograd, in eval mode (the reference)."""
    params = dict(net.named_parameters())
    out = []
    with module_mode(net, training=False):
        for i in range(len(y)):
            grads = torch.autograd.grad(F.cross_entropy(net(x[i:i + 1]), y[i:i + 1]), [params[n] for n in names])
            out.append(math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)))
    return np.array(out)


@pytest.mark.parametrize("name,layer", [("resnet18", "conv1"), ("resnet18", "layer4"), ("mobilenet_v3_small", None)])
@pytest.mark.slow
def test_gradient_norms_match_per_sample_autograd(name, layer):
    """The layer-wise path (conv1: a plain Conv2d) and torch.func's (BatchNorm's parameters in layer4, every
    parameter of a net with squeeze-excitation and hardswish) against autograd, sample by sample. In float64, where
    the two paths differ by rounding alone (tests/rounding.py; in float32 by up to 4e-5 through resnet18)."""
    net = model(name).double()
    x, y = (torch.as_tensor(a) for a in images(3))
    x = x.double()
    names = gradient_parameter_names(net, layer)
    before = state_of(net)
    norms, _ = gradient_norms(net, x, y, names, batch_size=2)  # a full batch and a partial one
    assert_unchanged(net, before)
    assert_same_float64(norms, autograd_norms(net, x, y, names))
    assert norms.min() > 0


@pytest.mark.slow
def test_reference_copies_train_like_separate_local_trainings():
    """RMIA's references (torch.func, copies stacked): each copy's parameters and its own BatchNorm statistics (and
    num_batches_tracked) as a separate local training of a copy in train mode would leave them. In float64, where
    the property is exact to rounding (tests/rounding.py; in float32 the CPU's kernels decide how far the two paths
    drift: up to 1e-2 of a bias after two steps)."""
    net = model("resnet18").double()
    x, y = images(8, seed=1)
    x = x.astype(np.float64)
    p = np.stack([np.random.default_rng(c).choice(8, 4, replace=False) for c in range(2)])
    recipe = TrainingRecipe("SGD", 0.05, 0.9, epochs=1, batch_size=2)  # two steps: momentum and BatchNorm's running
    # statistics carried from one to the next
    before = state_of(net)
    with module_mode(net, training=True):
        params, buffers = _train_chunk(net, dict(net.named_parameters()), dict(net.named_buffers()),
                                       torch.as_tensor(x[p]), torch.as_tensor(y[p]), recipe,
                                       torch.Generator().manual_seed(5))
    assert_unchanged(net, before)
    assert all(t.dtype == torch.float64 for t in params.values())
    orders = all_at_once_orders(5, recipe, copies=2, size=4)
    for c in range(2):
        local = train_one(net, x[p[c]], y[p[c]], recipe, [order[c] for order in orders])
        for n, value in [*local.named_parameters(), *local.named_buffers()]:
            assert_same_float64((params if n in params else buffers)[n][c], value.detach(), err_msg=n)
    assert int(buffers["bn1.num_batches_tracked"][0]) == 2  # two batches of 2
    assert not torch.equal(buffers["bn1.running_mean"][0], buffers["bn1.running_mean"][1])  # each copy its own


def test_fidel_and_deanonymization_take_the_first_and_last_dense_layer():
    net = model("resnet18")
    assert find_first_dense_layer(net, torch.zeros(1, *CIFAR)) == "fc"  # after the global pooling
    assert last_layer(net) == "fc"
    mobile = model("mobilenet_v3_small")
    assert find_first_dense_layer(mobile, torch.zeros(1, *CIFAR)) == "classifier.0"
    assert last_layer(mobile) == "classifier.3"


@pytest.mark.slow
def test_deanon_self_audit_on_a_batchnorm_classifier():
    x, y = images(200, seed=2)  # 25 members (two training batches: BatchNorm in train mode), the whole crowd of 3
    assert_self_audit_leaves_models_unchanged(model("mobilenet_v3_small").eval(), x, y, members=25)


@pytest.mark.federation
def test_the_round_audit_on_a_batchnorm_classifier():
    """Every audit in one round on torchvision's MobileNetV3 (BatchNorm, squeeze-excitation, Dropout): the
    membership signals of the local, global and update models (gradient norms w.r.t. the stem: a convolution and
    its BatchNorm), RMIA with each kind of references (torch.func copies with their own statistics), Fidel on the
    first dense layer (after pooling: the activation space) and the deanonymization self-audit."""
    x, y = images(120, seed=3)  # a population of 72: the deanon crowd's 2 users x 24 private samples, and a prior
    sets = AuditSets(members=(x[:24], y[:24]), nonmembers=(x[24:48], y[24:48]), population=(x[48:], y[48:]))
    received = model("mobilenet_v3_small")
    # lr 0.01: at 0.05 a few steps leave running statistics that blow eval-mode logits up to ~1e3, and the
    # references' probabilities underflow to 0, which RMIA refuses
    recipe = TrainingRecipe("SGD", 0.01, 0.9, epochs=1, batch_size=8)  # 3 steps: BatchNorm's statistics move
    local = train_one(received, *sets.members, recipe, [torch.randperm(24, generator=torch.Generator().manual_seed(0))])
    before = [(received, state_of(received)), (local, state_of(local))]
    settings = AuditSettings(batch_size=16, gradient_layer="features.0", sections={
        "fidel": {"enabled": True}, "deanon": {**DEANON, "crowd_users": 2, "shadows_per_user": 2},
        "rmia": {"references": ["global", "fine_tuned", "independent"], "reference_models": 2}})
    record = audit_round(local, received, sets, settings, party="p", round_num=0, seed=4,
                         training=LocalTraining(recipe, 24, 0.5), initial_model=received)
    check_record(record, settings, before)
    assert record.extra["rmia"]["independent"]["reference_models"] == 2
    assert record.extra["fidel"]["layer"] == "classifier.0" and record.extra["fidel"]["space"] == "activation"


# ------------------------------------------------------------------------------------------ DP retrain


@pytest.mark.slow
def test_dp_retrain_freezes_batchnorm_and_trains_the_rest_with_dp():
    """opacus refuses a trainable BatchNorm; the retrain keeps the architecture: BatchNorm's weights and running
    statistics are sent as received, every other tensor is trained with DP-SGD (clipped, noised, accounted)."""
    from opacus.validators import ModuleValidator

    from audit.dp_training import RoundAccountant, dp_retrain

    start = model("resnet18")
    assert not ModuleValidator.is_valid(start)  # why the retrain cannot train BatchNorm
    x, y = images(16, seed=5)  # two expected batches of 8
    before = state_of(start)
    accountant = RoundAccountant((x, y))
    result = dp_retrain(start, lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), accountant,
                        batch_size=8, epochs=1, noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    assert_unchanged(start, before)
    assert list(result.state_dict) == list(start.state_dict())
    bn = {n for n, m in start.named_modules() if isinstance(m, nn.BatchNorm2d)}
    for key, value in result.state_dict.items():
        frozen = key.rpartition(".")[0] in bn
        assert torch.equal(value, start.state_dict()[key]) == frozen, key
    assert result.steps > 0 and math.isfinite(result.loss)
    assert 0 < accountant.epsilon(1e-5) < math.inf
    assert all(m.weight.requires_grad for m in start.modules() if isinstance(m, nn.BatchNorm2d))


# ------------------------------------------------------------------------------------------ end to end


@pytest.mark.federation
def test_cifar10_pm_trains_and_audits_resnet18_on_files_in_torchvisions_layout(tmp_path, monkeypatch):
    """`cifar10_PM.py --dataset cifar10 --model resnet18` on tiny CIFAR-10 batches written in torchvision's
    cifar-10-batches-py layout (read by torchvision's CIFAR10, the test files' md5s put in its table: trust_files),
    two rounds of two parties with every signal and RMIA (one independent reference: the copies' own training is
    test_reference_copies_train_like_separate_local_trainings'): the reports exist and hold finite metrics. Run in
    this process (run_demo_here): what a new interpreter does is the demo's own tests' subject, not this one's."""
    import json

    from report_drawing import pages_drawn_at_the_end
    from shared_runs import run_demo_here
    from torchvision_files import trust_files, write_dataset

    write_dataset(tmp_path / "data", "cifar10", 80, 20, seed=7)
    trust_files(monkeypatch, tmp_path / "data", "cifar10")
    log_dir = tmp_path / "logs"
    args = ["--dataset", "cifar10", "--model", "resnet18", "--data-dir", str(tmp_path / "data"), "--comm_round", "2",
            "--collaborators", "2", "--train_dataset_ratio", "0.2", "--test_dataset_ratio", "0.2",
            "--audit_dataset_ratio", "0.4", "--fpr_tolerance", "0.1", "0.5", "--reference_models", "1",
            "--log_dir", str(log_dir), "--no_progress"]
    with pages_drawn_at_the_end():  # the pages are read, not each round's images
        proc = run_demo_here(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "finished 2 rounds" in proc.stdout
    for col in ("collaborator1", "collaborator2"):
        for rnd in (0, 1):
            record = json.loads((log_dir / col / f"round_{rnd:04d}" / "audit.json").read_text())
            metrics = record["metrics"]
            assert "mia_local_gradient_norm_exact_auc" in metrics and "rmia_independent_exact_auc" in metrics
            assert record["extra"]["rmia"]["independent"]["reference_models"] == 1
            assert all(math.isfinite(v) for v in metrics.values()), metrics
            assert record["settings"]["gradient_layer"] == "conv1"  # --is_features: the first layer with parameters
        assert (log_dir / col / "index.html").is_file()
    assert (log_dir / "index.html").is_file() and (log_dir / "aggregator" / "index.html").is_file()


def test_the_demo_refuses_a_model_that_cannot_take_the_datasets_images(tmp_path, capsys):
    """One line naming the flags before anything is written (ResNet-18 on digits' 8x8 images)."""
    import cifar10_PM

    log_dir = tmp_path / "logs"
    try:
        code = cifar10_PM.main(["--dataset", "digits", "--model", "resnet18", "--log_dir", str(log_dir)])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and not log_dir.exists()
    assert err.startswith("error: --model: model 'resnet18' cannot take inputs of shape 1x8x8: ")
    assert "--dataset digits" in err
