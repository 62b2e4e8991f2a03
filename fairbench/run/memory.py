"""Give the memory a run's finished stages freed back to the system before the next stage.

Why: a fleet run's stages free hundreds of MB (the simulator's jobs, the record columns'
intermediates, the summary's working arrays), and neither allocator returns them by itself:
glibc keeps freed heap chunks (its mmap threshold rises after the first large frees, so later
arrays land on the heap) and Arrow's mimalloc pool keeps its pages. The next stage then grows
the resident set on top of memory nobody uses. Measured on the 10-minute 80-replica VTC fleet
(1.92M requests, `python benchmarks/bench_sim.py --minutes 10 --policies vtc`): 1,585 MB
resident before the report with 335 MB of it live; the report's own peak then lay above the
summary's. Releasing costs a heap walk (milliseconds), nothing a result depends on.
"""

from __future__ import annotations

import ctypes
import gc
from functools import cache

from fairbench.run.records import release_arrow_memory


@cache
def _malloc_trim() -> object | None:
    """glibc's `malloc_trim`, or None where the C library is not glibc (macOS, musl)."""
    return _glibc("malloc_trim")


def _glibc(name: str) -> object | None:
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


# glibc's mallopt parameters (malloc.h) and the mmap threshold's ceiling on 64-bit
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30


def keep_freed_heap() -> bool:
    """Have glibc keep what a run frees for the run's next arrays, instead of handing it to
    the kernel and faulting it in again. Why: a fleet run's stages allocate and free
    1.9M-element arrays (15 MB) by the hundred; with glibc's defaults the first of them are
    mmapped, then (its threshold rising) land on the top of the heap, which is trimmed
    whenever 2× the largest freed chunk lies free there, so the next array faults its pages
    in again: about 10 µs of kernel time per 4 KiB page on the VMs this is measured on, a
    fifth of the 10-minute VTC fleet run's CPU. With the mmap threshold fixed at its ceiling
    (32 MB) and the heap trimmed only above 1 GB free, the freed pages are reused; the
    memory still goes back before the report (`release_freed_memory`: malloc_trim ignores
    the threshold). Process-wide and lasting: called for simulated runs, whose process does
    little else. False where the C library is not glibc."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)  # type: ignore[operator]
    ok &= mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)  # type: ignore[operator]
    return bool(ok)


def release_freed_memory() -> None:
    """Collect cycles, return Arrow's unused pool pages and glibc's free heap to the system."""
    gc.collect()
    release_arrow_memory()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)  # type: ignore[operator]
