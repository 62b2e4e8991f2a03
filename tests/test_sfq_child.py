"""SFQ over a charging child: VTC inside a bucket sees the service its tenants receive.

SFQ hashes flows into buckets and round-robins the buckets; the child orders the jobs of the
flows that share a bucket. VTC's order comes from charges (tokens served), so SFQ must pass
them on: before, SFQ told the engine nobody listened, its counters stayed at zero, and VTC
inside a bucket was FIFO.
"""

from __future__ import annotations

from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.policies.sfq import Sfq
from reference_scheduler.scheduler.config import parse_scheduler_config
from reference_scheduler.scheduler.engine import Engine

PROFILE = {"constant_step_ms": 10.0, "kv_cache_tokens": 100000, "max_num_seqs": 1}
# one bucket: both tenants collide, so the child alone decides between them
SPEC = {"name": "sfq", "buckets": 1, "child": "vtc"}


def test_the_vtc_child_is_charged_for_what_it_serves() -> None:
    config = parse_scheduler_config({"policy": SPEC, "profile": PROFILE})
    engine = Engine(config)
    assert engine.policy.uses_charge  # the engine charges it at all
    for i in range(2):
        engine.submit(Job(i, "heavy", "interactive", 10, 3, 0), 0)
    now, steps = 0, 0
    while (res := engine.step(0, now)) is not None and steps < 100:  # bounded
        now, steps = res.end_ns, steps + 1
    sfq = engine.policy
    assert isinstance(sfq, Sfq)
    bucket = next(iter(sfq._classes.values()))
    # prompts at 1 a token, output tokens at 2 (VTC's defaults), both jobs served in full
    assert bucket.child.counters == {"heavy": 2 * (10 * 1 + 3 * 2)}  # type: ignore[attr-defined]


def test_vtc_inside_the_bucket_lets_the_light_tenant_ahead() -> None:
    """heavy queues six long jobs first; light arrives with three short ones. FIFO would serve
    all of heavy first; VTC (charged) serves light as soon as heavy's counter is ahead."""
    order: dict[str, list[str]] = {}
    for child in ("fifo", "vtc"):
        spec = {"name": "sfq", "buckets": 1, "child": child}
        config = parse_scheduler_config({"policy": spec, "profile": PROFILE})
        jobs = [Job(i, "heavy", "interactive", 10, 50, i * 1_000) for i in range(6)]
        jobs += [Job(6 + i, "light", "interactive", 10, 5, 10_000 + i * 1_000) for i in range(3)]
        result = simulate(jobs, config)
        done = sorted(result.jobs, key=lambda j: j.done_ns)
        order[child] = [j.tenant for j in done]
    assert order["fifo"] == ["heavy"] * 6 + ["light"] * 3
    assert order["vtc"][:4] == ["heavy", "light", "light", "light"]
