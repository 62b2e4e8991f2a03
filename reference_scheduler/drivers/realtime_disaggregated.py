"""Prefill/decode disaggregation on the wall clock: the simulator's two pools and KV link, live.

Why a subclass of the real-time driver and not a second model: a live run of a disaggregated
scenario (`target: reference` with `scheduler.disaggregation`) must behave as the simulator's
model does (drivers/disaggregated.py), or a sim and a live run of one plan could not be compared
component by component. So this driver takes the simulator's pieces as they are — the pools'
configurations (`pool_configs`), the prefill and decode copies of a request (`to_prefill`,
`to_decode`), the up-front 400 (`refused`), the KV link's FIFO queue with its bandwidth, latency
and seeded jitter (`KvLink`), the cancel that finds a request in either pool or on the link, and
the `merge` of both pools' outcomes into the client's job — and only waits on the wall clock
where the simulator jumps:

1. A request enters the prefill pool (its policy, admission limits and prefix cache) as a
   one-token request; each prefill replica is a loop of `RealtimeDriver._replica`.
2. When its prefill step ends, `KvLink.transfer` says when its KV reaches the decode pool; one
   link task sleeps until the earliest such time (coarse on the loop, fine in a timer thread)
   and hands the request to the decode pool then. The arrival is stamped when it is handed over
   (`kv_arrived_ns`, never before the model's time; a late wake shows as transfer time).
3. The decode pool admits it only when its policy picks it and a slot and KV blocks are free —
   the same `Engine` admission as the simulator's decode pool — and its first decode step yields
   the client's first token. The decode replicas stream tokens as the colocated driver does.

Per request the client's job carries admit_ns (prefill pool), prefill_done_ns, kv_arrived_ns and
decode_admit_ns, so `core.job.ttft_parts` gives the server's timing block the same components as
the simulator's records. The scrape adds the waiting-queue length per pool
(`scheduler_pool_queue_depth{pool="prefill"|"decode"}`) and the KV transfers in flight.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable
from typing import Any

from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import Verdict
from reference_scheduler.drivers.disaggregated import (
    cancel,
    merge,
    pool_configs,
    refused,
    to_decode,
    to_prefill,
)
from reference_scheduler.drivers.realtime import COARSE_NS, DriverMetrics, RealtimeDriver, Stream
from reference_scheduler.scheduler.config import SchedulerConfig
from reference_scheduler.scheduler.disaggregation import KvLink
from reference_scheduler.scheduler.engine import Engine, StepResult

_LIVE = ("waiting", "running", "preempted")


class DisaggregatedDriver(RealtimeDriver):
    """A prefill pool (`self.engine`, where requests enter) and a decode pool (`self.decode`)
    joined by the KV link, each replica stepped on the wall clock."""

    def __init__(
        self,
        scheduler: SchedulerConfig,
        metrics: DriverMetrics,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        dis = scheduler.spec.disaggregation
        assert dis is not None
        prefill, decode = pool_configs(scheduler)
        self._decode_replicas = decode.replicas
        super().__init__(prefill, metrics, clock)
        self.decode = Engine(decode, keep_history=False)
        self.decode_wake = [asyncio.Event() for _ in self.decode.replicas]
        self.link = KvLink(
            dis.kv_transfer,
            scheduler.profile.kv_bytes_per_token,
            dis.prefill_replicas,
            scheduler.spec.seed,
        )
        self.jobs: dict[int, Job] = {}  # the client's job of each request in flight
        self.pjobs: dict[int, Job] = {}  # its prefill pool copy
        self.djobs: dict[int, Job] = {}  # its decode pool copy, once its KV arrived
        self.dropped: set[int] = set()  # cancelled while their KV was on the link
        self.arrivals: list[tuple[int, int]] = []  # heap of (KV arrival ns, job id)
        self.link_wake = asyncio.Event()

    def _timers(self) -> int:
        return len(self.wake) + self._decode_replicas + 1  # both pools' loops and the link's

    def start(self) -> None:
        super().start()
        self.tasks += [
            asyncio.create_task(self._replica(self.decode, self.decode_wake, r, self._decoded))
            for r in range(len(self.decode_wake))
        ]
        self.tasks.append(asyncio.create_task(self._link()))

    def waiting(self) -> int:
        """Both pools' waiting requests: the prefill queue and the decode wait."""
        return len(self.engine.policy) + len(self.decode.policy)

    def refresh(self, metrics: Any) -> None:
        metrics.refresh(self.engine)
        metrics.refresh_pools(
            {"prefill": self.engine, "decode": self.decode}, len(self.arrivals) - len(self.dropped)
        )

    # ------------------------------------------------------------------ requests

    def submit(self, job: Job) -> tuple[Stream | None, Any]:
        if refused(job, self.engine, self.decode):
            job.status, job.reject_code = "rejected", 400
            self.metrics.rejected(400)
            return None, Verdict(False, 400, 0, "context_length_exceeded")
        pj = to_prefill(job, job.arrival_ns)
        verdict = self.engine.submit(pj, self.now())
        if not verdict.accepted:
            job.status, job.reject_code = pj.status, pj.reject_code
            self.metrics.rejected(verdict.code)
            return None, verdict
        self.jobs[job.id], self.pjobs[job.id] = job, pj
        stream = self.streams[job.id] = Stream(job)
        for event in self.wake:
            event.set()
        self.metrics.queue_depth(self.waiting())
        return stream, verdict

    def cancel(self, job: Job) -> None:
        if self.jobs.pop(job.id, None) is not None:
            cancel(job, self.now(), self.engine, self.decode, self.pjobs, self.djobs, self.dropped)
            job.status = "cancelled"
            self.pjobs.pop(job.id, None)
            self.djobs.pop(job.id, None)
            self.metrics.cancelled.inc()
        self.streams.pop(job.id, None)

    # ------------------------------------------------------------------ the prefill pool

    def _deliver(self, r: int, res: StepResult) -> None:
        for pj in res.admitted:
            self.metrics.admitted(pj)
        for pj in res.finished:
            self._prefilled(pj)
        if res.finished:
            self.metrics.queue_depth(self.waiting())
            for event in self.wake:
                event.set()

    def _prefilled(self, pj: Job) -> None:
        job = self.jobs.get(pj.id)
        if job is None:
            return
        job.prefill_done_ns = pj.done_ns
        if job.max_tokens <= 1:  # its one token (or an embedding) came from the prefill pool
            self._finished(job)
            stream = self.streams.get(job.id)
            if stream is not None:
                stream.push(1 if job.max_tokens else 0, True)
            return
        arrive = self.link.transfer(pj.replica, pj.done_ns, job.prompt_tokens)
        heapq.heappush(self.arrivals, (arrive, job.id))
        self.link_wake.set()

    # ------------------------------------------------------------------ the KV link

    async def _link(self) -> None:
        """Hand each request to the decode pool when its KV arrives (the earliest first)."""
        while True:
            if not self.arrivals:
                self.link_wake.clear()
                await self.link_wake.wait()
                continue
            due = self.base + self.arrivals[0][0]
            delay = due - self.clock() - COARSE_NS
            if delay > 0:  # sleep on the loop, woken early by a transfer that lands sooner
                self.link_wake.clear()
                try:
                    async with asyncio.timeout(delay / 1e9):
                        await self.link_wake.wait()
                except TimeoutError:
                    pass
                continue
            await self._until(due)
            now = self.now()
            while self.arrivals and self.arrivals[0][0] <= now:
                _, job_id = heapq.heappop(self.arrivals)
                self._kv_arrived(job_id, now)

    def _kv_arrived(self, job_id: int, now: int) -> None:
        if job_id in self.dropped:
            self.dropped.discard(job_id)
            return
        job = self.jobs.get(job_id)
        if job is None:
            return
        dj = self.djobs[job_id] = to_decode(job, now)
        if self.decode.submit(dj, now).accepted:
            self.metrics.queue_depth(self.waiting())
            for event in self.decode_wake:
                event.set()
            return
        self._finished(job)  # refused by the decode pool: the stream ends with no token
        stream = self.streams.get(job_id)
        if stream is not None:
            stream.push(0, True)

    # ------------------------------------------------------------------ the decode pool

    def _decoded(self, r: int, res: StepResult) -> None:
        self._tokens(self.decode, r, res, self._finished)
        if res.finished:
            self.metrics.queue_depth(self.waiting())
            for event in self.decode_wake:
                event.set()

    def _finished(self, job: Job) -> None:
        """Write both pools' outcome into the client's job (before its stream's last push)."""
        own = self.jobs.pop(job.id, None)
        if own is None:
            return
        merge(own, self.pjobs.pop(job.id, None), self.djobs.pop(job.id, None))
        if own.status == "finished":
            self.metrics.finished(own)


__all__ = ["DisaggregatedDriver"]


def driver_for(scheduler: SchedulerConfig, metrics: DriverMetrics) -> RealtimeDriver:
    """The driver a configuration needs: the colocated one, or with `scheduler.disaggregation`
    the prefill and decode pools above (here, not in drivers/realtime.py, which this subclasses)."""
    if scheduler.spec.disaggregation is None:
        return RealtimeDriver(scheduler, metrics)
    return DisaggregatedDriver(scheduler, metrics)
