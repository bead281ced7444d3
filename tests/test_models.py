"""Tests for src.runner.models (Fidel-style CNN and FCNN)."""


import pytest
import torch
from torch import nn


from src.runner.models import ACTIVATIONS, CNN, FCNN, PAPER_MODELS, build_model

SHAPES = [(1, 8, 8), (3, 32, 32)]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("name", PAPER_MODELS)
@pytest.mark.parametrize("shape", SHAPES)
def test_output_shape(name, shape):
    model = build_model(name, shape, 10)
    out = model(torch.randn(5, *shape))
    assert out.shape == (5, 10)
    assert build_model(name, list(shape), 3)(torch.randn(2, *shape)).shape == (2, 3)  # loader gives a list


@pytest.mark.parametrize("shape", [(1, 2, 2), (2, 5, 7), (3, 9, 4)])
def test_cnn_any_image_size(shape):
    model = CNN(shape, 4)
    assert model(torch.randn(3, *shape)).shape == (3, 4)
    assert model.classifier.fc1.in_features == 32 * (shape[1] // 2) * (shape[2] // 2)


@pytest.mark.parametrize("bad", [(1, 1, 8), (1, 8), (0, 8, 8), "abc", (1, 8, 8.5)])
def test_bad_input_shape(bad):
    with pytest.raises(ValueError, match="input_shape|2x2"):
        CNN(bad, 10)


def test_bad_num_classes():
    with pytest.raises(ValueError, match="num_classes"):
        FCNN((1, 8, 8), 0)


@pytest.mark.parametrize("name", PAPER_MODELS)
@pytest.mark.parametrize("shape", SHAPES)
def test_module_names_and_first_dense_layer(name, shape):
    model = build_model(name, shape, 10)
    fc1 = model.get_submodule(model.FIRST_DENSE_LAYER)
    out = model.get_submodule(model.OUTPUT_LAYER)
    assert isinstance(fc1, nn.Linear) and fc1.out_features == 128
    assert isinstance(out, nn.Linear) and out.out_features == 10
    assert model.classifier[0] is fc1  # by index too
    x = torch.randn(2, *shape)
    assert model.features(x).shape == (2, fc1.in_features)  # features(x) is fc1's input
    keys = set(model.state_dict())
    assert {"classifier.fc1.weight", "classifier.fc1.bias", "classifier.out.weight"} <= keys
    if name == "cnn":
        assert isinstance(model.features.conv1, nn.Conv2d) and model.features.conv1.out_channels == 32
        assert [m.out_features for m in model.classifier if isinstance(m, nn.Linear)] == [128, 64, 10]
    else:
        assert [m.out_features for m in model.classifier if isinstance(m, nn.Linear)] == [128, 128, 64, 10]


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_fcnn_activations(activation):
    model = FCNN((1, 8, 8), 10, activation=activation)
    expected = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}[activation]
    acts = [model.classifier.act1, model.classifier.act2, model.classifier.act3]
    assert all(type(a) is expected for a in acts)
    assert model(torch.randn(4, 1, 8, 8)).shape == (4, 10)


def test_fcnn_dropout():
    plain = FCNN((1, 8, 8), 10)
    assert not any(isinstance(m, nn.Dropout) for m in plain.modules())
    assert isinstance(plain.classifier.drop1, nn.Identity)
    model = FCNN((1, 8, 8), 10, dropout=0.5)
    drops = [model.classifier.drop1, model.classifier.drop2, model.classifier.drop3]
    assert all(isinstance(d, nn.Dropout) and d.p == 0.5 for d in drops)
    # same names / indices with and without dropout
    assert [n for n, _ in plain.named_modules()] == [n for n, _ in model.named_modules()]
    assert plain.state_dict().keys() == model.state_dict().keys()
    x = torch.randn(8, 1, 8, 8)
    model.train()
    assert not torch.equal(model(x), model(x))  # dropout active in train mode
    model.eval()
    assert torch.equal(model(x), model(x))


@pytest.mark.parametrize("kwargs, key", [(dict(activation="gelu"), "activation"), (dict(dropout=1.0), "dropout"), (dict(dropout=-0.1), "dropout")])
def test_fcnn_bad_kwargs(kwargs, key):
    with pytest.raises(ValueError, match=key):
        build_model("fcnn", (1, 8, 8), 10, **kwargs)


def test_build_model_errors():
    with pytest.raises(ValueError, match=r"'resnet'.*cnn, fcnn"):
        build_model("resnet", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="activation"):
        build_model("cnn", (1, 8, 8), 10, activation="tanh")  # CNN has no settings
    with pytest.raises(ValueError, match="dropuot"):
        build_model("fcnn", (1, 8, 8), 10, dropuot=0.2)
    assert isinstance(build_model("fcnn", (1, 8, 8), 10, activation="tanh", dropout=0.1), FCNN)
    assert isinstance(build_model("CNN", (1, 8, 8), 10), CNN)


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_no_inplace_modules(name):
    for shape in SHAPES:
        model = build_model(name, shape, 10, **({"dropout": 0.2} if name == "fcnn" else {}))
        for mod_name, mod in model.named_modules():
            assert not getattr(mod, "inplace", False), f"{mod_name} is in-place"


@pytest.mark.parametrize("name", PAPER_MODELS)
@pytest.mark.parametrize("shape", SHAPES)
def test_gradients_flow(name, shape):
    model = build_model(name, shape, 10)
    x, y = torch.randn(6, *shape), torch.randint(0, 10, (6,))
    nn.functional.cross_entropy(model(x), y).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_per_sample_gradients_with_torch_func(name):
    """Per-sample gradients (vmap over grad) work and match the per-sample loop."""
    from torch.func import functional_call, grad, vmap

    model = build_model(name, (1, 8, 8), 10)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))

    def loss(p, xi, yi):
        out = functional_call(model, p, (xi.unsqueeze(0),))
        return nn.functional.cross_entropy(out, yi.unsqueeze(0))

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    model.zero_grad()
    nn.functional.cross_entropy(model(x[2:3]), y[2:3]).backward()
    torch.testing.assert_close(per_sample["classifier.fc1.weight"][2], model.classifier.fc1.weight.grad)
