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
# The report's drawing (most of the run's CPU; matplotlib, no torch) is left out: the metrics are compared.
RUN = """
import json, sys, tempfile
from pathlib import Path
if sys.argv[1] == "preload":
    import triton
sys.path.insert(0, sys.argv[2])
from audit.reporting.background import render_queue
render_queue.submit = lambda writer, round_num: None
from workspace.in_process import run_in_process
result = run_in_process(Path(tempfile.mkdtemp()) / "run", collaborators=2, rounds=1,
                        overrides={"tasks": {"train": {"kwargs": {"epochs": 1}}}})
print(json.dumps({"triton": repr(sys.modules.get("triton", "absent"))[:40],
                  "dynamo": "torch._dynamo" in sys.modules, "torchvision": "torchvision" in sys.modules,
                  "rounds": result.round_logs,
                  "collaborators": result.collaborator_metrics}))
"""


def _run(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", RUN, mode, str(ROOT)], capture_output=True, text=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.federation
def test_a_cpu_collaborator_keeps_triton_out_with_the_same_metrics():
    import importlib.metadata

    try:  # installed? (not an import: src/__init__.py, which this process ran, keeps it out)
        importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("only where torch's CUDA build brings triton along, as here")
    plain, preloaded = _run("plain"), _run("preload")
    # torch.optim did import torch._dynamo (the path that would load triton), and triton stayed out
    assert plain["dynamo"] and plain["triton"] == "None"
    assert preloaded["triton"].startswith("<module 'triton'")  # a process that had it keeps it
    # the workspace's own model (cnn) and digits need no torchvision: the model names' check does not import it
    assert plain["torchvision"] is False
    assert plain["rounds"] == preloaded["rounds"] and len(plain["rounds"]) == 1
    assert plain["collaborators"] == preloaded["collaborators"]
    assert any(k.endswith("mia_local_loss_auc") for k in plain["collaborators"][-1])  # the audit ran


# torch's CUDA libraries' pages, dropped (src.process.cuda_pages) between two equal trainings of a torchvision model in
# one process: the resident size around the release and the bytes of every result before and after it.
PAGES = """
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
import src, torch, torchvision
def rss():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))
def train():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 3, 32, 32), torch.arange(8)
    for _ in range(2):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return hashlib.sha256(b"".join(t.numpy().tobytes() for t in model.state_dict().values())).hexdigest()
kept = train()
from src.process.cuda_pages import release_cuda_library_pages
before = rss()
dropped = release_cuda_library_pages()
after = rss()
print(json.dumps({"before": before, "after": after, "dropped": dropped, "kept": kept, "released": train()}))
"""


@pytest.mark.federation
def test_the_cuda_libraries_pages_go_and_nothing_else_changes():
    import torch

    if torch.version.cuda is None or Path("/proc/driver/nvidia/version").exists():
        pytest.skip("only for torch's CUDA build on a machine without a GPU driver, as here")
    done = subprocess.run([sys.executable, "-c", PAGES, str(ROOT)], capture_output=True, text=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    released = json.loads(done.stdout.strip().splitlines()[-1])
    assert released["dropped"] > 50 * 2**20  # measured: about 0.17 GB
    assert released["before"] - released["after"] > 50 * 2**20
    assert released["released"] == released["kept"]  # the same training after the release, bit for bit
