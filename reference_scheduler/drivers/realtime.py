"""The real-time driver: the simulator's engine, stepped on the wall clock.

The same engine as the virtual-time driver; only the step that sleeps differs (SimPy's rt.py
idea). Each replica runs a loop: ask the engine for a step at `now`, sleep until the step's
absolute end time, then deliver its events to the waiting streams. Event-loop timers are
millisecond-grained, so the wait is coarse on the loop, then fine in a thread (`nanosleep` is
microsecond-grained and burns no CPU; the loop serves I/O meanwhile), then a short spin. The
fine stretch used to be spun whole: 1.2 ms of busy CPU per ~7 ms step, a sixth of a core taken
from the load generator that shares the machine with the embedded server, and no more punctual
for it on a busy machine, where the kernel preempts the spinner (issue #15, the quickstart on a
loaded 2-core machine, 10 runs each: server CPU 5.4-7.4 s spun vs 3.4-4.2 s; steps within 1 ms
of their end 86% vs 90%). The next step
starts at the previous step's end on the engine's timeline; when the event loop wakes late, the
lateness is measured (`scheduler_step_lag_seconds`) and the next step starts at the real time
instead, so a driver that falls behind says so rather than silently compressing time.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from reference_scheduler.core.job import Job
from reference_scheduler.scheduler.config import SchedulerConfig, SchedulerConfigError
from reference_scheduler.scheduler.engine import Engine, StepResult

COARSE_NS = 1_200_000  # the event loop's timer sleeps until this close to a step's end,
SPIN_NS = 300_000  # a thread until this close, and the rest is spun (yielding to I/O)


class Stream:
    """What one request's handler waits on: token counts, then a final status."""

    __slots__ = ("event", "finished", "job", "tokens")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.tokens = 0  # delivered, not yet taken by the handler
        self.finished = False
        self.event = asyncio.Event()

    def push(self, n: int, finished: bool) -> None:
        self.tokens += n
        self.finished = self.finished or finished
        self.event.set()

    async def take(self) -> tuple[int, bool]:
        while not self.tokens and not self.finished:
            self.event.clear()
            await self.event.wait()
        n, self.tokens = self.tokens, 0
        return n, self.finished


class DriverMetrics(Protocol):
    """What the driver reports as it steps (the server's Prometheus SLIs implement it)."""

    cancelled: Any  # a counter: .inc()

    def rejected(self, code: int) -> None: ...
    def queue_depth(self, depth: int) -> None: ...
    def step(self, res: StepResult, lag_ns: int, policy: Any) -> None: ...
    def admitted(self, job: Job) -> None: ...
    def finished(self, job: Job) -> None: ...


class RealtimeDriver:
    """Steps every replica of one engine on the wall clock; handlers wait on `Stream`s."""

    def __init__(
        self,
        scheduler: SchedulerConfig,
        metrics: DriverMetrics,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        if scheduler.engine != "reference":  # the vLLM model is for virtual time only
            raise SchedulerConfigError(
                ["scheduler.engine: 'vllm' is simulated only (target: sim); use a real vLLM"]
            )
        self.engine = Engine(scheduler, keep_history=False)
        self.metrics = metrics
        self.clock = clock
        self.base = clock()
        self.streams: dict[int, Stream] = {}
        self.wake = [asyncio.Event() for _ in self.engine.replicas]
        self.tasks: list[asyncio.Task[None]] = []
        self.ids = itertools.count()
        self._timer = ThreadPoolExecutor(self._timers(), thread_name_prefix="step-timer")

    def _timers(self) -> int:
        """Timer threads: one per replica loop that may wait at once."""
        return len(self.wake)

    def now(self) -> int:
        return self.clock() - self.base

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self._replica(self.engine, self.wake, r, self._deliver))
            for r in range(len(self.wake))
        ]

    def waiting(self) -> int:
        """Requests waiting for the scheduler (the `scheduler_queue_depth` gauge)."""
        return len(self.engine.policy)

    def refresh(self, metrics: Any) -> None:
        """Bring the scrape-time gauges up to date (the server calls it on each scrape)."""
        metrics.refresh(self.engine)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self._timer.shutdown(wait=False)

    def submit(self, job: Job) -> tuple[Stream | None, Any]:
        verdict = self.engine.submit(job, self.now())
        if not verdict.accepted:
            self.metrics.rejected(verdict.code)
            return None, verdict
        stream = Stream(job)
        self.streams[job.id] = stream
        for event in self.wake:
            event.set()
        self.metrics.queue_depth(self.waiting())
        return stream, verdict

    def cancel(self, job: Job) -> None:
        if self.engine.cancel(job, self.now()):
            self.metrics.cancelled.inc()
        self.streams.pop(job.id, None)

    async def _replica(
        self,
        engine: Engine,
        wake: list[asyncio.Event],
        r: int,
        deliver: Callable[[int, StepResult], None],
    ) -> None:
        """Replica r of `engine` on the wall clock: step, sleep to the step's end, deliver.
        One loop for every pool (the disaggregated driver runs one per replica of each)."""
        step_at = self.now()
        while True:
            res = engine.step(r, max(step_at, self.now()))
            if res is None:
                wake[r].clear()
                await wake[r].wait()
                step_at = self.now()
                continue
            due = self.base + res.end_ns
            await self._until(due)
            lag = self.clock() - due
            self.metrics.step(res, max(lag, 0), engine.policy)
            deliver(r, res)
            step_at = res.end_ns

    async def _until(self, due: int) -> None:
        """Return at the clock's `due` (ns): coarse on the loop, fine in a thread, then spin."""
        delay = due - self.clock() - COARSE_NS
        if delay > 0:
            await asyncio.sleep(delay / 1e9)
        fine = due - self.clock() - SPIN_NS
        if fine > 0:
            await asyncio.get_running_loop().run_in_executor(self._timer, time.sleep, fine / 1e9)
        while self.clock() < due:
            await asyncio.sleep(0)

    def _deliver(self, r: int, res: StepResult) -> None:
        for job in res.admitted:
            self.metrics.admitted(job)
        self._tokens(self.engine, r, res, self.metrics.finished)
        if res.finished:
            self.metrics.queue_depth(self.waiting())
            for event in self.wake:
                event.set()

    def _tokens(
        self, engine: Engine, r: int, res: StepResult, finished_hook: Callable[[Job], None]
    ) -> None:
        """Push a step's tokens to the streams: first tokens, one per decoding job, the last
        ones; `finished_hook(job)` runs for each finished job before its stream's last push, so
        a handler woken by it reads the job's outcome complete."""
        streams = self.streams
        first = {job.id for job in res.first_tokens}
        finished = {job.id for job in res.finished}
        for job in res.first_tokens:
            stream = streams.get(job.id)
            if job.id in finished:
                finished_hook(job)
            if stream is not None:
                stream.push(1 if job.max_tokens else 0, job.id in finished)
        if res.n_decode:
            for job in engine.decoding_jobs(r):
                stream = streams.get(job.id)
                if stream is not None:
                    stream.push(1, False)
        for job in res.finished:
            if job.id not in first:
                finished_hook(job)
                stream = streams.get(job.id)
                if stream is not None:
                    stream.push(1, True)
