"""The dual closed loop (reference_scheduler/scheduler/control.py, issue 38): each loop's action
fires when its condition holds and not otherwise, every action is counted (the simulator's
result and trace, the server's Prometheus counter), a refused request still ends as exactly one
rejected job, and the three pitfalls of scenarios/control-*.yaml show their symptoms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fairbench.plan.materialize import materialize
from fairbench.targets.sim import plan_jobs
from fairbench.workload.loading import load_scenario
from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import SimResult, simulate
from reference_scheduler.scheduler.config import SchedulerConfigError, parse_scheduler_config
from reference_scheduler.scheduler.engine import Engine
from reference_scheduler.server.metrics import SchedulerMetrics

ROOT = Path(__file__).resolve().parents[1]


def run(name: str, **override: Any) -> tuple[list[Job], SimResult]:
    """Simulate scenarios/NAME.yaml with `override` merged into its scheduler block."""
    scn = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    block = {**scn.scheduler, **override}
    scn = scn.model_copy(update={"scheduler": block})
    jobs = plan_jobs(materialize(scn), scn)
    return jobs, simulate(jobs, parse_scheduler_config(block), trace=True)


def first_action_s(result: SimResult, loop: str) -> float | None:
    assert result.trace is not None
    times = [t for t, event, _, _ in result.trace if event.startswith(f"control:{loop}:")]
    return min(times) / 1e9 if times else None


def interactive_attainment(jobs: list[Job], ttft_ms: float = 300.0) -> float:
    chat = [j for j in jobs if j.slo_class == "interactive"]
    return float(np.mean([0 <= j.first_token_ns - j.arrival_ns <= ttft_ms * 1e6 for j in chat]))


# ---------------------------------------------------------------- congestion loop


def test_congestion_ladder_fires_over_q_high_and_every_job_ends_once() -> None:
    ladder = ["degrade_max_tokens", "reject_best_effort"]
    congestion = {"q_high": 40, "q_low": 10, "actions": ladder, "degrade_to": 128}
    jobs, result = run("control-both", control={"congestion": congestion})
    counts = result.control
    assert counts["congestion", "degrade_max_tokens"] >= 1
    assert counts["congestion", "reject_best_effort"] >= 1
    assert counts["congestion", "release"] >= 1
    rejected = [j for j in jobs if j.status == "rejected"]
    assert rejected and all(j.slo_class == "best-effort" and j.reject_code == 503 for j in rejected)
    assert {j.status for j in jobs} == {"finished", "rejected"}  # one end each, none lost
    assert result.trace is not None
    refused = {i for _, event, i, _ in result.trace if event == "reject"}
    assert refused == {j.id for j in rejected}
    degraded = [j for j in jobs if j.slo_class == "batch" and j.max_tokens == 128]
    assert degraded  # the docs workload asks 200-600 tokens: 128 only by degradation
    # the order is the ladder's: degrade first, then reject
    events = [e for _, e, _, _ in result.trace if e.startswith("control:congestion:")]
    assert events[:2] == [
        "control:congestion:degrade_max_tokens",
        "control:congestion:reject_best_effort",
    ]


def test_congestion_under_q_high_takes_no_action() -> None:
    jobs, result = run("control-both", control={"congestion": {"q_high": 100_000}})
    assert result.control == {}
    assert all(j.status == "finished" for j in jobs)


def test_reclaim_borrowed_stops_tier_borrowing() -> None:
    """control-borrow-cap with a 90% ceiling lets chat borrow; reclaim returns it to its quota
    once the queue passes q_high, so chat does worse than with borrowing left alone."""
    tiers = {
        "name": "tiered",
        "borrow_ratio": 0.8,
        "tiers": [
            {"name": "interactive", "quota": 0.5, "child": "dwrr"},
            {"name": "batch", "quota": 0.5, "child": "dwrr"},
        ],
    }
    free, _ = run("control-borrow-cap", policy=tiers)
    congested = {"congestion": {"q_high": 1, "q_low": 0, "actions": ["reclaim_borrowed"]}}
    reclaimed, result = run("control-borrow-cap", policy=tiers, control=congested)
    assert result.control["congestion", "reclaim_borrowed"] >= 1
    assert interactive_attainment(reclaimed) < interactive_attainment(free) - 0.1


def test_control_config_errors_name_the_field() -> None:
    bad = [
        ({"congestion": {"q_high": 0}}, "control.congestion.q_high"),
        ({"congestion": {"q_high": 5, "actions": ["shout"]}}, "control.congestion.actions[0]"),
        ({"congestion": {"q_high": 5, "q_low": 9}}, "control.congestion"),
        ({"resource": {"window": "soon"}}, "control.resource.window"),
        ({"resource": {"weight_bounds": [2, 1]}}, "control.resource"),
        ({"resource": {"slo_min": 2}}, "control.resource.slo_min"),
    ]
    for control, field in bad:
        with pytest.raises(SchedulerConfigError) as error:
            parse_scheduler_config({"control": control})
        assert len(error.value.lines) == 1 and error.value.lines[0].startswith(field)
    cfg = parse_scheduler_config({"policy": "fifo", "control": {"congestion": {"q_high": 5}}})
    assert any("reclaim_borrowed does nothing" in w for w in cfg.warnings)
    tiered = parse_scheduler_config(
        {"policy": "three-tier", "control": {"congestion": {"q_high": 5}}}
    )
    assert tiered.warnings == ()


# ---------------------------------------------------------------- resource loop


def test_resource_loop_acts_only_while_a_tenant_misses() -> None:
    generous = {"ttft": {"interactive": "60s", "batch": "600s"}, "scale_out": {}}
    _, calm = run("control-both", control={"resource": generous})
    assert calm.control == {}  # every tenant attains its (generous) targets: nothing to do
    _, result = run("control-both", control={"resource": {"scale_out": {"cooldown": "60s"}}})
    assert result.control["resource", "weight_up"] >= 1
    assert result.control["resource", "scale_out"] == 1  # one episode, inside one cool-down


def test_weights_stay_in_their_bounds() -> None:
    jobs, _ = run(
        "control-both",
        control={
            "resource": {"weight_step": 1.0, "weight_bounds": [0.5, 2.5], "interval": "100ms"}
        },
    )
    weights = {j.weight for j in jobs}
    assert max(weights) == 2.5 and min(weights) >= 0.5


# ---------------------------------------------------------------- determinism, SLIs


def test_same_seed_same_counts_and_trace() -> None:
    a_jobs, a = run("control-both")
    b_jobs, b = run("control-both")
    assert a.control == b.control and a.control
    assert a.trace == b.trace
    assert [j.status for j in a_jobs] == [j.status for j in b_jobs]


def test_server_exports_the_action_counter() -> None:
    cfg = parse_scheduler_config(
        {
            "profile": {"constant_step_ms": 1.0, "kv_cache_tokens": 10**6},
            "control": {"congestion": {"q_high": 2}},
        }
    )
    engine = Engine(cfg, keep_history=False)
    for i in range(5):
        engine.submit(Job(i, "t", "best-effort", 10, 10, 0), 0)
    engine.step(0, 0)
    metrics = SchedulerMetrics()
    metrics.refresh(engine)
    text = metrics.render().decode()
    assert (
        'scheduler_control_actions_total{action="degrade_max_tokens",loop="congestion"} 1.0' in text
    )


# ---------------------------------------------------------------- the three pitfalls


def test_pitfall_borrow_cap_70_where_traffic_needs_90() -> None:
    capped, _ = run("control-borrow-cap")  # ceiling 0.5 x 1.4 = 70%
    tiers = {
        "name": "tiered",
        "borrow_ratio": 0.8,  # ceiling 90%
        "tiers": [
            {"name": "interactive", "quota": 0.5, "child": "dwrr"},
            {"name": "batch", "quota": 0.5, "child": "dwrr"},
        ],
    }
    enough, _ = run("control-borrow-cap", policy=tiers)
    assert interactive_attainment(capped) < 0.8 < 0.9 < interactive_attainment(enough)


def test_pitfall_a_five_minute_window_reacts_late() -> None:
    _, slow = run("control-window")  # window 300 s
    resource = {"resource": {"window": "30s", "scale_out": {"cooldown": "60s"}}}
    _, fast = run("control-window", control=resource)
    t_slow, t_fast = first_action_s(slow, "resource"), first_action_s(fast, "resource")
    assert t_fast is not None and t_fast >= 180  # the burst starts at 180 s
    assert t_slow is None or t_slow > t_fast + 5


def test_pitfall_both_loops_act_on_one_episode() -> None:
    _, result = run("control-both")
    counts = result.control
    assert counts["congestion", "degrade_max_tokens"] >= 1 and counts["resource", "scale_out"] >= 1
    degrade = first_action_s(result, "congestion")
    assert result.trace is not None
    scale = min(t for t, e, _, _ in result.trace if e == "control:resource:scale_out") / 1e9
    assert degrade is not None and abs(scale - degrade) < 5  # the same burst, both loops


def test_preemption_quota_lets_a_missing_tenant_preempt_its_own_tier() -> None:
    block = {
        "profile": {"constant_step_ms": 1.0, "kv_cache_tokens": 10**6, "max_num_seqs": 1},
        "preemption": {"mode": "recompute"},
        "control": {"resource": {"preemption_quota": 1}},
    }

    def second_job_preempts(credits: int) -> bool:
        engine = Engine(parse_scheduler_config(block))
        assert engine.control is not None
        long = Job(0, "calm", "interactive", 10, 1000, 0)
        engine.submit(long, 0)
        engine.step(0, 0)  # the calm tenant's long job takes the only slot
        engine.control.credits["late"] = credits  # what a missed evaluation grants
        engine.submit(Job(1, "late", "interactive", 10, 5, 1_000_000), 1_000_000)
        engine.step(0, 1_000_000)
        return long.status == "preempted"

    assert not second_job_preempts(0)  # same tier, no grant: it waits
    assert second_job_preempts(1)
    warned = parse_scheduler_config({**block, "preemption": None})
    assert any("preemption_quota: grants nothing" in w for w in warned.warnings)


def test_a_simulated_run_reports_the_counts_in_its_target_info() -> None:
    from fairbench.targets.sim import run_sim

    scn = load_scenario(ROOT / "scenarios" / "control-both.yaml")
    rows, info = run_sim(materialize(scn), scn)
    assert info["control_actions"]["congestion/degrade_max_tokens"] >= 1
    assert len(rows) == len(materialize(scn))  # every planned request is one record
    assert sum(r["status"] == "rejected" for r in rows) >= 1
    _, off = run_sim(materialize(scn), scn.model_copy(update={"scheduler": {"policy": "dwrr"}}))
    assert "control_actions" not in off


def test_the_server_degrades_and_counts_over_http() -> None:
    """One slot, 300 ms steps: two requests wait behind the first (q_high = 2; the queue is
    read at each step's start), the ladder degrades the request that arrives next to one output
    token, and /metrics counts the action."""
    import asyncio

    import aiohttp

    from reference_scheduler.server.app import build_app
    from reference_scheduler.server.config import parse_server_config
    from tests.loopback import serve

    config = parse_server_config(
        {
            "model": "ref",
            "scheduler": {
                "policy": "fifo",
                "profile": {"constant_step_ms": 300.0, "kv_cache_tokens": 10000, "max_num_seqs": 1},
                "control": {
                    "congestion": {
                        "q_high": 2,
                        "q_low": 0,
                        "actions": ["degrade_max_tokens"],
                        "degrade_to": 1,
                        "degrade_classes": ["interactive"],
                    }
                },
            },
        }
    )

    async def go() -> tuple[list[int], str]:
        async with (
            serve(build_app(config), reference=True) as url,
            aiohttp.ClientSession() as session,
        ):

            async def one(delay: float) -> int:
                await asyncio.sleep(delay)
                body = {"prompt": "ka ke", "max_tokens": 3}
                async with session.post(url + "/v1/completions", json=body) as r:
                    assert r.status == 200
                    return (await r.json())["usage"]["completion_tokens"]

            tokens = await asyncio.gather(one(0), one(0.02), one(0.04), one(0.8))
            async with session.get(url + "/metrics") as r:
                metrics = await r.text()
        return list(tokens), metrics

    tokens, metrics = asyncio.run(go())
    assert tokens == [3, 3, 3, 1]
    assert (
        'scheduler_control_actions_total{action="degrade_max_tokens",loop="congestion"} 1.0'
        in metrics
    )
