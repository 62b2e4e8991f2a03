"""dwrr — deficit weighted round robin across tenants (Shreedhar & Varghese, SIGCOMM 1995).

Each backlogged tenant (a "class") sits in a ring with a deficit counter. When the class at the
head cannot afford its head job, it earns its quantum (q·weight) and goes to the back of the
ring; when it can, the job is served and its cost is taken from the deficit. A class that empties
leaves the ring and forgets its deficit (so idle time earns no credit); a class that joins gets
one quantum and goes to the back (joining at the front would let a flapping tenant jump the
queue every time it goes idle — the same choice as Linux sch_drr).

Cost is known at arrival: prompt + requested output tokens by default (`cost:`), so a tenant
sending 4k-token prompts gets fewer requests per round than one sending 80-token chats, not the
same number.

Guarantees (cost in tokens, quanta Q_i = q·w_i, Max the largest job cost):
- At the end of each of its turns a class's deficit lies in [0, Max): it only stops when it
  cannot afford its head job, whose cost is < Max... (≤ Max; it stopped because deficit < cost).
- Service in n consecutive full turns is n·Q_i + DC_start − DC_end, within (n·Q_i − Max,
  n·Q_i + Max).
- Fairness bound (derived here; asserted on generated traces in the tests): over any interval in
  which classes i and j stay backlogged, let n_i, n_j be the turns that overlap the interval
  (|n_i − n_j| ≤ 1 in a ring). The two partial end turns give S_i ≤ n_i·Q_i + Max and
  S_j ≥ (n_j − 2)·Q_j − Max, so
        |S_i/w_i − S_j/w_j| ≤ 3q + Max/w_i + Max/w_j.
Drawbacks: fairness is in estimated cost, not in measured GPU time (a request that stops early
was charged its whole max_tokens), and the bound grows with q: small quanta are fairer, but
below Max a class may need several rounds to afford a job. The default q is 1,024 tokens: with
8,192, a tenant of 72-token chats held the ring for ~113 admissions a turn, and a polite
tenant's queue overflowed its admission cap behind it (tests/test_isolation.py). With
`cost: requests` the default quantum is one request: 1,024 would let a turn take 1,024 requests,
exhaustive polling rather than round robin.
Complexity: O(1) per decision when Q_i ≥ Max (every turn serves at least one job); the ring
holds only backlogged classes. Each class's own queue is a child policy (FIFO by default; WFQ
across a tenant's workloads in the `dwrr-wfq` preset).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any, ClassVar

from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import (
    ACCEPTED,
    BasePolicy,
    Policy,
    Verdict,
    checked_weights,
    cost_fn,
    key_fn,
    policy_hook,
)

DEFAULT_TOKEN_QUANTUM = 1024.0


def default_quantum(cost: str) -> float:
    """A turn's quantum when none is configured: one request, or 1,024 tokens of cost."""
    return 1.0 if cost == "requests" else DEFAULT_TOKEN_QUANTUM


class _Class:
    __slots__ = ("active", "child", "deficit", "key", "quantum", "take", "waiting")

    def __init__(self, key: Hashable, child: Policy, quantum: float) -> None:
        self.key = key
        self.child = child
        self.quantum = quantum
        self.deficit = 0.0
        self.active = False
        # per job, without a call: the child's jobs waiting (its len), and its take if any
        self.waiting = 0
        self.take = getattr(child, "take", None)


class Dwrr(BasePolicy):
    name: ClassVar[str] = "dwrr"

    def __init__(
        self,
        child: Callable[[], Policy],
        quantum: float | None = None,
        cost: str = "tokens",
        key: str = "tenant",
        weights: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__()
        if quantum is None:
            quantum = default_quantum(cost)
        if quantum <= 0:
            raise ValueError(f"quantum must be > 0, got {quantum}")
        self._child = child
        sample = child()
        self.uses_charge = bool(sample.uses_charge)
        # whether the children's `release` does anything (FIFO's does not): it runs per job
        self._child_releases = policy_hook(sample, "release") is not None
        self.quantum = float(quantum)
        self._cost = cost_fn(cost)
        self._key = key_fn(key)
        self._config: dict[str, Any] = {
            "child": child,
            "quantum": quantum,
            "cost": cost,
            "key": key,
            "weights": weights,
        }
        self.weights = checked_weights(weights)
        self._classes: dict[Hashable, _Class] = {}
        self._class_of: dict[int, _Class] = {}  # waiting job id -> its class
        self._ring: deque[_Class] = deque()
        self._len = 0
        self._head_cost = 0.0  # the cost of the job the last peek found affordable
        self.max_turn_end_deficit = 0.0  # for the [0, Max) invariant
        self.turns = 0

    def _class_key(self, job: Job, now_ns: int) -> Hashable:
        return self._key(job)

    def _weight(self, job: Job) -> float:
        return self.weights.get(job.tenant, job.weight)

    def enqueue(self, job: Job, now_ns: int) -> Verdict:
        key = self._class_key(job, now_ns)
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = _Class(key, self._child(), self.quantum * self._weight(job))
        verdict = cls.child.enqueue(job, now_ns)
        if not verdict.accepted:
            return verdict
        self._class_of[job.id] = cls
        cls.waiting += 1
        if not cls.active:
            cls.active = True
            cls.deficit = cls.quantum
            self._ring.append(cls)
        self._len += 1
        self.enqueued += 1
        return ACCEPTED

    def _advance(self, now_ns: int) -> tuple[_Class, Job] | None:
        """Rotate the ring until its head class can afford its head job (what dequeue does)."""
        ring = self._ring
        while ring:
            cls = ring[0]
            job = cls.child.peek(now_ns)
            if job is None:  # emptied by removals
                ring.popleft()
                cls.active = False
                cls.deficit = 0.0
                continue
            cost = self._cost(job)
            if cost <= cls.deficit:
                self._head_cost = cost  # take's, for this job: not computed twice
                return cls, job
            self.turns += 1
            if cls.deficit > self.max_turn_end_deficit:
                self.max_turn_end_deficit = cls.deficit
            cls.deficit += cls.quantum
            ring.rotate(-1)
        return None

    def peek(self, now_ns: int) -> Job | None:
        found = self._advance(now_ns)
        return found[1] if found else None

    def dequeue(self, now_ns: int) -> Job | None:
        found = self._advance(now_ns)
        if found is None:
            return None
        job = found[1]
        self.take(job, now_ns)  # _advance left its class at the ring's head, as peek does
        return job

    def take(self, job: Job, now_ns: int) -> None:
        """`dequeue(now_ns)` of the job `peek(now_ns)` just returned (core/policy.py): peek left
        the class that can afford it at the ring's head, so the ring is not advanced again."""
        cls = self._ring[0]
        if cls.take is not None:
            cls.take(job, now_ns)
        else:
            got = cls.child.dequeue(now_ns)
            assert got is job, "a child policy's peek and dequeue disagree"
        del self._class_of[job.id]
        cls.deficit -= self._head_cost  # what _advance found this job to cost
        self._len -= 1
        self.dequeued += 1
        cls.waiting -= 1
        if not cls.waiting:
            self._ring.popleft()
            cls.active = False
            self.turns += 1
            cls.deficit = 0.0

    def remove(self, job: Job) -> None:
        cls = self._class_of.pop(job.id, None)
        if cls is None:
            return
        cls.child.remove(job)
        cls.waiting -= 1
        self._len -= 1
        self.removed += 1

    def charge(self, job: Job, now_ns: int, prefill: int = 0, decode: int = 0) -> None:
        cls = self._classes.get(self._key(job))
        if cls is not None:
            cls.child.charge(job, now_ns, prefill, decode)

    def release(self, job: Job, now_ns: int) -> None:
        if not self._child_releases:
            return
        cls = self._classes.get(self._key(job))
        if cls is not None:
            cls.child.release(job, now_ns)

    def deficit(self, key: Hashable) -> float:
        cls = self._classes.get(key)
        return cls.deficit if cls else 0.0

    def stats(self) -> Mapping[str, float]:
        return {**super().stats(), "backlogged_classes": len(self._ring), "turns": self.turns}

    def reset(self) -> None:
        self.__init__(**self._config)  # type: ignore[misc]

    def __len__(self) -> int:
        return self._len
