"""The Policy protocol and the machinery every policy shares (this package's sch_generic.h).

A policy only orders waiting jobs; the engine decides when capacity exists. The verbs mirror a
Linux qdisc's: enqueue (with a verdict), dequeue, peek, plus `charge` (service is known only once
it is given, e.g. VTC's decoded tokens), `remove` (cancel, demote), `release` (a dequeued job left
the engine: finished or preempted; tier ceilings count running jobs) and `resumed` (a preempted
job came back), `stats`, `reset`, `len`.

Contract, enforced by the conformance suite: `peek(now)` returns exactly what the next
`dequeue(now)` returns; every accepted job is dequeued or removed exactly once; `len` counts live
waiting jobs. Policies receive `now` and never read a clock; ties break by `job.seq`.

Optional: `take(job, now)`, the `dequeue(now)` of the job the policy's `peek(now)` has just
returned, with nothing changed in between. The engine peeks, checks the job fits, then
dequeues: a policy that can take the peeked job without choosing it again saves a second
choice per admission (issue 35: the simulator's cost is per request). Policies without it are
dequeued as before.

`JobQueue` is the one FIFO with O(1) lazy removal that the policies build on, so a policy file
holds only its algorithm.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from reference_scheduler.core.job import Job


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: bool
    code: int = 0  # HTTP status for a rejection: 503 overload, 429 tenant over its limit
    retry_after_s: int = 0
    reason: str = ""


ACCEPTED = Verdict(True)


@runtime_checkable
class Policy(Protocol):
    name: ClassVar[str]

    def enqueue(self, job: Job, now_ns: int) -> Verdict: ...
    def dequeue(self, now_ns: int) -> Job | None: ...
    def peek(self, now_ns: int) -> Job | None: ...
    def charge(self, job: Job, now_ns: int, prefill: int = 0, decode: int = 0) -> None: ...
    def remove(self, job: Job) -> None: ...
    def release(self, job: Job, now_ns: int) -> None: ...
    def resumed(self, job: Job, now_ns: int) -> None: ...
    def bind(self, capacity_slots: int) -> None: ...
    def stats(self) -> Mapping[str, float]: ...
    def reset(self) -> None: ...
    def __len__(self) -> int: ...


class JobQueue:
    """FIFO of jobs with O(1) removal: a removed job is skipped when it reaches the head."""

    __slots__ = ("_items", "live")

    def __init__(self) -> None:
        self._items: deque[Job] = deque()
        self.live = 0

    def push(self, job: Job) -> None:
        job.queue = self
        self._items.append(job)
        self.live += 1

    def head(self) -> Job | None:
        items = self._items
        while items:
            job = items[0]
            if job.queue is self:
                return job
            items.popleft()
        return None

    def pop(self) -> Job | None:
        job = self.head()
        if job is not None:
            self._items.popleft()
            job.queue = None
            self.live -= 1
        return job

    def take(self, job: Job) -> None:
        """`pop()` when `head()` has just returned `job` (the engine's peek, then its dequeue):
        the head is known, so it is not looked for again."""
        self._items.popleft()
        job.queue = None
        self.live -= 1

    def discard(self, job: Job) -> bool:
        if job.queue is not self:
            return False
        job.queue = None
        self.live -= 1
        if not self.live:
            self._items.clear()
        return True

    def __len__(self) -> int:
        return self.live


class BasePolicy:
    """Counters and no-op hooks shared by all policies."""

    name: ClassVar[str] = "base"
    uses_charge: bool = False  # the engine skips per-step service charging when no one listens

    def __init__(self) -> None:
        self.enqueued = 0
        self.dequeued = 0
        self.removed = 0

    def charge(self, job: Job, now_ns: int, prefill: int = 0, decode: int = 0) -> None:
        return None

    def release(self, job: Job, now_ns: int) -> None:
        return None

    def resumed(self, job: Job, now_ns: int) -> None:
        """A preempted job re-entered the engine from its replica's resume queue (the inverse of
        the `release` its preemption caused)."""
        return None

    def bind(self, capacity_slots: int) -> None:
        """The engine tells the policy its running capacity (only tier ceilings use it)."""
        return None

    def stats(self) -> Mapping[str, float]:
        return {
            "enqueued": self.enqueued,
            "dequeued": self.dequeued,
            "removed": self.removed,
            "waiting": len(self),
        }  # type: ignore[arg-type]

    def __len__(self) -> int:  # pragma: no cover - every policy overrides it
        raise NotImplementedError


def policy_hook(policy: object, name: str) -> Callable[..., Any] | None:
    """`policy.<name>` bound, or None where it is BasePolicy's no-op: the engine calls `release`
    once per job, and skipping a call that does nothing is a share of its per-request cost
    (issue 35)."""
    method = getattr(type(policy), name, None)
    if method is None or method is getattr(BasePolicy, name):
        return None
    return getattr(policy, name)


CostFn = Callable[[Job], float]

COSTS: dict[str, CostFn] = {
    "tokens": lambda job: float(job.prompt_tokens + job.max_tokens),
    "weighted-tokens": lambda job: float(job.prompt_tokens + 2 * job.max_tokens),
    "prompt": lambda job: float(job.prompt_tokens),
    "requests": lambda job: 1.0,
}

KEYS: dict[str, Callable[[Job], Any]] = {
    "tenant": lambda job: job.tenant,
    "slo_class": lambda job: job.slo_class,
    "flow": lambda job: (job.tenant, job.flow),
}


def checked_weights(weights: Mapping[str, float] | None) -> dict[str, float]:
    """A policy's `weights` map, each a finite number > 0: a share divides by its weight (WFQ's
    finish tags, VTC's counters) or scales a quantum by it (DWRR), so a weight of 0 would fail
    mid-run or never let a tenant's turn end. Raised at configuration, naming the tenant."""
    out = dict(weights or {})
    for tenant, weight in out.items():
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not math.isfinite(weight)
            or weight <= 0
        ):
            raise ValueError(f"weights[{tenant!r}] must be a number > 0, got {weight!r}")
    return out


def cost_fn(name: str) -> CostFn:
    if name not in COSTS:
        raise ValueError(f"unknown cost {name!r}; known: {sorted(COSTS)}")
    return COSTS[name]


def key_fn(name: str) -> Callable[[Job], Any]:
    if name not in KEYS:
        raise ValueError(f"unknown flow key {name!r}; known: {sorted(KEYS)}")
    return KEYS[name]
