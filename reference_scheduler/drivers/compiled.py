"""The virtual-time driver compiled: `virtual.simulate` for the common configuration, as arrays
under numba, with the same output to the nanosecond.

Why (issue 35). A step-by-step simulator in Python pays about 9 µs of CPU per replica step in
Python's per-call and per-attribute cost, however the step's logic is trimmed: 14 of the 39 CPU s
of a 10-minute, 80-replica fleet run (1.9M requests), and the Job objects it needs cost 6 more
to make and to read back. Here the jobs are columns, the replicas and the policy's state are
arrays, and the loop is machine code: the engine's part of that run is about 2 CPU s.

What it covers, and the rest. `supported(config)` says whether a configuration is one this
driver runs: the reference engine, colocated, without preemption, a prefix cache, admission
limits, control loops or step noise, with every policy of the registry and every preset:
FIFO, VTC, LCF, strict priority, WFQ, DWRR (by tenant, over FIFO or WFQ queues: `dwrr-wfq`),
SFQ (over FIFO buckets) and tiers over any of those (`three-tier`, `htb-sfq`); `_layout` says
which options. Everything else (a child other than FIFO inside SFQ, other than FIFO or WFQ
inside DWRR, DWRR keyed by class or flow, sessions and traces) runs in `virtual.simulate` as
before; a caller asks `supported` first.
Where a policy's choice depends on something a Job carries that the columns do not (an SFQ
bucket's salted hash, a priority level), it is computed here, per job, with the policy's own
code (`_sfq_buckets`, `_levels`), and the loop reads it.

Same output. This is a transcription of `virtual.simulate` (its `follow is None` path) and of
`scheduler.engine.Engine` with those policies, event for event: the same arrival, timeout,
stop and step-end order, the same admission passes, the same float operations in the same
order for step costs, VTC's counters and DWRR's deficits. tests/test_sim_compiled.py holds
every per-job field, every replica's decode-step end times, the step count and the end time
equal to the Python engine's across policies, loads, timeouts, the stop, one replica and
many; the golden outputs pin whole runs. A change to the engine's semantics must be made in
both (the test fails until it is).

The state lives in arrays between calls: the loop returns to Python every `slice_events`
events (a person's progress bar) and when the decode-step log needs more room, and resumes
exactly where it stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reference_scheduler.core.job import Job
from reference_scheduler.drivers.compiled_codes import (
    CANCELLED,
    DWRR,
    FIFO,
    FINISHED,
    JI_ADMIT,
    JI_BACKLOG,
    JI_BLOCKS,
    JI_DONE,
    JI_FIRST_STEP,
    JI_FIRST_TOKEN,
    JI_FRESH,
    JI_GENERATED,
    JI_LAST_STEP,
    JI_LEAD,
    JI_NXT,
    JI_PASSED_OVER,
    JI_PREFILL_LEFT,
    JI_REJECT_CODE,
    JI_REPLICA,
    JI_SEG_COUNT,
    JI_SEG_FIRST,
    JI_SEG_LEAD,
    JI_SEG_REPLICA,
    JI_SEQ,
    JI_WAIT_SINCE,
    LCF,
    N_STATE,
    NEVER,
    PI_HEAP_OFF,
    PI_JOBS_SIZE,
    PI_ORDER,
    PI_QHEAD,
    PI_QTAIL,
    PRIORITY,
    PT_LAST_LEFT,
    PT_TWAITING,
    QUEUE_FIFO,
    QUEUE_WFQ,
    REJECTED,
    RI_FH_LEN,
    RI_PF_LEN,
    RI_REP_BATCH,
    RI_REP_CONTEXT,
    RI_REP_DECODING,
    RI_REP_EXTRA,
    RI_REP_FREE,
    RI_REP_LAST_END,
    RI_REP_PENDING,
    RI_REP_SLOTS,
    RI_REP_STEPS,
    RQ_FH_JOB,
    RQ_FH_SEQ,
    RQ_FH_STEP,
    RQ_PF,
    RT_TD,
    RT_TD_JOB,
    RUNNING,
    S_ENDED,
    S_IDLE,
    S_LOG,
    S_NOW,
    SFQ,
    STATUS_NAMES,
    VTC,
    WAITING,
    WFQ,
)
from reference_scheduler.scheduler.config import SchedulerConfig

__all__ = [
    "CANCELLED",
    "FINISHED",
    "REJECTED",
    "RUNNING",
    "STATUS_NAMES",
    "WAITING",
    "CompiledResult",
    "simulate_columns",
    "supported",
]
_COSTS = ("tokens", "weighted-tokens", "prompt", "requests")  # core.policy.COSTS
_KEYS = ("tenant", "slo_class", "flow")  # core.policy.KEYS


@dataclass(frozen=True)
class _Layout:
    """The policy as the loop runs it: tiers (one when not tiered), each with a child."""

    tiered: bool
    children: list[Any]  # each tier's child policy object (the configuration's own)
    kinds: list[int]  # each tier's child kind (SFQ here; the loop runs it as DWRR)
    queues: list[int]  # each tier's DWRR classes' queue (QUEUE_FIFO or QUEUE_WFQ)
    tier_by_class: dict[str, int]
    last: int  # the tier of a class no tier names
    floor_slots: list[float]
    lend_slots: list[float]
    charging: bool  # the policy charges service (Engine._uses_charge)


def supported(config: SchedulerConfig) -> str | None:
    """None when this driver runs `config` exactly as `virtual.simulate` does; otherwise why
    not, in a few words (the caller then runs the Python engine)."""
    spec = config.spec
    why = []
    if spec.engine != "reference":
        why.append(f"engine {spec.engine}")
    for name in ("disaggregation", "preemption", "prefix_cache", "admission", "control"):
        if getattr(spec, name) is not None:
            why.append(name)
    if spec.step_noise_cv > 0:
        why.append("step noise")
    if not _steps_fit(config):
        why.append("steps too long for int64 times")
    layout = _layout(config)
    if isinstance(layout, str):
        why.append(layout)
    if not why:  # only then: importing numba costs a run that will not use it 0.3 s
        try:
            import numba  # noqa: F401
        except ImportError:
            why.append("numba not installed")
    return ", ".join(why) or None


def _steps_fit(config: SchedulerConfig) -> bool:
    """Whether every step's duration, bounded from the profile's coefficients at the largest
    batch, chunk and context, fits the loop's int64 times with room to spare (under 2^39 ns,
    about 9 minutes; the running heap's keys are end << shift | replica). Python's ints have
    no such bound, so a profile beyond it runs there."""
    prof = config.profile
    coefficients = [prof.a, prof.b, prof.c, prof.d, prof.e, prof.f, prof.floor]
    if prof.constant_step_ms is not None:
        coefficients.append(prof.constant_step_ms)
    if not all(math.isfinite(x) for x in coefficients):
        return False
    n, batch = prof.max_num_batched_tokens, prof.max_num_seqs
    context = batch * config.max_model_len
    ms = (
        abs(prof.a) + abs(prof.b) * (n + batch) + abs(prof.c) * n * n + abs(prof.d)
        + abs(prof.e) * batch + abs(prof.f) * context + abs(prof.floor)
        + abs(prof.constant_step_ms or 0.0)
    )  # fmt: skip
    extra_ms = batch * prof.front_end_core_ms + prof.idle_wake_ms
    return (ms + extra_ms) * 1e6 < 2**39


def _child_kind(child: Any) -> tuple[int, int] | None:
    """A tier's child as the loop knows it, (kind, its DWRR classes' queue): exact types (a
    subclass may change anything), options the loop transcribes."""
    from reference_scheduler.policies.dwrr import Dwrr
    from reference_scheduler.policies.fifo import Fifo
    from reference_scheduler.policies.priority import Priority
    from reference_scheduler.policies.sfq import Sfq
    from reference_scheduler.policies.vtc import Lcf, Vtc
    from reference_scheduler.policies.wfq import Wfq

    kind = {Fifo: FIFO, Vtc: VTC, Lcf: LCF, Priority: PRIORITY}.get(type(child))
    if kind is not None:
        return kind, QUEUE_FIFO
    if type(child) is Wfq:
        ok = child._config["key"] in _KEYS and child._config["cost"] in _COSTS
        return (WFQ, QUEUE_FIFO) if ok else None
    if type(child) in (Dwrr, Sfq):  # over FIFO queues (Dwrr also over WFQ), a cost it knows
        config = child._config
        if config["cost"] not in _COSTS or config["key"] not in _KEYS:
            return None
        inner = _child_kind(child._child())
        if type(child) is Sfq:
            return (SFQ, QUEUE_FIFO) if inner == (FIFO, QUEUE_FIFO) else None
        if config["key"] != "tenant" or inner not in ((FIFO, QUEUE_FIFO), (WFQ, QUEUE_FIFO)):
            return None  # by tenant: a class's quantum is its tenant's weight
        return DWRR, (QUEUE_WFQ if inner[0] == WFQ else QUEUE_FIFO)
    return None


def _layout(config: SchedulerConfig) -> _Layout | str:
    """The policy's layout, or why the loop cannot run it."""
    from reference_scheduler.policies.tiered import Tiered

    policy = config.policy_factory()
    policy.bind(config.replicas * config.profile.max_num_seqs)  # as Engine does
    tiered = type(policy) is Tiered
    children = list(policy.children) if tiered else [policy]
    found = [_child_kind(child) for child in children]
    if any(kind is None for kind in found):
        return f"policy {config.spec.policy}"
    return _Layout(
        tiered=tiered,
        children=children,
        kinds=[kind for kind, _ in found],  # type: ignore[misc]
        queues=[queue for _, queue in found],  # type: ignore[misc]
        tier_by_class=dict(policy._tier_by_class) if tiered else {},
        last=policy._last if tiered else 0,
        floor_slots=list(policy._floor_slots) if tiered else [0.0],
        lend_slots=list(policy._lend_slots) if tiered else [0.0],
        charging=bool(getattr(policy, "uses_charge", True)),
    )


@dataclass(frozen=True)
class _Jobs:
    """The job columns a policy's configuration is computed from (simulate_columns's)."""

    prompt: np.ndarray
    outs: np.ndarray
    arrival: np.ndarray
    tenant: np.ndarray
    tenant_weight: np.ndarray
    tenant_names: Sequence[str]
    slo_class: np.ndarray
    class_names: Sequence[str]
    class_rank: Sequence[int] | None
    workload: np.ndarray | None
    workload_names: Sequence[str] | None
    fits: int  # the longest job the engine takes (longer ones are refused, never enqueued)


@dataclass(frozen=True)
class _PolicyConfig:
    """compiled_loop's C tuple, the width of a tier's classes, the WFQ (instance, flow) slots,
    and each WFQ instance's heap room (the jobs it will be given)."""

    arrays: tuple[np.ndarray, ...]
    width: int
    slots: int
    heap_room: np.ndarray


def _cost(name: str, prompt: np.ndarray, outs: np.ndarray) -> np.ndarray:
    """core.policy.COSTS of each job, as float(...) of the same ints."""
    if name == "tokens":
        return (prompt + outs).astype(np.float64)
    if name == "weighted-tokens":
        return (prompt + 2 * outs).astype(np.float64)
    if name == "prompt":
        return prompt.astype(np.float64)
    return np.ones(len(prompt), dtype=np.float64)  # requests


def _keys(key: str, jobs: _Jobs) -> tuple[np.ndarray, list[Job]]:
    """core.policy.KEYS as codes: each job's key's code, and a Job bearing each code's key
    (for the policies that hash it)."""
    if key == "tenant":
        return jobs.tenant, [Job(0, name, "", 0, 0, 0) for name in jobs.tenant_names]
    if key == "slo_class":
        return jobs.slo_class, [Job(0, "", name, 0, 0, 0) for name in jobs.class_names]
    if jobs.workload is None or jobs.workload_names is None:
        raise ValueError("a policy keyed by flow needs the jobs' workload column")
    n_wl = len(jobs.workload_names)
    pairs, codes = _numbered(jobs.tenant * n_wl + jobs.workload)
    names = [
        Job(0, jobs.tenant_names[p // n_wl], "", 0, 0, 0, flow=jobs.workload_names[p % n_wl])
        for p in pairs.tolist()
    ]
    return codes.astype(np.int64), names


def _sfq_buckets(sfq: Any, mine: np.ndarray, jobs: _Jobs) -> np.ndarray:
    """Each of `mine`'s jobs' bucket (Sfq._class_key, called on `sfq` itself). The bucket
    depends on when the job was enqueued: the salt is redrawn at the first enqueue of each
    perturbation period. Jobs are enqueued at their arrival, in index order, unless refused
    as too long; so each period's first such arrival draws the period's salt, and every key
    hashed then gives the bucket of that key's jobs in that period. Periods × keys calls,
    not one per job."""
    codes, keyed = _keys(sfq._config["key"], jobs)
    out = np.zeros(len(mine), dtype=np.int64)
    enqueued = np.flatnonzero(mine & (jobs.prompt + jobs.outs <= jobs.fits))
    if not len(enqueued):
        return out
    arrival = jobs.arrival[enqueued]
    # a period past every int64 time (perturb_s of 9.2e9 s or more) never ends: period 0
    period_ns = min(sfq.perturb_ns, 1 << 62)
    periods, first, which = np.unique(arrival // period_ns, return_index=True, return_inverse=True)
    table = np.empty((len(periods), len(keyed)), dtype=np.int64)
    for p, at in enumerate(first.tolist()):
        now = int(arrival[at])
        for c, job in enumerate(keyed):
            table[p, c] = sfq._class_key(job, now)
    out[enqueued] = table[which, codes[enqueued]]
    return out


def _levels(priority: Any, mine: np.ndarray, jobs: _Jobs) -> tuple[np.ndarray, int]:
    """Each job's level in a Priority's order (its rank's place among the ranks the jobs
    have), and how many levels: Priority._order lists only ranks seen, and an empty level
    is skipped, so the ranks of all the tier's jobs order the levels the same way."""
    if priority.by == "slo_class":
        if jobs.class_rank is None:
            raise ValueError("a priority policy by slo_class needs the classes' ranks")
        ranks, codes = list(jobs.class_rank), jobs.slo_class
    else:
        ranks = [priority.ranks.get(name, 1 << 30) for name in jobs.tenant_names]
        codes = jobs.tenant
    # ordered as Python orders the ranks themselves (a float rank, an int past int64, equal
    # ranks of two types), the order Priority keeps them in
    order = sorted(set(ranks))
    place = {rank: k for k, rank in enumerate(order)}  # equal ranks are one key, as in the set
    level = np.array([place[rank] for rank in ranks], dtype=np.int64)
    return level[codes], len(order)


def _policy_config(layout: _Layout, jobs: _Jobs) -> _PolicyConfig:
    """compiled_loop's C tuple: each tier's kind and classes' queue, each job's tier, class,
    DWRR cost, WFQ flow, cost and weight, each (tier, class)'s DWRR quantum and VTC divisor,
    each tier's VTC prices and WFQ rate, the tiers' floors and ceilings in slots. The same
    floats the policy objects compute."""
    n, n_tiers, n_ten = len(jobs.prompt), len(layout.kinds), len(jobs.tenant_names)
    class_tier = np.array(
        [layout.tier_by_class.get(name, layout.last) for name in jobs.class_names] or [0],
        dtype=np.int64,
    )
    # per job, as the rows of compiled_loop's C_JOB_I (CJ_*) and C_JOB_F (CJF_*)
    job_int = np.zeros((3, n), dtype=np.int64)
    tier, klass, flow = job_int
    if layout.tiered:
        np.take(class_tier, jobs.slo_class, out=tier)
    job_float = np.zeros((3, n), dtype=np.float64)
    cost, wfq_cost, wfq_weight = job_float
    wfq_weight[:] = 1.0
    rate = np.ones(n_tiers, dtype=np.float64)
    width = max(n_ten, 1)
    wfq_jobs = np.zeros(n, dtype=np.bool_)  # the jobs a WFQ orders (their flows need slots)
    for k, (kind, child) in enumerate(zip(layout.kinds, layout.children, strict=True)):
        mine = tier == k
        if kind in (VTC, LCF, DWRR):
            klass[mine] = jobs.tenant[mine]
        elif kind == SFQ:
            klass[mine] = _sfq_buckets(child, mine, jobs)[mine]
            width = max(width, child.buckets)
        elif kind == PRIORITY:
            levels, count = _levels(child, mine, jobs)
            klass[mine] = levels[mine]
            width = max(width, count)
        if kind in (DWRR, SFQ):
            cost[mine] = _cost(child._config["cost"], jobs.prompt[mine], jobs.outs[mine])
        wfq = child if kind == WFQ else None
        if kind == DWRR and layout.queues[k] == QUEUE_WFQ:
            wfq = child._child()  # each class's WFQ, all made alike
        if wfq is not None:
            codes, _ = _keys(wfq._config["key"], jobs)
            flow[mine] = codes[mine]
            wfq_jobs |= mine
            wfq_cost[mine] = _cost(wfq._config["cost"], jobs.prompt[mine], jobs.outs[mine])
            # Wfq.enqueue's weight: weights.get(job.tenant, job.weight)
            by_tenant = [
                wfq.weights.get(name, float(jobs.tenant_weight[t]))
                for t, name in enumerate(jobs.tenant_names)
            ]
            wfq_weight[mine] = np.asarray(by_tenant, dtype=np.float64)[jobs.tenant[mine]]
            rate[k] = wfq.rate_per_ns
    quantum = np.zeros(n_tiers * width, dtype=np.float64)
    divisor = np.ones(n_tiers * width, dtype=np.float64)
    price = np.zeros((n_tiers, 2), dtype=np.float64)
    heap_room = np.zeros(n_tiers * width, dtype=np.int64)
    for k, (kind, child) in enumerate(zip(layout.kinds, layout.children, strict=True)):
        weights = child.weights if kind in (VTC, LCF, DWRR) else {}
        for t, name in enumerate(jobs.tenant_names):
            # the tenant's weight: the policy's configured one, else the job's (its tenant's)
            w = weights.get(name, float(jobs.tenant_weight[t]))
            divisor[k * width + t] = w
            if kind == DWRR:
                quantum[k * width + t] = child.quantum * w
        if kind == SFQ:  # Sfq._weight is 1
            quantum[k * width : (k + 1) * width] = child.quantum * 1.0
        if kind in (VTC, LCF):
            price[k] = (child.input_price, child.output_price)
        mine = tier == k
        if kind == WFQ:  # one WFQ, instance k * width
            heap_room[k * width] = int(mine.sum())
        elif kind == DWRR and layout.queues[k] == QUEUE_WFQ:  # one per class
            heap_room[k * width : (k + 1) * width] = np.bincount(klass[mine], minlength=width)[
                :width
            ]
    slots = _flow_slots(flow, klass, tier, wfq_jobs, layout, width)
    loop_kinds = [DWRR if kind == SFQ else kind for kind in layout.kinds]
    # grouped as compiled_loop's C_* tuple members, their rows its CJ_*, CJF_*, CP_*, CT_*, CTF_*
    arrays = (
        job_int,
        job_float,
        np.stack([quantum, divisor]),
        np.array([loop_kinds, layout.queues], dtype=np.int64),
        np.stack(
            [
                np.array(layout.floor_slots, dtype=np.float64),
                np.array(layout.lend_slots, dtype=np.float64),
                rate,
                price[:, 0],
                price[:, 1],
            ]
        ),
    )
    return _PolicyConfig(arrays, width, slots, heap_room)


def _flow_slots(
    flow: np.ndarray,
    klass: np.ndarray,
    tier: np.ndarray,
    wfq_jobs: np.ndarray,
    layout: _Layout,
    width: int,
) -> int:
    """Number the (WFQ instance, flow) pairs the jobs have, and write each WFQ job's slot over
    its flow code (the loop's CJ_FLOW); return how many slots. A WFQ keeps state only for
    the flows it has seen; a slot for every instance and flow would be tiers x width x flows
    (dwrr-wfq over 3,000 tenants of 3 workloads each: 27M slots, 459 MB)."""
    if not wfq_jobs.any():
        return 1
    queue_wfq = np.array(layout.queues, dtype=np.int64)[tier] == QUEUE_WFQ
    instance = tier * width + np.where(queue_wfq, klass, 0)  # a tier's WFQ, or its class's
    at = np.flatnonzero(wfq_jobs)
    _, slot = _numbered(instance[at] * (int(flow.max()) + 1) + flow[at])
    flow[at] = slot
    return int(slot.max()) + 1


def _numbered(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) of non-negative ints: the distinct values in
    order, and each value's place among them. Counted rather than sorted where the values are
    small (O(n): the fleet's 1.9M flow codes in a few ms instead of 0.2 s)."""
    if len(values) and int(values.max()) < 4 * len(values):
        present = np.bincount(values) > 0
        return np.flatnonzero(present), (np.cumsum(present) - 1)[values]
    distinct, codes = np.unique(values, return_inverse=True)
    return distinct, codes.astype(np.int64)


@dataclass
class CompiledResult:
    """Per-job outcome columns (the input order) and per-replica decode-step end times: what
    `virtual.SimResult` carries, without a Job object per request."""

    status: np.ndarray  # int8 codes of STATUS_NAMES
    replica: np.ndarray
    admit_ns: np.ndarray
    first_token_ns: np.ndarray
    done_ns: np.ndarray
    first_step: np.ndarray
    last_step: np.ndarray
    backlog_ns: np.ndarray
    passed_over_ns: np.ndarray
    wait_since_ns: np.ndarray
    reject_code: np.ndarray
    generated: np.ndarray
    # the one decode segment of a job cancelled while decoding (Job.segments), else -1
    seg_replica: np.ndarray
    seg_lead_ns: np.ndarray
    seg_first: np.ndarray
    seg_count: np.ndarray
    decode_ends: list[np.ndarray]
    end_ns: int
    steps: int


def simulate_columns(
    prompt_tokens: np.ndarray,
    max_tokens: np.ndarray,
    arrival_ns: np.ndarray,
    tenant: np.ndarray,
    tenant_weight: np.ndarray,
    tenant_names: Sequence[str],
    slo_class: np.ndarray,
    class_names: Sequence[str],
    config: SchedulerConfig,
    timeout_ns: int | None = None,
    stop_ns: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    slice_events: int = 4096,
    log_room: int = 1 << 16,
    class_rank: Sequence[int] | None = None,
    workload: np.ndarray | None = None,
    workload_names: Sequence[str] | None = None,
) -> CompiledResult:
    """`virtual.simulate` of the jobs given as columns (sorted by arrival; `tenant` codes into
    `tenant_names` and `tenant_weight`, each tenant's Job.weight; `slo_class` codes into
    `class_names`, `class_rank` each class's Job.priority; `workload` codes into
    `workload_names`, each job's Job.flow), for a configuration `supported` accepts. The
    ranks are needed by a priority policy by class, the workloads by a policy keyed by flow.
    `slice_events`: events between two `progress` calls; `log_room`: the decode-step log's
    first size, doubled when full (both change nothing but the speed)."""
    why = supported(config)
    if why is not None:
        raise ValueError(f"the compiled driver does not run this configuration: {why}")
    _check_columns(
        prompt_tokens, max_tokens, arrival_ns, tenant, len(tenant_names), slo_class,
        len(class_names), len(tenant_weight), timeout_ns, slice_events,
    )  # fmt: skip
    if workload is not None:
        n_wl = len(workload_names or ())
        if len(workload) != len(arrival_ns) or (
            len(workload) and (int(np.min(workload)) < 0 or int(np.max(workload)) >= n_wl)
        ):
            raise ValueError(f"workload codes must index its {n_wl} names, one per job")
    if class_rank is not None and len(class_rank) != len(class_names):
        raise ValueError("one rank per class name")
    from reference_scheduler.drivers import compiled_loop

    layout = _layout(config)
    assert isinstance(layout, _Layout)
    prof = config.profile
    spec = config.spec
    n = len(arrival_ns)
    n_rep = config.replicas
    n_ten = len(tenant_names)
    prompt = np.ascontiguousarray(prompt_tokens, dtype=np.int64)
    outs = np.ascontiguousarray(max_tokens, dtype=np.int64)
    arrival = np.ascontiguousarray(arrival_ns, dtype=np.int64)
    ten = np.ascontiguousarray(tenant, dtype=np.int64)
    fits = min(config.max_model_len, config.kv_blocks * spec.block_size)
    jobs = _Jobs(
        prompt, outs, arrival, ten, np.asarray(tenant_weight, dtype=np.float64), tenant_names,
        np.ascontiguousarray(slo_class, dtype=np.int64), class_names, class_rank,
        None if workload is None else np.asarray(workload, dtype=np.int64), workload_names,
        fits,
    )  # fmt: skip
    policy = _policy_config(layout, jobs)
    shift = max(n_rep - 1, 1).bit_length()
    if stop_ns is None or (stop_ns + (1 << 40)).bit_length() + shift > 62:
        # the running heap's keys are end << shift | replica, in an int64
        raise ValueError("the compiled driver needs a stop time within int64 keys")
    ints = np.array(
        [
            int(layout.tiered),
            n_rep,
            shift,
            prof.max_num_seqs,
            prof.max_num_batched_tokens,
            int(prof.chunked_prefill),
            prof.admit_every,
            spec.block_size,
            fits,
            config.kv_blocks,
            round(prof.front_end_core_ms * 1e6),
            round(prof.idle_wake_ms * 1e6),
            round(prof.idle_after_ms * 1e6),
            -1 if timeout_ns is None else timeout_ns,
            stop_ns,
            int(prof.constant_step_ms is not None),
            int(prof.mixed_step == "sum"),
            int(layout.charging),
            int(layout.tiered),  # Tiered.release counts running jobs; the others do nothing
            n_ten,
            policy.width,
        ],
        dtype=np.int64,
    )
    floats = np.array(
        [prof.a, prof.b, prof.c, prof.d, prof.e, prof.f, prof.floor, prof.constant_step_ms or 0.0],
        dtype=np.float64,
    )
    arrays = _Arrays(
        n, n_rep, n_ten, len(layout.kinds), prof.max_num_seqs, policy.width, policy.slots,
        policy.heap_room,
    )  # fmt: skip
    state = np.zeros(N_STATE, dtype=np.int64)
    state[S_IDLE] = n_rep
    arrays.idle_heap[:n_rep] = np.arange(n_rep)
    arrays.rep_free[:] = config.kv_blocks
    cap = max(log_room, 4 * n_rep + 8)
    log_end = np.empty(cap, dtype=np.int64)
    log_rep = np.empty(cap, dtype=np.int32)
    while True:
        code = compiled_loop.run(
            state, ints, floats, prompt, outs, arrival, ten, policy.arrays, arrays.jobs(),
            arrays.replicas(), arrays.policy(), arrays.heaps(), log_end, log_rep, slice_events,
        )  # fmt: skip
        if progress is not None:
            progress(int(state[S_ENDED]), int(state[S_NOW]))
        if code == 0:
            break
        if code == 2:  # the decode-step log is full: twice the room, and on
            log_end = np.concatenate((log_end, np.empty_like(log_end)))
            log_rep = np.concatenate((log_rep, np.empty_like(log_rep)))
    used = int(state[S_LOG])
    reps = log_rep[:used]
    # each replica's steps in log order: the stable order is unique, and NumPy radix-sorts
    # 16-bit keys, O(n), where it merge-sorts wider ones (the fleet's 1.8M steps: 0.14 -> 0.03
    # CPU s)
    order = np.argsort(reps.astype(np.int16) if n_rep <= 2**15 else reps, kind="stable")
    ends = log_end[:used][order]
    bounds = np.searchsorted(reps[order], np.arange(n_rep + 1))
    decode_ends = [ends[bounds[r] : bounds[r + 1]] for r in range(n_rep)]
    if progress is not None:
        progress(n, int(state[S_NOW]))
    a = arrays
    # each column its own array, copied out of the loop's 2D one, so that a caller that drops
    # the columns it has read frees them one by one (a view would hold the whole 2D array, 21
    # columns, for as long as any one column lives: the fleet's peak RSS +270 MB)
    columns = {
        "replica": a.replica, "admit_ns": a.admit, "first_token_ns": a.first_token,
        "done_ns": a.done, "first_step": a.first_step, "last_step": a.last_step,
        "backlog_ns": a.backlog, "passed_over_ns": a.passed_over,
        "wait_since_ns": a.wait_since, "reject_code": a.reject_code,
        "generated": a.generated, "seg_replica": a.seg_replica, "seg_lead_ns": a.seg_lead,
        "seg_first": a.seg_first, "seg_count": a.seg_count,
    }  # fmt: skip
    status, steps = a.status, int(a.rep_steps.sum())
    del a, arrays
    return CompiledResult(
        status=status,
        **{name: view.copy() for name, view in columns.items()},
        decode_ends=decode_ends,
        end_ns=int(state[S_NOW]),
        steps=steps,
    )


def warm_up() -> None:
    """Have numba compile the loop now (or load it from its cache): one tiny run. For a
    caller that would rather pay the first use's compile up front (the test suite)."""
    from reference_scheduler.scheduler.config import parse_scheduler_config

    one = np.ones(1, dtype=np.int64)
    simulate_columns(
        one, one, one, one * 0, np.ones(1), ["t"], one * 0, ["c"],
        parse_scheduler_config({"policy": "fifo"}), stop_ns=10**9, class_rank=[0],
    )  # fmt: skip


def _check_columns(
    prompt: np.ndarray,
    outs: np.ndarray,
    arrival: np.ndarray,
    tenant: np.ndarray,
    n_tenants: int,
    slo_class: np.ndarray,
    n_classes: int,
    n_weights: int,
    timeout_ns: int | None,
    slice_events: int,
) -> None:
    """What the loop takes on trust, checked first: it indexes its arrays without bounds
    checks, so a code out of range would write past an array's end, not raise."""
    n = len(arrival)
    if not all(len(a) == n for a in (prompt, outs, tenant, slo_class)):
        raise ValueError("the job columns must all have one length")
    if n_weights != n_tenants:
        raise ValueError("one weight per tenant name")
    for name, codes, size in (("tenant", tenant, n_tenants), ("slo_class", slo_class, n_classes)):
        if n and (int(np.min(codes)) < 0 or int(np.max(codes)) >= size):
            raise ValueError(f"{name} codes must index its {size} names")
    if n and (np.any(np.diff(arrival) < 0) or int(np.min(arrival)) < 0):
        raise ValueError("arrivals must be sorted and not negative")
    if n and (int(np.min(prompt)) < 0 or int(np.min(outs)) < 0):
        raise ValueError("token counts must not be negative")
    if timeout_ns is not None and timeout_ns < 0:
        raise ValueError("timeout_ns must not be negative")
    if slice_events < 1:
        raise ValueError("slice_events must be at least 1")


class _Arrays:
    """The loop's arrays: per job, per replica, per queue and per tenant."""

    def __init__(
        self,
        n: int,
        n_rep: int,
        n_ten: int,
        n_tiers: int,
        seqs: int,
        width: int,
        slots: int,
        heap_room: np.ndarray,
    ) -> None:
        i64 = np.int64

        def full(size: int | tuple[int, int], value: int) -> np.ndarray:
            return np.full(size, value, dtype=i64)

        # per job: the int64 columns as rows of one 2D array (compiled_loop's JI_*), each
        # row's first value; the status; whether in a policy queue
        firsts = {  # attribute, first value (every JI_* row)
            JI_REPLICA: ("replica", -1), JI_ADMIT: ("admit", -1),
            JI_FIRST_TOKEN: ("first_token", -1), JI_DONE: ("done", -1),
            JI_FIRST_STEP: ("first_step", -1), JI_LAST_STEP: ("last_step", -1),
            JI_BACKLOG: ("backlog", 0), JI_PASSED_OVER: ("passed_over", -1),
            JI_WAIT_SINCE: ("wait_since", -1), JI_REJECT_CODE: ("reject_code", 0),
            JI_GENERATED: ("generated", 0), JI_PREFILL_LEFT: ("prefill_left", 0),
            JI_BLOCKS: ("blocks", 0), JI_SEQ: ("seq", 0), JI_LEAD: ("lead", -1),
            JI_SEG_REPLICA: ("seg_replica", -1), JI_SEG_LEAD: ("seg_lead", -1),
            JI_SEG_FIRST: ("seg_first", -1), JI_SEG_COUNT: ("seg_count", -1),
            JI_NXT: ("nxt", -1),  # the next job in its policy queue
            JI_FRESH: ("fresh", -1),
        }  # fmt: skip
        self.job_int = np.empty((len(firsts), n), dtype=i64)
        for row, (name, first) in firsts.items():
            self.job_int[row] = first
            setattr(self, name, self.job_int[row])
        self.status = np.zeros(n, dtype=np.int8)
        self.inq = np.zeros(n, dtype=np.bool_)
        # the policy (compiled_loop's policy section), its arrays grouped by type and length
        # into 2D arrays whose rows compiled_loop names (PI_*, PF_*, ...): per (tier, class) a
        # queue, VTC's counter, DWRR's class, a WFQ instance; per tier the rest. WFQ: GPS's
        # state per instance, each flow's last finish tag and weight, and the instance's two
        # heaps in its region of the heap arrays (as many entries as jobs it is given)
        pairs = n_tiers * width
        self.p_int = np.zeros((PI_JOBS_SIZE + 1, pairs), dtype=i64)
        for row in (PI_QHEAD, PI_QTAIL, PI_ORDER):  # -1: none, never seen
            self.p_int[row] = -1
        self.p_int[PI_HEAP_OFF] = np.concatenate(([0], np.cumsum(heap_room)[:-1]))
        self.p_float = np.zeros((5, pairs), dtype=np.float64)
        self.p_bool = np.zeros((2, pairs), dtype=np.bool_)
        self.ring = full((n_tiers, width), -1)
        self.p_tier = np.zeros((PT_TWAITING + 1, n_tiers), dtype=i64)
        self.p_tier[PT_LAST_LEFT] = -1
        self.head_cost = np.zeros(n_tiers, dtype=np.float64)
        self.slot_float = np.zeros((2, slots), dtype=np.float64)  # (WFQ instance, flow) slots
        self.gps_on = np.zeros(slots, dtype=np.bool_)
        room = max(int(heap_room.sum()), 1)
        self.heap_float = np.empty((2, room), dtype=np.float64)  # written before read
        self.heap_int = np.empty((4, room), dtype=i64)
        # per replica: the int64 counts as rows of one 2D array (compiled_loop's RI_*); the
        # prefilling jobs (admission order) and the decoding jobs' heap, a min-heap of (last
        # decode step, seq) and the job, per slot (RQ_*); per tenant the decoding jobs and the
        # job that opened that count, its tier (RT_*)
        counts = {
            RI_REP_BATCH: "rep_batch", RI_REP_CONTEXT: "rep_context",
            RI_REP_DECODING: "rep_decoding", RI_REP_PENDING: "rep_pending",
            RI_REP_SLOTS: "rep_slots", RI_REP_FREE: "rep_free", RI_REP_EXTRA: "rep_extra",
            RI_REP_LAST_END: "rep_last_end", RI_REP_STEPS: "rep_steps", RI_PF_LEN: "pf_len",
            RI_FH_LEN: "fh_len",
        }  # fmt: skip
        self.rep_int = np.zeros((len(counts), n_rep), dtype=i64)
        for row, name in counts.items():
            setattr(self, name, self.rep_int[row])
        self.rep_last_end[:] = -NEVER  # never ran: idle for as long as it takes
        self.rep_slot = np.empty((4, n_rep, seqs), dtype=i64)
        for row, first in ((RQ_PF, -1), (RQ_FH_STEP, 0), (RQ_FH_SEQ, 0), (RQ_FH_JOB, -1)):
            self.rep_slot[row] = first
        self.rep_tenant = np.empty((2, n_rep, n_ten), dtype=i64)
        self.rep_tenant[RT_TD] = 0  # decoding jobs per replica and tenant
        self.rep_tenant[RT_TD_JOB] = -1
        self.run_heap = full(n_rep, 0)  # replicas stepping: end << shift | replica
        self.idle_heap = full(n_rep, 0)

    # compiled_loop's tuples, in the order its functions unpack them
    def jobs(self) -> tuple[np.ndarray, ...]:
        return (self.job_int, self.status, self.inq)

    def replicas(self) -> tuple[np.ndarray, ...]:
        return (self.rep_int, self.rep_slot, self.rep_tenant)

    def policy(self) -> tuple[np.ndarray, ...]:
        return (
            self.p_int, self.p_float, self.p_bool, self.ring, self.p_tier, self.head_cost,
            self.nxt, self.inq, self.slot_float, self.gps_on, self.heap_float, self.heap_int,
        )  # fmt: skip

    def heaps(self) -> tuple[np.ndarray, ...]:
        return (self.run_heap, self.idle_heap)
