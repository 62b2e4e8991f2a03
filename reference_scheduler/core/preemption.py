"""Preemption: which running job gives way to a more urgent waiting one, how, and how often.

When a waiting job cannot be admitted on a replica (no batch slot or not enough KV blocks), it
may preempt running jobs of a *strictly lower* tier (a larger class rank) on that replica: the
lowest tier first, and within it the most recently admitted (the least work to redo — vLLM's
choice too). A job never preempts its own tier, and a resuming job never preempts anyone.

Modes (per configuration):
- `cooperative`: the victim pauses at the step boundary and keeps its KV resident, so only its
  batch slot (and its share of each step) is freed; it resumes where it stopped, at no cost.
  It cannot help a job that is short of KV blocks.
- `swap`: the victim's KV moves to host memory and back when it resumes, each way costing
  `context × kv_bytes_per_token ÷ bandwidth` (+ latency), added to the step in which the copy
  happens. ~50 GB/s is PCIe Gen5 x16; an NVMe target is just a lower bandwidth and higher latency.
- `recompute`: the victim's KV is dropped; on resume it prefills its prompt plus the tokens it
  had generated, less what the prefix cache still holds, and that prefill yields its next token.
Preempted jobs wait in their replica's resume queue, ahead of new arrivals of their own or a
lower tier; they do not re-enter the policy (which would charge their service twice).

Budget and demotion. Each tenant may *suffer* at most `budget.count` preemptions per sliding
`budget.window_s`. When the next preemption would exceed the victim tenant's budget, the
scheduler demotes the waiting job one tier instead of preempting: a burst of urgent work then
queues behind its own kind rather than thrashing the same tenant over and over. Demotion moves a
waiting job to a lower tier without losing its place in time or any computed state; its SLO
class label never changes. `Engine.promote` moves a job back up and is counted.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class BudgetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    count: int = Field(ge=0, description="preemptions a tenant may suffer per window")
    window_s: float = Field(gt=0, allow_inf_nan=False)


class PreemptionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    mode: Literal["none", "cooperative", "swap", "recompute"] = "none"
    swap_bandwidth_gbps: float = Field(50.0, gt=0, allow_inf_nan=False, description="GB/s")
    swap_latency_us: float = Field(0.0, ge=0, allow_inf_nan=False)
    budget: BudgetSpec | None = None


@dataclass
class Preemption:
    spec: PreemptionSpec
    kv_bytes_per_token: int
    suffered: Counter[str] = field(default_factory=Counter)  # preemptions per victim tenant
    by_tenant_class: Counter[tuple[str, str]] = field(default_factory=Counter)
    demotions: int = 0
    promotions: int = 0
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0
    recompute_tokens: int = 0
    log: list[tuple[int, str, int, int]] = field(default_factory=list)  # (t, what, job, tokens)
    _recent: dict[str, deque[int]] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.spec.mode != "none"

    def over_budget(self, tenant: str, now_ns: int) -> bool:
        budget = self.spec.budget
        if budget is None:
            return False
        recent = self._recent.setdefault(tenant, deque())
        horizon = now_ns - int(budget.window_s * 1e9)
        while recent and recent[0] <= horizon:
            recent.popleft()
        return len(recent) >= budget.count

    def record(self, tenant: str, slo_class: str, now_ns: int) -> None:
        self.suffered[tenant] += 1
        self.by_tenant_class[tenant, slo_class] += 1
        self._recent.setdefault(tenant, deque()).append(now_ns)

    def swap_ns(self, tokens: int) -> int:
        """One direction of a swap: tokens × bytes/token ÷ bandwidth, plus the latency."""
        seconds = tokens * self.kv_bytes_per_token / (self.spec.swap_bandwidth_gbps * 1e9)
        return int(seconds * 1e9 + self.spec.swap_latency_us * 1e3)
