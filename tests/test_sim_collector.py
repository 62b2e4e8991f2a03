"""The simulator pauses Python's cycle collector and gives it back as it was (issue 35).

Why: `targets.sim.run_sim` turns the collector off while it makes and simulates the jobs (each
burst of allocations otherwise walked every job made so far); a run must leave the process's
collector as it found it, even when the simulation raises, and its records must not change.
"""

from __future__ import annotations

import gc

import pytest

from fairbench.targets.sim import collector_paused


def test_back_on_after_and_off_inside() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_back_on_after_an_error() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the simulation failed")
    assert gc.isenabled()


def test_left_off_when_it_was_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
