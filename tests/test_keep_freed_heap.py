"""A simulated run has glibc keep the heap its stages free for their next arrays (issue 35).

Why it matters: with glibc's defaults, four 15 MB arrays freed together are trimmed off the
heap and the next four fault every page in again (about 10 µs of kernel time per 4 KiB page
on the VMs measured: a fifth of the 10-minute fleet run's CPU). The child processes below
count those page faults with and without `keep_freed_heap`, and the sim path must call it."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fairbench.run import memory
from fairbench.workload.loading import load_scenario

ROOT = Path(__file__).resolve().parents[1]
measure = importlib.import_module(
    "fairbench.run.measure"
)  # the module: the package exports a function of that name

_CHILD = """
import ctypes, resource, sys
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "keep":
    from fairbench.run.memory import keep_freed_heap
    assert keep_freed_heap()
size = 15 << 20
def one_round():
    ps = [libc.malloc(size) for _ in range(4)]
    for p in ps:
        ctypes.memset(p, 1, size)
    for p in reversed(ps):
        libc.free(p)
one_round()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    one_round()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def _faults(mode: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        env.pop(name, None)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True, env=env
    )
    return int(out.stdout.strip())


@pytest.mark.skipif(memory._glibc("mallopt") is None, reason="the C library is not glibc")
def test_freed_heap_is_reused_without_faulting_it_in_again() -> None:
    pages = 5 * 4 * (15 << 20) // 4096  # five rounds of four 15 MB arrays
    assert _faults("plain") > pages // 2  # glibc's defaults: trimmed and faulted in again
    assert _faults("keep") < pages // 20


def test_the_simulated_path_keeps_the_freed_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure() asks for it before the plan is made (the plan's arrays are the first)."""

    def stop() -> bool:
        raise RuntimeError("keep_freed_heap called")

    monkeypatch.setattr(measure, "keep_freed_heap", stop)
    monkeypatch.setattr(measure, "materialize", lambda *a: pytest.fail("planned before it"))
    scn = load_scenario(ROOT / "scenarios" / "fleet-80.yaml")
    assert scn.target.kind == "sim"
    with pytest.raises(RuntimeError, match="keep_freed_heap called"):
        measure.measure(scn)
