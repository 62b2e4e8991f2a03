"""The simulator reduces to textbook queues and reproduces their formulas; it is deterministic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.scheduler.config import parse_scheduler_config

SINGLE_SERVER = {
    "policy": "fifo",
    "profile": {"constant_step_ms": 1.0, "kv_cache_tokens": 10**9, "max_num_seqs": 1},
}


def mg1_wait_ratio(rho: float, tokens: np.ndarray | None, p: float | None = None) -> float:
    """Pollaczek–Khinchine: Wq / E[S] = ρ·E[S²] / (2·E[S]²·(1 − ρ)).

    Service S = N·τ with N output tokens: constant N gives E[S²]/E[S]² = 1 (M/D/1: ρ/(2(1−ρ)));
    geometric N with success probability p gives E[N²]/E[N]² = 2 − p, which tends to the
    exponential's 2 (M/M/1: ρ/(1−ρ) = 4 at ρ = 0.8) as p → 0."""
    second_over_first_sq = 1.0 if p is None else 2.0 - p
    return rho * second_over_first_sq / (2.0 * (1.0 - rho))


def replicate_wait(tokens_fn, rho: float, mean_tokens: float, reps: int, n: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    cfg = parse_scheduler_config(SINGLE_SERVER)
    service_ms = mean_tokens * 1.0
    lam = rho / service_ms  # per ms
    means = []
    for seed in range(reps):
        rng = np.random.default_rng(1000 + seed)
        arrivals = np.cumsum(rng.exponential(1.0 / lam, n)) * 1e6  # ns
        tokens = tokens_fn(rng, n)
        jobs = [
            Job(i, "a", "batch", 1, int(k), int(t))
            for i, (t, k) in enumerate(zip(arrivals, tokens, strict=True))
        ]
        simulate(jobs, cfg)
        wait = np.array([j.admit_ns - j.arrival_ns for j in jobs[n // 10 :]]) / 1e6
        means.append(wait.mean() / service_ms)
    return np.array(means)


def within_replication_band(values: np.ndarray, expected: float) -> None:
    """|mean − expected| ≤ 4 standard errors, the standard error taken across replications."""
    se = values.std(ddof=1) / math.sqrt(len(values))
    assert abs(values.mean() - expected) <= 4 * se, (values.mean(), expected, se)
    assert se < 0.05 * expected  # the test has the power to see a 5% error


@pytest.mark.slow
def test_md1_wait_is_two_service_times_at_rho_08() -> None:
    ratios = replicate_wait(lambda rng, n: np.full(n, 10), 0.8, 10, reps=10, n=30_000)
    within_replication_band(ratios, mg1_wait_ratio(0.8, None))  # 2.0


@pytest.mark.slow
def test_mm1_limit_wait_is_about_four_service_times_at_rho_08() -> None:
    p = 1 / 20
    ratios = replicate_wait(lambda rng, n: rng.geometric(p, n), 0.8, 1 / p, reps=10, n=30_000)
    expected = mg1_wait_ratio(0.8, None, p)  # 3.9; the exponential limit is 4.0
    within_replication_band(ratios, expected)
    assert abs(expected - 4.0) < 0.11


def mixed_jobs(seed: int, n: int = 4000) -> list[Job]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / 40, n)) * 1e9
    jobs = []
    for i, at in enumerate(t):
        kind = int(rng.integers(0, 3))
        prompt, out, cls = [
            (80, int(rng.integers(20, 300)), "interactive"),
            (int(rng.integers(2000, 6000)), 150, "batch"),
            (256, 0, "best-effort"),
        ][kind]
        jobs.append(
            Job(
                i,
                f"t{int(rng.integers(0, 4))}",
                cls,
                prompt,
                out,
                int(at),
                weight=1 + i % 2,
                priority=kind,
                flow=f"w{kind}",
            )
        )
    return jobs


POLICY_NAMES = [
    "fifo",
    "priority",
    "dwrr",
    "wfq",
    "sfq",
    "vtc",
    "lcf",
    "dwrr-wfq",
    "htb-sfq",
    "three-tier",
]


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_littles_law_on_the_event_log(policy: str) -> None:
    """L = λ·W, with L the time-average of jobs in system computed from the event log alone."""
    jobs = mixed_jobs(7)
    cfg = parse_scheduler_config({"policy": policy, "replicas": 2})
    result = simulate(jobs, cfg, trace=True)
    assert result.trace is not None
    events = []
    arrived, left = set(), set()
    for t, kind, job_id, _ in result.trace:
        if kind == "arrive":
            assert job_id not in arrived
            arrived.add(job_id)
            events.append((t, 1))
        elif kind == "finish":
            assert job_id in arrived and job_id not in left
            left.add(job_id)
            events.append((t, -1))
    assert arrived == left == {j.id for j in jobs}
    events.sort()
    t0, t_end = events[0][0], events[-1][0]
    area, level, prev = 0.0, 0, t0
    for t, delta in events:
        area += level * (t - prev)
        level += delta
        prev = t
    occupancy = area / (t_end - t0)  # L
    rate = len(jobs) / (t_end - t0)  # λ
    sojourn = np.mean([j.done_ns - j.arrival_ns for j in jobs])  # W
    assert occupancy == pytest.approx(rate * sojourn, rel=1e-9)
    # and per job the stamps are ordered
    for j in jobs:
        assert j.arrival_ns <= j.admit_ns <= j.first_token_ns <= j.done_ns


@pytest.mark.parametrize("policy", ["vtc", "htb-sfq", "wfq"])
def test_same_inputs_same_trace_bit_for_bit(policy: str) -> None:
    spec = {"policy": policy, "replicas": 3, "step_noise_cv": 0.1, "seed": 9}
    a = simulate(mixed_jobs(3), parse_scheduler_config(spec), trace=True)
    b = simulate(mixed_jobs(3), parse_scheduler_config(spec), trace=True)
    assert a.trace == b.trace
    assert all(np.array_equal(x, y) for x, y in zip(a.decode_ends, b.decode_ends, strict=True))


def test_token_times_and_itl_from_step_arrays() -> None:
    """A lone job on a constant-step engine: token k at (k+1) steps after admission."""
    cfg = parse_scheduler_config(SINGLE_SERVER)
    jobs = [Job(0, "a", "batch", 1, 5, 0), Job(1, "a", "batch", 1, 3, 1_500_000)]
    result = simulate(jobs, cfg)
    ms = 1_000_000
    assert list(result.token_times(jobs[0])) == [1 * ms, 2 * ms, 3 * ms, 4 * ms, 5 * ms]
    # job 1 waits for job 0 (max_num_seqs = 1), starts at 5 ms
    assert jobs[1].admit_ns == 5 * ms
    assert list(result.token_times(jobs[1])) == [6 * ms, 7 * ms, 8 * ms]
    assert list(result.itl_max_ns()) == [ms, ms]


def test_chunked_prefill_and_cost_model_step_times() -> None:
    """A 10,000-token prompt on the 8B profile runs in two chunks (8192 + 1808 tokens)."""
    cfg = parse_scheduler_config({"policy": "fifo", "profile": "h100-llama3-8b"})
    job = Job(0, "a", "batch", 10_000, 2, 0)
    result = simulate([job], cfg)
    p = cfg.profile
    first = p.step_ms(8192, 0, 0)
    second = p.step_ms(1808, 0, 0)
    assert job.first_token_ns == int(first * 1e6) + int(second * 1e6)
    decode = p.step_ms(0, 1, 10_001)
    assert job.done_ns == job.first_token_ns + int(decode * 1e6)
    assert result.steps == 3
