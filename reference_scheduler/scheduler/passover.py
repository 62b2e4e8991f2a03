"""Passed over: the scheduler's own record of contention, per job, in O(1) per job.

Why: a request that waits for the next step boundary was not denied anything, and fairness among
the backlogged must not count it (fairbench's service difference did, from arrival to first token,
and read demand as unfairness). A job is *passed over* when an admission pass (the start of a step,
or an admission decision) ends while it has arrived and still waits, or when it is preempted; it
then waits for the scheduler until it is admitted or resumed. Each job keeps the first such
instant (`passed_over_ns`) and the sum of those waits (`backlog_ns`), never a per-step list.

Cost: jobs that arrived since the last pass sit in `fresh`; a pass that ends with a non-empty queue
stamps the fresh ones still waiting and empties it, so each job is looked at once.
"""

from __future__ import annotations

from reference_scheduler.core.job import Job


class PassOver:
    __slots__ = ("fresh",)

    def __init__(self) -> None:
        self.fresh: list[Job] = []

    def arrived(self, job: Job) -> None:
        self.fresh.append(job)

    def pass_ended(self, now_ns: int, queued: int) -> None:
        """An admission pass ended at `now_ns` with `queued` jobs still waiting."""
        fresh = self.fresh
        if not fresh:
            return
        if queued:
            for job in fresh:
                if job.status == "waiting" and job.wait_since_ns < 0:
                    wait_from(job, now_ns)
        fresh.clear()


def wait_from(job: Job, now_ns: int) -> None:
    """The job waits for the scheduler from `now_ns` (passed over, or preempted)."""
    if job.passed_over_ns < 0:
        job.passed_over_ns = now_ns
    job.wait_since_ns = now_ns


def wait_ends(job: Job, now_ns: int) -> None:
    """Admitted, resumed or cancelled: the wait (if any) ends at `now_ns`."""
    if job.wait_since_ns >= 0:
        job.backlog_ns += now_ns - job.wait_since_ns
        job.wait_since_ns = -1
