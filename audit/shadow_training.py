"""Many small local trainings at once: the adversary's shadow updates.

Each copy starts from the same (received global) weights and runs the collaborators' local recipe on its own
data subset. The copies' parameters are stacked along a leading axis and trained together: a torch.func.vmap'd
functional_call gives every copy's outputs in one call, and the loss is the sum of the copies' mean losses, so
one backward gives each copy exactly its own gradient (the copies share nothing). SGD (with momentum) and Adam
act element-wise, so torch.optim on the stacked tensors is each copy's own optimiser.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

__all__ = ["TrainingRecipe", "train_copies", "copies_per_chunk"]

OPTIMIZERS = ("SGD", "Adam")
# Memory for stacked copies: parameters, gradients and up to two optimiser states each (float32).
_CHUNK_BUDGET_BYTES = 512 * 2**20


@dataclass(frozen=True)
class TrainingRecipe:
    """The local training a collaborator runs each round (the task runner's optimiser, epochs, batch size)."""

    optimizer: str = "SGD"
    learning_rate: float = 0.01
    momentum: float = 0.9
    epochs: int = 1
    batch_size: int = 32

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"recipe.optimizer: {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        if not self.learning_rate > 0 or self.epochs < 1 or self.batch_size < 1 or self.momentum < 0:
            raise ValueError(f"recipe: invalid {self}")

    def make_optimizer(self, tensors: list[torch.Tensor]) -> torch.optim.Optimizer:
        if self.optimizer == "SGD":
            return torch.optim.SGD(tensors, lr=self.learning_rate, momentum=self.momentum)
        return torch.optim.Adam(tensors, lr=self.learning_rate)


def copies_per_chunk(model: torch.nn.Module) -> int:
    n_params = sum(p.numel() for p in model.parameters())
    return max(1, _CHUNK_BUDGET_BYTES // (16 * n_params))


def _train_chunk(model, params, buffers, x, y, recipe: TrainingRecipe, generator: torch.Generator) -> dict:
    copies, size = y.shape
    stacked = {n: p.detach().unsqueeze(0).repeat(copies, *([1] * p.dim())).requires_grad_(True)
               for n, p in params.items()}
    optimizer = recipe.make_optimizer(list(stacked.values()))
    forward = vmap(lambda p, xb: functional_call(model, (p, buffers), (xb,)), randomness="different")
    rows = torch.arange(copies)[:, None]
    for _ in range(recipe.epochs):
        order = torch.argsort(torch.rand(copies, size, generator=generator), dim=1)  # each copy its own shuffle
        for start in range(0, size, recipe.batch_size):
            idx = order[:, start:start + recipe.batch_size]
            logits = forward(stacked, x[rows, idx])
            losses = F.cross_entropy(logits.flatten(0, 1), y[rows, idx].flatten(), reduction="none")
            optimizer.zero_grad(set_to_none=True)
            losses.view(copies, -1).mean(dim=1).sum().backward()
            optimizer.step()
    return {n: t.detach() for n, t in stacked.items()}


def train_copies(model: torch.nn.Module, x, y, recipe: TrainingRecipe, *, names: list[str], seed: int = 0,
                 chunk: int | None = None) -> np.ndarray:
    """Train len(x) copies of `model`, copy c on (x[c], y[c]) with `recipe`; return their raw updates.

    x: (copies, samples, *features), y: (copies, samples) labels. Returns (copies, d) float64: each copy's
    trained-minus-start values of the parameters `names`, flattened and concatenated in that order.
    Deterministic for a given seed (shuffles and dropout); `model` itself is left unchanged.
    """
    x = torch.as_tensor(np.asarray(x), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(y), dtype=torch.long)
    if x.shape[:2] != y.shape or y.ndim != 2 or y.shape[1] == 0:
        raise ValueError(f"train_copies: x {tuple(x.shape)} and y {tuple(y.shape)} must be (copies, samples, ...) "
                         "and (copies, samples) with samples >= 1")
    params = dict(model.named_parameters())
    unknown = [n for n in names if n not in params]
    if unknown:
        raise ValueError(f"train_copies: {unknown} are not parameters of the model")
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    chunk = chunk or copies_per_chunk(model)
    generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    out = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # dropout masks
        model.train()  # as the local training runs
        try:
            for start in range(0, len(y), chunk):
                trained = _train_chunk(model, params, buffers, x[start:start + chunk], y[start:start + chunk],
                                       recipe, generator)
                out.append(torch.cat([(trained[n] - params[n].detach()).flatten(1) for n in names], dim=1))
        finally:
            model.train(was_training)
    return torch.cat(out).double().numpy()
