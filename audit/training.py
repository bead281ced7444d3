"""Many small local trainings at once: the adversary's shadow updates, and reference models for RMIA.

Each copy starts from the same (received global) weights and runs the collaborators' local recipe on its own
data subset. The copies' parameters are stacked along a leading axis and trained together: a torch.func.vmap'd
functional_call gives every copy's outputs in one call, and the loss is the sum of the copies' mean losses, so
one backward gives each copy exactly its own gradient (the copies share nothing). SGD (with momentum) and Adam
act element-wise, so torch.optim on the stacked tensors is each copy's own optimiser. Buffers are stacked the same
way: each copy's BatchNorm updates its own running statistics, as a separate local training would, and the
received model's parameters and buffers are never written. A forward vmap cannot batch (e.g. BatchNorm with
momentum=None) trains the copies one at a time instead, with a warning.

`train_copies` returns each copy's update (trained minus start) of chosen parameters; `train_references` keeps the
trained copies' parameters and buffers stacked (`TrainedCopies`), and `TrainedCopies.logits(x)` runs every copy on
the same samples in eval mode under vmap, for membership inference against reference models (audit/membership/rmia.py).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from audit.config.vocabulary import OPTIMIZERS
from audit.model_io import check_batch_size, model_device, model_input, module_mode
from audit.scaled_pixels import read_in_chunks
from audit.spill import SpillFolder, weightless_template

__all__ = ["TrainingRecipe", "TrainedCopies", "train_copies", "train_references", "copies_per_chunk"]

# Memory for stacked copies: parameters, gradients and up to two optimiser states each (float32).
_CHUNK_BUDGET_BYTES = 512 * 2**20
# Trained copies larger than this (all of them together) wait on disk between uses, one chunk in memory at a time:
# RMIA's independent references are kept across rounds, and even one of the tutorial's AlexNet (93 MB a party) held in
# memory was most of a run's growth from its first round to its second; writing and reading it back costs a fraction
# of a second a round against its training's tens of seconds.
_SPILL_BYTES = 32 * 2**20


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


def _stacked(tensors: dict, copies: int) -> dict:
    """Each tensor repeated `copies` times along a new leading axis, in new storage (one slice per copy)."""
    return {n: t.detach().unsqueeze(0).repeat(copies, *([1] * t.dim())) for n, t in tensors.items()}


def _copies_forward(model, batched: bool):
    """forward(params, buffers, inputs) -> every copy's outputs, all three stacked along the copies' axis."""
    if batched:
        return vmap(lambda p, b, xb: functional_call(model, (p, b), (xb,)), randomness="different")

    def one_at_a_time(p, b, xs):  # views of the stacked tensors: gradients and buffer updates land in copy c's slice
        return torch.stack([functional_call(model, ({n: t[c] for n, t in p.items()}, {n: t[c] for n, t in b.items()}),
                                            (xs[c],)) for c in range(len(xs))])

    return one_at_a_time


def _train_chunk(model, params, buffers, x, y, recipe: TrainingRecipe, generator: torch.Generator,
                 batched: bool = True, start: tuple[dict, dict] | None = None,
                 own_start: bool = False) -> tuple[dict, dict]:
    """The copies' trained parameters and their buffers after training, each stacked (copies, ...).

    `batched`: all copies in one vmap'd forward; else one functional_call per copy (the same training, slower;
    dropout masks are drawn copy by copy, so they differ from the batched ones). `start`: each copy's own starting
    parameters and buffers, stacked (copies, ...); None: every copy starts from `params` and `buffers`.
    `own_start`: start's tensors are this call's alone (just read from disk) and are trained in place, not copied:
    one chunk's parameters less in memory while it trains."""
    copies, size = y.shape
    if start is None:
        stacked = {n: t.requires_grad_(True) for n, t in _stacked(params, copies).items()}
        # Every copy its own buffers, batched like the parameters: BatchNorm in train mode updates its running
        # statistics (and num_batches_tracked) in place, which vmap allows only on batched buffers ("Batch norm got a
        # batched tensor as input while the running_mean or running_var ... were not batched"), and the received
        # model's stay untouched.
        stacked_buffers = _stacked(buffers, copies)
    elif own_start:
        stacked = {n: start[0][n].detach().requires_grad_(True) for n in params}
        stacked_buffers = {n: start[1][n].detach() for n in buffers}
    else:  # new storage: the copies handed in stay as they were
        stacked = {n: start[0][n].detach().clone().requires_grad_(True) for n in params}
        stacked_buffers = {n: start[1][n].detach().clone() for n in buffers}
    optimizer = recipe.make_optimizer(list(stacked.values()))
    forward = _copies_forward(model, batched)
    rows = torch.arange(copies, device=x.device)[:, None]
    for _ in range(recipe.epochs):
        # Each copy its own shuffle, drawn on the CPU (the seeded generator's device, so the same on any device),
        # used where the samples are.
        order = torch.argsort(torch.rand(copies, size, generator=generator, device="cpu"), dim=1).to(x.device)
        for start in range(0, size, recipe.batch_size):
            idx = order[:, start:start + recipe.batch_size]
            logits = forward(stacked, stacked_buffers, x[rows, idx])
            losses = F.cross_entropy(logits.flatten(0, 1), y[rows, idx].flatten(), reduction="none")
            optimizer.zero_grad(set_to_none=True)
            losses.view(copies, -1).mean(dim=1).sum().backward()
            optimizer.step()
    # The last step's gradients and the optimizer's state (a chunk's size each) go now, not whenever a garbage
    # collection reaches the optimizer: the next chunk trains while this one's result is being stored.
    optimizer.zero_grad(set_to_none=True)
    optimizer.state.clear()
    return {n: t.detach() for n, t in stacked.items()}, stacked_buffers


def _dropout_rng_state(cuda: list) -> tuple:
    return torch.get_rng_state(), [torch.cuda.get_rng_state(device) for device in cuda]


def _set_dropout_rng_state(cuda: list, state: tuple) -> None:
    torch.set_rng_state(state[0])
    for device, device_state in zip(cuda, state[1]):
        torch.cuda.set_rng_state(device_state, device)


def _start_of(start: "TrainedCopies | None", first: int, chunk: int) -> tuple[dict, dict] | None:
    return None if start is None else start.copies(first, first + chunk)


def _train_in_chunks(model: torch.nn.Module, x, y, recipe: TrainingRecipe, *, seed: int, chunk: int | None,
                     on_chunk, caller: str, start: "TrainedCopies | None" = None, subsets=None) -> None:
    """Train len(x) copies of `model` on (x[c], y[c]), `chunk` copies at a time, and hand each chunk's trained
    parameters and buffers (stacked, (copies in the chunk, ...)) to on_chunk(start, params, buffers) before the next
    chunk is trained: memory is one chunk's training plus what on_chunk keeps. `start`: copy c continues from
    start's copy c instead of from `model`'s weights. `subsets` (copies, samples) indices: x (N, ...) and y (N,) are
    one pool and copy c trains on its rows subsets[c], picked a chunk at a time (no (copies, samples, ...) copy of the
    data)."""
    device = model_device(model)
    if subsets is not None and read_in_chunks(x):
        def pick(rows):  # a pool held as pixels: only the rows a chunk trains on are converted
            return model_input(model, x[rows.cpu().numpy()])
    else:
        x = model_input(model, np.asarray(x))

        def pick(rows):
            return x[rows]
    y = torch.as_tensor(np.asarray(y), dtype=torch.long, device=device)
    if subsets is not None:
        subsets = torch.as_tensor(np.asarray(subsets), dtype=torch.long, device=device)
        if subsets.ndim != 2 or subsets.shape[1] == 0 or len(x) != len(y) or y.ndim != 1 or (
                subsets.numel() and not 0 <= int(subsets.min()) <= int(subsets.max()) < len(y)):
            raise ValueError(f"{caller}: subsets {tuple(subsets.shape)} must be (copies, samples) indices into x "
                             f"{tuple(x.shape)} and y {tuple(y.shape)}, one row per sample")
    elif x.shape[:2] != y.shape or y.ndim != 2 or y.shape[1] == 0:
        raise ValueError(f"{caller}: x {tuple(x.shape)} and y {tuple(y.shape)} must be (copies, samples, ...) "
                         "and (copies, samples) with samples >= 1")
    copies = len(subsets) if subsets is not None else len(y)
    params = dict(model.named_parameters())
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    chunk = chunk or copies_per_chunk(model)
    generator = torch.Generator().manual_seed(seed)
    # One copy per chunk (a large model, or a single copy): plain autograd, not vmap over one copy, which trains the
    # same (the same draws, weights equal to rounding) with vmap's batching rules as overhead and nothing to batch.
    batched = min(chunk, copies) > 1
    # Train mode for every submodule, as the local training runs (model.train()); each one's flag comes back after.
    # Dropout draws from the generator of the device the model is on: that one is seeded here and given back after.
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), module_mode(model, training=True):
        torch.manual_seed(seed)  # dropout masks
        for first in range(0, copies, chunk):
            if subsets is None:
                xs, ys = x[first:first + chunk], y[first:first + chunk]
            else:
                xs, ys = pick(subsets[first:first + chunk]), y[subsets[first:first + chunk]]
            args = (model, params, buffers, xs, ys, recipe, generator)
            # Copies read from disk are nobody else's: trained in place (read again for a retry, which starts over).
            owned = start is not None and start.on_disk
            vmap_error = None
            if batched:
                dropout_state, shuffle_state = _dropout_rng_state(cuda), generator.get_state()
                try:
                    trained, trained_buffers = _train_chunk(*args, start=_start_of(start, first, chunk),
                                                            own_start=owned)
                except (RuntimeError, NotImplementedError) as err:
                    vmap_error = err
                    _set_dropout_rng_state(cuda, dropout_state)  # redo the chunk from scratch, same draws
                    generator.set_state(shuffle_state)
            if not batched or vmap_error is not None:
                # For forwards vmap cannot batch (BatchNorm with momentum=None reads float(num_batches_tracked),
                # .item(), data-dependent control flow); an error that is not vmap's is raised here again, by plain
                # autograd, with its own message. Stacked buffers are made anew per call: the failed try left none.
                trained, trained_buffers = _train_chunk(*args, batched=False, start=_start_of(start, first, chunk),
                                                        own_start=owned)
            if vmap_error is not None:
                warnings.warn(f"{caller}: torch.func.vmap cannot batch the model's training forward "
                              f"({vmap_error}); training the copies one at a time, which is slower",
                              RuntimeWarning, stacklevel=3)
                batched = False
            on_chunk(first, trained, trained_buffers)
            del trained, trained_buffers  # on_chunk's now: not held while the next chunk trains


def train_copies(model: torch.nn.Module, x, y, recipe: TrainingRecipe, *, names: list[str], seed: int = 0,
                 chunk: int | None = None) -> np.ndarray:
    """Train len(x) copies of `model`, copy c on (x[c], y[c]) with `recipe`; return their raw updates.

    x: (copies, samples, *features), y: (copies, samples) labels. Returns (copies, d) float64: each copy's
    trained-minus-start values of the parameters `names`, flattened and concatenated in that order.
    Deterministic for a given seed (shuffles and dropout); `model` itself is left unchanged (parameters, buffers,
    train/eval flags). Floating inputs are cast to the model's dtype, integer inputs (token ids) kept integer.
    """
    params = dict(model.named_parameters())
    unknown = [n for n in names if n not in params]
    if unknown:
        raise ValueError(f"train_copies: {unknown} are not parameters of the model")
    out = []

    def keep_update(start, trained, buffers):
        out.append(torch.cat([(trained[n] - params[n].detach()).flatten(1) for n in names], dim=1))

    _train_in_chunks(model, x, y, recipe, seed=seed, chunk=chunk, on_chunk=keep_update, caller="train_copies")
    return torch.cat(out).double().cpu().numpy()


# ------------------------------------------------------------------------------------------ reference models


def _eval_chunk(model: torch.nn.Module, params: dict, buffers: dict, xb: torch.Tensor, batched: bool) -> torch.Tensor:
    """Every copy of the chunk on the same batch: (copies, batch, classes). `model` must be in eval mode."""
    if batched:
        return vmap(lambda p, b: functional_call(model, (p, b), (xb,)))(params, buffers)
    copies = next(iter(params.values())).shape[0]
    return torch.stack([functional_call(model, ({n: t[c] for n, t in params.items()},
                                                {n: t[c] for n, t in buffers.items()}), (xb,))
                        for c in range(copies)])


class _SpilledCopies:
    """Stacked copies in files of a private temporary folder (audit.spill.SpillFolder: the same values when read
    back, the folder gone with the object), one file per chunk of copies as it was trained."""

    def __init__(self):
        self._files = SpillFolder("trained_copies_")
        self.folder = self._files.folder
        self.bounds: list[tuple[int, int]] = []  # (first copy, stop) of each file, in order

    def __len__(self) -> int:
        return self.bounds[-1][1] if self.bounds else 0

    def append(self, params: dict, buffers: dict) -> None:
        first = len(self)
        self._files.save(str(len(self.bounds)), {"params": params, "buffers": buffers})
        self.bounds.append((first, first + next(iter(params.values())).shape[0]))

    def read(self, first: int, stop: int) -> tuple[dict, dict]:
        """Copies first..stop-1, stacked (read from the files that hold them)."""
        parts = []
        for index, (a, b) in enumerate(self.bounds):
            if a < stop and b > first:
                saved = self._files.load(str(index))
                lo, hi = max(first, a) - a, min(stop, b) - a
                parts.append({kind: {n: t[lo:hi] if (lo, hi) != (0, b - a) else t for n, t in saved[kind].items()}
                              for kind in ("params", "buffers")})
        if len(parts) == 1:
            return parts[0]["params"], parts[0]["buffers"]
        return tuple({n: torch.cat([part[kind][n] for part in parts]) for n in parts[0][kind]}
                     for kind in ("params", "buffers"))


class TrainedCopies:
    """K trained copies of `model` without K nn.Modules: every parameter and buffer stacked, (K, *shape).

    `model` is the architecture the copies were trained from; `.model` keeps only its structure
    (audit.spill.weightless_template: a few bytes per tensor), not a whole model's weights as long as the copies live
    (a party keeps its independent references across rounds: they would pin the plan's initial model, 89 MB for the
    tutorial's net). `logits` runs every copy in eval mode. The stacked tensors are in memory, or (`train_references`
    with copies larger than _SPILL_BYTES) on disk until used, a chunk at a time: `copies(first, stop)` reads a range;
    `params` / `buffers` all of them."""

    def __init__(self, model: torch.nn.Module, params: dict | None = None, buffers: dict | None = None, *,
                 spilled: _SpilledCopies | None = None):
        if (params is None) == (spilled is None):
            raise ValueError("TrainedCopies: give the stacked params (and buffers) or the spilled copies, one of them")
        self.model = weightless_template(model)
        self._params, self._buffers, self._spilled = params, buffers or {}, spilled

    def __len__(self) -> int:
        if self._spilled is not None:
            return len(self._spilled)
        return next(iter(self._params.values())).shape[0]

    @property
    def on_disk(self) -> bool:
        return self._spilled is not None

    def copies(self, first: int, stop: int) -> tuple[dict, dict]:
        """(params, buffers) of copies first..stop-1, each stacked (stop - first, ...)."""
        if self._spilled is not None:
            return self._spilled.read(first, stop)
        return ({n: t[first:stop] for n, t in self._params.items()},
                {n: t[first:stop] for n, t in self._buffers.items()})

    @property
    def params(self) -> dict:
        return self._params if self._spilled is None else self.copies(0, len(self))[0]

    @property
    def buffers(self) -> dict:
        return self._buffers if self._spilled is None else self.copies(0, len(self))[1]

    def logits(self, x, *, batch_size: int = 256, chunk: int | None = None) -> np.ndarray:
        """Every copy's outputs on the samples x, (K, N, classes) float64, in eval mode (Dropout off, each copy's own
        BatchNorm running statistics), no autograd graph. One vmap'd call per `chunk` copies (default: as many as
        `copies_per_chunk` trains at once) and `batch_size` samples, so memory is bounded by chunk x batch_size
        activations whatever K and N; one copy at a time (with a warning) where vmap cannot batch the forward."""
        check_batch_size(batch_size)
        x = model_input(self.model, x)
        if x.ndim == 0 or x.shape[0] == 0:
            raise ValueError(f"TrainedCopies.logits: x must be (N, ...) with N >= 1, got {tuple(x.shape)}")
        chunk = chunk or copies_per_chunk(self.model)
        batched = min(chunk, len(self)) > 1  # one copy at a time: plain calls, as in training
        rows = []
        with torch.no_grad(), module_mode(self.model, training=False):
            for start in range(0, len(self), chunk):
                params, buffers = self.copies(start, start + chunk)
                parts = []
                for b in range(0, x.shape[0], batch_size):
                    xb = x[b:b + batch_size]
                    vmap_error = None
                    if batched:
                        try:
                            out = _eval_chunk(self.model, params, buffers, xb, True)
                        except (RuntimeError, NotImplementedError) as err:
                            vmap_error = err
                    if not batched or vmap_error is not None:
                        # An error that is not vmap's is raised here again, with its own message and no warning.
                        out = _eval_chunk(self.model, params, buffers, xb, False)
                    if vmap_error is not None:
                        warnings.warn(f"TrainedCopies.logits: torch.func.vmap cannot batch the model's forward "
                                      f"({vmap_error}); evaluating the copies one at a time", RuntimeWarning,
                                      stacklevel=2)
                        batched = False
                    if out.ndim != 3:
                        raise ValueError("the model must return a logits tensor of shape (batch, classes)")
                    parts.append(out.to(torch.float64))
                rows.append(torch.cat(parts, dim=1))
        return torch.cat(rows).cpu().numpy()


def train_references(model: torch.nn.Module, x, y, recipe: TrainingRecipe, *, seed: int = 0,
                     chunk: int | None = None, start: TrainedCopies | None = None, subsets=None) -> TrainedCopies:
    """Train len(x) reference models at once, copy c on (x[c], y[c]) (or, with `subsets`, on the rows subsets[c] of
    the pool x, y: the same training without stacking the copies' data) with the party's `recipe`, exactly as
    `train_copies` trains them (same shuffles, dropout masks, per-copy BatchNorm statistics for a seed), and keep
    each copy's trained parameters and buffers: `.logits(samples)` then gives every copy's outputs, for RMIA's
    Pr(x | reference) (`audit.membership.rmia.true_class_probability`).

    Every copy starts from `model`'s current parameters and buffers: pass the received global model for references
    fine-tuned from it, or a freshly initialised model of the same architecture for references that never saw the
    party's data. `start`: K copies trained before (e.g. by an earlier call), each continuing from its own weights,
    with a fresh optimiser (as a party's local training restarts its optimiser each round); `model` is then only the
    architecture (`start.model` will do). Training memory is one chunk's (`copies_per_chunk`: parameters,
    gradients, optimiser states); the result holds K copies' parameters and buffers (4 bytes per float32 value per copy), on disk when they exceed
    _SPILL_BYTES (RMIA's references of a large model, kept across rounds): each chunk is written as it is trained
    and read back, the same values, when the copies are used."""
    copies = len(y) if subsets is None else len(subsets)
    if start is not None and len(start) != copies:
        raise ValueError(f"train_references: start holds {len(start)} copies, the data {copies}")
    params, buffers = {}, {}
    copy_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    spilled = _SpilledCopies() if copies * copy_bytes > _SPILL_BYTES else None

    def keep(start, trained, trained_buffers):
        if spilled is not None:  # each chunk to disk as it is trained: memory holds one chunk, not all K
            spilled.append(trained, trained_buffers)
            return
        for name, t in trained.items():
            params.setdefault(name, []).append(t)
        for name, t in trained_buffers.items():
            buffers.setdefault(name, []).append(t)

    _train_in_chunks(model, x, y, recipe, seed=seed, chunk=chunk, on_chunk=keep, caller="train_references",
                     start=start, subsets=subsets)
    if spilled is not None:
        return TrainedCopies(model, spilled=spilled)
    return TrainedCopies(model, {n: torch.cat(ts) for n, ts in params.items()},
                         {n: torch.cat(ts) for n, ts in buffers.items()})
