"""tiered — SLO tiers with quotas, child policies and capped borrowing (the HTB idea).

Each tier (interactive / batch / best-effort by default, listed most urgent first) owns a quota
q_k of the pool's running capacity (its batch slots, W × max_num_seqs) and a child policy that
orders its own jobs (DWRR across tenants by default). When the engine has room it asks for one
job, and the tier is chosen in two passes over the tiers that have waiting work:

1. guarantees: the most urgent tier running below its floor f_k (below);
2. borrowing: otherwise the most urgent tier running below its ceiling
   c_k = min(1, q_k·(1 + borrow_ratio)); a tier at its ceiling waits even if slots are free.

So a more urgent tier with waiting work takes slots ahead of less urgent ones up to its ceiling:
it borrows a lower tier's idle quota and, while that tier is busy, compresses it, by at most its
borrow room c_k - q_k. The floor is what compression leaves a tier: its quota less its share
(in proportion to quota) of every more urgent tier's borrow room,
f_k = max(0, q_k - sum_{i<k} (c_i - q_i)·q_k / sum_{j>i} q_j). With borrow_ratio 0 floors,
quotas and ceilings coincide and saturated tiers share the pool exactly by quota; with the
`three-tier` preset (30/50/20, borrow 0.5) interactive may run up to 45% and compress batch to
39%, and batch's own borrow room (25%) exceeds best-effort's quota, so best-effort is a scavenger
tier (floor 0) while the two above it are saturated.

Why not "the tier furthest below its quota" (the rule before issue 38): quotas count running
jobs, and a tier of many short chats always runs more jobs than a tier of a few long documents,
so that rule put the document tier first at every decision although neither was near its quota,
and chat queued behind 4k-token prefills: interactive SLO attainment fell below FIFO's
(docs/control.md has the measurement). HTB, too, serves classes under their rate by priority.

The ceiling is HTB's `ceil`: the capacity left idle is the price of not letting one tier's burst
take slots that another tier will need a moment later. Unbounded borrowing (ceil = 1) is work
conserving but lets a borrowing tier fill the pool, and with long jobs the lower tiers then
starve in a "waterfall" as each tier's burst borrows from the next; the hard cap bounds it.
Quotas count running jobs, so they are shares of service when jobs are alike; a tier of long
jobs holds its slots longer (use tokens-based child policies to balance tenants inside a tier).

Jobs of a class no tier names go to the last tier. O(tiers) per decision plus the child's cost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import ACCEPTED, BasePolicy, Policy, Verdict, policy_hook


def floors(quotas: Sequence[float], ceilings: Sequence[float]) -> list[float]:
    """Each tier's floor: its quota less its share, in proportion to quota, of the borrow room
    (ceiling - quota) of every more urgent tier; never below 0."""
    out = []
    for k, quota in enumerate(quotas):
        squeeze = 0.0
        for i in range(k):
            below = sum(quotas[i + 1 :])
            squeeze += (ceilings[i] - quotas[i]) * quota / below
        out.append(max(0.0, quota - squeeze))
    return out


@dataclass(frozen=True)
class TierSpec:
    name: str
    quota: float
    child: Callable[[], Policy]
    classes: tuple[str, ...] = field(default=())


class Tiered(BasePolicy):
    name: ClassVar[str] = "tiered"

    def __init__(self, tiers: Sequence[TierSpec], borrow_ratio: float = 0.5) -> None:
        super().__init__()
        if not tiers:
            raise ValueError("tiered needs at least one tier")
        if borrow_ratio < 0:
            raise ValueError(f"borrow_ratio must be >= 0, got {borrow_ratio}")
        total = sum(t.quota for t in tiers)
        if any(t.quota <= 0 for t in tiers) or total > 1.0 + 1e-9:
            raise ValueError(f"tier quotas must be > 0 and sum to at most 1, got {total:g}")
        self.specs = list(tiers)
        self.borrow_ratio = borrow_ratio
        self.children = [t.child() for t in tiers]
        self.uses_charge = any(child.uses_charge for child in self.children)
        self.quotas = [t.quota for t in tiers]
        self.ceilings = [min(1.0, t.quota * (1.0 + borrow_ratio)) for t in tiers]
        self.floors = floors(self.quotas, self.ceilings)
        self._lend = self.ceilings  # the ceilings in force: the quotas while reclaiming
        self._tier_by_class = {c: k for k, t in enumerate(tiers) for c in (t.classes or (t.name,))}
        self.running = [0] * len(tiers)
        self.capacity = 1
        self._len = 0
        self._last = len(tiers) - 1  # the tier of a class no tier names
        self._thresholds()
        # each tier's waiting jobs, kept here: `_choose` runs twice per admission and read
        # len(child), a Python call per tier (issue 35); `release` skips a child's no-op one
        self._waiting = [0] * len(tiers)
        self._child_release = [policy_hook(child, "release") for child in self.children]
        self.at_ceiling = [0] * len(tiers)  # decisions in which a tier waited at its ceiling

    def bind(self, capacity_slots: int) -> None:
        self.capacity = max(1, int(capacity_slots))
        self._thresholds()

    def _thresholds(self) -> None:
        """Each tier's floor and ceiling in slots, the products `_choose` compares running
        counts with (the same floats), kept here: they change only with the capacity (bind)
        and the ceilings in force (reclaim), and `_choose` runs twice per admission."""
        self._floor_slots = [f * self.capacity for f in self.floors]
        self._lend_slots = [c * self.capacity for c in self._lend]

    def tier_of(self, job: Job) -> int:
        return self._tier_by_class.get(job.tier or job.slo_class, self._last)

    def _choose(self) -> int | None:
        """The guarantee pass, then the borrowing pass (the module docstring)."""
        borrower = None
        running = self.running
        floor_slots = self._floor_slots
        for k, waiting in enumerate(self._waiting):
            if not waiting:
                continue
            if running[k] < floor_slots[k]:
                return k
            if borrower is None and running[k] < self._lend_slots[k]:
                borrower = k
        return borrower

    def reclaim(self, on: bool) -> None:
        """The congestion loop's reclaim_borrowed (scheduler/control.py): while on, no tier
        borrows (each ceiling is its quota), so slots borrowers free go back to their owners."""
        self._lend = self.quotas if on else self.ceilings
        self._thresholds()

    def enqueue(self, job: Job, now_ns: int) -> Verdict:
        k = self._tier_by_class.get(job.tier or job.slo_class, self._last)  # tier_of
        verdict = self.children[k].enqueue(job, now_ns)
        if verdict.accepted:
            self._waiting[k] += 1
            self._len += 1
            self.enqueued += 1
            return ACCEPTED
        return verdict

    def peek(self, now_ns: int) -> Job | None:
        k = self._choose()
        return self.children[k].peek(now_ns) if k is not None else None

    def dequeue(self, now_ns: int) -> Job | None:
        k = self._choose()
        if k is None:
            for j, child in enumerate(self.children):
                if len(child):
                    self.at_ceiling[j] += 1
            return None
        job = self.children[k].dequeue(now_ns)
        if job is not None:
            self.running[k] += 1
            self._waiting[k] -= 1
            self._len -= 1
            self.dequeued += 1
        return job

    def take(self, job: Job, now_ns: int) -> None:
        """`dequeue(now_ns)` of the job `peek(now_ns)` just returned (core/policy.py): its tier
        is the one `_choose` picked, so the tiers are not looked at again."""
        k = self._tier_by_class.get(job.tier or job.slo_class, self._last)  # tier_of
        child = self.children[k]
        take = getattr(child, "take", None)
        if take is not None:
            take(job, now_ns)
        else:
            got = child.dequeue(now_ns)
            assert got is job, "a child policy's peek and dequeue disagree"
        self.running[k] += 1
        self._waiting[k] -= 1
        self._len -= 1
        self.dequeued += 1

    def remove(self, job: Job) -> None:
        k = self.tier_of(job)
        child = self.children[k]
        before = len(child)
        child.remove(job)
        if len(child) < before:
            self._waiting[k] -= 1
            self._len -= 1
            self.removed += 1

    def charge(self, job: Job, now_ns: int, prefill: int = 0, decode: int = 0) -> None:
        self.children[self.tier_of(job)].charge(job, now_ns, prefill, decode)

    def release(self, job: Job, now_ns: int) -> None:
        k = self._tier_by_class.get(job.tier or job.slo_class, self._last)  # tier_of
        self.running[k] -= 1
        release = self._child_release[k]
        if release is not None:
            release(job, now_ns)

    def resumed(self, job: Job, now_ns: int) -> None:
        self.running[self.tier_of(job)] += 1

    def protects(self, victim: Job, chosen: Sequence[Job], cand: Job) -> bool:
        """Whether preempting `victim` (beside the victims `chosen` so far) to admit `cand` would
        leave the victim's tier below its floor: the floor is what compression leaves a tier,
        and a tier below it is served first (the guarantee pass), so the room would go straight
        back to it and the pass would preempt and resume the same job forever. A victim of
        cand's own tier leaves the tier's count as it was."""
        k = self.tier_of(victim)
        if k == self.tier_of(cand):
            return False
        taken = sum(1 for job in chosen if self.tier_of(job) == k)
        return self.running[k] - taken - 1 < self.floors[k] * self.capacity

    def borrowed(self) -> list[float]:
        """Slots each tier runs above its quota right now."""
        return [
            max(0.0, r - q * self.capacity) for r, q in zip(self.running, self.quotas, strict=True)
        ]

    def borrowing(self) -> dict[tuple[str, str], float]:
        """(lender, borrower) -> share of capacity the borrower uses out of the lender's unused
        quota. A tier above its quota borrows from the tiers below theirs, in proportion to what
        each leaves unused (HTB lends the same way)."""
        unused = [
            max(0.0, q * self.capacity - r) for r, q in zip(self.running, self.quotas, strict=True)
        ]
        spare = sum(unused)
        out: dict[tuple[str, str], float] = {}
        for b, extra in enumerate(self.borrowed()):
            if extra <= 0 or spare <= 0:
                continue
            for lender, free in enumerate(unused):
                if free > 0 and lender != b:
                    share = extra * free / spare / self.capacity
                    out[self.specs[lender].name, self.specs[b].name] = share
        return out

    def stats(self) -> Mapping[str, float]:
        out = dict(super().stats())
        for spec, running, borrowed in zip(self.specs, self.running, self.borrowed(), strict=True):
            out[f"running:{spec.name}"] = running
            out[f"borrowed:{spec.name}"] = borrowed
        return out

    def reset(self) -> None:
        capacity = self.capacity
        self.__init__(self.specs, self.borrow_ratio)  # type: ignore[misc]
        self.bind(capacity)

    def __len__(self) -> int:
        return self._len
