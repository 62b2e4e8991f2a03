"""Simulation speed and policy decision cost.

1. Simulated requests per wall-second: 10 simulated minutes of a mixed chat / summary /
   embedding workload at 3,200 req/s on 80 replicas of the h100-llama3-8b profile (1.92M
   requests), one core. Target: >= 30,000 simulated requests/s. FIFO is the baseline measured
   in the same run; other policies are shown as a ratio to it.
2. Policy decision cost vs queue depth (10^2 … 10^6 waiting jobs): one enqueue + one dequeue at
   a steady depth, µs per decision. DWRR should stay flat, WFQ grow logarithmically.

    python benchmarks/bench_sim.py [--minutes 10] [--policies fifo,dwrr,vtc] [--depth-max 1000000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import finish, show, verdict

from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.policies import build_policy
from reference_scheduler.scheduler.config import parse_scheduler_config

CLASSES = ("interactive", "batch", "best-effort")


def workload(rate: float, seconds: float, seed: int = 1) -> list[Job]:
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    t = np.cumsum(rng.exponential(1 / rate, n)) * 1e9
    kind = rng.choice(3, size=n, p=[0.8, 0.1, 0.1])
    chat_in = np.clip(rng.lognormal(np.log(80), 0.8, n), 8, 2000).astype(int)
    chat_out = np.clip(rng.lognormal(np.log(150), 0.6, n), 1, 1000).astype(int)
    doc_in = np.clip(rng.normal(4000, 500, n), 1000, 8000).astype(int)
    emb_in = rng.integers(64, 512, n)
    prompt = np.where(kind == 0, chat_in, np.where(kind == 1, doc_in, emb_in))
    output = np.where(kind == 0, chat_out, np.where(kind == 1, 200, 0))
    tenant = rng.integers(0, 8, n)
    return [
        Job(
            i,
            f"t{tenant[i]}",
            CLASSES[kind[i]],
            int(prompt[i]),
            int(output[i]),
            int(t[i]),
            priority=int(kind[i]),
        )
        for i in range(n)
    ]


def sim_speed(policies: list[str], minutes: float, replicas: int, rate: float) -> None:
    rows = []
    base = None
    for name in policies:
        jobs = workload(rate, minutes * 60)
        cfg = parse_scheduler_config(
            {"policy": name, "profile": "h100-llama3-8b", "replicas": replicas}
        )
        start = time.perf_counter()
        result = simulate(jobs, cfg)
        wall = time.perf_counter() - start
        speed = len(jobs) / wall
        base = base or speed
        ttft = (result.column("first_token_ns") - result.column("arrival_ns")) / 1e6
        rows.append(
            [
                name,
                f"{len(jobs):,}",
                f"{result.steps:,}",
                f"{wall:.1f}",
                f"{speed:,.0f}",
                f"{speed / base:.2f}",
                f"{np.percentile(ttft, 50):.0f} / {np.percentile(ttft, 99):.0f}",
            ]
        )
        if name == policies[0]:
            verdict(speed >= 30_000, f"{name}: {speed:,.0f} simulated requests/s (target 30,000)")
    show(
        f"{minutes:g} simulated min, {rate:,.0f} req/s, {replicas} replicas of h100-llama3-8b",
        ["policy", "requests", "steps", "wall s", "sim req/s", "ratio to first", "TTFT p50/p99 ms"],
        rows,
    )


def decision_cost(policies: list[str], depths: list[int]) -> None:
    rng = np.random.default_rng(2)
    rows = []
    for name in policies:
        row = [name]
        base = None
        for depth in depths:
            policy = build_policy(name)
            policy.bind(1 << 30)
            seq = 0
            for _ in range(depth):
                job = Job(
                    seq,
                    f"t{seq % 16}",
                    CLASSES[seq % 3],
                    int(rng.integers(10, 4000)),
                    int(rng.integers(0, 500)),
                    seq,
                    seq=seq,
                    priority=seq % 3,
                )
                policy.enqueue(job, seq)
                seq += 1
            ops = 20_000
            pre = [
                Job(
                    seq + k,
                    f"t{(seq + k) % 16}",
                    CLASSES[k % 3],
                    500,
                    100,
                    seq + k,
                    seq=seq + k,
                    priority=k % 3,
                )
                for k in range(ops)
            ]
            start = time.perf_counter()
            for k, job in enumerate(pre):
                policy.enqueue(job, seq + k)
                got = policy.dequeue(seq + k)
                policy.release(got, seq + k)
            per = (time.perf_counter() - start) / ops * 1e6
            base = base or per
            row.append(f"{per:.2f} ({per / base:.1f}x)")
        rows.append(row)
    show(
        "policy decision cost: µs per enqueue+dequeue at steady depth (ratio to smallest depth)",
        ["policy", *[f"{d:,}" for d in depths]],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--replicas", type=int, default=80)
    parser.add_argument("--rate", type=float, default=3200.0)
    parser.add_argument("--policies", default="fifo,dwrr,vtc")
    parser.add_argument("--depth-max", type=int, default=1_000_000)
    parser.add_argument("--skip-sim", action="store_true")
    args = parser.parse_args()
    if not args.skip_sim:
        sim_speed(args.policies.split(","), args.minutes, args.replicas, args.rate)
    depths = [d for d in (100, 1_000, 10_000, 100_000, 1_000_000) if d <= args.depth_max]
    decision_cost(["fifo", "dwrr", "wfq", "vtc", "sfq", "three-tier"], depths)
    finish()


if __name__ == "__main__":
    main()
