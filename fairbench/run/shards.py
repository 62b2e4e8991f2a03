"""A run split across generator processes: one shard of the plan each, one shared t0.

The parent starts `n` spawned workers, each loading the plan and warming its connections; when
all are ready (or one died, whose requests then show up as missing), it sets t0 once in shared
memory, so every shard's schedule is on the same CLOCK_MONOTONIC timeline.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fairbench.plan.model import Plan, load_plan
from fairbench.run.executor import ExecOptions, LiveCounters
from fairbench.run.live import Progress, live, uvloop_run
from fairbench.run.scrape import ScraperProcess
from fairbench.targets.factory import metrics_url
from fairbench.workload.loading import parse_scenario
from fairbench.workload.models import Scenario

PER_WORKER_RATE = 800.0  # req/s one generator process keeps with margin (see benchmarks)


def default_workers(plan: Plan) -> int:
    """Enough generator processes for the plan's busiest second, no more than the cores."""
    if len(plan) < 2:
        return 1
    seconds = plan.columns["offset_ns"] // 1_000_000_000
    peak = int(np.bincount(seconds).max())
    return max(1, min(os.cpu_count() or 1, math.ceil(peak / PER_WORKER_RATE)))


def worker_main(args: dict[str, Any], shared: Any) -> None:
    """One generator process: its shard of the plan, its own journal, the shared t0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into SIGTERM
    plan = load_plan(args["plan"])
    scn = parse_scenario(args["scenario"])
    k, n = args["worker"], args["workers"]
    indices = np.arange(k, len(plan), n)

    def progress(c: LiveCounters) -> None:
        shared[4 * k : 4 * k + 4] = [c.sent, c.done, c.errors, c.last_lag_ns]

    async def t0_source() -> int:
        shared[4 * n + k] = 1  # this shard is loaded, connected and warm
        while not shared[5 * n]:
            await asyncio.sleep(0.005)
        return int(shared[5 * n])

    exec_options = ExecOptions(**args["exec"])
    if n > len(os.sched_getaffinity(0)):
        exec_options.spin_s = 0.0  # spinners sharing a core only slow each other down
    result, _ = uvloop_run(
        live(
            plan,
            scn,
            Path(args["journal"]),
            exec_options,
            indices,
            k,
            t0_source,
            args["base_url"],
            progress,
            None,
            args["tenant_keys"],
            args["setup"],
        )
    )
    np.save(args["lags"], result.loop_lag_ns)


@dataclass
class Shards:
    """One plan split into `n` shards, as every way of running them needs it: generator
    processes here (`run_sharded`) or Ray actors (`ray_shards.run_ray`). Shard k sends requests
    k, k+n, ... of the plan (`worker_main`), journals into run_dir, and shares the one t0."""

    tenant_keys: dict[str, str] | None
    plan_path: Path
    plan: Plan
    scn: Scenario
    run_dir: Path
    n: int
    exec_options: ExecOptions
    base_url: str | None
    progress: Progress | None
    setup: dict[str, Any] | None = None

    def worker_args(self, k: int) -> dict[str, Any]:
        """What `worker_main` of shard k reads, besides where its files go on its node."""
        return {
            "scenario": self.scn.model_dump(mode="json"),
            "worker": k,
            "workers": self.n,
            "exec": dict(self.exec_options.__dict__),
            "base_url": self.base_url,
            "tenant_keys": self.tenant_keys,
            "setup": self.setup,
        }

    def scraper(self) -> ScraperProcess | None:
        """The one scraper of the target's /metrics (none where the target has none)."""
        url = metrics_url(self.scn, self.base_url)
        if not url:
            return None
        path = self.run_dir / "server_metrics.parquet"
        return ScraperProcess(url, path, self.scn.target.scrape_interval)


def run_sharded(shards: Shards) -> tuple[bool, np.ndarray, int]:
    """The shards as spawned generator processes on this machine; (stopped, the loop lags of
    every shard, t0)."""
    n, run_dir, exec_options = shards.n, shards.run_dir, shards.exec_options
    ctx = mp.get_context("spawn")
    # Per shard: sent, done, errors, last lag (4n); then a ready flag per shard (n); then t0.
    shared = ctx.Array("q", 5 * n + 1, lock=False)
    t0 = 0
    scraper = shards.scraper()
    procs = []
    for k in range(n):
        args = {
            **shards.worker_args(k),
            "plan": str(shards.plan_path),
            "journal": str(run_dir / f"journal-{k}.jsonl"),
            "lags": str(run_dir / f".loop-lag-{k}.npy"),
        }
        proc = ctx.Process(target=worker_main, args=(args, shared), daemon=True)
        proc.start()
        procs.append(proc)
    stopped = False
    counters = LiveCounters(planned=len(shards.plan))
    try:
        while any(p.is_alive() for p in procs):
            ready = all(shared[4 * n + k] for k in range(n))
            if not t0 and (ready or not all(p.is_alive() for p in procs)):
                # Every shard has loaded its plan and warmed its connections (or one died, and
                # the rest must not wait forever: its requests will show up as missing).
                if scraper is not None:
                    scraper.wait_ready()  # its baseline scrape must come before t0
                t0 = time.perf_counter_ns() + int(exec_options.lead_s * 1e9)
                shared[5 * n] = t0
                if scraper is not None:
                    scraper.start(t0)
            try:
                time.sleep(0.2)
            except KeyboardInterrupt:
                stopped = True
                for p in procs:
                    if p.is_alive() and p.pid:
                        os.kill(p.pid, signal.SIGTERM)
            values = list(shared[: 4 * n])
            counters.sent = sum(values[0::4])
            counters.done = sum(values[1::4])
            counters.errors = sum(values[2::4])
            counters.last_lag_ns = max(values[3::4]) if values else 0
            if shards.progress is not None:
                shards.progress(counters)
    finally:
        for p in procs:
            p.join()
        if scraper is not None:
            scraper.stop_sync(t0)
    lags = [
        np.load(run_dir / f".loop-lag-{k}.npy")
        for k in range(n)
        if (run_dir / f".loop-lag-{k}.npy").exists()
    ]
    for k in range(n):
        (run_dir / f".loop-lag-{k}.npy").unlink(missing_ok=True)
    return stopped, np.concatenate(lags) if lags else np.empty(0, dtype=np.int64), t0
