"""The names of the models a plan can name (`task_runner.settings.model`), torch-free until torchvision's registry is
read: the workspace's own (src.runner.models builds them), then torchvision's classifiers (src.runner.torchvision_models
fits them to a dataset's images). The demo's --model choices and the plan's check read them here.
"""

from __future__ import annotations

__all__ = ["MODELS", "WORKSPACE_MODELS", "TORCHVISION_LEFT_OUT", "in_models", "ModelChoices"]

# MODELS is read from torchvision's own registry (torchvision.models.list_models) when it is first used, which
# imports torch: the rest of this module stays torch-free.
WORKSPACE_MODELS = ("cnn", "fcnn", "alexnet")
# Families of torchvision's registry that are not offered, by the start of their names, and why.
TORCHVISION_LEFT_OUT = {
    "alexnet": "the name is the workspace's AlexNet, the OpenFL tutorial's net",
    "googlenet": "its training output is a tuple with auxiliary heads, not logits",
    "inception_v3": "its training output is a tuple with auxiliary heads, and it needs images of 75x75 or more",
    "vit_": "built for one image size (224x224; its position embeddings)",
    "maxvit_": "built for one image size (224x224)",
}


def _models() -> tuple[str, ...]:
    import torchvision.models

    registry = torchvision.models.list_models(module=torchvision.models)  # classification models only
    return WORKSPACE_MODELS + tuple(name for name in registry if not name.startswith(tuple(TORCHVISION_LEFT_OUT)))


def in_models(name) -> bool:
    """Whether ``name`` is in MODELS. The workspace's own names are answered without reading torchvision's registry:
    a process that builds one of them never imports torchvision."""
    return name in WORKSPACE_MODELS or name in _registry()


class ModelChoices:
    """MODELS as argparse's ``choices``: membership through in_models, the list read only when it is shown."""

    def __contains__(self, name) -> bool:
        return in_models(name)

    def __iter__(self):
        return iter(_registry())

    def __len__(self) -> int:
        return len(_registry())


def _registry() -> tuple[str, ...]:
    if "MODELS" not in globals():  # looked up once, on first use
        globals()["MODELS"] = _models()
    return globals()["MODELS"]


def __getattr__(name: str):
    if name == "MODELS":
        return _registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

