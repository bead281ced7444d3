"""src/process/freed_memory.py: the memory a task freed goes back to the system, and nothing the program computes
changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from audit.config.audit_settings import AuditSettings
from audit.round_audit import AuditSets, LocalTraining, audit_round
from audit.training import TrainingRecipe
from src.process.freed_memory import _malloc_trim, release_freed_memory

glibc = pytest.mark.skipif(_malloc_trim() is None, reason="the C library has no malloc_trim (not glibc)")


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@glibc
def test_memory_freed_under_a_live_block_goes_back_to_the_system():
    """Blocks under the mmap threshold freed below one that stays live: malloc keeps them (the heap's top is in
    use), release_freed_memory gives them back."""
    blocks = [bytearray(b"\x01" * 64_000) for _ in range(3000)]  # ~190 MB in the heap, every page touched
    pin = bytearray(b"\x01" * 64_000)  # allocated last: above the others, it keeps the heap's top in use
    before = resident_bytes()
    del blocks
    kept = resident_bytes()
    assert release_freed_memory()
    after = resident_bytes()
    assert kept - after > 100e6, (before, kept, after)  # most of the ~190 MB freed went back
    assert pin[0] == 1  # what is live stays


def test_a_release_between_audits_changes_no_metric():
    """The same audit (RMIA's references trained and kept across rounds, in the party's store) gives the same metrics
    whether the freed memory is released between its rounds or not."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(260, 8)).astype(np.float32)
    y = (x[:, 0] + 0.5 * rng.normal(size=260) > 0).astype(np.int64)
    sets = AuditSets(members=(x[:40], y[:40]), nonmembers=(x[40:140], y[40:140]), population=(x[140:], y[140:]))
    torch.manual_seed(0)
    initial = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    local = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    settings = AuditSettings(signals=("loss",), fpr_tolerance=(0.1,), audit_global=False, update_attack=False,
                             sections={"rmia": {"references": ["independent"], "reference_models": 2}})
    training = LocalTraining(TrainingRecipe("SGD", 0.05, 0.9, epochs=2, batch_size=10), member_count=40,
                             federation_alpha=None)

    def rounds(release: bool) -> list[dict]:
        store, metrics = {}, []
        for round_num in range(2):
            record = audit_round(local, initial, sets, settings, party="p", round_num=round_num, seed=3,
                                 training=training, initial_model=initial, store=store)
            metrics.append(record.metrics)
            if release:
                release_freed_memory()
        return metrics

    assert rounds(release=True) == rounds(release=False)


def test_the_runner_that_built_the_initial_model_is_freed_before_the_rounds(tmp_path, monkeypatch):
    """The one-process run's initial model comes from a task runner of its own (a model and an optimizer), which is
    reference cycles: it is gone when the initial model is, without waiting for Python's own collections."""
    import gc
    import weakref

    from openfl.federated.task.runner_pt import PyTorchTaskRunner

    from workspace.in_process import initial_tensor_dict, parse_plan
    from workspace.plan_file import write_run_plan

    plan = parse_plan(write_run_plan(tmp_path, collaborators=2, rounds=1, overrides={}))
    built = []
    real = PyTorchTaskRunner.__init__

    def tracked(self, *args, **kwargs):
        real(self, *args, **kwargs)
        built.append(weakref.ref(self))

    monkeypatch.setattr(PyTorchTaskRunner, "__init__", tracked)
    gc.collect()
    gc.disable()
    try:
        tensors = initial_tensor_dict(plan)
        alive = [ref() is not None for ref in built]
    finally:
        gc.enable()
    assert tensors and alive == [False]
