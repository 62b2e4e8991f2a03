"""Prefill/decode disaggregation in virtual time: two engines joined by KV links.

Why composed, not built in: the engines (scheduler/engine.py, vllm.py) are one pool's state
machine; a disaggregated deployment is two such pools. This driver runs a prefill pool of
`prefill_replicas` and a decode pool of `decode_replicas`, each an `Engine` with the configured
policy of its own (the policy applies at both pools, as in vLLM's and SGLang's PD modes, where
each instance runs its own scheduler, and llm-d, whose pods keep vLLM's; docs/incident.md):

1. A request arrives at the prefill pool's queue and is prefilled there as a one-token request
   (vLLM's proxy sends the prefill instance `max_tokens: 1`; that token is not streamed).
2. Its KV (prompt tokens × the profile's `kv_bytes_per_token`, per GPU) crosses its prefill
   replica's link (each GPU's NIC in parallel, so one GPU's shard at one NIC's bandwidth): a FIFO
   queue with bandwidth, latency and jitter (scheduler/disaggregation.py, `KvLink`).
3. Only when the KV has arrived does the request enter the decode pool's queue; a decode replica
   admits it when its policy picks it and a batch slot and KV blocks are free. The decode replica
   recomputes the prompt's last token (vLLM's connector loads all but it), which yields the
   client's first token, then decodes the rest. So, per request,

       TTFT = front end + queue (prefill pool) + prefill + KV transfer + decode wait + first step

   and records carry each term (Job.admit_ns, prefill_done_ns, kv_arrived_ns, decode_admit_ns).

How a request reaches a decode replica is `disaggregation.decode_admission`: `pooled` (the
default, above: the decode pool's one queue, joined on arrival), or bound to one replica when its
prefill ends — `reserve` (round-robin, holding a slot of that replica while its KV is in flight)
or `kv_aware` (the replica with the least backlog, no slot held in flight). Bound, each decode
replica is an `Engine` of its own (its own queue and policy, as each decode instance of vLLM or
SGLang schedules its own), and a held slot is one of its `max_num_seqs` taken until the KV
arrives (`_Bound`).

A request asking for at most one token (or an embedding) finishes in the prefill pool. Requests
too long for the model are refused (400) up front, as the colocated engine refuses them. The
decode pool has no admission limits and no prefix cache of its own (its KV came over the link);
the scenario's admission and prefix cache apply at the prefill pool, where requests enter.
What the pools' policies are charged: the prefill pool charges the prompt, the decode pool charges
the prompt again at admission (the engine's own accounting) and each decoded token.

Timeouts and the run's stop cancel a request wherever it is: in a pool (the engine cancels it),
or on the link (its KV is dropped when it arrives). At one instant the order is: arrivals,
timeouts, the stop, KV arrivals, prefill step ends, decode step ends.
"""

from __future__ import annotations

import heapq

import numpy as np

from reference_scheduler.core.job import Job
from reference_scheduler.scheduler.config import SchedulerConfig, parse_scheduler_config
from reference_scheduler.scheduler.disaggregation import KvLink
from reference_scheduler.scheduler.vllm import make_engine

_KV, _PREFILL, _DECODE = 0, 1, 2  # event kinds on the heap, in their order at one instant


def pool_configs(
    config: SchedulerConfig, decode_replicas: int | None = None
) -> tuple[SchedulerConfig, SchedulerConfig]:
    """The prefill pool's and the decode pool's configurations, validated like any block
    (`decode_replicas`: another replica count for the decode pool, 1 for a bound replica)."""
    spec = config.spec
    dis = spec.disaggregation
    assert dis is not None
    base = spec.model_dump(exclude={"disaggregation"}, exclude_none=True)
    prefill = parse_scheduler_config({**base, "replicas": dis.prefill_replicas})
    replicas = dis.decode_replicas if decode_replicas is None else decode_replicas
    decode_block = {**base, "replicas": replicas}
    decode_block.pop("admission", None)
    decode_block.pop("prefix_cache", None)
    return prefill, parse_scheduler_config(decode_block)


class _Bound:
    """The decode pool when a request is bound to one replica as its prefill ends (`reserve`,
    `kv_aware`): one single-replica engine per decode replica, the bindings, the transfers in
    flight to each, and under `reserve` the slots they hold. Events and kicks name a replica by
    its index k here (each engine's own replica is 0)."""

    def __init__(self, d_config: SchedulerConfig, replicas: int, mode: str) -> None:
        self.engines = [make_engine(d_config) for _ in range(replicas)]
        self.mode = mode
        self.inflight = [0] * replicas  # transfers bound to k whose KV has not arrived
        self.bound: dict[int, int] = {}  # job id -> its decode replica
        self._next = 0  # round-robin's turn

    def bind(self, job_id: int) -> int:
        """Choose the request's decode replica as its transfer starts (and hold a slot)."""
        n = len(self.engines)
        if self.mode == "reserve":
            k = self._next
            self._next = (k + 1) % n
        else:  # kv_aware: the least backlog, the lower index on ties
            k = min(range(n), key=lambda i: (self._backlog(i), i))
        self.bound[job_id] = k
        self.inflight[k] += 1
        if self.mode == "reserve":
            self.engines[k].replicas[0].slots += 1  # held until the KV arrives
        return k

    def _backlog(self, k: int) -> int:
        engine = self.engines[k]
        return self.inflight[k] + len(engine.policy) + engine.replicas[0].slots

    def arrived(self, job_id: int) -> int:
        """The KV of a bound request arrived (or was dropped): its hold ends; its replica."""
        k = self.bound[job_id]
        self.inflight[k] -= 1
        if self.mode == "reserve":
            self.engines[k].replicas[0].slots -= 1
        return k

    def engine_of(self, job_id: int) -> object:
        return self.engines[self.bound.get(job_id, 0)]


def _copy(job: Job, max_tokens: int, arrival_ns: int) -> Job:
    return Job(
        job.id,
        job.tenant,
        job.slo_class,
        job.prompt_tokens,
        max_tokens,
        arrival_ns,
        weight=job.weight,
        priority=job.priority,
        flow=job.flow,
        block_hashes=job.block_hashes,
    )


def refused(job: Job, prefill: object, decode: object) -> bool:
    """Whether a request is too long for either pool (a 400, as the colocated engine refuses)."""
    total = job.prompt_tokens + job.max_tokens
    return total > prefill.max_model_len or decode.blocks_for(job) > decode.kv_blocks  # type: ignore[attr-defined]


def to_prefill(job: Job, now: int) -> Job:
    """The prefill pool's copy of a request: the prompt and one token (vLLM's proxy sends the
    prefill instance `max_tokens: 1`), arriving at `now`."""
    return _copy(job, min(job.max_tokens, 1), now)


def to_decode(job: Job, now: int) -> Job:
    """The decode pool's copy of a request whose KV arrived at `now` (stamped on `job`): all
    its tokens, the prompt's KV but its last token already there."""
    job.kv_arrived_ns = now
    dj = _copy(job, job.max_tokens, now)
    dj.cached_tokens = max(job.prompt_tokens - 1, 0)  # the KV that came over the link
    return dj


def simulate_disaggregated(
    jobs: list[Job],
    config: SchedulerConfig,
    timeout_ns: int | None = None,
    stop_ns: int | None = None,
) -> tuple[list[Job], list[np.ndarray], int, int]:
    """`virtual.simulate` for a config with `disaggregation`: the jobs (their outcome written
    in), the decode pool's decode-step end times per replica (token times index them), the last
    event's time and the steps run; virtual.simulate wraps them in its SimResult (this module
    does not import it: drivers/virtual imports this one)."""
    dis = config.spec.disaggregation
    assert dis is not None
    bound: _Bound | None = None
    if dis.decode_admission == "pooled":
        p_config, d_config = pool_configs(config)
        pe, de = make_engine(p_config), make_engine(d_config)
        d_idle = list(range(len(de.replicas)))
    else:
        p_config, d_config = pool_configs(config, 1)
        pe = make_engine(p_config)
        bound = _Bound(d_config, dis.decode_replicas, dis.decode_admission)
        de = bound.engines[0]  # for the up-front 400: every decode replica is alike
        d_idle = list(range(dis.decode_replicas))
    link = KvLink(
        dis.kv_transfer, config.profile.kv_bytes_per_token, dis.prefill_replicas, config.spec.seed
    )
    index = {job.id: k for k, job in enumerate(jobs)}
    pjobs: dict[int, Job] = {}
    djobs: dict[int, Job] = {}
    dropped: set[int] = set()  # cancelled while their KV was on the link
    events: list[tuple[int, int, int]] = []  # (t, kind, replica or job id)
    idle = {_PREFILL: list(range(len(pe.replicas))), _DECODE: d_idle}
    engines = {_PREFILL: pe, _DECODE: de}
    push, pop = heapq.heappush, heapq.heappop

    def decode_of(job_id: int) -> object:
        return de if bound is None else bound.engine_of(job_id)

    def kick(kind: int, now: int) -> None:
        if kind == _DECODE and bound is not None:
            for k in range(len(bound.engines)):
                kick_bound(k, now)
            return
        engine, free = engines[kind], idle[kind]
        tried = []
        while free and len(engine.policy):
            r = pop(free)
            res = engine.step(r, now)
            if res is None:
                tried.append(r)
                break
            after_step(kind, r, res, now)
        for r in tried:
            push(free, r)

    def kick_bound(k: int, now: int) -> None:
        """Start bound decode replica k if it is idle and has a request waiting."""
        assert bound is not None
        engine = bound.engines[k]
        if k in d_idle and len(engine.policy):
            res = engine.step(0, now)
            if res is not None:
                d_idle.remove(k)
                push(events, (res.end_ns, _DECODE, k))

    def after_step(kind: int, r: int, res: object, now: int) -> None:
        push(events, (res.end_ns, kind, r))  # type: ignore[attr-defined]
        if kind == _PREFILL:
            for pj in res.finished:  # type: ignore[attr-defined]
                prefilled(pj)

    def prefilled(pj: Job) -> None:
        job = jobs[index[pj.id]]
        job.prefill_done_ns = pj.done_ns
        if job.max_tokens <= 1:
            return
        arrive = link.transfer(pj.replica, pj.done_ns, job.prompt_tokens)
        if bound is not None:
            bound.bind(pj.id)
        push(events, (arrive, _KV, pj.id))

    def kv_arrived(job_id: int, now: int) -> None:
        if bound is not None:
            k = bound.arrived(job_id)
            if job_id not in dropped:
                dj = djobs[job_id] = to_decode(jobs[index[job_id]], now)
                bound.engines[k].submit(dj, now)
            kick_bound(k, now)  # its request, or a slot the dropped one held
            return
        if job_id in dropped:
            return
        dj = djobs[job_id] = to_decode(jobs[index[job_id]], now)
        if de.submit(dj, now).accepted:
            kick(_DECODE, now)

    never = 1 << 62
    stop_at = never if stop_ns is None else stop_ns
    i, n, d, now = 0, len(jobs), 0, 0
    while i < n or events:
        t_arrive = jobs[i].arrival_ns if i < n else never
        t_event = events[0][0] if events else never
        t_due = jobs[d].arrival_ns + timeout_ns if timeout_ns is not None and d < i else never
        if t_arrive <= t_due and t_arrive <= stop_at and t_arrive <= t_event and i < n:
            job = jobs[i]
            i += 1
            now = job.arrival_ns
            pj = pjobs[job.id] = to_prefill(job, now)
            if refused(job, pe, de):
                pj.status, pj.reject_code = "rejected", 400  # as the colocated engine refuses
                continue
            if pe.submit(pj, now).accepted:
                kick(_PREFILL, now)
            continue
        if t_due <= stop_at and t_due <= t_event and t_due < never:
            now = t_due
            cancel(jobs[d], now, pe, decode_of(jobs[d].id), pjobs, djobs, dropped)
            d += 1
            kick(_PREFILL, now)
            kick(_DECODE, now)
            continue
        if stop_at <= t_event and stop_at < never:
            now = stop_at
            for job in jobs[:i]:
                cancel(job, now, pe, decode_of(job.id), pjobs, djobs, dropped)
            break
        now, kind, ref = pop(events)
        if kind == _KV:
            kv_arrived(ref, now)
            continue
        if kind == _DECODE and bound is not None:
            res = bound.engines[ref].step(0, now)
            if res is None:
                d_idle.append(ref)
            else:
                push(events, (res.end_ns, _DECODE, ref))
            continue
        engine = engines[kind]
        res = engine.step(ref, now)
        if res is None:
            push(idle[kind], ref)
            continue
        after_step(kind, ref, res, now)
        if res.finished and idle[kind] and len(engine.policy):
            kick(kind, now)
    for job in jobs:
        merge(job, pjobs.get(job.id), djobs.get(job.id))
        if bound is not None and job.id in djobs:  # its engine's replica 0 is replica k
            k = job.replica = bound.bound[job.id]
            job.segments = [(k, *seg[1:]) for seg in job.segments]
    d_reps = de.replicas if bound is None else [e.replicas[0] for e in bound.engines]
    decode_ends = [np.asarray(rep.decode_ends, dtype=np.int64) for rep in d_reps]
    steps = sum(rep.steps for rep in pe.replicas) + sum(rep.steps for rep in d_reps)
    return jobs, decode_ends, now, steps


def cancel(
    job: Job,
    now: int,
    pe: object,
    de: object,
    pjobs: dict[int, Job],
    djobs: dict[int, Job],
    dropped: set[int],
) -> None:
    """The client gave up on `job`: stop it in whichever pool (or link) holds it."""
    live = ("waiting", "running", "preempted")
    dj, pj = djobs.get(job.id), pjobs.get(job.id)
    if dj is not None:
        if dj.status in live:
            de.cancel(dj, now)  # type: ignore[attr-defined]
    elif pj is not None and pj.status in live:
        pe.cancel(pj, now)  # type: ignore[attr-defined]
    elif pj is not None and pj.status == "finished" and job.max_tokens > 1:
        dropped.add(job.id)  # its KV is on the link
        job.status = "cancelled"


def merge(job: Job, pj: Job | None, dj: Job | None) -> None:
    """Write the request's outcome over both pools into the caller's job."""
    if pj is None:
        return  # never arrived (the run stopped first)
    job.admit_ns = pj.admit_ns
    job.passed_over_ns = pj.passed_over_ns
    job.backlog_ns = pj.backlog_ns
    job.wait_since_ns = pj.wait_since_ns
    job.cached_tokens = pj.cached_tokens
    job.preemptions = pj.preemptions
    job.reject_code = pj.reject_code
    job.retry_after_s = pj.retry_after_s
    job.replica = 0
    if dj is None:
        if job.status != "cancelled" or pj.status != "finished":
            job.status = pj.status
        if pj.status == "finished" and job.max_tokens <= 1:
            job.first_token_ns = pj.first_token_ns
            job.done_ns = pj.done_ns
            job.generated = pj.generated
        return
    job.status = dj.status
    job.replica = dj.replica
    job.decode_admit_ns = dj.admit_ns
    job.first_token_ns = dj.first_token_ns
    job.done_ns = dj.done_ns
    job.first_step = dj.first_step
    job.last_step = dj.last_step
    job.segments = dj.segments
    job.generated = dj.generated
    job.lead_ns = dj.lead_ns
    job.preemptions += dj.preemptions
    job.backlog_ns += dj.backlog_ns
    if job.wait_since_ns < 0 and dj.wait_since_ns >= 0:
        job.wait_since_ns = dj.wait_since_ns
    if dj.passed_over_ns >= 0 and job.passed_over_ns < 0:
        job.passed_over_ns = dj.passed_over_ns
    if dj.status == "rejected":
        job.reject_code = dj.reject_code
