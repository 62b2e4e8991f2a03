"""The executor's options and the counters a progress display reads, without the executor.

Why a module of their own: the simulated path (fairbench.run.measure) builds `ExecOptions` and
subclasses `LiveCounters` but never runs the executor, whose imports (asyncio, the live
process, the Prometheus scraper, the shard pool: about 50 ms of CPU) a simulated run then does
not pay (issue 35). `fairbench.run.executor` re-exports both, so either path names the same
classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class ExecOptions:
    timeout_s: float = 600.0  # per request, from its intended time
    grace_s: float = 30.0  # after the last send (or a stop), before cancelling what is left
    concurrency_cap: int | None = None  # closed-loop experiments only
    lead_s: float = 0.25  # t0 lies this far after the executor starts
    # How to wait for a send time (fairbench.run.pacer): `auto` = a timerfd at the deadline
    # where the platform has one (no CPU while waiting), else sleep to within `spin_s` of it and
    # spin (yielding to I/O); `spin` forces the latter.
    pacing: str = "auto"
    spin_s: float = 0.0012
    # workloads whose sessions are agents: a cancel reason names their "step N", not "turn N"
    agent_workloads: tuple[str, ...] = ()


@dataclass
class LiveCounters:
    """What the progress display reads; updated by the executor as it goes."""

    planned: int = 0
    sent: int = 0
    done: int = 0
    errors: int = 0
    last_lag_ns: int = 0
    by_status: dict[str, int] = field(default_factory=dict)

    @property
    def in_flight(self) -> int:
        return self.sent - self.done


# what a progress display is given: called with the counters as the run goes
Progress = Callable[[LiveCounters], None]
