"""The memory a task freed, given back to the system before the next one (glibc's malloc_trim).

glibc's malloc keeps what a program frees for its own reuse: blocks under its mmap threshold (which rises to 32 MB
as larger blocks are freed) go back into its heaps, one per thread that allocated (torch's intra-op threads, the
report renderer), and only the top of a heap is returned to the system. A round's tasks free hundreds of MB each
(the local training's activations and gradients, the audit's reference models and gradient norms, a received model
read back), so the resident size ratchets up from round to round although what is live does not grow
(benchmarks/README.md, "Memory across rounds"). `malloc_trim(0)` gives every free page of every heap back
(madvise), in milliseconds; elsewhere than glibc it does nothing. What the program holds, and every value it
computes, is unchanged: only pages with nothing live on them go.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["release_freed_memory"]


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's malloc_trim, or None (musl, macOS, Windows: no such call)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Give the pages malloc keeps free back to the system; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
