"""The direct leakage probe: how many samples of one local batch the update the received model would produce gives
away to analytic inversion, whatever the construction.

One training step's gradient on a fixed batch of the party's members (its own batch size), in train mode as the local
training runs it (Dropout off: see capture_linear_layers). For every linear layer applied once per sample, the per-sample gradients of its output (`gamma`, n x
k) give dW = gamma^T a and db = gamma^T 1 for its inputs a. Two inversions are tried, each exact when its condition
holds:

- a neuron that one sample alone moves gives that sample's input as dW_i / db_i (Fidel; trap weights make it likely);
- two neurons whose sets of moving samples differ by one sample (a "bin" of an imprint layer, Fowl et al.) give it as
  (dW_i - dW_j) / (db_i - db_j), when the two neurons pass the same gradient back (the imprint's equal next-layer
  columns).

The reconstructions are matched one-to-one to the true inputs of that layer (Pearson r >= 0.98, Fidel's scoring,
audit.fidel.scoring), so a sample counts once however many neurons give it. The samples whose inputs the first dense
layer in forward order gives back decide (its input is the sample for an MLP, the feature map feeding it for a CNN);
later layers give back hidden activations, which honest models also give in numbers that move from round to round, so
their counts are reported and do not decide.

Knows nothing of OpenFL; the model is the plan's template run on the received tensors (torch.func.functional_call):
no copy of the model, and its own weights are never read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import beta, binom
from torch import nn
from torch.func import functional_call

from audit.config.fidel_settings import DEFAULT_THRESHOLD
from audit.fidel.layers import DEFAULT_MIN_REL_BIAS, reconstruct
from audit.fidel.scoring import count_revealed, pearson_matrix
from audit.model_io import model_input, module_mode

__all__ = ["LayerCapture", "capture_linear_layers", "bin_reconstructions", "read_back", "ProbeResult", "leakage_probe",
           "mcnemar_greater", "clopper_pearson"]

# Candidate bins per sample kept (the pairs with the largest |db_i - db_j|: the least rounding noise).
_BINS_PER_SAMPLE = 2


@dataclass(frozen=True, eq=False)
class LayerCapture:
    """One linear layer's part of the probe step, in float64."""

    name: str
    gamma: np.ndarray           # (n, k) d loss / d output per sample (the batch loss is the mean: 1/n of each's)
    inputs: np.ndarray | None   # (n, d) the layer's input per sample; None for a layer not to be inverted
    dw: np.ndarray | None       # (k, d) gradient of the weight (None likewise)
    db: np.ndarray | None       # (k,) gradient of the bias


def _is_dropout(module: nn.Module) -> bool:
    return "Dropout" in type(module).__name__  # Dropout, Dropout1d/2d/3d, AlphaDropout, FeatureAlphaDropout


def capture_linear_layers(template: nn.Module, tensors: dict[str, torch.Tensor], x, y, *,
                          invert: str = "first") -> list[LayerCapture]:
    """One forward and backward pass of the mean cross-entropy of (x, y), in train mode (BatchNorm on the batch's
    statistics, as the local training runs it) but with Dropout off: its random zeros would read as neurons few
    samples move, and honest references and received model are then compared on the same deterministic step. The
    template's parameters and buffers are replaced by `tensors` (buffers are copied: BatchNorm's running statistics
    move in train mode). Returns every nn.Linear with a bias called on one row per sample, in forward order; the
    inputs and weight gradients (float64, a layer's size each) of the first only, or of every one with
    invert="all"."""
    # No parameter's gradient is needed: a layer's dW and db follow from its output's gradient gamma and its input
    # (dW = gamma^T a, db = gamma^T 1). So autograd starts at the first captured output, and nothing before it (the
    # convolutions of a CNN) keeps activations or gets a gradient: the whole model's gradients and the features'
    # saved activations were the step's largest memory.
    linears = {module: name for name, module in template.named_modules() if isinstance(module, nn.Linear)
               and module.bias is not None}
    parameter_names = {name for name, _ in template.named_parameters()}
    params = {name: t.detach() for name, t in tensors.items() if name in parameter_names}
    buffers = {name: t.detach().clone() for name, t in tensors.items() if name not in parameter_names}
    xb = model_input(template, x)
    n = len(xb)
    seen: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def hook(module, args, output):
        inp = args[0] if args else None
        if isinstance(inp, torch.Tensor) and inp.ndim == 2 and inp.shape[0] == n and isinstance(output, torch.Tensor):
            z = output if output.requires_grad else output.detach().requires_grad_()
            seen.append((linears[module], inp.detach(), z))
            return z.clone()  # an in-place op downstream (ReLU(inplace=True)) changes the copy, not z

    handles = [module.register_forward_hook(hook) for module in linears]
    try:
        with module_mode(template, training=True), torch.enable_grad():  # each module's own flag comes back after
            for module in template.modules():
                if _is_dropout(module):
                    module.eval()
            logits = functional_call(template, {**params, **buffers}, (xb,))
            if not seen or not logits.requires_grad:
                return []
            loss = F.cross_entropy(logits, torch.as_tensor(np.asarray(y), dtype=torch.long, device=logits.device))
            gammas = torch.autograd.grad(loss, [z for _, _, z in seen], allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    out = []
    for (name, inp, _), gamma in zip(seen, gammas):
        if gamma is None:  # the layer does not reach the loss
            continue
        g = gamma.double().cpu()
        if invert == "all" or not out:
            a = inp.double().cpu()
            out.append(LayerCapture(name=name, gamma=g.numpy(), inputs=a.numpy(), dw=(g.T @ a).numpy(),
                                    db=g.sum(dim=0).numpy()))
        else:
            out.append(LayerCapture(name=name, gamma=g.numpy(), inputs=None, dw=None, db=None))
    return out


def bin_reconstructions(layer: LayerCapture, min_rel_bias: float = DEFAULT_MIN_REL_BIAS) -> np.ndarray:
    """(dW_i - dW_j) / (db_i - db_j) for neuron pairs whose sets of moving samples are nested and differ by exactly
    one sample (a bin holding one sample); at most _BINS_PER_SAMPLE per sample. Empty (0, d) when none.

    The pairs are found by hashing each neuron's set of moving samples (a sum of random 64-bit words, one per sample,
    wrapping): S_j = S_i minus sample s iff h(S_j) = h(S_i) - r_s, up to a collision of 64-bit words, which is
    checked away. O(k n log k) for k neurons and n samples, where comparing every pair would be O(k^2 n)."""
    moves = layer.gamma != 0                                  # (n, k)
    n, k = moves.shape
    words = np.random.default_rng(0).integers(0, 2**63, size=n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = (moves * words[:, None]).sum(axis=0, dtype=np.uint64)  # (k,) the hash of each neuron's set
        without = h[None, :] - words[:, None]                      # (n, k) the hash of S_i without sample s
    sizes = moves.sum(axis=0)
    order = np.argsort(h)
    s_idx, i_idx = np.nonzero(moves)
    pos = np.searchsorted(h[order], without[s_idx, i_idx])
    found = pos < k
    pos = np.minimum(pos, k - 1)
    hit = found & (h[order][pos] == without[s_idx, i_idx])
    s_idx, i_idx, j_idx = s_idx[hit], i_idx[hit], order[pos[hit]]
    keep = sizes[j_idx] >= 1  # a neuron no sample moves is no bin's edge: S_i alone is a single neuron's read-back
    s_idx, i_idx, j_idx = s_idx[keep], i_idx[keep], j_idx[keep]
    only_i = moves[:, i_idx] & ~moves[:, j_idx]                # (n, pairs)
    exact = ((only_i.sum(axis=0) == 1) & only_i[s_idx, np.arange(len(s_idx))]
             & ~np.any(moves[:, j_idx] & ~moves[:, i_idx], axis=0))
    s_idx, i_idx, j_idx = s_idx[exact], i_idx[exact], j_idx[exact]
    if s_idx.size == 0:
        return np.zeros((0, layer.dw.shape[1]))
    ddb = layer.db[i_idx] - layer.db[j_idx]
    keep = np.abs(ddb) > min_rel_bias * np.abs(layer.db).max(initial=0.0)
    s_idx, i_idx, j_idx, ddb = s_idx[keep], i_idx[keep], j_idx[keep], ddb[keep]
    order = np.lexsort((-np.abs(ddb), s_idx))                # by sample, the largest |ddb| first
    first = np.r_[0, np.flatnonzero(np.diff(s_idx[order])) + 1] if order.size else np.zeros(0, dtype=int)
    rank = np.arange(len(order)) - np.repeat(first, np.diff(np.r_[first, len(order)]))
    chosen = order[rank < _BINS_PER_SAMPLE]
    return (layer.dw[i_idx[chosen]] - layer.dw[j_idx[chosen]]) / ddb[chosen, None]


def read_back(layer: LayerCapture, threshold: float = DEFAULT_THRESHOLD) -> tuple[np.ndarray, int, int]:
    """Which samples' inputs of `layer` the update gives back (bool (n,)), from single neurons and from bins; and how
    many single-neuron and bin reconstructions were scored."""
    singles, _used = reconstruct(layer.dw, layer.db)
    bins = bin_reconstructions(layer)
    candidates = np.concatenate([singles, bins]) if len(bins) else singles
    revealed = np.zeros(len(layer.inputs), dtype=bool)
    if len(candidates):
        _rows, cols = count_revealed(pearson_matrix(candidates, layer.inputs), threshold)
        revealed[cols] = True
    return revealed, len(singles), len(bins)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided exact interval of a rate from k of n."""
    a = (1 - confidence) / 2
    low = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return low, high


def mcnemar_greater(received: np.ndarray, reference: np.ndarray) -> float:
    """One-sided exact McNemar p-value that the received model reveals more of the same samples than the reference:
    the samples only one of them reveals are split as by a fair coin under the null."""
    only_received = int(np.sum(received & ~reference))
    only_reference = int(np.sum(reference & ~received))
    if only_received == 0:
        return 1.0
    return float(binom.sf(only_received - 1, only_received + only_reference, 0.5))


@dataclass(frozen=True, eq=False)
class ProbeResult:
    layers: tuple[dict, ...]     # per linear layer, forward order: name, space, revealed, candidates
    first_layer: str | None      # the deciding layer (None: the model calls no linear layer once per sample)
    revealed: np.ndarray         # (n,) bool: samples the first dense layer gives back
    batch: int

    @property
    def count(self) -> int:
        return int(self.revealed.sum())

    def to_dict(self) -> dict:
        low, high = clopper_pearson(self.count, self.batch) if self.batch else (math.nan, math.nan)
        return {"first_layer": self.first_layer, "revealed": self.count, "batch": self.batch,
                "revealed_fraction_interval_95": [low, high], "layers": list(self.layers)}


def leakage_probe(template: nn.Module, tensors: dict[str, torch.Tensor], x, y, *,
          threshold: float = DEFAULT_THRESHOLD, all_layers: bool = False) -> ProbeResult:
    """The probe of the module docstring on one batch (x, y); `tensors` are the received weights in the plan's
    dtypes (audit.received_model.architecture)."""
    captures = capture_linear_layers(template, tensors, x, y, invert="all" if all_layers else "first")
    return probe_captures(captures, x, threshold, all_layers)


def probe_captures(captures: list[LayerCapture], x, threshold: float = DEFAULT_THRESHOLD,
                   all_layers: bool = False) -> ProbeResult:
    """The read-back of the first dense layer (and of every later linear layer with `all_layers`, for reports)."""
    n = len(x)
    flat = np.asarray(x, dtype=np.float64).reshape(n, -1)
    layers, first = [], None
    for layer in captures if all_layers else captures[:1]:
        revealed, singles, bins = read_back(layer, threshold)
        raw = layer.inputs.shape == flat.shape and np.allclose(layer.inputs, flat, atol=1e-6)
        layers.append({"layer": layer.name, "space": "input" if raw else "activation", "revealed": int(revealed.sum()),
                       "neurons_scored": singles, "bins_scored": bins})
        if first is None:
            first = revealed
    return ProbeResult(tuple(layers), captures[0].name if captures else None,
                       first if first is not None else np.zeros(n, dtype=bool), n)
