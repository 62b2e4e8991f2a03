"""The memory a run's finished stages freed goes back to the system before the report.

Why a test: glibc keeps freed heap chunks resident (a fleet run held 1,585 MB before its report
with 335 MB of it live, fairbench/run/memory.py), so the report's peak lay on top of memory
nobody used. These tests fail if the release stops releasing or stops being called."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairbench.run import memory


def _resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(memory._malloc_trim() is None, reason="the C library is not glibc")
def test_freed_heap_chunks_are_given_back() -> None:
    """The simulator's pattern: many Python objects over 512 bytes (glibc's heap, not
    pymalloc's; a Job is about 0.5 KB), freed with a few still live among them, stay resident
    (about 280 MB here) until the release gives the free pages between the live ones back."""
    items = [b"x" * 700 + str(i).encode() for i in range(400_000)]
    keep = items[::1000]  # one live object in every ~700 KB of freed ones: no trim at the top
    del items
    freed = _resident_mb()
    memory.release_freed_memory()
    released = _resident_mb()
    assert len(keep) == 400
    assert freed - released > 150, (freed, released)


def test_a_run_releases_before_its_caller_reports(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`run_scenario` releases once the records and summary are written, so the CLI's report
    (which reads them back from disk) starts from what is live."""
    import fairbench.pipeline as pipeline
    from fairbench.run.rundir import RunOptions
    from fairbench.workload.loading import load_scenario

    calls: list[bool] = []
    monkeypatch.setattr(pipeline, "release_freed_memory", lambda: calls.append(True))
    scn = load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "onoff.yaml")
    outcome = pipeline.run_scenario(scn, RunOptions(out=tmp_path / "run", progress=False))
    assert calls == [True] and outcome.summary["valid"]
