"""Tests for src.runner.models.AlexNet (the OpenFL Privacy Meter tutorial's Net) and its `--layer_number` mapping."""

from pathlib import Path

import pytest
import torch
from torch import nn


import cifar10_PM
from src.runner.model_names import MODELS
from src.runner.models import PAPER_MODELS, AlexNet, build_model

SHAPES = [(3, 32, 32), (1, 8, 8)]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("shape", SHAPES)
def test_output_shape(shape):
    model = build_model("alexnet", shape, 10).eval()
    assert model(torch.randn(4, *shape)).shape == (4, 10)
    assert build_model("AlexNet", list(shape), 3)(torch.randn(2, *shape)).shape == (2, 3)


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 5, 7), (3, 64, 64)])
def test_any_image_size_builds(shape):
    assert AlexNet(shape, 4)(torch.randn(2, *shape)).shape == (2, 4)


def test_parameter_count_on_cifar_shape():
    n = sum(p.numel() for p in AlexNet((3, 32, 32), 10).parameters())
    assert n == 23_272_266  # the tutorial's Net: ~23.3M
    assert abs(n - 23.3e6) < 0.05e6


@pytest.mark.parametrize("shape", SHAPES)
def test_no_inplace_modules_and_dropout(shape):
    model = AlexNet(shape, 10)
    assert not [m for m in model.modules() if getattr(m, "inplace", False)]
    assert sum(isinstance(m, nn.Dropout) for m in model.modules()) == 2
    convs = [m for m in model.features if isinstance(m, nn.Conv2d)]
    linears = [m for m in model.classifier if isinstance(m, nn.Linear)]
    assert len(convs) == 5 and [m.out_features for m in linears] == [4096, 4096, 10]


@pytest.mark.parametrize("shape", SHAPES)
def test_layout_and_first_dense_layer(shape):
    model = AlexNet(shape, 10).eval()
    fc1 = model.get_submodule(model.FIRST_DENSE_LAYER)
    assert isinstance(fc1, nn.Linear) and fc1 is model.classifier.fc1
    assert isinstance(model.get_submodule(model.OUTPUT_LAYER), nn.Linear)
    assert isinstance(model.features, nn.Sequential) and isinstance(model.classifier, nn.Sequential)
    x = torch.randn(2, *shape)
    assert model.features(x).shape == (2, fc1.in_features)  # features(x) is fc1's input (after Dropout)
    assert model.features[10] is model.features.conv5  # the tutorial's --layer_number 10


def test_model_lists():
    assert "alexnet" in MODELS and set(PAPER_MODELS) <= set(MODELS)
    with pytest.raises(ValueError, match="alexnet"):
        build_model("vgg", (3, 32, 32), 10)
    with pytest.raises(ValueError, match="not a setting"):
        build_model("alexnet", (3, 32, 32), 10, dropout=0.1)


@pytest.mark.parametrize("dataset", ["cifar10", "digits"])
@pytest.mark.slow
def test_layer_number_10_is_a_conv_layer_with_parameters(dataset):
    name = cifar10_PM.feature_layer("alexnet", dataset, 10)
    assert name == "features.conv5"
    from src.data.datasets import dataset_info

    info = dataset_info(dataset)
    layer = build_model("alexnet", info.input_shape, info.num_classes).get_submodule(name)
    assert isinstance(layer, nn.Conv2d) and any(True for _ in layer.parameters())
    args = cifar10_PM.build_parser().parse_args(
        ["--model", "alexnet", "--dataset", dataset, "--is_feature", "True", "--layer_number", "10"])
    args.report_dir = Path("unused")
    audit = cifar10_PM.overrides_from_args(args)["task_runner"]["settings"]["audit"]
    assert audit["gradient_layer"] == "features.conv5"
    with pytest.raises(ValueError, match="layer_number"):
        cifar10_PM.feature_layer("alexnet", dataset, 11)  # a ReLU: no parameters
