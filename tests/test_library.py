"""docs/library.md: the auditor as a package of its own. Its plain PyTorch loop runs from the package that
`pip install .` builds (the wheel, installed without its dependencies into a fresh venv that reuses this environment's
packages), in a process that cannot import OpenFL, outside the repository."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "library.md"

# Imported first by the venv's interpreter (a .pth line): OpenFL cannot be imported there, as on a host without it.
NO_OPENFL = '''
import importlib.abc, sys

class NoOpenFL(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "openfl" or name.startswith("openfl."):
            raise ModuleNotFoundError(f"No module named {name!r} (not installed for this test)", name=name)
        return None

sys.meta_path.insert(0, NoOpenFL())
'''

CHECK = '''
import runpy, sys
try:
    import openfl  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    sys.exit("openfl imported")
import audit
from pathlib import Path
where = Path(audit.__file__).resolve()
if not where.is_relative_to(Path(sys.argv[1]).resolve()):
    sys.exit(f"audit imported from {where}, not from the venv")
if not (where.parent / "reporting" / "templates" / "page.html").is_file():
    sys.exit("the package's page template is missing")
runpy.run_path(sys.argv[2], run_name="__main__")
print("openfl:", "openfl" in sys.modules)
'''


def _example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), flags=re.S | re.M)
    assert len(blocks) == 1, "docs/library.md: one python example"
    return blocks[0]


def test_the_example_is_a_short_loop():
    lines = _example().strip().splitlines()
    assert len(lines) <= 30, f"the plain loop is {len(lines)} lines"
    assert re.findall(r"^from audit import (.+)$", _example(), flags=re.M), "imports the public API"
    assert "audit." not in _example().replace("audit_round", "")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv holding the wheel `pip install .` builds, on this environment's other packages, without OpenFL."""
    base = tmp_path_factory.mktemp("library")
    source = base / "source"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copytree(ROOT / "audit", source / "audit", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (source / "docs").mkdir()
    shutil.copy(PAGE, source / "docs")
    wheels = base / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(wheels), str(source)], check=True, timeout=300)
    wheel, = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "audit/reporting/templates/page.html" in names
    assert not [n for n in names if not n.startswith(("audit/", "privacy_auditor-"))], "only the auditor"
    requires = re.findall(r"^Requires-Dist: ([\w.-]+)", metadata, flags=re.M)
    assert {"torch", "numpy", "scipy", "scikit-learn", "matplotlib", "opacus", "privacy-meter"} <= set(requires)
    assert not [r for r in requires if r.lower().startswith("openfl")]

    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "_no_openfl.py").write_text(NO_OPENFL)
    # This environment's packages after the venv's own: the wheel's `audit` is the one imported.
    (site / "zz_shared.pth").write_text(f"import _no_openfl\n{sysconfig.get_paths()['purelib']}\n")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], check=True,
                   timeout=300)
    return venv


@pytest.mark.federation  # child processes: pip and a new interpreter
def test_the_loop_runs_from_the_installed_package_without_openfl(installed, tmp_path):
    example = tmp_path / "example.py"
    example.write_text(_example())
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([installed / "bin" / "python", "-c", CHECK, str(installed), str(example)], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    leak, decision, openfl = result.stdout.strip().splitlines()
    # The members' labels are random: the model memorises them, the audit shows it and the budget withholds it.
    assert leak.startswith("leak detected (")
    assert decision == "withhold it: leak_epsilon_lb over its limit"
    assert openfl == "openfl: False"
    page = PAGE.read_text(encoding="utf-8")
    assert decision in page and leak.split(":")[0] in page  # what the page shows
