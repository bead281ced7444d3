"""Drop the pages of torch's CUDA libraries from a process on a machine that has no GPU to run them.

torchvision's wheels work with PyPI's torch, a CUDA build, whose CUDA libraries (cuBLAS, cuBLASLt, NVRTC, nvJitLink,
libtorch_cuda, ...) are loaded by `import torch` with or without a GPU, and their loading leaves their code and
read-only data resident in every process (benchmarks/README.md, "torch builds", has the figures). Without an NVIDIA
driver nothing runs that code. Those pages are the files' own: a mapping that cannot be written and holds no
anonymous (copy-on-write) page is byte for byte the file, so madvise(MADV_DONTNEED) drops it from the process and
any later access reads it back from the file (on Linux, for private file mappings). Mappings that were written
(relocated data) are left alone, and so is everything on a machine with a GPU.

`keep_triton_out()` is what src/__init__.py runs before torch._dynamo is imported (see there). This module imports
nothing but the standard library: the participants' launcher (workspace/fx_worker.py) loads it from its file and runs
both, as a participant would, without importing `src`.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from pathlib import Path

__all__ = ["keep_triton_out", "release_cuda_library_pages"]

# torch's CUDA libraries: the nvidia-* wheels' (site-packages/nvidia/...), torch's own CUDA parts, torchvision's
# nvJPEG.
_CUDA_LIBRARY = re.compile(r"/nvidia/|/libtorch_cuda[^/]*\.so|/libc10_cuda\.so|/libcudart[^/]*\.so|/libnvjpeg[^/]*\.so")
_MADV_DONTNEED = 4
_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")


def _gpu_driver() -> bool:
    return Path("/proc/driver/nvidia/version").exists()  # the NVIDIA driver's, present wherever a CUDA GPU can be used


def keep_triton_out() -> None:
    """Without an NVIDIA driver, make `import triton` fail as for a missing package (a None in sys.modules), which
    torch handles; a process that loaded triton already keeps it."""
    if not _gpu_driver():
        sys.modules.setdefault("triton", None)


def release_cuda_library_pages() -> int:
    """Drop the resident pages of the CUDA libraries' unwritten mappings; returns the bytes dropped (0 where there is
    a GPU driver, or this is not Linux, or torch is not a CUDA build)."""
    torch = sys.modules.get("torch")
    if (not sys.platform.startswith("linux") or _gpu_driver() or torch is None
            or getattr(torch.version, "cuda", None) is None):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        mappings = _unwritten_mappings()
    except OSError:
        return 0
    dropped = 0
    for start, stop, resident in mappings:
        if libc.madvise(start, stop - start, _MADV_DONTNEED) == 0:
            dropped += resident
    return dropped


def _unwritten_mappings() -> list[tuple[int, int, int]]:
    """(start, stop, resident bytes) of the CUDA libraries' mappings that are not writable and hold no anonymous page,
    from /proc/self/smaps."""
    found, current = [], None
    with open(f"/proc/{os.getpid()}/smaps") as smaps:
        for line in smaps:
            header = _MAPPING.match(line)
            if header:
                start, stop, perms, path = header.groups()
                current = None
                if "w" not in perms and _CUDA_LIBRARY.search(path):
                    current = [int(start, 16), int(stop, 16), 0, 0]
                    found.append(current)
            elif current is not None:
                key, _, value = line.partition(":")
                if key in ("Rss", "Anonymous"):
                    current[2 if key == "Rss" else 3] = int(value.split()[0]) * 1024
    return [(start, stop, rss) for start, stop, rss, anonymous in found if anonymous == 0]
