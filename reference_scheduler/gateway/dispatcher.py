"""The dispatcher: the policy queue in front of upstream engines, a state machine with no clock.

It plays the engine's part for the policy, through the same protocol and in the same order of
calls, so a policy cannot tell a simulated replica from a vLLM behind the gateway:
- `submit` runs admission control (429/503 with Retry-After, core/admission.py) and then
  `policy.enqueue`, exactly as `Engine.submit` does;
- `pick` pulls from the policy (`peek`, then `dequeue` of that same job) while an upstream has
  room (pool.py), charges the prompt as prefill at dispatch (`Engine._start` does the same at
  admission) and places the job on the least loaded upstream;
- `charge_decode` charges output tokens as they stream back, and `settle` tops the charges up to
  the upstream's own `usage` counts once it reports them (the prompt was counted before
  admission by gateway/tokens.py, maybe estimated; charges only ever grow, so a policy never
  sees service taken back);
- `finish` releases: the upstream slot and `policy.release`, or `policy.remove` for a job still
  waiting. It is idempotent, so every exit path of a handler may call it.
- contention as the policy saw it (scheduler/passover.py, as the engine keeps it): a job is passed
  over when a `pick` pass ends while it still waits, and waits for the scheduler until it is
  dispatched or leaves; `timing` gives the gateway's record of it to the client (issue 33: the
  fairness figures count only such waits as backlog, not a request's own service time).
A job that fails before its first byte leaves its upstream's slot and waits in the retry queue,
ahead of the policy's queue, for another upstream: like a preempted job on a replica's resume
queue, it does not go back through the policy (that would charge it twice). It is retried once.

The policy's order holds across upstreams: when the job the policy puts first fits nowhere (a
token budget), nothing behind it overtakes it.
"""

from __future__ import annotations

from collections import deque

from reference_scheduler.core.admission import Admission, AdmissionSpec
from reference_scheduler.core.job import Job
from reference_scheduler.core.policy import Verdict
from reference_scheduler.core.preemption import Preemption, PreemptionSpec
from reference_scheduler.gateway.pool import Pool, Upstream
from reference_scheduler.scheduler.config import SchedulerConfig
from reference_scheduler.scheduler.passover import PassOver, wait_ends

# The response header that carries `Dispatcher.timing` to the client (fairbench reads it:
# fairbench/targets/http/wire.py GATEWAY_TIMING_HEADER, the same name in lower case)
TIMING_HEADER = "X-Fairbench-Gateway"


class Dispatcher:
    def __init__(self, scheduler: SchedulerConfig, pool: Pool) -> None:
        self.policy = scheduler.policy_factory()
        self.pool = pool
        self.policy.bind(pool.capacity)
        self._uses_charge = bool(getattr(self.policy, "uses_charge", True))
        spec = scheduler.spec
        self.admission = Admission(spec.admission or AdmissionSpec())
        # What the engine's metrics read; the gateway never preempts (config.py), so these stay 0.
        self.preemption = Preemption(PreemptionSpec(), 0)
        self.cache = None
        self.token_cap = pool.largest_token_budget()
        self.retry: deque[Job] = deque()
        self.exclude: dict[int, int] = {}  # job id -> the upstream a retry must avoid
        self.retried: set[int] = set()
        self.dispatched = 0
        self._seq = 0
        self.passover = PassOver()

    @property
    def replicas(self) -> list[Upstream]:
        """The engine's metrics count running jobs over `replicas[].slots`: here, the upstreams."""
        return self.pool.upstreams

    # ------------------------------------------------------------------ entering

    def submit(self, job: Job, now_ns: int) -> Verdict:
        self._seq += 1
        job.seq = self._seq
        if self.token_cap is not None and job.cost > self.token_cap:
            job.status = "rejected"
            job.reject_code = 400
            return Verdict(False, 400, 0, "context_length_exceeded")
        verdict = self.admission.enter(job, now_ns, self.policy)
        if verdict.accepted:
            self.passover.arrived(job)
        return verdict

    # ------------------------------------------------------------------ dispatching

    def pick(self, now_ns: int) -> list[tuple[Job, Upstream]]:
        """Every job that can leave the queue now, with its upstream (retries first)."""
        placed: list[tuple[Job, Upstream]] = []
        pool = self.pool
        if self.retry:
            for job in list(self.retry):
                up = pool.choose(job.cost, now_ns, exclude=self.exclude[job.id])
                if up is not None:
                    self.retry.remove(job)
                    self._place(job, up)
                    placed.append((job, up))
        policy = self.policy
        while len(policy):
            cand = policy.peek(now_ns)
            if cand is None:
                break  # e.g. tier ceilings: nothing may run now
            up = pool.choose(cand.cost, now_ns)
            if up is None:
                break
            got = policy.dequeue(now_ns)
            assert got is cand, f"{type(policy).__name__}: peek and dequeue disagree"
            self.admission.left_queue(cand)
            wait_ends(cand, now_ns)
            cand.admit_ns = now_ns
            if self._uses_charge:
                policy.charge(cand, now_ns, prefill=cand.prompt_tokens)
            self._place(cand, up)
            placed.append((cand, up))
        self.passover.pass_ended(now_ns, len(policy))
        return placed

    def _place(self, job: Job, up: Upstream) -> None:
        job.blocks = job.cost  # what the token budget holds for it, given back as is
        self.pool.take(up, job.blocks)
        job.status = "running"
        job.replica = up.index
        self.dispatched += 1

    def requeue(self, job: Job, now_ns: int) -> bool:
        """The job failed on its upstream before its first byte: free that slot and queue it for
        one retry elsewhere. False (and nothing changes) if it was retried already or no other
        upstream is healthy; the caller then answers with the error."""
        if job.status != "running" or job.id in self.retried:
            return False
        if not self.pool.any_other_healthy(job.replica):
            return False
        self.pool.give(self.pool.upstreams[job.replica], job.blocks)
        self.retried.add(job.id)
        self.exclude[job.id] = job.replica
        job.status = "retry"
        self.retry.append(job)
        return True

    # ------------------------------------------------------------------ service

    def charge_decode(self, job: Job, now_ns: int, n: int) -> None:
        job.generated += n
        if self._uses_charge and n:
            self.policy.charge(job, now_ns, 0, n)

    def settle(self, job: Job, now_ns: int, prompt_tokens: int, completion_tokens: int) -> None:
        """Top charges (and the token budget the job holds) up to the upstream's usage report,
        never down; called once per answer."""
        if job.status == "running":
            more = prompt_tokens + job.max_tokens - job.blocks
            if more > 0:
                self.pool.upstreams[job.replica].inflight_tokens += more
                job.blocks += more
        prefill = max(0, prompt_tokens - job.prompt_tokens)
        decode = max(0, completion_tokens - job.generated)
        job.generated += decode
        if self._uses_charge and (prefill or decode):
            self.policy.charge(job, now_ns, prefill, decode)

    # ------------------------------------------------------------------ leaving

    def finish(self, job: Job, now_ns: int, outcome: str = "finished") -> bool:
        """The job is done (finished, failed or cancelled), wherever it was. True the first time;
        a second call does nothing."""
        status = job.status
        if status == "waiting":
            self.policy.remove(job)
            self.admission.left_queue(job)
            wait_ends(job, now_ns)
        elif status == "running":
            self.pool.give(self.pool.upstreams[job.replica], job.blocks)
            self.policy.release(job, now_ns)
            if outcome == "finished":
                self.admission.finished(now_ns)
        elif status == "retry":
            self.retry.remove(job)
            self.policy.release(job, now_ns)
        else:
            return False
        self.exclude.pop(job.id, None)
        self.retried.discard(job.id)
        job.status = outcome
        job.done_ns = now_ns
        return True

    def waiting(self) -> int:
        return len(self.policy) + len(self.retry)

    @staticmethod
    def timing(job: Job) -> dict[str, int | None]:
        """The gateway's queue record of a dispatched job, offsets from its receipt here (the
        reference server's `fairbench` block has the same fields for its own queue): the wait to
        dispatch, the first moment the policy passed it over (None: never), and the time spent
        passed over. Final at dispatch: the gateway never preempts."""
        return {
            "queue_time_ns": job.admit_ns - job.arrival_ns if job.admit_ns >= 0 else None,
            "passed_over_ns": (
                job.passed_over_ns - job.arrival_ns if job.passed_over_ns >= 0 else None
            ),
            "backlog_ns": job.backlog_ns,
        }
