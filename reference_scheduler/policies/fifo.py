"""fifo — first come, first served.

The baseline every production engine starts from (vLLM's default `fcfs`). Work-conserving and
starvation-free, and blind to everything else: one tenant's burst of 4k-token prompts sits in
front of everybody's 80-token chats, and a tenant's share of the GPU is its share of arrivals.
O(1) per decision.
"""

from __future__ import annotations

from typing import ClassVar

from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import ACCEPTED, BasePolicy, JobQueue, Verdict


class Fifo(BasePolicy):
    name: ClassVar[str] = "fifo"

    def __init__(self) -> None:
        super().__init__()
        self._q = JobQueue()

    def enqueue(self, job: Job, now_ns: int) -> Verdict:
        q = self._q  # JobQueue.push, inlined (here and below: once or twice per request)
        job.queue = q
        q._items.append(job)
        q.live += 1
        self.enqueued += 1
        return ACCEPTED

    def peek(self, now_ns: int) -> Job | None:
        q = self._q  # JobQueue.head
        items = q._items
        while items:
            job = items[0]
            if job.queue is q:
                return job
            items.popleft()
        return None

    def dequeue(self, now_ns: int) -> Job | None:
        job = self._q.pop()
        if job is not None:
            self.dequeued += 1
        return job

    def take(self, job: Job, now_ns: int) -> None:
        """`dequeue(now_ns)` of the head `peek(now_ns)` just returned (core/policy.py)."""
        q = self._q  # JobQueue.take
        q._items.popleft()
        job.queue = None
        q.live -= 1
        self.dequeued += 1

    def remove(self, job: Job) -> None:
        if self._q.discard(job):
            self.removed += 1

    def reset(self) -> None:
        while self._q.pop() is not None:
            pass

    def __len__(self) -> int:
        return len(self._q)
