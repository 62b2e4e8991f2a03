"""Preemption modes, the budget and demotion: strict priority, conservation, exact costs."""

from __future__ import annotations

import numpy as np
import pytest

from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.scheduler.config import parse_scheduler_config
from reference_scheduler.scheduler.engine import Engine

RANK = {"interactive": 0, "batch": 1, "best-effort": 2}


def config(mode: str, **extra: object) -> object:
    return parse_scheduler_config(
        {
            "policy": "priority",
            "profile": {
                "constant_step_ms": 5.0,
                "kv_cache_tokens": 4000,
                "max_num_seqs": 4,
                "kv_bytes_per_token": 131072,
            },
            "preemption": {"mode": mode, **extra},
        }
    )


def simulate_engine(jobs: list[Job], cfg: object) -> Engine:
    """Simulate and hand back the engine, to read its preemption counters and log."""
    engines: list[Engine] = []
    original = Engine.__init__

    def spy(self, *a, **k):  # type: ignore[no-untyped-def]
        original(self, *a, **k)
        engines.append(self)

    Engine.__init__ = spy  # type: ignore[method-assign]
    try:
        simulate(jobs, cfg)  # type: ignore[arg-type]
    finally:
        Engine.__init__ = original  # type: ignore[method-assign]
    return engines[0]


def mixed(seed: int = 1, n: int = 300) -> list[Job]:
    """Batch floods first; interactive and best-effort keep arriving on top of it."""
    rng = np.random.default_rng(seed)
    jobs = [
        Job(
            i,
            "bulk",
            "batch",
            int(rng.integers(50, 400)),
            int(rng.integers(20, 200)),
            i * 2_000_000,
            priority=1,
        )
        for i in range(60)
    ]
    t = 100_000_000
    for i in range(60, n):
        t += int(rng.exponential(20_000_000))
        cls = "interactive" if rng.random() < 0.6 else "best-effort"
        tenant = "chat" if cls == "interactive" else "scrape"
        jobs.append(
            Job(
                i,
                tenant,
                cls,
                int(rng.integers(20, 300)),
                int(rng.integers(5, 120)),
                t,
                priority=RANK[cls],
            )
        )
    return jobs


@pytest.mark.parametrize("mode", ["cooperative", "swap", "recompute"])
def test_no_lower_tier_job_starts_while_a_higher_tier_job_waits(mode: str) -> None:
    jobs = mixed()
    result = simulate(jobs, config(mode), trace=True)
    assert result.trace is not None
    waiting: dict[int, int] = {}  # job id -> rank, for jobs waiting (queued or preempted)
    by_id = {j.id: j for j in jobs}
    preempted_at = {}
    for t, event, job_id, _ in result.trace:
        if event == "arrive":
            waiting[job_id] = by_id[job_id].priority
        elif event == "admit":
            rank = by_id[job_id].priority
            waiting.pop(job_id, None)
            assert all(r >= rank for r in waiting.values()), (t, job_id, waiting)
        elif event == "preempt":
            waiting[job_id] = by_id[job_id].priority
            preempted_at[job_id] = t
    assert preempted_at, "the workload must actually cause preemptions"
    assert all(j.status == "finished" for j in jobs)


@pytest.mark.parametrize("mode", ["cooperative", "swap", "recompute"])
def test_every_token_is_produced_exactly_once(mode: str) -> None:
    jobs = mixed()
    result = simulate(jobs, config(mode))
    assert sum(j.preemptions for j in jobs) > 0
    for job in jobs:
        times = result.token_times(job)
        assert len(times) == job.max_tokens, (job.id, len(times), job.max_tokens)
        assert np.all(np.diff(times) > 0)
        assert times[-1] == job.done_ns


def test_the_same_plan_decodes_the_same_tokens_under_every_mode() -> None:
    totals = {}
    for mode in ("none", "cooperative", "swap", "recompute"):
        jobs = mixed(seed=4)
        result = simulate(jobs, config(mode))
        totals[mode] = sum(len(result.token_times(j)) for j in jobs)
    assert len(set(totals.values())) == 1


def test_swap_moves_twice_the_context_per_round_trip() -> None:
    jobs = mixed(seed=2)
    cfg = config("swap")
    pre = simulate_engine(jobs, cfg).preemption
    out = [(job, tokens) for _, what, job, tokens in pre.log if what == "preempt"]
    back = [(job, tokens) for _, what, job, tokens in pre.log if what == "swap_in"]
    assert out and sorted(out) == sorted(back)  # every swap-out came back, same size
    kv = 131072
    assert pre.swap_out_bytes == pre.swap_in_bytes == kv * sum(t for _, t in out)
    # and the size is the victim's context at that moment: prompt + tokens produced by then
    by_id = {j.id: j for j in jobs}
    for _, what, job_id, tokens in pre.log:
        if what == "preempt":
            job = by_id[job_id]
            assert tokens <= job.prompt_tokens + job.max_tokens


def test_swap_and_recompute_time_costs_follow_the_formula() -> None:
    """One slot: a batch job is running; an interactive job preempts it."""
    kv_bytes, bw_gbps = 1_000_000, 1.0  # 1 MB per token over 1 GB/s: 1 ms per token
    for mode in ("swap", "recompute"):
        cfg = parse_scheduler_config(
            {
                "policy": "priority",
                "profile": {
                    "constant_step_ms": 10.0,
                    "kv_cache_tokens": 10**6,
                    "max_num_seqs": 1,
                    "kv_bytes_per_token": kv_bytes,
                },
                "preemption": {"mode": mode, "swap_bandwidth_gbps": bw_gbps},
            }
        )
        batch = Job(0, "bulk", "batch", 100, 50, 0, priority=1)
        urgent = Job(1, "chat", "interactive", 10, 3, 55_000_000, priority=0)
        simulate([batch, urgent], cfg)
        # batch: prefill step 0-10 ms (1st token), decode steps end 20, 30, 40, 50, 60 ms.
        # The urgent job arrives at 55 ms and is admitted at the 60 ms boundary; batch has
        # produced 6 tokens, so its context is 106.
        assert urgent.admit_ns == 60_000_000
        swap_out = 106 * 1_000_000 if mode == "swap" else 0
        assert urgent.first_token_ns == 60_000_000 + 10_000_000 + swap_out
        assert urgent.done_ns == urgent.first_token_ns + 2 * 10_000_000
        resumed = urgent.done_ns
        if mode == "swap":  # swap back in (106 ms), then 44 more decode steps
            assert batch.done_ns == resumed + 106_000_000 + 44 * 10_000_000
        else:  # re-prefill 106 tokens in one 10 ms step (yields token 7), then 43 steps
            assert batch.done_ns == resumed + 10_000_000 + 43 * 10_000_000
        assert batch.preemptions == 1


def test_the_budget_turns_the_next_preemption_into_a_demotion() -> None:
    cfg = parse_scheduler_config(
        {
            "policy": "priority",
            "profile": {"constant_step_ms": 5.0, "kv_cache_tokens": 100_000, "max_num_seqs": 4},
            "preemption": {"mode": "recompute", "budget": {"count": 2, "window_s": 3600}},
        }
    )  # four long bulk jobs fill the four slots; each urgent job needs one
    bulk = [Job(i, "bulk", "batch", 100, 2000, 0, priority=1) for i in range(4)]
    urgent = [
        Job(10 + k, "chat", "interactive", 10, 5, 100_000_000 * (k + 1), priority=0)
        for k in range(4)
    ]
    pre = simulate_engine(bulk + urgent, cfg).preemption
    assert pre.suffered["bulk"] == 2  # the budget
    assert pre.demotions >= 1
    demoted = [job for _, what, job, _ in pre.log if what == "demote"]
    assert demoted[0] == 12  # the third urgent job: its preemption would have been the 3rd
    job = next(j for j in urgent if j.id == 12)
    assert job.slo_class == "interactive" and job.tier == "batch" and job.priority == 1


def test_recompute_re_prefills_the_lost_context_minus_cache_hits() -> None:
    cfg = parse_scheduler_config(
        {
            "policy": "priority",
            "profile": {"constant_step_ms": 10.0, "kv_cache_tokens": 10**6, "max_num_seqs": 1},
            "preemption": {"mode": "recompute"},
            "prefix_cache": {"blocks": 1000},
        }
    )
    # 64 full prompt blocks; a first copy of the prompt runs alone, so its blocks get cached
    hashes = tuple(range(64))
    warm = Job(0, "bulk", "batch", 1024, 1, 0, priority=1, block_hashes=hashes)
    batch = Job(1, "bulk", "batch", 1024, 50, 100_000_000, priority=1, block_hashes=hashes)
    urgent = Job(2, "chat", "interactive", 10, 2, 150_000_000, priority=0)
    pre = simulate_engine([warm, batch, urgent], cfg).preemption
    ((_, _, victim, lost),) = [e for e in pre.log if e[1] == "preempt"]
    ((_, _, again, redo),) = [e for e in pre.log if e[1] == "recompute"]
    assert victim == again == 1
    # context = 1024 prompt + tokens produced; the 1,024 cached prompt tokens are not redone
    assert redo == lost - 1024 and pre.recompute_tokens == redo > 0
    assert all(j.status == "finished" for j in (warm, batch, urgent))


def test_tier_borrowing_is_attributed_to_the_lenders() -> None:
    from reference_scheduler.policies.fifo import Fifo
    from reference_scheduler.policies.tiered import Tiered, TierSpec

    tiers = Tiered(
        [
            TierSpec("interactive", 0.5, Fifo),
            TierSpec("batch", 0.3, Fifo),
            TierSpec("best-effort", 0.2, Fifo),
        ],
        borrow_ratio=1.0,
    )
    tiers.bind(10)
    tiers.running = [8, 1, 1]  # interactive 3 slots over its 5; batch leaves 2, best-effort 1
    lent = tiers.borrowing()
    assert lent == pytest.approx(
        {("batch", "interactive"): 0.2, ("best-effort", "interactive"): 0.1}
    )
