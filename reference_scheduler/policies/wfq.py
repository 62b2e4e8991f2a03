"""wfq — weighted fair queueing with virtual finish times (Demers, Keshav & Shenker 1989;
Parekh & Gallager 1993).

WFQ serves jobs in the order they would finish under GPS, the fluid ideal in which every
backlogged flow is served at once at rate r·w_f/Σw. It tracks GPS's virtual time V(t),
dV/dt = r / Σ_{f GPS-backlogged} w_f, and stamps each arriving job with
        S = max(V(arrival), F_prev(flow)),   F = S + cost/w_flow,
then always dequeues the smallest F (ties by arrival sequence).

Guarantee (Parekh–Gallager): on a non-preemptive server of rate r, every job departs no later
than its GPS finish time plus L_max/r. The conformance tests check exactly this against an
independent fluid simulation.

In an LLM engine the "link rate" is not constant (it depends on the batch), so `rate` (tokens/s)
is the reference fluid server's rate — an estimate of the pool's throughput. If it is off, V runs
too fast or too slow; the ordering is still a fair interleaving, but the GPS bound then only
holds for a server of that rate. Cost is known at arrival (prompt + max_tokens by default).

Complexity: O(log n) per enqueue and dequeue (a heap of waiting jobs; a heap of GPS-backlogged
flows for virtual-time updates, amortized O(log flows)).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Mapping
from typing import Any, ClassVar

from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import (
    ACCEPTED,
    BasePolicy,
    Verdict,
    checked_weights,
    cost_fn,
    key_fn,
)


class Wfq(BasePolicy):
    name: ClassVar[str] = "wfq"

    def __init__(
        self,
        rate: float = 20000.0,
        cost: str = "tokens",
        key: str = "tenant",
        weights: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__()
        if rate <= 0:
            raise ValueError(f"rate must be > 0 tokens/s, got {rate}")
        self._config: dict[str, Any] = {"rate": rate, "cost": cost, "key": key, "weights": weights}
        self.rate_per_ns = rate / 1e9
        self._cost = cost_fn(cost)
        self._key = key_fn(key)
        self.weights = checked_weights(weights)
        self.vtime = 0.0
        self._t_last = 0
        self._finish: dict[Hashable, float] = {}  # last finish tag per flow
        self._flow_weight: dict[Hashable, float] = {}
        self._gps: list[tuple[float, int, Hashable]] = []  # (finish tag, seq, flow)
        self._gps_active: set[Hashable] = set()
        self._active_weight = 0.0
        self._jobs: list[tuple[float, int, Job]] = []
        self._len = 0
        self._n = 0

    def _advance(self, now_ns: int) -> None:
        """Bring GPS virtual time to `now_ns`, retiring flows whose fluid backlog drains."""
        if now_ns <= self._t_last:
            return
        gps = self._gps
        while self._gps_active:
            top, _, flow = gps[0]
            if flow not in self._gps_active or self._finish[flow] != top:
                heapq.heappop(gps)  # stale entry
                continue
            reach_ns = self._t_last + (top - self.vtime) * self._active_weight / self.rate_per_ns
            if reach_ns > now_ns:
                self.vtime += (now_ns - self._t_last) * self.rate_per_ns / self._active_weight
                break
            self.vtime = top
            self._t_last = reach_ns  # type: ignore[assignment]
            heapq.heappop(gps)
            self._gps_active.discard(flow)
            self._active_weight -= self._flow_weight[flow]
            if not self._gps_active:
                self._active_weight = 0.0
        self._t_last = now_ns

    def enqueue(self, job: Job, now_ns: int) -> Verdict:
        self._advance(now_ns)
        flow = self._key(job)
        weight = self.weights.get(job.tenant, job.weight)
        self._flow_weight[flow] = weight
        start = max(self.vtime, self._finish.get(flow, 0.0))
        finish = start + self._cost(job) / weight
        self._finish[flow] = finish
        self._n += 1
        if flow not in self._gps_active:
            self._gps_active.add(flow)
            self._active_weight += weight
        heapq.heappush(self._gps, (finish, self._n, flow))
        job.tag = finish
        job.queue = self
        heapq.heappush(self._jobs, (finish, job.seq, job))
        self._len += 1
        self.enqueued += 1
        return ACCEPTED

    def peek(self, now_ns: int) -> Job | None:
        jobs = self._jobs
        while jobs and jobs[0][2].queue is not self:
            heapq.heappop(jobs)
        return jobs[0][2] if jobs else None

    def dequeue(self, now_ns: int) -> Job | None:
        job = self.peek(now_ns)
        if job is None:
            return None
        heapq.heappop(self._jobs)
        job.queue = None
        self._len -= 1
        self.dequeued += 1
        return job

    def remove(self, job: Job) -> None:
        if job.queue is self:
            job.queue = None
            self._len -= 1
            self.removed += 1

    def stats(self) -> Mapping[str, float]:
        return {
            **super().stats(),
            "virtual_time": self.vtime,
            "gps_backlogged_flows": len(self._gps_active),
        }

    def reset(self) -> None:
        self.__init__(**self._config)  # type: ignore[misc]

    def __len__(self) -> int:
        return self._len
