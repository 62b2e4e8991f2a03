"""The simulator's fast paths (issue 35) give what the plain computations give, bit for bit.

Each shortcut replaces a computation whose result is part of the records: the pure decode
step's cost kept per batch size, the last token's time read by index instead of from the
token-time array, the driver's run of step ends checked against the next arrival once. The
golden outputs pin whole runs; these pin each shortcut on its own, where a bug would show
first."""

from __future__ import annotations

import itertools
import random

import pytest

from reference_scheduler.core.costmodel import Profile, load_profile, shipped_profiles
from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.scheduler.config import SchedulerConfig, parse_scheduler_config


@pytest.mark.parametrize("name", shipped_profiles())
def test_decode_base_plus_context_term_is_step_ms(name: str) -> None:
    profile = load_profile(name)
    rng = random.Random(name)
    for _ in range(2000):
        batch, context = rng.randint(1, 1024), rng.randint(0, 4_000_000)
        base = profile.decode_base_ms(batch)
        assert base is not None
        assert base + profile.f * context == profile.step_ms(0, batch, context)


def test_decode_base_on_random_coefficients_and_constant_steps() -> None:
    rng = random.Random(35)
    for _ in range(2000):
        p = Profile("r", *(rng.uniform(0, 10) * 10 ** rng.randint(-7, 1) for _ in range(7)))
        batch, context = rng.randint(1, 512), rng.randint(0, 1 << 22)
        assert p.decode_base_ms(batch) + p.f * context == p.step_ms(0, batch, context)  # type: ignore[operator]
    assert Profile("c", constant_step_ms=5.0).decode_base_ms(3) is None


def _jobs(n: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    t = 0
    jobs = []
    for i in range(n):
        t += rng.randint(0, 4_000_000)
        tier = rng.randint(0, 2)
        jobs.append(
            Job(
                i,
                f"t{rng.randint(0, 3)}",
                ("interactive", "batch", "best-effort")[tier],
                rng.randint(1, 3000),
                rng.choice([0, 1, 2, rng.randint(3, 400)]),
                t,
                priority=tier,
            )
        )
    return jobs


def _config(policy: str, **extra: object) -> SchedulerConfig:
    return parse_scheduler_config(
        {"policy": policy, "profile": "a10g-llama2-7b", "replicas": 3, **extra}
    )


CONFIGS = [
    ("vtc", {}),
    ("fifo", {"step_noise_cv": 0.3}),
    ("three-tier", {"preemption": {"mode": "recompute"}, "max_num_seqs": 8}),
    ("three-tier", {"preemption": {"mode": "swap"}, "max_num_seqs": 8}),
]


@pytest.mark.parametrize(
    ("policy", "extra"), CONFIGS, ids=[c[0] + str(i) for i, c in enumerate(CONFIGS)]
)
def test_last_token_by_index_is_the_token_times_last(policy: str, extra: dict) -> None:
    from fairbench.targets.sim import _last_token_ns

    result = simulate(_jobs(600, 1), _config(policy, **extra), timeout_ns=20_000_000_000)
    finished = [j for j in result.jobs if j.status == "finished"]
    assert finished
    for job in finished:
        times = result.token_times(job)
        assert _last_token_ns(result, job) == (int(times[-1]) if len(times) else None)


@pytest.mark.parametrize(
    ("policy", "extra"), CONFIGS, ids=[c[0] + str(i) for i, c in enumerate(CONFIGS)]
)
def test_progress_and_trace_change_nothing(policy: str, extra: dict) -> None:
    """The driver's inner run of step ends calls progress and records the trace as it goes;
    neither may change the run (cut-offs and a stop included)."""
    told: list[tuple[int, int]] = []

    def run(**kw: object) -> list[tuple]:
        result = simulate(
            _jobs(600, 2),
            _config(policy, **extra),
            timeout_ns=8_000_000_000,
            stop_ns=90_000_000_000,
            **kw,
        )
        return [
            (j.status, j.admit_ns, j.first_token_ns, j.done_ns, j.replica, j.preemptions)
            for j in result.jobs
        ] + [(result.end_ns, result.steps)]

    plain = run()
    assert run(trace=True) == plain
    assert run(progress=lambda ended, now: told.append((ended, now))) == plain
    assert told and told[-1][0] == 600
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(told))  # virtual time only moves on


def test_the_bar_says_draining_past_the_plan_span() -> None:
    """Past the last send the simulator still finishes what is in flight (up to the grace):
    the bar says so instead of 'virtual 36.2 of 20.0 s · ETA 0 s'."""
    from fairbench.run.measure import SimCounters

    c = SimCounters(planned=10, span_s=20.0, virtual_s=5.0, eta_s=3.0)
    assert c.line == "simulating · virtual 5.0 of 20.0 s · ETA 3 s"
    c.virtual_s = 36.2
    assert c.line == "simulating · virtual 36.2 s · draining past the plan's 20.0 s"


def test_vtc_charge_decode_is_the_charge_loop_bit_for_bit() -> None:
    """Weights and prices that do not divide evenly: the sums must still match exactly."""
    from reference_scheduler.policies.vtc import Vtc

    rng = random.Random(7)
    weights = {f"t{k}": rng.choice([1.0, 3.0, 0.7, 2.5]) for k in range(5)}
    a, b = Vtc(1.3, 2.1, weights), Vtc(1.3, 2.1, weights)
    jobs = [Job(k, f"t{k % 6}", "c", 10, 10, 0, weight=1.9) for k in range(6)]  # t5: no weight
    for policy in (a, b):
        for job in jobs[:5]:
            policy.enqueue(job, 0)
    for step in range(3000):
        entries = [[rng.randint(1, 300), job] for job in rng.sample(jobs, rng.randint(1, 6))]
        for count, job in entries:
            a.charge(job, step, 0, count)
        b.charge_decode(entries, step)
    assert a.counters == b.counters and all(v > 0 for v in a.counters.values())
