"""`scheduler: {engine: vllm}`: the simulator schedules as vLLM V1 does (issue #16, item 2).

What would break if the model were wrong: the priority queue would not protect the urgent
class; KV would be reserved up front (so the preemption below never happens) or the wrong
request would be preempted; a preempted request would resume without re-prefilling; a step
would run more tokens than `max_num_batched_tokens`; a plan would not give the same records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fairbench.plan.materialize import materialize
from fairbench.targets.sim import run_sim
from fairbench.workload.loading import parse_scenario
from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.scheduler.config import SchedulerConfigError, parse_scheduler_config
from reference_scheduler.scheduler.vllm import VllmEngine, make_engine
from tests.cli import run_cli

REPO = Path(__file__).resolve().parents[1]


def two_classes(policy: str) -> dict[str, Any]:
    """Chat (interactive, priority 0) under a document flood (batch, priority 1) that
    overloads a small KV cache, so requests queue and running ones are preempted."""
    return {
        "name": "vllm-two-classes",
        "workloads": {
            "chat": {"endpoint": "chat", "prompt_tokens": 200, "output_tokens": 64},
            "doc": {
                "endpoint": "completions",
                "prompt_tokens": {"dist": "uniform", "low": 1500, "high": 4000},
                "output_tokens": {"dist": "uniform", "low": 100, "high": 300},
            },
        },
        "tenants": [
            {"id": "chat", "slo_class": "interactive", "mix": "chat",
             "arrival": {"process": "poisson", "rate": "4/s"}},
            {"id": "flood", "slo_class": "batch", "mix": "doc",
             "arrival": {"process": "poisson", "rate": "10/s"}},
        ],
        "run": {"duration": "20s", "seed": 3, "grace": "10min"},  # every request finishes
        "target": {"kind": "sim"},
        "scheduler": {
            "engine": "vllm",
            "policy": policy,
            "profile": "h100-llama3-8b",
            "kv_cache_tokens": 30000,
        },
    }  # fmt: skip


def sim_records(policy: str) -> list[dict[str, Any]]:
    scn = parse_scenario(two_classes(policy))
    rows, info = run_sim(materialize(scn), scn)
    assert info["policy"] == policy
    return rows


def ttft_p99(rows: list[dict[str, Any]], cls: str) -> float:
    ttft = [r["t_first_token_ns"] - r["t_sent_ns"] for r in rows if r["slo_class"] == cls]
    return float(np.percentile(ttft, 99))


def test_priority_protects_the_urgent_class_where_fcfs_does_not() -> None:
    fcfs, prio = sim_records("fcfs"), sim_records("priority")
    for rows in (fcfs, prio):
        assert {r["status"] for r in rows} == {"ok"}  # overloaded, yet everything is served
    assert sum(r["preemptions"] for r in fcfs) > 0  # the KV cache did run out
    # Under FCFS chat queues behind the flood; under priority it jumps the queue.
    assert ttft_p99(prio, "interactive") < ttft_p99(fcfs, "interactive") / 10
    # The flood pays for it, but is not starved: its TTFT p99 is no better under priority.
    assert ttft_p99(prio, "batch") >= ttft_p99(fcfs, "batch") * 0.9


def small_engine(policy: str, **extra: Any) -> VllmEngine:
    cfg = parse_scheduler_config(
        {
            "engine": "vllm",
            "policy": policy,
            "profile": {"constant_step_ms": 10.0, "kv_cache_tokens": 160, "max_num_seqs": 8},
            **extra,
        }
    )
    engine = make_engine(cfg)
    assert isinstance(engine, VllmEngine)
    return engine


def three_jobs() -> list[Job]:
    """32-token prompts (2 blocks of 16) growing to 96 tokens (6 blocks) each: together they
    need 18 blocks of the 10 there are. The low-priority job runs first, alone, so it is the
    first of the running list, not the last."""
    return [
        Job(0, "t", "batch", 32, 64, 0, priority=1),  # low priority, earliest
        Job(1, "t", "interactive", 32, 64, 1, priority=0),
        Job(2, "t", "interactive", 32, 64, 2, priority=0),  # latest
    ]


def run_steps(engine: VllmEngine, jobs: list[Job]) -> list[tuple[int, int, list[int], list[int]]]:
    """Submit each job at the first step boundary at or after its arrival, step until all
    finish: (prefill tokens, decode seqs, admitted ids, preempted ids) per step."""
    pending = sorted(jobs, key=lambda j: j.arrival_ns)
    now, steps = 0, []
    for _ in range(10_000):
        while pending and pending[0].arrival_ns <= now:
            assert engine.submit(pending.pop(0), now).accepted
        res = engine.step(0, now)
        if res is None:
            if not pending:
                break
            now = pending[0].arrival_ns
            continue
        steps.append(
            (
                res.n_prefill,
                res.n_decode,
                [j.id for j in res.admitted],
                [j.id for j in res.preempted],
            )
        )
        now = res.end_ns
    assert all(j.status == "finished" for j in jobs)
    return steps


@pytest.mark.parametrize(("policy", "victim"), [("priority", 0), ("fcfs", 2)])
def test_kv_exhaustion_preempts_the_lowest_priority_or_latest_and_recomputes_it(
    policy: str, victim: int
) -> None:
    engine = small_engine(policy)
    jobs = three_jobs()
    steps = run_steps(engine, jobs)
    # Blocks are allocated as tokens are computed: all three run at once (7 of 10 blocks after
    # the second step), where reserving prompt + max output (6 blocks each) admits one.
    assert steps[0][:3] == (32, 0, [0])
    assert steps[1][:3] == (64, 1, [1, 2])
    preempts = [(t, job, lost) for t, kind, job, lost in engine.log if kind == "preempt"]
    # priority: the largest (priority, arrival) goes, the early low-priority job;
    # fcfs: the last of the running list, the job admitted last.
    assert preempts and preempts[0][1] == victim
    assert jobs[victim].preemptions >= 1
    first_preempt_step = next(k for k, s in enumerate(steps) if s[3])
    # Recompute: its blocks were freed and on resumption it re-prefills its prompt and every
    # token it had generated, in one prefill that yields its next token.
    lost = preempts[0][2]
    recomputes = [t for _, kind, job, t in engine.log if kind == "recompute" and job == victim]
    assert recomputes[0] == lost + 1  # computed tokens + the sampled one not yet computed
    resumed = next(k for k, s in enumerate(steps) if k > first_preempt_step and victim in s[2])
    assert steps[resumed][0] >= recomputes[0]
    # Nothing is lost: every job produced all its tokens, in order, the victim included.
    result_times = [np.diff(_token_times(engine, j)) for j in jobs]
    assert all(len(t) == 63 and (t > 0).all() for t in result_times)
    assert engine.replicas[0].free_blocks == engine.kv_blocks


def _token_times(engine: VllmEngine, job: Job) -> np.ndarray:
    ends = np.asarray(engine.replicas[0].decode_ends)
    return np.concatenate([ends[first : first + count] for _, _, first, count in job.segments])


def test_token_budget_max_num_seqs_and_kv_hold_on_every_step() -> None:
    budget, seqs = 512, 6
    engine = small_engine(
        "fcfs", max_num_batched_tokens=budget, max_num_seqs=seqs, kv_cache_tokens=4096
    )
    rng = np.random.default_rng(7)
    jobs = [
        Job(i, "t", "batch", int(rng.integers(10, 2000)), int(rng.integers(1, 80)), 0)
        for i in range(60)
    ]
    for job in jobs:
        assert engine.submit(job, 0).accepted
    now, chunked, rep = 0, 0, engine.replicas[0]
    for _ in range(100_000):
        res = engine.step(0, now)
        if res is None:
            break
        assert res.n_prefill + res.n_decode <= budget  # the per-step token budget
        assert len(rep.running) <= seqs  # max_num_seqs
        held = sum(j.blocks for j in rep.running)
        assert rep.free_blocks >= 0 and held + rep.free_blocks == engine.kv_blocks
        chunked += res.n_prefill + res.n_decode == budget
        now = res.end_ns
    assert all(j.status == "finished" for j in jobs)
    assert chunked > 0  # prompts longer than the budget were split into chunks


def test_the_same_plan_gives_the_same_records_byte_for_byte() -> None:
    a = json.dumps(sim_records("priority"), sort_keys=True)
    b = json.dumps(sim_records("priority"), sort_keys=True)
    assert a == b


def test_fcfs_serves_in_arrival_order_when_nothing_is_preempted() -> None:
    cfg = parse_scheduler_config(
        {
            "engine": "vllm",
            "policy": "fcfs",
            "profile": {"constant_step_ms": 5.0, "kv_cache_tokens": 100_000, "max_num_seqs": 2},
        }
    )
    jobs = [Job(i, "t", "batch", 100, 20, i * 1000, priority=2 - i % 3) for i in range(9)]
    result = simulate(jobs, cfg)
    firsts = result.column("first_token_ns")
    assert (np.diff(firsts) >= 0).all()  # priorities are ignored under fcfs


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"policy": "vtc"}, "scheduler.policy"),
        ({"policy": "fcfs", "preemption": {"mode": "swap"}}, "scheduler.preemption"),
        ({"policy": "fcfs", "replicas": 2}, "scheduler.replicas"),
        ({"policy": "fcfs", "admission": {"max_queue": 5}}, "scheduler.admission"),
    ],
)
def test_knobs_vllm_lacks_are_refused_in_one_line(block: dict[str, Any], field: str) -> None:
    with pytest.raises(SchedulerConfigError) as error:
        parse_scheduler_config({"engine": "vllm", **block})
    assert len(error.value.lines) == 1 and error.value.lines[0].startswith(field + ":")


def test_fairbench_run_and_ab_use_the_vllm_engine_unchanged(tmp_path: Path) -> None:
    scenario = REPO / "scenarios" / "vllm-sim-priority.yaml"
    out = tmp_path / "ab"
    done = run_cli(
        "ab", str(scenario), "--a", "scheduler.policy=fcfs", "--b", "scheduler.policy=priority",
        "--iterations", "1", "--out", str(out), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    comparison = json.loads((out / "comparison.json").read_text())
    text = json.dumps(comparison)
    assert "ttft_p99.class.interactive" in text
    bad = run_cli("validate", str(_bad_scenario(tmp_path, scenario)))
    assert bad.returncode != 0
    assert "scheduler.policy" in bad.stdout + bad.stderr
    assert "Traceback" not in bad.stdout + bad.stderr


def test_a_scenario_asking_the_vllm_model_of_a_live_target_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    text = (REPO / "scenarios" / "vllm-sim-priority.yaml").read_text()
    path = tmp_path / "live.yaml"
    path.write_text(text.replace("target: {kind: sim}", "target: {kind: reference}"))
    done = run_cli("validate", str(path))
    assert done.returncode == 2
    lines = [x for x in (done.stdout + done.stderr).splitlines() if "scheduler.engine" in x]
    assert len(lines) == 1 and "target: {kind: sim}" in lines[0]
    assert "Traceback" not in done.stdout + done.stderr


def _bad_scenario(tmp_path: Path, scenario: Path) -> Path:
    text = scenario.read_text().replace("policy: priority,", "policy: dwrr,")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


def test_without_chunked_prefill_a_prompt_waits_for_a_budget_it_fits_whole() -> None:
    engine = small_engine(
        "fcfs", chunked_prefill=False, max_num_batched_tokens=512, kv_cache_tokens=8192
    )
    jobs = [Job(i, "t", "batch", 400, 4, 0) for i in range(3)]
    steps = run_steps(engine, jobs)
    # Step 1 runs job 0's whole prompt; job 1's (400 > the 112 left) stops the waiting loop.
    assert steps[0][:3] == (400, 0, [0])
    # Step 2 mixes job 0's decode with job 1's whole prompt; job 2 (400 > 111) waits again.
    assert steps[1][:3] == (400, 1, [1])
    assert all(prefill in (0, 400) for prefill, *_ in steps)  # a prompt is never split


def test_a_cancelled_job_frees_its_blocks_and_keeps_the_tokens_it_produced() -> None:
    """The virtual driver cancels a job whose client gave up (a timeout, the end of the run)."""
    engine = small_engine("priority", kv_cache_tokens=4096)
    jobs = [Job(0, "t", "batch", 40, 50, 0), Job(1, "t", "batch", 40, 50, 0, priority=1)]
    for job in jobs:
        engine.submit(job, 0)
    waiting = Job(2, "t", "batch", 40, 50, 0, priority=2)
    now = 0
    for _ in range(10):
        now = engine.step(0, now).end_ns  # type: ignore[union-attr]
    engine.submit(waiting, now)
    assert engine.cancel(jobs[0], now) and engine.cancel(waiting, now)
    assert not engine.cancel(waiting, now)  # no longer live
    assert jobs[0].status == "cancelled" and jobs[0].blocks == 0
    assert len(engine.policy) == 0 and engine.replicas[0].running == [jobs[1]]
    held = jobs[1].blocks
    assert engine.replicas[0].free_blocks + held == engine.kv_blocks
    assert sum(count for *_, count in jobs[0].segments) == 10  # a token per step it ran
    while engine.step(0, now) is not None:
        now = engine.replicas[0].decode_ends[-1]
    assert jobs[1].status == "finished" and engine.replicas[0].free_blocks == engine.kv_blocks


# ---------------------------------------------------------------- issue 36 item 5


def _vllm(**profile: Any) -> Any:
    base = {"constant_step_ms": 5.0, "kv_cache_tokens": 1600, "max_num_seqs": 8}
    block = {"engine": "vllm", "policy": "fcfs", "profile": {**base, **profile}}
    return block


def test_a_waiting_head_that_does_not_fit_stops_the_waiting_loop_as_vllm_does() -> None:
    """vLLM V1 (vllm/v1/core/sched/scheduler.py at 00024d314514900f361ad072af6931e403b7f589)
    `break`s the waiting loop when `allocate_slots` returns None for the head: a later request
    that would fit is *not* scheduled past it. (It skips a head — `skipped_waiting_requests` —
    only for reasons the model has no equivalent of: remote KV not yet arrived, a grammar not yet
    compiled, the LoRA limit.) A 1,400-token head needs 88 of the 100 blocks while a 400-token
    request runs; the 32-token request behind the head waits until the head is admitted."""
    cfg = parse_scheduler_config(_vllm())
    running = Job(0, "t", "batch", 400, 40, 0)
    head = Job(1, "t", "batch", 1400, 1, 1000)
    small = Job(2, "t", "batch", 32, 1, 2000)
    result = simulate([running, head, small], cfg)
    assert head.admit_ns >= running.done_ns  # the head waited for the blocks to come back
    assert small.admit_ns >= head.admit_ns  # and the small one, which fit at once, behind it
    assert small.admit_ns > small.arrival_ns + 30 * 5_000_000  # ~40 steps, not the next one
    assert result.jobs[2].status == "finished"


def test_without_chunked_prefill_a_head_over_the_budget_stops_the_waiting_loop_too() -> None:
    cfg = parse_scheduler_config(
        _vllm(chunked_prefill=False, max_num_batched_tokens=1024, kv_cache_tokens=100_000)
    )
    a = Job(0, "t", "batch", 900, 3, 0)
    b = Job(1, "t", "batch", 500, 3, 0)  # 500 > the 124 tokens left in a's step
    c = Job(2, "t", "batch", 100, 3, 0)  # would fit in them
    simulate([a, b, c], cfg)
    assert a.admit_ns == 0 and b.admit_ns > 0 and c.admit_ns >= b.admit_ns


def test_vllm_prefix_caching_hits_shared_prompt_blocks_and_saves_their_prefill() -> None:
    shared = tuple(range(100, 132))  # 32 blocks = 512 tokens of a common system prompt
    profile = {"a": 2.0, "b": 0.05, "d": 5.0, "kv_cache_tokens": 100_000, "max_num_seqs": 8}
    block = {"engine": "vllm", "policy": "fcfs", "profile": profile}
    off = parse_scheduler_config(block)
    on = parse_scheduler_config({**block, "prefix_caching": True})

    def jobs() -> list[Job]:
        out = []
        for i in range(3):
            job = Job(i, "t", "batch", 520, 4, i * 100_000_000)
            job.block_hashes = shared
            out.append(job)
        return out

    cold, warm = simulate(jobs(), off), simulate(jobs(), on)
    assert [j.cached_tokens for j in cold.jobs] == [0, 0, 0]
    assert [j.cached_tokens for j in warm.jobs] == [0, 512, 512]
    ttft = [j.first_token_ns - j.arrival_ns for j in warm.jobs]
    cold_ttft = [j.first_token_ns - j.arrival_ns for j in cold.jobs]
    assert ttft[1] < cold_ttft[1] and ttft[0] == cold_ttft[0]


def test_vllm_prefix_cache_lives_in_the_free_blocks_and_is_evicted_lru() -> None:
    """The cache is vLLM's KV pool itself: a finished request's blocks stay cached in the free
    queue, and a later allocation that needs them evicts the least recently freed first."""
    cfg = parse_scheduler_config({**_vllm(kv_cache_tokens=1600), "prefix_caching": True})
    engine = make_engine(cfg)
    assert isinstance(engine, VllmEngine) and engine.pool is not None
    a = Job(0, "t", "batch", 640, 1, 0)  # 40 blocks, all cached when it is done
    a.block_hashes = tuple(range(1, 41))
    big = Job(1, "t", "batch", 1400, 1, 10_000_000)  # needs 88 blocks: evicts 28 of a's 40
    again = Job(2, "t", "batch", 640, 1, 50_000_000)
    again.block_hashes = a.block_hashes
    result = simulate([a, big, again], cfg)
    assert result.jobs[0].status == result.jobs[1].status == "finished"
    # a's blocks were freed tail first, so its head blocks survived the eviction
    assert 0 < again.cached_tokens < 640
    assert again.cached_tokens == 12 * 16


def test_prefix_caching_is_refused_on_the_reference_engine_in_one_line() -> None:
    with pytest.raises(SchedulerConfigError) as error:
        parse_scheduler_config({"prefix_caching": True})
    assert len(error.value.lines) == 1
    assert error.value.lines[0].startswith("scheduler.prefix_caching:")
