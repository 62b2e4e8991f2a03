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
    segments: list[tuple[int, int, int, int]] | tuple[()] = field(default=(), repr=False)
    # (replica, lead token ns or -1, first decode step, decode steps): kept once preempted.
    # Empty, it is the one shared () and a list only from the first `add_segment`: an empty
    # list per job was 72 bytes × 1.9M jobs of a 10-minute fleet run (137 MB, and their page
    # faults), where nearly no job is ever preempted (issue 35)
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

    def add_segment(self, segment: tuple[int, int, int, int]) -> None:
        """Append to `segments`, making its list on the first (the default is a shared ())."""
        if self.segments:
            self.segments.append(segment)  # type: ignore[union-attr]
        else:
            self.segments = [segment]

    @property
    def cost(self) -> int:
        """Work estimate known at arrival: prompt plus requested output tokens."""
        return self.prompt_tokens + self.max_tokens

    def ttft_parts(self) -> dict[str, int]:
        """A finished job's TTFT after its queue wait: prefill, KV transfer, decode wait (ns).

        One definition for every driver: the simulator's records (fairbench/targets/sim.py)
        and the real-time server's timing block (server/app.py) both call it, so a sim run
        and a live run of one plan report the same components.

        Colocated, the prefill runs from admission to the first token (the step that ends the
        prompt yields it) and the other two are 0. Disaggregated (drivers/disaggregated.py,
        drivers/realtime_disaggregated.py) the prefill ends when the prefill pool finished the
        prompt, the transfer when its KV reached the decode pool, the wait when a decode
        replica admitted it; the decode pool's first step gives the first token. A preempted
        job's first token may come after a recompute: the parts still sum, since each is a
        difference of consecutive stamps."""
        if self.prefill_done_ns < 0:
            end = self.first_token_ns if self.first_token_ns >= 0 else self.done_ns
            return {"prefill_ns": end - self.admit_ns, "kv_transfer_ns": 0, "decode_wait_ns": 0}
        if self.kv_arrived_ns < 0:  # at most one token: finished in the prefill pool
            return {
                "prefill_ns": self.prefill_done_ns - self.admit_ns,
                "kv_transfer_ns": 0,
                "decode_wait_ns": 0,
            }
        return {
            "prefill_ns": self.prefill_done_ns - self.admit_ns,
            "kv_transfer_ns": self.kv_arrived_ns - self.prefill_done_ns,
            "decode_wait_ns": self.decode_admit_ns - self.kv_arrived_ns,
        }


# The components as a function of a job, for callers that map it over many (fairbench's sim).
ttft_parts = Job.ttft_parts
