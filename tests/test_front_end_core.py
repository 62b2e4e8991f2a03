"""The front end's core time (`front_end_core_ms`): where a CPU engine's API server shares the
engine's core, a request that arrives while the engine is running others slows their steps.

What would break if the model were wrong: the charge landing on an idle engine (whose core the
front end did not take from anyone), landing nowhere, or landing on other than the next step;
the two simulated engines (the reference one and vLLM's scheduling) disagreeing on it.
`tests/test_profile_probe.py` checks that `fairbench profile` measures it back.
"""

from __future__ import annotations

import numpy as np
import pytest

from reference_scheduler.core.costmodel import ProfileError, load_profile
from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.scheduler.config import parse_scheduler_config

MS = 1_000_000


def _config(engine: str, front_end_ms: float, seqs: int = 8):  # type: ignore[no-untyped-def]
    profile = {
        "name": "flat",
        "constant_step_ms": 10.0,  # every step 10 ms, whatever it holds
        "front_end_core_ms": front_end_ms,
        "kv_cache_tokens": 100_000,
        "max_num_seqs": seqs,
    }
    block = {"engine": "vllm", "policy": "fcfs", "profile": profile}
    if engine == "reference":
        block = {"policy": "fifo", "profile": profile}
    return parse_scheduler_config(block)


def _tokens(engine: str, front_end_ms: float, seqs: int = 8) -> list[np.ndarray]:
    """A arrives at an idle engine at 0 (5 tokens), B at 15 ms while A decodes (3 tokens), C
    at 1 s to an idle engine again (2 tokens): each job's token times in ms."""
    jobs = [
        Job(0, "t", "c", 10, 5, 0),
        Job(1, "t", "c", 10, 3, 15 * MS),
        Job(2, "t", "c", 10, 2, 1000 * MS),
    ]
    result = simulate(jobs, _config(engine, front_end_ms, seqs))
    assert all(job.status == "finished" for job in result.jobs)
    return [result.token_times(job) / MS for job in result.jobs]


@pytest.mark.parametrize("engine", ["vllm", "reference"])
def test_a_request_arriving_at_a_busy_engine_lengthens_its_next_step(engine: str) -> None:
    plain = _tokens(engine, 0.0)
    charged = _tokens(engine, 4.0)
    # without the front end: 10 ms steps back to back; B joins A at the step starting at 20
    assert plain[0].tolist() == [10, 20, 30, 40, 50]
    assert plain[1].tolist() == [30, 40, 50]
    # with it: that step (the first after B arrived while A ran) takes 10 + 4 ms, and every
    # later token of both moves by those 4 ms
    assert charged[0].tolist() == [10, 20, 34, 44, 54]
    assert charged[1].tolist() == [34, 44, 54]
    # A and C arrived at an idle engine: nobody's steps paid for their front ends
    assert charged[2].tolist() == plain[2].tolist() == [1010, 1020]


@pytest.mark.parametrize("engine", ["vllm", "reference"])
def test_a_request_queued_behind_a_full_engine_pays_when_it_arrives(engine: str) -> None:
    """One sequence at a time: B arrives at 15 ms while A runs and waits for A to finish. Its
    front end ran at its arrival, beside A's steps, so A's next step pays, not B's admission
    (at which the engine is empty)."""
    plain = _tokens(engine, 0.0, seqs=1)
    charged = _tokens(engine, 4.0, seqs=1)
    assert plain[0].tolist() == [10, 20, 30, 40, 50] and plain[1].tolist() == [60, 70, 80]
    assert charged[0].tolist() == [10, 20, 34, 44, 54]
    assert charged[1].tolist() == [64, 74, 84]


def test_the_profile_field_is_checked() -> None:
    with pytest.raises(ProfileError, match="front_end_core_ms: must be a finite number >= 0"):
        load_profile({"name": "x", "kv_cache_tokens": 1, "front_end_core_ms": -1.0})
    assert load_profile({"name": "x", "kv_cache_tokens": 1}).front_end_core_ms == 0.0
