"""Admission control, congestion response and the global prefix cache."""

from __future__ import annotations

import pytest

from reference_scheduler.core.job import Job
from reference_scheduler.core.prefix_cache import PrefixCache, PrefixCacheSpec
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.scheduler.config import parse_scheduler_config
from reference_scheduler.scheduler.engine import Engine

SLOW = {"constant_step_ms": 10.0, "kv_cache_tokens": 10**6, "max_num_seqs": 1}


def engine(**admission: object) -> Engine:
    return Engine(
        parse_scheduler_config({"policy": "fifo", "profile": SLOW, "admission": admission})
    )


def job(i: int, tenant: str = "a", cls: str = "interactive", out: int = 10) -> Job:
    return Job(i, tenant, cls, 16, out, 0)


def test_global_cap_rejects_with_503_and_the_job_never_enters() -> None:
    eng = engine(max_queue=5)
    verdicts = [eng.submit(job(i), 0) for i in range(8)]
    assert [v.accepted for v in verdicts] == [True] * 5 + [False] * 3
    assert {(v.code, v.reason) for v in verdicts[5:]} == {(503, "queue_full")}
    assert all(v.retry_after_s >= 1 for v in verdicts[5:])
    assert len(eng.policy) == 5 and eng.admission is not None
    assert eng.admission.rejected["queue_full"] == 3


def test_tenant_cap_is_429_and_other_tenants_still_get_in() -> None:
    eng = engine(max_queue_per_tenant=2)
    got = [eng.submit(job(i, "greedy"), 0) for i in range(3)] + [eng.submit(job(9, "polite"), 0)]
    assert [v.accepted for v in got] == [True, True, False, True]
    assert (got[2].code, got[2].reason) == (429, "tenant_queue_full")


def test_best_effort_is_shed_first() -> None:
    eng = engine(shed_best_effort_depth=3, max_queue=10)
    for i in range(3):
        assert eng.submit(job(i), 0).accepted
    shed = eng.submit(job(3, cls="best-effort"), 0)
    assert (shed.accepted, shed.code, shed.reason) == (False, 503, "shed_best_effort")
    assert eng.submit(job(4, cls="interactive"), 0).accepted  # others still admitted


def test_tier_cap() -> None:
    eng = engine(max_queue_per_tier={"batch": 1})
    assert eng.submit(job(0, cls="batch"), 0).accepted
    refused = eng.submit(job(1, cls="batch"), 0)
    assert (refused.accepted, refused.reason) == (False, "tier_queue_full")
    assert eng.submit(job(2, cls="interactive"), 0).accepted


def test_congestion_caps_max_tokens_of_batch_before_rejecting() -> None:
    eng = engine(degrade_depth=2, degrade_max_tokens=256)
    jobs = [
        job(0, out=1000),
        job(1, out=1000),
        job(2, cls="batch", out=1000),
        job(3, cls="interactive", out=1000),
    ]
    for j in jobs:
        assert eng.submit(j, 0).accepted
    assert [j.max_tokens for j in jobs] == [1000, 1000, 256, 1000]
    assert eng.admission is not None and eng.admission.degraded == 1


def test_retry_after_is_the_queue_drain_time_at_the_recent_rate() -> None:
    from reference_scheduler.core.admission import Admission, AdmissionSpec

    adm = Admission(AdmissionSpec(max_queue=7))
    for k in range(30):  # 30 completions within the last 10 s: 3 per second
        adm.finished(20_000_000_000 + k * 300_000_000)
    for _ in range(7):
        adm.entered(Job(0, "a", "interactive", 1, 1, 0))
    refusal = adm.check(Job(1, "a", "interactive", 1, 1, 0), 29_000_000_000)
    assert refusal is not None and refusal.retry_after_s == 3  # ceil(7 waiting / 3 per s)
    # much later, those completions have left the window: no rate known, a cautious 10 s
    refusal = adm.check(Job(2, "a", "interactive", 1, 1, 0), 60_000_000_000)
    assert refusal is not None and refusal.retry_after_s == 10


# ---------------------------------------------------------------- prefix cache


def test_match_counts_leading_full_blocks_and_keeps_one_token_to_compute() -> None:
    cache = PrefixCache(PrefixCacheSpec(blocks=100), block_size=16)
    cache.insert((1, 2, 3), "interactive")
    assert cache.match((1, 2, 9, 3), 64) == 32  # stops at the first miss
    assert cache.match((1, 2, 3), 48) == 47  # a 48-token prompt computes at least one token
    assert cache.match((7,), 16) == 0
    assert (cache.query_tokens, cache.hit_tokens) == (64 + 48 + 16, 32 + 47)


@pytest.mark.parametrize(("fraction", "survives"), [(0.5, True), (0.0, False)])
def test_interactive_prefix_survives_best_effort_churn(fraction: float, survives: bool) -> None:
    cache = PrefixCache(PrefixCacheSpec(blocks=100, protected_fraction=fraction), 16)
    hot = tuple(range(10))
    cache.insert(hot, "interactive")
    for k in range(50):  # 1,000 blocks of unique best-effort documents
        cache.insert(tuple(range(1000 + 20 * k, 1020 + 20 * k)), "best-effort")
    assert all(h in cache for h in hot) is survives
    assert len(cache) == 100


def test_batch_reuses_an_interactive_prefix() -> None:
    cache = PrefixCache(PrefixCacheSpec(blocks=100), 16)
    cache.insert((5, 6, 7, 8), "interactive")
    assert cache.match((5, 6, 7, 8, 99), 80) == 64


def test_cache_hits_cut_prefill_in_the_engine() -> None:
    cfg = parse_scheduler_config(
        {"policy": "fifo", "profile": "h100-llama3-8b", "prefix_cache": {"blocks": 1000}}
    )
    hashes = tuple(range(64))  # a 1,024-token prompt, 64 full blocks
    first = Job(0, "a", "interactive", 1024, 2, 0, block_hashes=hashes)
    second = Job(1, "b", "batch", 1024, 2, 1_000_000_000, block_hashes=hashes)
    simulate([first, second], cfg)
    assert (first.cached_tokens, second.cached_tokens) == (0, 1023)
    p = cfg.profile
    assert first.first_token_ns - first.admit_ns == int(p.step_ms(1024, 0, 0) * 1e6)
    assert second.first_token_ns - second.admit_ns == int(p.step_ms(1, 0, 0) * 1e6)
