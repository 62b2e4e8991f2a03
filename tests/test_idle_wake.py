"""An idle engine's wake (`idle_wake_ms`): an engine that has had nothing to run for
`idle_after_ms` or longer takes longer to start its next step (measured on the CPU vLLM: about
3 ms more to a lone request's first token after 100 ms of quiet; costmodel says why).

What would break if the model were wrong: the wake charged to a request that finds the engine
busy, or idle for less than the threshold; charged nowhere, or to a later step than the one that
starts the request; the two simulated engines (the reference one and vLLM's scheduling)
disagreeing on it. `tests/test_profile_probe.py` checks that `fairbench profile` measures it
back.
"""

from __future__ import annotations

import numpy as np
import pytest

from reference_scheduler.core.costmodel import ProfileError, load_profile
from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.scheduler.config import parse_scheduler_config

MS = 1_000_000


def _tokens(engine: str, wake_ms: float) -> list[np.ndarray]:
    """Every step 10 ms. A arrives at 0 at an engine that never ran (5 tokens), B at 15 ms
    while A decodes (3 tokens), C at 1 s after a long quiet (2 tokens), D 20 ms after C's last
    step ended (1 token): each job's token times in ms."""
    profile = {
        "name": "flat",
        "constant_step_ms": 10.0,
        "idle_wake_ms": wake_ms,
        "idle_after_ms": 50.0,
        "kv_cache_tokens": 100_000,
        "max_num_seqs": 8,
    }
    block = {"engine": "vllm", "policy": "fcfs", "profile": profile}
    if engine == "reference":
        block = {"policy": "fifo", "profile": profile}
    end_c = 1000 + 2 * 10 + (wake_ms if wake_ms else 0)
    jobs = [
        Job(0, "t", "c", 10, 5, 0),
        Job(1, "t", "c", 10, 3, 15 * MS),
        Job(2, "t", "c", 10, 2, 1000 * MS),
        Job(3, "t", "c", 10, 1, round((end_c + 20) * MS)),
    ]
    result = simulate(jobs, parse_scheduler_config(block))
    assert all(job.status == "finished" for job in result.jobs)
    return [result.token_times(job) / MS for job in result.jobs]


@pytest.mark.parametrize("engine", ["vllm", "reference"])
def test_a_request_finding_the_engine_idle_waits_for_it_to_wake(engine: str) -> None:
    plain = _tokens(engine, 0.0)
    woken = _tokens(engine, 3.0)
    assert plain[0].tolist() == [10, 20, 30, 40, 50]
    assert plain[1].tolist() == [30, 40, 50]
    assert plain[2].tolist() == [1010, 1020]
    assert plain[3].tolist() == [1050]
    # A found an engine that never ran: its first step takes 10 + 3 ms; B joined a busy
    # engine and paid nothing (every later token moves by A's 3 ms only)
    assert woken[0].tolist() == [13, 23, 33, 43, 53]
    assert woken[1].tolist() == [33, 43, 53]
    # C came after 947 ms of quiet: it pays; D came 20 ms after C's last step: it does not
    assert woken[2].tolist() == [1013, 1023]
    assert woken[3].tolist() == [1053]


def test_the_profile_fields_are_checked() -> None:
    with pytest.raises(ProfileError, match="idle_wake_ms: must be a finite number >= 0"):
        load_profile({"name": "x", "kv_cache_tokens": 1, "idle_wake_ms": -1.0})
    with pytest.raises(ProfileError, match="idle_after_ms: must be a finite number >= 0"):
        load_profile({"name": "x", "kv_cache_tokens": 1, "idle_after_ms": float("nan")})
    plain = load_profile({"name": "x", "kv_cache_tokens": 1})
    assert plain.idle_wake_ms == 0.0 and plain.idle_after_ms == 50.0
