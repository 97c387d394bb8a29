"""glibc malloc settings for the CPU engine (EngineConfig.tune_malloc).

By default glibc serves allocations above a threshold (128 KiB, raised as large blocks are
freed) with fresh mmap'ed pages and gives the top of its heap back to the system once more than
twice that is free. An eager decode step at batch 64 allocates and frees megabytes of
temporaries per layer (the paged-KV gather, the Gated DeltaNet state products), so it faulted in
fresh zeroed pages every step: about a third of the plain step's time at 1 thread
(experiments/lean_step). `tune_malloc` sets, once per process, the same three knobs as the
MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ and MALLOC_TOP_PAD_ environment variables: blocks
up to 32 MiB (glibc's largest threshold) come from the heap, which is trimmed only above 1 GiB
free, and grows 64 MiB at a time. The process keeps its peak heap instead of returning it.
"""
from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3   # glibc's mallopt parameters
SETTINGS = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 1 << 30), (M_TOP_PAD, 64 << 20))
ENV_KNOBS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_applied = False


def tune_malloc() -> bool:
    """Apply SETTINGS with glibc's mallopt (module doc). Returns True when they are in force (now
    or from an earlier call); False without glibc, or when the environment sets any of
    ENV_KNOBS (the user's own settings win)."""
    global _applied
    if _applied:
        return True
    if any(k in os.environ for k in ENV_KNOBS):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt, _ = libc.mallopt, libc.gnu_get_libc_version       # glibc only
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = all(mallopt(param, value) == 1 for param, value in SETTINGS)
    return _applied
