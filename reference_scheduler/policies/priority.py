"""priority — strict priority by class (or by tenant), FIFO within a level.

vLLM's `--scheduling-policy priority` orders its waiting queue this way. Strict priority gives
the urgent class the best latency it can have and gives the others nothing while it is
backlogged: a lower level starves for as long as a higher one has work. Use it to show that
trade-off, or inside a tier whose ceiling bounds the damage. O(levels) per decision (a handful).

`by: slo_class` ranks by the job's class rank (`job.priority`, lower first); `by: tenant` ranks
by an explicit `ranks` map (tenants not in it rank last).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import ClassVar

from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import ACCEPTED, BasePolicy, JobQueue, Verdict


class Priority(BasePolicy):
    name: ClassVar[str] = "priority"

    def __init__(self, by: str = "slo_class", ranks: Mapping[str, int] | None = None) -> None:
        super().__init__()
        if by not in ("slo_class", "tenant"):
            raise ValueError(f"by must be 'slo_class' or 'tenant', got {by!r}")
        self.by = by
        self.ranks = dict(ranks or {})
        for tenant, rank in self.ranks.items():  # ordered against each other and 1 << 30
            if isinstance(rank, bool) or not isinstance(rank, int | float) or rank != rank:
                raise ValueError(f"ranks[{tenant!r}] must be a number, got {rank!r}")
        self._levels: dict[int, JobQueue] = {}
        self._order: list[int] = []
        self._len = 0

    def _rank(self, job: Job) -> int:
        if self.by == "slo_class":
            return job.priority
        return self.ranks.get(job.tenant, 1 << 30)

    def enqueue(self, job: Job, now_ns: int) -> Verdict:
        rank = self._rank(job)
        queue = self._levels.get(rank)
        if queue is None:
            queue = self._levels[rank] = JobQueue()
            bisect.insort(self._order, rank)
        queue.push(job)
        self._len += 1
        self.enqueued += 1
        return ACCEPTED

    def _first(self) -> JobQueue | None:
        for rank in self._order:
            queue = self._levels[rank]
            if queue.live:
                return queue
        return None

    def peek(self, now_ns: int) -> Job | None:
        queue = self._first()
        return queue.head() if queue else None

    def dequeue(self, now_ns: int) -> Job | None:
        queue = self._first()
        if queue is None:
            return None
        self._len -= 1
        self.dequeued += 1
        return queue.pop()

    def remove(self, job: Job) -> None:
        queue = job.queue
        if isinstance(queue, JobQueue) and queue.discard(job):
            self._len -= 1
            self.removed += 1

    def reset(self) -> None:
        self.__init__(self.by, self.ranks)  # type: ignore[misc]

    def __len__(self) -> int:
        return self._len
