"""The real-time driver's wait: never before a step's end, and its timer threads go with it.

How close after the end it returns depends on the machine (benchmarks/bench_server.py measures
the step lag); what must hold anywhere is that it is never early and that stopping leaves no
timer behind.
"""

from __future__ import annotations

import asyncio
import time

from reference_scheduler.drivers.realtime import COARSE_NS, SPIN_NS, RealtimeDriver
from reference_scheduler.scheduler.config import parse_scheduler_config


class NoMetrics:
    """The driver's metrics hooks, unused here."""

    cancelled = None

    def rejected(self, code: int) -> None: ...
    def queue_depth(self, depth: int) -> None: ...
    def step(self, res: object, lag_ns: int, policy: object) -> None: ...
    def admitted(self, job: object) -> None: ...
    def finished(self, job: object) -> None: ...


async def test_the_wait_never_returns_before_its_due_time() -> None:
    driver = RealtimeDriver(parse_scheduler_config({"policy": "fifo", "replicas": 2}), NoMetrics())
    # due times inside each stage of the wait: spun only, thread then spin, loop then thread
    for ahead_ns in (0, SPIN_NS // 2, SPIN_NS + 200_000, COARSE_NS + 3_000_000, -1_000_000):
        due = time.perf_counter_ns() + ahead_ns
        await driver._until(due)
        assert time.perf_counter_ns() >= due, ahead_ns
    # two replicas wait at once, each on its own timer thread
    due = time.perf_counter_ns() + 2_000_000
    await asyncio.gather(driver._until(due), driver._until(due + 500_000))
    assert time.perf_counter_ns() >= due + 500_000
    await driver.stop()
    assert driver._timer._shutdown
