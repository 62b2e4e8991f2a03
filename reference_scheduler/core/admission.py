"""Admission control and congestion response: what happens before a job enters the scheduler.

A rejected request never enters the policy; it gets HTTP 503 (the system is overloaded) or 429
(this tenant is over its own limit) with an integer Retry-After, and is counted by reason.

Checks, in order (the cheapest refusal first):
1. per-tenant queue cap           -> 429 "tenant_queue_full"
2. best-effort shedding: above `shed_best_effort_depth` waiting jobs, best-effort work is
   refused first, while other classes are still admitted -> 503 "shed_best_effort"
3. per-tier (per-class) queue cap  -> 503 "tier_queue_full"
4. global queue cap                -> 503 "queue_full"
Congestion response, before rejecting anything: above `degrade_depth` waiting jobs, the
`max_tokens` of batch and best-effort work is capped at `degrade_max_tokens` (graceful
degradation: shorter answers rather than none), counted as "degraded".

Before all of them, a job that could never run (longer than the context, or than the whole KV
pool) is a 400 `context_length_exceeded` (`refuse_too_long`, both engine modes).

Retry-After is the time the queue ahead would take to drain at the recent completion rate,
rounded up to whole seconds and clamped to [1, 60]: honest back-pressure rather than a constant.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import Policy, Verdict


def refuse_too_long(
    job: Job, max_model_len: int, block_size: int, kv_blocks: int
) -> Verdict | None:
    """The 400 `context_length_exceeded` of a job that could never run: its prompt and
    max_tokens exceed the context, or need more KV blocks than the whole pool holds. Checked
    before any queue (a retry cannot help), the same in both engine modes; None if it fits."""
    total = job.prompt_tokens + job.max_tokens
    if total <= max_model_len and -(-total // block_size) <= kv_blocks:
        return None
    job.status = "rejected"
    job.reject_code = 400
    return Verdict(False, 400, 0, "context_length_exceeded")


class AdmissionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_queue: int | None = Field(None, ge=1)
    max_queue_per_tier: dict[str, int] = Field(default_factory=dict)
    max_queue_per_tenant: int | None = Field(None, ge=1)
    shed_best_effort_depth: int | None = Field(None, ge=0)
    best_effort_classes: list[str] = Field(default_factory=lambda: ["best-effort"])
    degrade_depth: int | None = Field(None, ge=0)
    degrade_classes: list[str] = Field(default_factory=lambda: ["batch", "best-effort"])
    degrade_max_tokens: int = Field(256, ge=1)


@dataclass
class Admission:
    spec: AdmissionSpec
    waiting: int = 0
    by_tenant: Counter[str] = field(default_factory=Counter)
    by_class: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)  # by reason
    degraded: int = 0
    finish_times: deque[int] = field(default_factory=deque)  # recent completion times (ns)
    _limited_for: AdmissionSpec | None = field(default=None, repr=False, compare=False)
    _limited: bool = field(default=False, repr=False, compare=False)
    # the spec when it sets no limits (None otherwise, or once `spec` is replaced): the engine
    # reads it to skip `enter`'s checks, a call per request (issue 35)
    open_for: AdmissionSpec | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._limited_for, self._limited = self.spec, self.limited
        self.open_for = None if self._limited else self.spec

    @property
    def limited(self) -> bool:
        s = self.spec
        return any(
            x is not None
            for x in (
                s.max_queue,
                s.max_queue_per_tenant,
                s.shed_best_effort_depth,
                s.degrade_depth,
            )
        ) or bool(s.max_queue_per_tier)

    def _retry_after(self, now_ns: int) -> int:
        window = 10_000_000_000
        while self.finish_times and self.finish_times[0] < now_ns - window:
            self.finish_times.popleft()
        rate = len(self.finish_times) / (window / 1e9)
        if rate <= 0:
            return 1 if self.waiting == 0 else 10
        return int(min(60, max(1, math.ceil(self.waiting / rate))))

    def check(self, job: Job, now_ns: int) -> Verdict | None:
        """None to admit (possibly after degrading the job), else the rejection."""
        spec = self.spec
        reason, code = None, 503
        if (
            spec.max_queue_per_tenant is not None
            and self.by_tenant[job.tenant] >= spec.max_queue_per_tenant
        ):
            reason, code = "tenant_queue_full", 429
        elif (
            spec.shed_best_effort_depth is not None
            and job.slo_class in spec.best_effort_classes
            and self.waiting >= spec.shed_best_effort_depth
        ):
            reason = "shed_best_effort"
        elif (
            job.slo_class in spec.max_queue_per_tier
            and self.by_class[job.slo_class] >= spec.max_queue_per_tier[job.slo_class]
        ):
            reason = "tier_queue_full"
        elif spec.max_queue is not None and self.waiting >= spec.max_queue:
            reason = "queue_full"
        if reason is not None:
            self.rejected[reason] += 1
            return Verdict(False, code, self._retry_after(now_ns), reason)
        if (
            spec.degrade_depth is not None
            and self.waiting >= spec.degrade_depth
            and job.slo_class in spec.degrade_classes
            and job.max_tokens > spec.degrade_max_tokens
        ):
            job.max_tokens = spec.degrade_max_tokens
            self.degraded += 1
        return None

    def enter(self, job: Job, now_ns: int, policy: Policy) -> Verdict:
        """The one way into a scheduler's queue, for the engine and the gateway alike: the
        admission checks (where any are configured), then the policy's own verdict; a refused
        job is marked rejected with its code and Retry-After, an accepted one is counted."""
        if self._limited_for is not self.spec:  # `limited`, once per spec: it runs per request
            self._limited_for, self._limited = self.spec, self.limited
            self.open_for = None if self._limited else self.spec
        verdict = self.check(job, now_ns) if self._limited else None
        if verdict is None:
            verdict = policy.enqueue(job, now_ns)
            if verdict.accepted:
                self.entered(job)
                return verdict
        job.status = "rejected"
        job.reject_code = verdict.code
        job.retry_after_s = verdict.retry_after_s
        return verdict

    def entered(self, job: Job) -> None:
        self.waiting += 1
        self.by_tenant[job.tenant] += 1
        self.by_class[job.slo_class] += 1

    def left_queue(self, job: Job) -> None:
        self.waiting -= 1
        self.by_tenant[job.tenant] -= 1
        self.by_class[job.slo_class] -= 1

    def finished(self, now_ns: int) -> None:
        """Completions of the last 10 s (the rate Retry-After is estimated from); older ones are
        dropped as new ones arrive, so a long-running server holds a window, not a history."""
        self.finish_times.append(now_ns)
        horizon = now_ns - 10_000_000_000
        while self.finish_times[0] < horizon:
            self.finish_times.popleft()
