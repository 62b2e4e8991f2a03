"""One generator process executing (its share of) a plan against a live target.

It opens the target, warms its connections, starts the Prometheus scraper, takes t0 (or waits
for the parent's, as a shard), runs the executor, and turns SIGINT/SIGTERM into a graceful stop
(a second signal drops the grace period). Everything it measures goes to its journal.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from fairbench.plan.model import Plan
from fairbench.run.exec_types import Progress
from fairbench.run.executor import ExecOptions, ExecResult, Executor
from fairbench.run.records import JournalWriter
from fairbench.run.scrape import ScraperProcess
from fairbench.targets.factory import make_target, metrics_url
from fairbench.workload.models import Scenario


async def live(
    plan: Plan,
    scn: Scenario,
    journal: Path,
    exec_options: ExecOptions,
    indices: np.ndarray | None,
    worker: int,
    t0_source: Callable[[], Awaitable[int]] | None,
    base_url: str | None,
    progress: Progress | None,
    run_dir: Path | None,
    tenant_keys: dict[str, str] | None = None,
    setup: dict[str, Any] | None = None,
) -> tuple[ExecResult, dict[str, Any]]:
    target = make_target(scn, base_url, tenant_keys, setup)
    await target.open()
    writer = JournalWriter(journal)
    executor = Executor(plan, target, writer, exec_options, indices, worker)
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    hits = {"n": 0}

    def on_signal() -> None:
        hits["n"] += 1
        executor.stop.set()
        if hits["n"] > 1:
            executor.options.grace_s = 0.0

    for sig in signals:
        loop.add_signal_handler(sig, on_signal)
    scraper = None
    t0 = 0
    ticker = None
    # the target knows its URL once open (the reference target starts its own server)
    url = metrics_url(scn, getattr(target, "base_url", None)) if run_dir is not None else None
    if url and run_dir is not None:  # launched now: its interpreter starts during warm-up
        scraper = ScraperProcess(
            url, run_dir / "server_metrics.parquet", scn.target.scrape_interval
        )
    try:
        warm = getattr(target, "warm", None)
        if warm is not None:  # connections open before t0, not on the first requests' clock
            await warm(executor.warm_connections())
        if scraper is not None:
            await asyncio.to_thread(scraper.wait_ready)
        if t0_source is not None:  # a shard: the parent sets t0 once every shard is ready
            t0 = await t0_source()
        else:
            t0 = time.perf_counter_ns() + int(exec_options.lead_s * 1e9)
        if scraper is not None:
            scraper.start(t0)
        if progress is not None:

            async def tick() -> None:
                while True:
                    progress(executor.counters)
                    await asyncio.sleep(0.2)

            ticker = asyncio.create_task(tick())
        result = await executor.run(t0)
        if progress is not None:
            progress(executor.counters)
    finally:
        if ticker is not None:
            ticker.cancel()
        if scraper is not None:
            await scraper.stop(t0)
        for sig in signals:
            loop.remove_signal_handler(sig)
        writer.close()
        info = dict(target.info())
        await target.close()
    return result, info


def uvloop_run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        return asyncio.run(coro)
