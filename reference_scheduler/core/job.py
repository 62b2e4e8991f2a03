"""Job: the scheduler's view of one request.

A plain mutable record with `__slots__`: the engine touches millions of them per simulated
minute, so attribute access must be cheap. Times are integer nanoseconds on the driver's clock
(virtual in `sim`, monotonic in `server`); -1 means "not reached".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, eq=False)
class Job:
    id: int
    tenant: str
    slo_class: str
    prompt_tokens: int
    max_tokens: int  # output tokens to produce (ignore_eos semantics); 0 for embeddings
    arrival_ns: int
    weight: float = 1.0  # the tenant's weight
    priority: int = 0  # the class's rank: lower is more urgent
    flow: str = ""  # a sub-flow inside the tenant (e.g. the workload), for child policies
    block_hashes: tuple[int, ...] = ()  # chained prefix-block hashes (prefix cache)
    seq: int = 0  # submission order, for deterministic ties (set by the engine)

    # Progress, written by the engine.
    status: str = "waiting"  # waiting | running | finished | rejected | cancelled
    replica: int = -1
    admit_ns: int = -1
    first_token_ns: int = -1
    done_ns: int = -1
    first_step: int = -1  # the replica's step index that produced the first token
    last_step: int = -1
    prefill_left: int = 0
    blocks: int = 0  # KV blocks held
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    preemptions: int = 0
    generated: int = 0  # output tokens produced before the current decode segment
    lead_ns: int = -1  # the current segment's lead token (first token, or a recompute's)
    segments: list[tuple[int, int, int, int]] = field(default_factory=list, repr=False)
    # (replica, lead token ns or -1, first decode step, decode steps): kept once preempted
    tier: str | None = None  # the tier a demotion moved the job to (its slo_class never changes)
    swapped_tokens: int = 0  # KV tokens in host memory while swapped out
    reject_code: int = 0
    # Contention, written by the engine (scheduler.passover): when an admission pass first ended
    # with this job still waiting (or it was preempted), and the time it has waited since it was
    # passed over, summed over its waits; -1 while it waits in such a wait (`wait_since_ns`).
    passed_over_ns: int = -1
    backlog_ns: int = 0
    wait_since_ns: int = -1
    retry_after_s: int = 0
    # Disaggregated serving (drivers/disaggregated.py), -1 when colocated: when the prefill pool
    # finished the prompt, when its KV reached the decode pool, when a decode replica admitted it.
    prefill_done_ns: int = -1
    kv_arrived_ns: int = -1
    decode_admit_ns: int = -1

    # Scratch space owned by whichever policy holds the job.
    queue: Any = field(default=None, repr=False)
    tag: float = 0.0

    @property
    def cost(self) -> int:
        """Work estimate known at arrival: prompt plus requested output tokens."""
        return self.prompt_tokens + self.max_tokens
