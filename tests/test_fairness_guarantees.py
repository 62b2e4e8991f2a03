"""Each policy's documented guarantee, checked against an independent ground truth."""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.policies.dwrr import Dwrr
from reference_scheduler.policies.fifo import Fifo
from reference_scheduler.policies.wfq import Wfq
from reference_scheduler.scheduler.config import parse_scheduler_config
from reference_scheduler.scheduler.engine import Engine

# ---------------------------------------------------------------- DRR


@settings(max_examples=80, deadline=None)
@given(
    quantum=st.integers(50, 3000),
    weights=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
    costs=st.lists(st.integers(1, 2000), min_size=30, max_size=90),
    seed=st.integers(0, 10**6),
)
def test_dwrr_service_gap_bound_and_deficit_invariant(
    quantum: int, weights: tuple[int, int, int], costs: list[int], seed: int
) -> None:
    """|S_i/w_i − S_j/w_j| ≤ 3q + Max/w_i + Max/w_j while both stay backlogged (dwrr.py)."""
    rng = np.random.default_rng(seed)
    policy = Dwrr(child=Fifo, quantum=quantum)
    jobs = []
    for i, cost in enumerate(costs):
        tenant = int(rng.integers(0, 3))
        job = Job(i, f"t{tenant}", "batch", cost, 0, 0, weight=weights[tenant], seq=i)
        jobs.append(job)
        policy.enqueue(job, 0)
    max_cost = max(costs)
    remaining = defaultdict(int)
    for job in jobs:
        remaining[job.tenant] += 1
    served = defaultdict(float)
    history = []  # normalized service per tenant after each dequeue, while all backlogged
    for _ in jobs:
        job = policy.dequeue(0)
        assert job is not None
        served[job.tenant] += job.cost
        remaining[job.tenant] -= 1
        if remaining[job.tenant] == 0:
            assert policy.deficit(job.tenant) == 0.0  # an emptied class forgets its deficit
            break
        history.append({t: served[t] / weights[int(t[1])] for t in ("t0", "t1", "t2")})
    assert 0 <= policy.max_turn_end_deficit < max_cost
    tenants = [t for t in ("t0", "t1", "t2") if any(j.tenant == t for j in jobs)]
    for a in tenants:
        for b in tenants:
            if a >= b or not history:
                continue
            gap = [h[a] - h[b] for h in history]
            wa, wb = weights[int(a[1])], weights[int(b[1])]
            bound = 3 * quantum + max_cost / wa + max_cost / wb
            # the interval can start at 0 (nothing served yet)
            assert max([0.0, *gap]) - min([0.0, *gap]) <= bound + 1e-9


# ---------------------------------------------------------------- WFQ vs GPS


def gps_finish_times(
    arrivals: list[tuple[float, str, float, int]], weights: dict[str, float], rate: float
) -> dict[int, float]:
    """Fluid GPS, event by event: backlogged flows share `rate` in proportion to weight."""
    pending = deque(sorted(arrivals))
    queues: dict[str, deque[list[float]]] = defaultdict(deque)  # [remaining work, id]
    now = 0.0
    done: dict[int, float] = {}
    while pending or any(queues.values()):
        active = [f for f, q in queues.items() if q]
        if not active:
            now = max(now, pending[0][0])
        else:
            total_w = sum(weights[f] for f in active)
            # time for each active flow's head job to finish at its current share
            t_head = min(queues[f][0][0] * total_w / (weights[f] * rate) for f in active)
            t_next_arrival = pending[0][0] - now if pending else float("inf")
            dt = min(t_head, t_next_arrival)
            for f in active:
                queues[f][0][0] -= dt * rate * weights[f] / total_w
            now += dt
            for f in active:
                if queues[f][0][0] <= 1e-9:
                    done[int(queues[f][0][1])] = now
                    queues[f].popleft()
        while pending and pending[0][0] <= now + 1e-12:
            _, flow, work, jid = pending.popleft()
            queues[flow].append([work, jid])
    return done


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(5, 60))
def test_wfq_departures_within_one_max_job_of_gps(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    rate = 1000.0  # tokens per second
    weights = {"a": 1.0, "b": 2.0, "c": 3.0}
    arrivals = []
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(0.3))
        flow = "abc"[int(rng.integers(0, 3))]
        arrivals.append((t, flow, float(rng.integers(1, 400)), i))
    l_max = max(a[2] for a in arrivals)
    gps = gps_finish_times(arrivals, weights, rate)
    policy = Wfq(rate=rate, cost="prompt")
    jobs = {
        i: Job(i, f, "batch", int(work), 0, int(at * 1e9), weight=weights[f], seq=i)
        for at, f, work, i in arrivals
    }
    queue = deque(sorted(arrivals))
    free_at = 0.0
    departures: dict[int, float] = {}
    while queue or len(policy):
        if not len(policy) or (queue and queue[0][0] <= free_at):
            at, _, _, i = queue.popleft()
            policy.enqueue(jobs[i], int(at * 1e9))
            continue
        start = free_at
        if queue and not len(policy):
            continue
        job = policy.dequeue(int(start * 1e9))
        assert job is not None
        free_at = start + job.prompt_tokens / rate
        departures[job.id] = free_at
        if queue and queue[0][0] > free_at and not len(policy):
            free_at = queue[0][0]
    for i, t_dep in departures.items():
        assert t_dep <= gps[i] + l_max / rate + 1e-6, (i, t_dep, gps[i])


# ---------------------------------------------------------------- VTC


def backlogged_run(
    policy: str, tenants: dict[str, float], jobs_each: int, profile: str = "a10g-llama2-7b"
) -> tuple[Engine, list[dict[str, float]]]:
    """Every tenant's jobs submitted at t=0; step one replica, recording VTC counters."""
    engine = Engine(parse_scheduler_config({"policy": policy, "profile": profile}))
    i = 0
    for _ in range(jobs_each):
        for name, weight in tenants.items():
            engine.submit(Job(i, name, "batch", 256, 256, 0, weight=weight), 0)
            i += 1
    now = 0
    history = []
    while True:
        res = engine.step(0, now)
        if res is None:
            break
        now = res.end_ns
        if all(len(q) for q in engine.policy._queues.values()):  # type: ignore[attr-defined]
            history.append(dict(engine.policy.counters))  # type: ignore[attr-defined]
    return engine, history


def test_vtc_counter_gap_bound_between_backlogged_tenants() -> None:
    _, history = backlogged_run("vtc", {"a": 1.0, "b": 1.0, "c": 1.0}, 150)
    assert len(history) > 100
    bound = 2 * max(1.0 * 256, 2.0 * 10_000)  # 2·max(w_in·L_input, w_out·M), M = KV tokens
    gap = max(max(h.values()) - min(h.values()) for h in history)
    assert gap <= bound


def service_until_first_drains(result: object, jobs: list[Job]) -> dict[str, float]:
    """Weighted tokens (1·input + 2·output) each tenant received before any queue drained."""
    last_admit: dict[str, int] = defaultdict(int)
    for job in jobs:
        last_admit[job.tenant] = max(last_admit[job.tenant], job.admit_ns)
    horizon = min(last_admit.values())
    service: dict[str, float] = defaultdict(float)
    for job in jobs:
        if 0 <= job.admit_ns <= horizon:
            service[job.tenant] += job.prompt_tokens
        times = result.token_times(job)  # type: ignore[attr-defined]
        service[job.tenant] += 2.0 * int((times <= horizon).sum())
    return service


@pytest.mark.parametrize(
    "policy",
    # DWRR's shares are exact per round; its quantum (here one max job) sets the granularity.
    ["vtc", {"name": "dwrr", "quantum": 512}],
    ids=["vtc", "dwrr"],
)
def test_weights_1_2_3_4_give_service_1_2_3_4(policy: object) -> None:
    weights = {"w1": 1.0, "w2": 2.0, "w3": 3.0, "w4": 4.0}
    jobs = []
    for k in range(900):
        for name, w in weights.items():
            jobs.append(Job(len(jobs), name, "batch", 256, 256, k * 1000, weight=w))
    cfg = parse_scheduler_config({"policy": policy, "profile": "a10g-llama2-7b"})
    result = simulate(jobs, cfg)
    service = service_until_first_drains(result, jobs)
    base = service["w1"]
    for name, w in weights.items():
        assert service[name] / base == pytest.approx(w, rel=0.03), (name, service)


def test_vtc_lift_stops_banked_credit_but_lcf_does_not() -> None:
    """A tenant idle while another was served must not then monopolize the engine."""
    outcomes = {}
    for policy in ("vtc", "lcf"):
        jobs = [Job(i, "busy", "batch", 256, 64, 0) for i in range(400)]
        jobs += [Job(400 + i, "late", "batch", 256, 64, 10_000_000_000) for i in range(400)]
        cfg = parse_scheduler_config({"policy": policy, "profile": "a10g-llama2-7b"})
        simulate(jobs, cfg)
        late_start = 10_000_000_000  # "busy" is still backlogged then
        busy_after = [j for j in jobs[:400] if j.admit_ns >= late_start]
        late = jobs[400:]
        window_end = late_start + 5_000_000_000
        outcomes[policy] = (
            sum(1 for j in busy_after if j.admit_ns < window_end),
            sum(1 for j in late if j.admit_ns < window_end),
        )
    busy_vtc, late_vtc = outcomes["vtc"]
    busy_lcf, late_lcf = outcomes["lcf"]
    assert busy_lcf == 0 and late_lcf > 0  # LCF: the late tenant's low counter shuts busy out
    assert busy_vtc > 0.3 * (busy_vtc + late_vtc)  # VTC: the two share the engine


# ---------------------------------------------------------------- tiers


def tier_config(tiers: list[tuple[str, float]], borrow: float) -> object:
    return parse_scheduler_config(
        {
            "policy": {
                "name": "tiered",
                "borrow_ratio": borrow,
                "tiers": [{"name": n, "quota": q} for n, q in tiers],
            },
            "profile": {"constant_step_ms": 10.0, "kv_cache_tokens": 10**9, "max_num_seqs": 40},
        }
    )


def test_saturated_tiers_get_their_quotas() -> None:
    """Without borrowing, floors, quotas and ceilings coincide (with borrowing a more urgent
    tier compresses the busy ones below it: tests/test_tiered_semantics.py)."""
    tiers = [("interactive", 0.3), ("batch", 0.5), ("best-effort", 0.2)]
    jobs = []
    for k in range(800):
        for name, _ in tiers:
            jobs.append(Job(len(jobs), f"{name}-tenant", name, 1, 20, k))
    result = simulate(jobs, tier_config(tiers, 0.0))
    service = service_until_first_drains(result, jobs)
    total = sum(service.values())
    for name, quota in tiers:
        assert service[f"{name}-tenant"] / total == pytest.approx(quota, rel=0.03)


@pytest.mark.parametrize(("quota", "borrow"), [(0.3, 0.5), (0.3, 0.0), (0.6, 1.0)])
def test_a_lone_tier_caps_at_its_ceiling(quota: float, borrow: float) -> None:
    tiers = [("interactive", quota), ("batch", 1.0 - quota)]
    jobs = [Job(i, "solo", "interactive", 1, 20, 0) for i in range(2000)]
    result = simulate(jobs, tier_config(tiers, borrow))
    busy_s = (result.end_ns - 0) / 1e9
    # A full pool of 40 slots finishes 40 jobs of 20 steps (0.2 s) every 0.2 s: 200 jobs/s.
    throughput = len(jobs) / busy_s
    ceiling = min(1.0, quota * (1 + borrow))
    assert throughput / 200.0 == pytest.approx(ceiling, rel=0.03)


# ---------------------------------------------------------------- presets run end to end


@pytest.mark.parametrize("preset", ["dwrr-wfq", "htb-sfq", "three-tier"])
def test_presets_simulate(preset: str) -> None:
    rng = np.random.default_rng(3)
    jobs = [
        Job(
            i,
            f"t{i % 4}",
            ["interactive", "batch", "best-effort"][i % 3],
            int(rng.integers(10, 2000)),
            int(rng.integers(0, 300)),
            i * 5_000_000,
            flow=f"w{i % 2}",
        )
        for i in range(3000)
    ]
    simulate(jobs, parse_scheduler_config({"policy": preset}))
    assert all(j.status == "finished" for j in jobs)


def test_gps_helper_two_flows() -> None:
    """The fluid reference itself, on a case worked by hand: flows a (w=1) and b (w=3) each send
    one 300-token job at t=0 on a 100 tokens/s server: b gets 75/s and ends at 4 s having used
    300; a got 25/s, so it has 200 left at 4 s and then alone at 100/s ends at 6 s."""
    done = gps_finish_times([(0.0, "a", 300.0, 0), (0.0, "b", 300.0, 1)], {"a": 1, "b": 3}, 100)
    assert done[1] == pytest.approx(4.0) and done[0] == pytest.approx(6.0)
