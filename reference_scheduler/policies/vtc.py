"""vtc — the Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language Models",
OSDI 2024), and lcf, the same without the counter lift.

Each tenant has a counter of the service it received: w_in per input token (charged when the
job is admitted) plus w_out per output token (charged as each token is produced), divided by the
tenant's weight; defaults 1 and 2, the paper's. The scheduler always admits from the backlogged
tenant with the lowest counter. Charging what was actually served (not an estimate) makes VTC
robust to unknown output lengths.

The lift. A tenant that was idle has a low counter; served on it, it would monopolize the engine
until it caught up ("banked" credit). So when a tenant's queue goes from empty to non-empty, its
counter is lifted: c_u ← max(c_u, min over the *other* backlogged tenants' counters). When no
other tenant is backlogged we follow the paper's Algorithm 2 and lift to the counter of the
tenant that left the backlog last. The authors' artifact (slora/server/router/vtc_req_queue.py)
skips the lift in that case, which lets a tenant bank credit across an idle system; we do not.
`lcf` (least counter first, no lift) is the paper's baseline that shows why the lift matters.

Guarantee (paper, Theorem 4.4): between two continuously backlogged tenants the counter gap
stays within 2·max(w_in·L_input, w_out·M), L_input the longest prompt and M the most tokens the
engine can hold at once. Drawback: fairness is in tokens, not GPU time (a 4k prefill and 4k
decode steps are priced alike up to w_in/w_out). O(tenants) per decision: the minimum is a scan
over backlogged tenants (tenants are few; jobs can be many).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import (
    ACCEPTED,
    BasePolicy,
    JobQueue,
    Verdict,
    checked_weights,
)


class Vtc(BasePolicy):
    name: ClassVar[str] = "vtc"
    lift: ClassVar[bool] = True
    uses_charge = True

    def __init__(
        self,
        input_price: float = 1.0,
        output_price: float = 2.0,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__()
        self._config: dict[str, Any] = {
            "input_price": input_price,
            "output_price": output_price,
            "weights": weights,
        }
        self.input_price = input_price
        self.output_price = output_price
        self.weights = checked_weights(weights)
        self.counters: dict[str, float] = {}
        self._queues: dict[str, JobQueue] = {}
        self._order: dict[str, int] = {}  # first-seen order, for deterministic ties
        self._backlogged: set[str] = set()
        self._last_left: str | None = None
        self._len = 0

    def _weight(self, job: Job) -> float:
        return self.weights.get(job.tenant, job.weight)

    def enqueue(self, job: Job, now_ns: int) -> Verdict:
        tenant = job.tenant
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = JobQueue()
            self.counters[tenant] = 0.0
            self._order[tenant] = len(self._order)
        if not queue.live:
            if self.lift:
                self._lift(tenant)
            self._backlogged.add(tenant)
        job.queue = queue  # JobQueue.push, inlined: it runs once per request
        queue._items.append(job)
        queue.live += 1
        self._len += 1
        self.enqueued += 1
        return ACCEPTED

    def _lift(self, tenant: str) -> None:
        counters = self.counters
        floor = None  # min over the other backlogged tenants' counters, without a list
        for t in self._backlogged:
            if t != tenant:
                c = counters[t]
                if floor is None or c < floor:
                    floor = c
        if floor is None:
            if self._last_left is None or self._last_left == tenant:
                return
            floor = counters[self._last_left]
        if floor > counters[tenant]:
            counters[tenant] = floor

    def _pick(self) -> str | None:
        """The backlogged tenant with the lowest (counter, first-seen order): the order is read
        only on a tie, and no key tuple is built (it runs twice per admission)."""
        best = None
        best_c = 0.0
        counters = self.counters
        for tenant in self._backlogged:
            c = counters[tenant]
            if (
                best is None
                or c < best_c
                or (c == best_c and self._order[tenant] < self._order[best])
            ):
                best, best_c = tenant, c
        return best

    def peek(self, now_ns: int) -> Job | None:
        tenant = self._pick()
        if tenant is None:
            return None
        queue = self._queues[tenant]  # JobQueue.head, inlined: it runs once per admission
        items = queue._items
        while items:
            job = items[0]
            if job.queue is queue:
                return job
            items.popleft()
        return None

    def dequeue(self, now_ns: int) -> Job | None:
        tenant = self._pick()
        if tenant is None:
            return None
        queue = self._queues[tenant]
        job = queue.pop()
        self._len -= 1
        self.dequeued += 1
        if not queue.live:
            self._backlogged.discard(tenant)
            self._last_left = tenant
        return job

    def take(self, job: Job, now_ns: int) -> None:
        """`dequeue(now_ns)` of the job `peek(now_ns)` just returned (core/policy.py): it is
        its tenant's queue head, so the tenant is not chosen again."""
        queue = job.queue
        queue._items.popleft()  # JobQueue.take, inlined
        job.queue = None
        queue.live -= 1
        self._len -= 1
        self.dequeued += 1
        if not queue.live:
            self._backlogged.discard(job.tenant)
            self._last_left = job.tenant

    def remove(self, job: Job) -> None:
        queue = self._queues.get(job.tenant)
        if queue is not None and queue.discard(job):
            self._len -= 1
            self.removed += 1
            if not queue.live:
                self._backlogged.discard(job.tenant)
                self._last_left = job.tenant

    def charge(self, job: Job, now_ns: int, prefill: int = 0, decode: int = 0) -> None:
        # called per tenant per decode step: `_weight` inlined, the same float operations
        tenant = job.tenant
        weights = self.weights
        try:  # a tenant never enqueued (or reset since) has no counter: nothing to charge
            self.counters[tenant] += (self.input_price * prefill + self.output_price * decode) / (
                weights.get(tenant, job.weight) if weights else job.weight
            )
        except KeyError:
            return

    def charge_decode(self, entries: Iterable[list], now_ns: int) -> None:
        """One decode step's charges, `charge(job, now_ns, 0, count)` for each [count, job] of
        `entries` (a replica's decoding tenants), in that order and with the same float
        operations, without a call per tenant: the engine's per-step cost (issue 35)."""
        counters = self.counters
        weights = self.weights
        zero = self.input_price * 0
        price = self.output_price
        # `tenant in counters` and the weights' lookup cost more than the charge: a missing
        # counter (a tenant reset since) raises before the sum is taken; without configured
        # weights the job's weight is the divisor `weights.get` would give
        if weights:
            for count, job in entries:
                tenant = job.tenant
                try:
                    counters[tenant] += (zero + price * count) / weights.get(tenant, job.weight)
                except KeyError:
                    continue
        else:
            for count, job in entries:
                try:
                    counters[job.tenant] += (zero + price * count) / job.weight
                except KeyError:
                    continue

    def stats(self) -> Mapping[str, float]:
        out = dict(super().stats())
        for tenant, value in self.counters.items():
            out[f"counter:{tenant}"] = value
        return out

    def reset(self) -> None:
        self.__init__(**self._config)  # type: ignore[misc]

    def __len__(self) -> int:
        return self._len


class Lcf(Vtc):
    """Least counter first: VTC without the lift (the paper's baseline)."""

    name: ClassVar[str] = "lcf"
    lift: ClassVar[bool] = False
