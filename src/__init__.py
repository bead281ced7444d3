"""Privacy-audited OpenFL workspace code (data, models, data loader, task runner, auditor).

The task runner imports the top-level `audit` package, which OpenFL 1.9's `fx workspace export` does not pack
(it packs src/, plan/, save/ and requirements.txt only). So `audit` travels inside src/: src/shipped/audit is
a symlink to ../../audit in git (one copy of the code), and export's copy of src/ follows it, so an exported
workspace holds a real src/shipped/audit/. In a workspace without a top-level audit/ (one made by
`fx workspace import`), src/shipped goes first on sys.path before anything imports `audit`: every OpenFL
entry point reaches it through a `src.*` template, which runs this file first. Where audit/ is at the top
(the repository, an aggregator's clone), nothing changes.

On a machine without an NVIDIA driver, importing this package keeps triton out of the process: torch._dynamo,
which torchvision imports and torch.optim imports on first use, imports triton (a compiler of GPU kernels that
torch's CUDA build brings along) when it is installed: its library pages in every process (benchmarks/README.md,
"torch builds"), and nothing without a GPU can run what it compiles. A None in sys.modules makes that import fail as
for a missing package, which torch handles. A process that loaded triton already keeps it (src.process.cuda_pages.keep_triton_out).
"""

import sys
from pathlib import Path

from src.process.cuda_pages import keep_triton_out

keep_triton_out()

_WORKSPACE = Path(__file__).resolve().parent.parent
_SHIPPED = Path(__file__).resolve().parent / "shipped"

if not (_WORKSPACE / "audit" / "__init__.py").is_file():
    if not (_SHIPPED / "audit" / "__init__.py").is_file():
        raise ImportError(f"the audit package is missing: neither {_WORKSPACE / 'audit'} nor {_SHIPPED / 'audit'} "
                          "holds it (src/shipped/audit is a symlink in git: check out the repository with symlinks, "
                          "then export the workspace again)")
    # First, not last: this workspace's own audit code wins over any other `audit` on the path.
    if str(_SHIPPED) not in sys.path:
        sys.path.insert(0, str(_SHIPPED))
