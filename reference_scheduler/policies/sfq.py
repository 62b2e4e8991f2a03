"""sfq — stochastic fair queueing (McKenney, INFOCOM 1990; Linux net/sched/sch_sfq.c).

Flows (tenant by default, or tenant+workload) are hashed into a fixed number of buckets, and
the buckets are served by deficit round robin with equal quanta. Memory is bounded by the bucket
count, not the number of tenants, which is why it suits a tier with many small tenants.
Not 100% fair: flows that collide in a bucket share one bucket's share. The hash salt is redrawn
every `perturb` seconds from a seeded generator, so a collision does not last; flows already
queued keep their bucket until it drains (rehashing queued jobs would reorder them). Weights are
ignored by design (use dwrr for weighted shares). O(1) per decision.

A child that charges for service (vtc, lcf) is charged: each flow's service goes to the bucket
its latest job was dequeued from (where the flow competes now; a perturbation moves new jobs to
a new bucket, and the charges follow them), so the child's counters advance as they would on
their own. Without this the engine, asked whether anyone listens, skipped charging and a vtc
child degenerated to FIFO inside each bucket.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from typing import ClassVar

import numpy as np

from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import Policy
from reference_scheduler.policies.dwrr import Dwrr, _Class


class Sfq(Dwrr):
    name: ClassVar[str] = "sfq"

    def __init__(
        self,
        child: Callable[[], Policy],
        buckets: int = 64,
        perturb_s: float = 10.0,
        quantum: float | None = None,
        cost: str = "tokens",
        key: str = "tenant",
        seed: int = 0,
    ) -> None:
        if buckets < 1:
            raise ValueError(f"buckets must be >= 1, got {buckets}")
        if not perturb_s >= 1e-9:  # its period is in whole nanoseconds (NaN fails too)
            raise ValueError(f"perturb_s must be at least 1e-9 (one nanosecond), got {perturb_s}")
        super().__init__(child, quantum=quantum, cost=cost, key=key)
        self._config = {
            "child": child,
            "buckets": buckets,
            "perturb_s": perturb_s,
            "quantum": quantum,
            "cost": cost,
            "key": key,
            "seed": seed,
        }
        self.buckets = buckets
        self._served_in: dict[Hashable, _Class] = {}  # flow -> bucket of its latest dequeue
        self.perturb_ns = int(perturb_s * 1e9)
        self._rng = np.random.default_rng(seed)
        self._salt = int(self._rng.integers(0, 2**63))
        self._next_perturb = self.perturb_ns
        self.perturbations = 0

    def _weight(self, job: Job) -> float:
        return 1.0

    def _class_key(self, job: Job, now_ns: int) -> Hashable:
        if now_ns >= self._next_perturb:
            periods = (now_ns - self._next_perturb) // self.perturb_ns + 1
            self._next_perturb += periods * self.perturb_ns
            self._salt = int(self._rng.integers(0, 2**63))
            self.perturbations += 1
        flow = repr(self._key(job)).encode()
        digest = hashlib.blake2b(flow, digest_size=8, key=self._salt.to_bytes(8, "little"))
        return int.from_bytes(digest.digest(), "little") % self.buckets

    def dequeue(self, now_ns: int) -> Job | None:
        job = self.peek(now_ns)
        if job is None:
            return None
        bucket = self._class_of[job.id]
        got = super().dequeue(now_ns)
        assert got is job
        self._served_in[self._key(job)] = bucket
        return job

    def take(self, job: Job, now_ns: int) -> None:
        """Dwrr's take, remembering the bucket as dequeue does (core/policy.py: take)."""
        bucket = self._class_of[job.id]
        super().take(job, now_ns)
        self._served_in[self._key(job)] = bucket

    def charge(self, job: Job, now_ns: int, prefill: int = 0, decode: int = 0) -> None:
        bucket = self._served_in.get(self._key(job))
        if bucket is not None:
            bucket.child.charge(job, now_ns, prefill, decode)

    def release(self, job: Job, now_ns: int) -> None:
        bucket = self._served_in.get(self._key(job))
        if bucket is not None:
            bucket.child.release(job, now_ns)
