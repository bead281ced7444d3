"""A collaborator process on a machine without a GPU does not load triton (src/__init__.py), and that changes no
answer."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A small in-process federation (the real task runner, audit on, digits) in a fresh interpreter; prints what was
# loaded and every round's metrics. argv[1] == "preload": triton is imported first, as a GPU process might have.
RUN = """
import json, sys, tempfile
from pathlib import Path
if sys.argv[1] == "preload":
    import triton
sys.path.insert(0, sys.argv[2])
from workspace.in_process import run_in_process
result = run_in_process(Path(tempfile.mkdtemp()) / "run", collaborators=2, rounds=1,
                        overrides={"tasks": {"train": {"kwargs": {"epochs": 1}}}})
print(json.dumps({"triton": repr(sys.modules.get("triton", "absent"))[:40],
                  "dynamo": "torch._dynamo" in sys.modules, "rounds": result.round_logs,
                  "collaborators": result.collaborator_metrics}))
"""


def _run(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", RUN, mode, str(ROOT)], capture_output=True, text=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.federation
def test_a_cpu_collaborator_keeps_triton_out_with_the_same_metrics():
    pytest.importorskip("triton")  # only where torch's CUDA build brings it along, as here
    plain, preloaded = _run("plain"), _run("preload")
    # torch.optim did import torch._dynamo (the path that would load triton), and triton stayed out
    assert plain["dynamo"] and plain["triton"] == "None"
    assert preloaded["triton"].startswith("<module 'triton'")  # a process that had it keeps it
    assert plain["rounds"] == preloaded["rounds"] and len(plain["rounds"]) == 1
    assert plain["collaborators"] == preloaded["collaborators"]
    assert any(k.endswith("mia_local_loss_auc") for k in plain["collaborators"][-1])  # the audit ran
