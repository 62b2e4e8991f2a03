"""Defaults relative to the engine pool, and the warning when a setting makes a policy degenerate.

An engine of one batch slot and a constant 10 ms step serves 100 tokens/s. WFQ's rate is its
fluid reference server's speed: derived from that pool it interleaves tenants as GPS would; the
old fixed 20,000 tokens/s is 200× too fast, so virtual time outruns service and WFQ orders by
arrival (FIFO). DWRR costed in requests serves one request a turn by default, not 1,024.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fairbench.pipeline import run_scenario
from fairbench.plan.materialize import materialize
from fairbench.run.rundir import RunOptions
from fairbench.targets.sim import run_sim
from fairbench.workload.loading import parse_scenario
from fairbench.workload.models import Scenario
from reference_scheduler.core.job import Job
from reference_scheduler.policies import build_policy, policy_factory, pool_of
from reference_scheduler.policies.dwrr import Dwrr
from reference_scheduler.policies.fifo import Fifo
from reference_scheduler.scheduler.config import parse_scheduler_config

SLOW = {"name": "slow", "constant_step_ms": 10.0, "kv_cache_tokens": 100000, "max_num_seqs": 1}
PROMPT, OUTPUT = 4, 20  # cost 24 tokens, 0.2 s of service


def overload(policy: Any) -> Scenario:
    """A flood at 8/s and a polite tenant at ~1/s on a pool that serves 5 requests/s."""
    return parse_scenario(
        {
            "name": "wfq-vs-fifo",
            "workloads": {
                "w": {"endpoint": "chat", "prompt_tokens": PROMPT, "output_tokens": OUTPUT}
            },
            "tenants": [
                {"id": "flood", "mix": "w", "arrival": {"process": "constant", "rate": "8/s"}},
                {"id": "polite", "mix": "w", "arrival": {"process": "constant", "rate": "0.9/s"}},
            ],
            "run": {"duration": "10s", "seed": 2},
            "target": {"kind": "sim"},
            "scheduler": {"policy": policy, "profile": SLOW},
        }
    )


def polite_latency_s(policy: Any) -> np.ndarray:
    scn = overload(policy)
    rows, _ = run_sim(materialize(scn), scn)
    assert {r["status"] for r in rows} == {"ok"}
    return np.array(
        [(r["t_done_ns"] - r["t_intended_ns"]) / 1e9 for r in rows if r["tenant"] == "polite"]
    )


def test_the_pool_gives_the_rate() -> None:
    config = parse_scheduler_config({"policy": "wfq", "profile": SLOW, "replicas": 3})
    assert pool_of(config.profile, 3).tokens_per_s == 300.0
    assert config.policy_factory().rate_per_ns * 1e9 == 300.0  # type: ignore[attr-defined]
    assert config.warnings == ()
    # the shipped H100 profile keeps a rate of the old default's order (it was chosen for it)
    h100 = parse_scheduler_config({"policy": "wfq"}).policy_factory()
    assert 10_000 < h100.rate_per_ns * 1e9 < 40_000  # type: ignore[attr-defined]


def test_wfq_with_the_derived_rate_protects_the_polite_tenant_fifo_does_not() -> None:
    fifo = polite_latency_s("fifo")
    wfq = polite_latency_s("wfq")
    stale = polite_latency_s({"name": "wfq", "rate": 20000})
    # Parekh–Gallager: a polite job departs by its GPS finish (its cost at half the rate, both
    # tenants backlogged) plus one largest job at the full rate, plus the step it waits for.
    rate = 100.0
    cost = PROMPT + OUTPUT
    bound = cost / (rate / 2) + cost / rate + OUTPUT * 0.01
    assert wfq.max() <= bound
    # FIFO: the polite tenant queues behind the flood's ever-growing backlog
    assert fifo.max() > 5 * bound and np.median(fifo) > 5 * np.median(wfq)
    # the stale 20,000 tokens/s makes WFQ behave as FIFO
    assert np.median(stale) > 5 * np.median(wfq)
    assert stale.max() > 5 * bound


def test_a_degenerate_rate_is_warned_about_in_the_run(tmp_path: Path) -> None:
    config = parse_scheduler_config({"policy": {"name": "wfq", "rate": 20000}, "profile": SLOW})
    assert len(config.warnings) == 1
    line = config.warnings[0]
    assert line.startswith("scheduler.policy.rate: ") and "200×" in line and "FIFO" in line
    outcome = run_scenario(
        overload({"name": "wfq", "rate": 20000}), RunOptions(out=tmp_path / "run", progress=False)
    )
    assert outcome.summary["warnings"] == [line]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    header = json.loads((tmp_path / "run" / "run.json").read_text())
    assert summary["warnings"] == [line] and header["target"]["warnings"] == [line]
    # a rate far below the pool's is degenerate the other way
    slow = parse_scheduler_config({"policy": {"name": "wfq", "rate": 5}, "profile": SLOW})
    assert "never forget" in slow.warnings[0]
    # and a derived rate, or one near the pool's, says nothing
    assert parse_scheduler_config({"policy": "dwrr-wfq", "profile": SLOW}).warnings == ()
    near = {"name": "wfq", "rate": 150}
    assert parse_scheduler_config({"policy": near, "profile": SLOW}).warnings == ()


def jobs_of(tenants: str) -> list[Job]:
    return [Job(i, t, "interactive", 10, 10, i) for i, t in enumerate(tenants)]


def order(policy: Any, tenants: str) -> str:
    for job in jobs_of(tenants):
        job.seq = job.id
        policy.enqueue(job, 0)
    out = []
    while len(policy):
        out.append(policy.dequeue(0).tenant)
    return "".join(out)


def test_dwrr_costed_in_requests_round_robins_by_default() -> None:
    assert Dwrr(Fifo, cost="requests").quantum == 1.0
    assert Dwrr(Fifo).quantum == 1024.0  # in tokens, unchanged
    assert order(build_policy({"name": "dwrr", "cost": "requests"}), "AAAABBBB") == "ABABABAB"
    exhaustive = {"name": "dwrr", "cost": "requests", "quantum": 1024}
    assert order(build_policy(exhaustive), "AAAABBBB") == "AAAABBBB"
    warnings: list[str] = []
    pool = pool_of(parse_scheduler_config({"profile": SLOW}).profile, 2)
    policy_factory(exhaustive, pool=pool, warnings=warnings)
    assert len(warnings) == 1 and "exhaustive polling" in warnings[0]
    assert warnings[0].startswith("policy.quantum: ")
    # sfq shares the rule, a child position included
    nested = {
        "name": "tiered",
        "tiers": [
            {
                "name": "interactive",
                "quota": 1,
                "child": {"name": "sfq", "cost": "requests", "quantum": 64},
            }
        ],
    }
    warnings.clear()
    policy_factory(nested, pool=pool, warnings=warnings)
    assert len(warnings) == 1 and warnings[0].startswith("policy.tiers[0].child.quantum: ")
