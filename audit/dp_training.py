"""DP-SGD retraining of one round's update with opacus (used by the gate's `dp_retrain` action).

opacus does per-sample clipping, noise and privacy accounting; this module only sets up the recipe the
plain training uses (same model start, optimizer type and hyper-parameters, batch size and epochs).

Sampling is Poisson (opacus' DPDataLoader, each member joins a batch with probability batch_size / n):
the accountant's subsampled-Gaussian bound assumes it, so with shuffled fixed-size batches the reported
epsilon would not be a valid bound. The accountant is RDP: fast and stable for the few hundred steps
of a round; one accountant serves every try of a round, so the epsilon it reports composes all of them.

BatchNorm (torchvision's classifiers): in train mode a sample's output depends on the other samples of its batch,
so no per-sample gradient bounds its influence, and the running statistics it updates are averages of the members'
activations with no noise; opacus refuses such a layer. The retrain keeps the plan's architecture: BatchNorm runs
in eval mode with the received model's statistics, its weight and bias are not trained, and every other parameter
is trained with DP-SGD. In eval mode BatchNorm is a fixed per-channel affine map, so each sample's gradient is its
own and opacus' clipping and accounting hold; what the retrain sends for BatchNorm's tensors is what it received
(no member's data in them). Replacing BatchNorm by GroupNorm (opacus' fix) would change the architecture the
aggregator averages.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class DPResult:
    state_dict: dict  # the retrained model's weights (keys of the plain model, no opacus prefix)
    loss: float  # mean training loss of the last epoch
    noise_multiplier: float
    steps: int
    sample_rate: float = 0.0  # Poisson sampling rate of each example per step (what the accountant is told)


class RoundAccountant:
    """One privacy engine per round: every DP retrain of the round adds to its epsilon."""

    def __init__(self, members: tuple[np.ndarray, np.ndarray]):
        # Imported here, on the first DP retrain: otherwise opacus' memory would be in every collaborator process.
        from opacus import PrivacyEngine

        with warnings.catch_warnings():
            # "Secure RNG turned off": seeded generators are the point here (reproducible runs).
            warnings.simplefilter("ignore", UserWarning)
            self.engine = PrivacyEngine(accountant="rdp")
        x, y = members
        x = torch.as_tensor(np.asarray(x))
        # One dataset object for every try, so opacus knows they train on the same data. Integer inputs (token ids
        # for an Embedding) stay integer.
        self.dataset = TensorDataset(x.float() if x.is_floating_point() else x,
                                     torch.as_tensor(np.asarray(y), dtype=torch.int64))

    def epsilon(self, delta: float) -> float:
        if not self.engine.accountant.history:
            return 0.0
        return float(self.engine.get_epsilon(delta))


def dp_retrain(
    start_model: torch.nn.Module,
    make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer],
    accountant: RoundAccountant,
    *,
    batch_size: int,
    epochs: int,
    noise_multiplier: float,
    max_grad_norm: float,
    seed: int,
    canaries=None,
) -> DPResult:
    """Train a copy of `start_model` for `epochs` with DP-SGD; `start_model` itself is left untouched.

    `canaries` (audit.canary.gradients.GradientCanaries, for an audit's shadow training only): white-box canary
    gradients added among each step's per-sample gradients before opacus clips them, and read back after the step."""
    model = copy.deepcopy(start_model)
    model.train()
    _freeze_batchnorm(model)
    device = next(model.parameters()).device  # the dataset stays on the CPU (opacus samples it); batches go here
    optimizer = make_optimizer(model)
    loader = DataLoader(accountant.dataset, batch_size=batch_size,
                        generator=torch.Generator().manual_seed(seed))  # Poisson sampling draws from it
    private_model, private_optimizer, private_loader = accountant.engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        poisson_sampling=True,
        noise_generator=torch.Generator().manual_seed(seed + 1),
    )
    sample_rate = float(private_loader.sample_rate)  # what opacus tells its accountant: 1 / batches per epoch
    if canaries is not None:
        canaries.start(private_optimizer.params, sample_rate=sample_rate, noise_multiplier=noise_multiplier,
                       max_grad_norm=max_grad_norm)
    steps, losses = 0, []
    with warnings.catch_warnings():
        # The input does not require grad, so torch warns that opacus' full backward hook on the first
        # layer fires for module outputs only: that is all opacus needs for per-sample gradients.
        warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
        try:
            for _ in range(epochs):
                losses = []
                for x, y in private_loader:
                    x, y = x.to(device), y.to(device)
                    private_optimizer.zero_grad()
                    loss = F.cross_entropy(private_model(x), y)
                    loss.backward()
                    if canaries is not None:
                        canaries.before_step(private_optimizer)
                    private_optimizer.step()
                    if canaries is not None:
                        canaries.after_step(private_optimizer)
                    steps += 1
                    if len(y):  # Poisson sampling may draw an empty batch (its loss is NaN)
                        losses.append(float(loss.detach()))
        finally:
            private_model.cleanup()  # remove opacus' hooks and attributes from the model
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return DPResult(state_dict=state, loss=float(np.mean(losses)) if losses else float("nan"),
                    noise_multiplier=noise_multiplier, steps=steps, sample_rate=sample_rate)


_BATCHNORM = (torch.nn.modules.batchnorm._BatchNorm,)


def _freeze_batchnorm(model: torch.nn.Module) -> None:
    """BatchNorm layers in eval mode (the received running statistics) with their weight and bias not trained (see
    the module docstring)."""
    for module in model.modules():
        if isinstance(module, _BATCHNORM):
            module.eval()
            for parameter in module.parameters(recurse=False):
                parameter.requires_grad_(False)


@dataclass(frozen=True)
class DPTraining:
    """The party's DP-SGD recipe as the audit's `audit.canary.dp.DPTrainer`: `dp_retrain` itself (this module's, the
    code that trains the sent update) run on other data, with its own accountant, and white-box canaries when
    given. The canary audit trains its shadows with it, so it audits this very code."""

    make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer]
    batch_size: int
    epochs: int
    noise_multiplier: float
    max_grad_norm: float

    def __call__(self, start_model: torch.nn.Module, x, y, *, seed: int, gradient_canaries=None):
        from audit.canary.dp import DPRun

        result = dp_retrain(start_model, self.make_optimizer, RoundAccountant((x, y)), batch_size=self.batch_size,
                            epochs=self.epochs, noise_multiplier=self.noise_multiplier,
                            max_grad_norm=self.max_grad_norm, seed=seed, canaries=gradient_canaries)
        return DPRun(result.state_dict, result.noise_multiplier, self.max_grad_norm, result.sample_rate, result.steps)
