"""The repository root is an OpenFL workspace: `fx plan initialize` works in (a copy of) it."""

import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FX = Path(sys.executable).parent / "fx"


def copy_workspace(dest: Path) -> Path:
    # workspace/ too: fx imports its command modules by bare name with the workspace first on sys.path, so a
    # regular package named `workspace` there would shadow fx's own and break every fx command.
    # Symlinks kept, as a clone has them: src/shipped/audit stays a link to this copy's audit/.
    for name in ("plan", "src", "audit", "workspace", "save"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pbuf"),
                        symlinks=True)
    shutil.copy(ROOT / ".workspace", dest / ".workspace")
    return dest




@pytest.mark.federation
@pytest.mark.skipif(not FX.exists(), reason="fx is installed with openfl in the project's venv")
def test_fx_plan_initialize_writes_the_initial_model(tmp_path, fx_fork):
    ws = copy_workspace(tmp_path)
    result = fx_fork(ws, "plan", "initialize")  # OpenFL's command (tests/fx_forks.py)
    assert result.returncode == 0, result.stdout[-3000:]
    assert (ws / "save" / "init.pbuf").stat().st_size > 0


@pytest.mark.federation
@pytest.mark.skipif(not FX.exists(), reason="fx is installed with openfl in the project's venv")
def test_fx_plan_initialize_rejects_a_bad_audit_key(tmp_path, fx_fork):
    ws = copy_workspace(tmp_path)
    plan = ws / "plan" / "plan.yaml"
    text, count = re.subn(r"fpr_tolerance: \[[^\]]*\]", "fpr_tolerance: [0.01, 2.0]", plan.read_text())
    assert count == 1  # the plan's own line was replaced
    plan.write_text(text)
    result = fx_fork(ws, "plan", "initialize")
    assert result.returncode != 0
    assert "task_runner.settings.audit.fpr_tolerance" in result.stdout
    assert not (ws / "save" / "init.pbuf").exists()
