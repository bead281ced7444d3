"""The numerically sensitive tests (marker `numerics`) again, in a child pytest, on the kernels of a CPU without AVX2:
torch's own (ATEN_CPU_CAPABILITY=default), oneDNN's (ONEDNN_MAX_CPU_ISA) and MKL's (MKL_ENABLE_INSTRUCTIONS) limited
alike. The suite itself runs them on this machine's capability; a tolerance tuned to one machine's rounding fails
here, not on the next machine (tests/README.md, "Numerical tolerances", has the command for AVX2)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What a CPU with only the x86-64 baseline runs: the three libraries that choose kernels by the CPU, each told so
DEFAULT = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}


@pytest.mark.numerics
def test_torch_runs_the_capability_it_was_asked_for():
    """In the child run below: the capability asked for is the one torch's kernels use."""
    import torch

    asked = os.environ.get("ATEN_CPU_CAPABILITY")
    if asked:
        assert torch.backends.cpu.get_cpu_capability().lower() == asked.lower()


@pytest.mark.slow
def test_numerical_tests_pass_on_the_default_cpu_capability(request):
    ids = sorted({item.nodeid.split("@")[0] for item in request.session.items  # xdist appends @group
                  if item.get_closest_marker("numerics") is not None})
    whole = len(ids) < 2  # this file run alone: the child finds them in the whole suite
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "ATEN_CPU", "ONEDNN_", "MKL_ENABLE"))}
    env.update(DEFAULT)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0",
                           *(["-m", "numerics", str(ROOT / "tests")] if whole else ids)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"under {DEFAULT}:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    summary = done.stdout.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary) if not word.startswith("warning")}
    assert set(counts) - {"deselected"} == {"passed"}, summary  # none skipped
    assert counts["passed"] > 1 and (whole or counts == {"passed": len(ids)}), (summary, len(ids))
