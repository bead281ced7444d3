"""What a train task hands OpenFL: its trained tensors, read off the model while the audit runs, then what the audit
decided to send.

OpenFL's PyTorchTaskRunner.train_task returns copies of the trained weights (a model's size) that stay until the
results are sent, through the audit, which reads the model itself: `results_as_views` makes them views of the
model's own tensors meanwhile. What is sent (and what OpenFL keeps of it) is a copy of the model as the audit left it
(`replace_with_sent`): never the model's own tensors, which the next round's training overwrites.
"""

from __future__ import annotations

from typing import Mapping

__all__ = ["results_as_views", "replace_with_sent"]


def results_as_views(state: Mapping, *outputs: dict) -> set:
    """Each trained tensor of `outputs` (TensorKey -> array) that the model holds on the CPU replaced by a view of the
    model's own tensor (`state`: its state dict, which shares their memory); returns the names replaced."""
    viewed = set()
    for out in outputs:
        for key in list(out):
            tensor = state.get(key.tensor_name)
            if "metric" in key.tags or tensor is None or tensor.device.type != "cpu":
                continue
            try:
                view = tensor.numpy()
            except TypeError:  # a dtype numpy lacks (bfloat16): OpenFL's copy stays
                continue
            out[key] = view  # OpenFL's array was made from this tensor: the same shape and dtype
            viewed.add(key.tensor_name)
    return viewed


def replace_with_sent(sent: Mapping, *outputs: dict, names: set | None = None) -> None:
    """Replace the round's trained tensors of `outputs` (those in `names`; None: all) with `sent`, copies of what the
    model now holds (the runner's get_tensor_dict: what the audit decided to send)."""
    for out in outputs:
        for key in list(out):
            if "metric" in key.tags or (names is not None and key.tensor_name not in names):
                continue
            if key.tensor_name not in sent:
                raise RuntimeError(f"gate: no value to send for trained tensor {key.tensor_name!r}")
            out[key] = sent[key.tensor_name]
