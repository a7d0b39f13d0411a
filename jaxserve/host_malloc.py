"""Keep freed host memory for reuse, so XLA:CPU's per-step scratch buffers are not page-faulted in afresh.

XLA:CPU allocates each program run's temporaries (one buffer: 72 MB for a SmolLM2-135M decode step at
batch 64) with ``malloc`` from one of its worker threads and frees them at the end of the run. glibc
serves such a request from a fresh ``mmap`` (its per-thread arenas hold at most 64 MB, and chunks above
the mmap threshold are mapped anyway) and unmaps it on ``free``, so every step touches ~18,000 new
pages: ~12,000 minor page faults and ~27 ms of kernel time per batch-64 step on the 2-core VM, and
a sampler program with a large untaken branch ran 13.7 ms instead of 4.9 ms (measured; the figures are
in the engine's notes). vLLM asks its CPU users to preload tcmalloc for the same reason.

``retain_freed_memory`` does the equivalent with glibc alone: one arena (``M_ARENA_MAX=1``: every
thread allocates from the ``brk`` heap, which has no size cap), no ``mmap`` for large chunks
(``M_MMAP_MAX=0``), and freed memory at the top of the heap kept up to ``TRIM_THRESHOLD_BYTES``
(``M_TRIM_THRESHOLD``). After the first step the scratch buffer is reused: ~0 faults per step.

It runs when ``jaxserve`` is imported (no JAX import here), which is before JAX starts its threads
in the usual ``import jaxserve`` order; threads that allocated before it keep their arenas. Set
``JAXSERVE_HOST_MALLOC=system`` to leave glibc's defaults alone (e.g. to measure the difference, or
when another allocator is preloaded). Not glibc (macOS, musl): nothing happens.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

ENV = "JAXSERVE_HOST_MALLOC"
TRIM_THRESHOLD_BYTES = 512 << 20
# mallopt parameter numbers from glibc's <malloc.h>
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8

_applied: bool | None = None


def _glibc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # only glibc has it (and mallopt's parameters above)
    except (OSError, AttributeError):
        return None
    return libc


def retain_freed_memory() -> bool:
    """Apply the settings above once per process; True when they are in force (glibc, not opted out)."""
    global _applied
    if _applied is None:
        choice = os.environ.get(ENV, "retain")
        if choice not in ("retain", "system"):
            raise ValueError(f"{ENV} must be 'retain' or 'system', got {choice!r}")
        libc = _glibc() if choice == "retain" else None
        _applied = libc is not None and all(
            libc.mallopt(param, value) == 1
            for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)))
    return _applied
