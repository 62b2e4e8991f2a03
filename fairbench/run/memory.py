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
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Collect cycles, return Arrow's unused pool pages and glibc's free heap to the system."""
    gc.collect()
    release_arrow_memory()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)  # type: ignore[operator]
