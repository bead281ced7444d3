"""A task's results as OpenFL's NamedTensor protos, each made when it is read, not all at once.

OpenFL 1.9's `Collaborator.send_task_results` makes every tensor's NamedTensor (its compressed bytes, a model's size
in all) into a list, then hands the list to the client. In one process (`workspace.in_process.DirectClient`) the
aggregator processes the results inside that call, and the round's last results end the round there (the new global
model, the model file): the list is still held then, a model's size above what the round needs. Over gRPC the request
copies every NamedTensor, so the list and the request held two of them. A NamedTensorsOnRead makes each when it is
read: the aggregator holds one at a time, and the request is the only copy. It can be read again (OpenFL's client
sends again after a lost connection, the aggregator's persistent store reads the results before processing them),
making the same protos each time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

__all__ = ["NamedTensorsOnRead"]


class NamedTensorsOnRead:
    """The NamedTensors `to_named_tensor(key, array)` makes of `tensor_dict`, in its order, made as they are read."""

    def __init__(self, to_named_tensor: Callable, tensor_dict: Mapping):
        self._to_named_tensor = to_named_tensor
        self._tensor_dict = tensor_dict

    def __len__(self) -> int:
        return len(self._tensor_dict)

    def __iter__(self) -> Iterator:
        for key, array in self._tensor_dict.items():
            yield self._to_named_tensor(key, array)
