"""The virtual-time driver compiled: `virtual.simulate` for the common configuration, as arrays
under numba, with the same output to the nanosecond.

Why (issue 35). A step-by-step simulator in Python pays about 9 µs of CPU per replica step in
Python's per-call and per-attribute cost, however the step's logic is trimmed: 14 of the 39 CPU s
of a 10-minute, 80-replica fleet run (1.9M requests), and the Job objects it needs cost 6 more
to make and to read back. Here the jobs are columns, the replicas and the policy's state are
arrays, and the loop is machine code: the engine's part of that run is about a second.

What it covers, and the rest. `supported(config)` says whether a configuration is one this
driver runs: the reference engine, colocated, without preemption, a prefix cache, admission
limits, control loops or step noise, a policy among FIFO, VTC and LCF. Everything else, and
sessions and traces, runs in `virtual.simulate` as before; a caller asks `supported` first.

Same output. This is a transcription of `virtual.simulate` (its `follow is None` path) and of
`scheduler.engine.Engine` with those policies, event for event: the same arrival, timeout,
stop and step-end order, the same admission passes, the same float operations in the same
order for step costs and VTC's counters. tests/test_sim_compiled.py holds every per-job field,
every replica's decode-step end times, the step count and the end time equal to the Python
engine's across policies, loads, timeouts, the stop, one replica and many; the golden outputs
pin whole runs. A change to the engine's semantics must be made in both (the test fails
until it is).

The state lives in arrays between calls: the loop returns to Python every `slice_events`
events (a person's progress bar) and when the decode-step log needs more room, and resumes
exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from reference_scheduler.scheduler.config import SchedulerConfig

NEVER = 1 << 62
# job status codes (Job.status): the order of STATUS_NAMES
WAITING, RUNNING, FINISHED, REJECTED, CANCELLED = 0, 1, 2, 3, 4
STATUS_NAMES = ("waiting", "running", "finished", "rejected", "cancelled")
FIFO, VTC, LCF = 0, 1, 2
_KINDS = {"fifo": FIFO, "vtc": VTC, "lcf": LCF}

# the loop's scalar state, one int64 each in `state` (indices)
(
    S_I,  # next arrival
    S_D,  # next job whose timeout is due
    S_NOW,
    S_EVENTS,
    S_ENDED,
    S_SEQ,  # submissions so far (Job.seq)
    S_WAITING,  # jobs in the policy (admission.waiting == len(policy))
    S_RUN,  # size of the running heap
    S_IDLE,  # size of the idle heap
    S_FRESH,  # jobs arrived since the last admission pass
    S_LAST_LEFT,  # VTC: the tenant that left the backlog last (-1: none)
    S_SEEN,  # VTC: tenants seen so far (first-seen order)
    S_LOG,  # decode-step log entries used
    S_DONE,  # 1 when the run ended
    S_GRANTED,
) = range(15)
N_STATE = 15


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
    if _policy_kind(config) is None:
        why.append(f"policy {spec.policy}")
    try:
        import numba  # noqa: F401
    except ImportError:
        why.append("numba not installed")
    return ", ".join(why) or None


def _policy_kind(config: SchedulerConfig) -> int | None:
    from reference_scheduler.policies.fifo import Fifo
    from reference_scheduler.policies.vtc import Lcf, Vtc

    policy = config.policy_factory()
    kind = {Fifo: FIFO, Vtc: VTC, Lcf: LCF}.get(type(policy))  # exact types: no subclasses
    return kind


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
    config: SchedulerConfig,
    timeout_ns: int | None = None,
    stop_ns: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    slice_events: int = 4096,
    log_room: int = 1 << 16,
) -> CompiledResult:
    """`virtual.simulate` of the jobs given as columns (sorted by arrival; `tenant` codes into
    `tenant_weight`, each tenant's Job.weight, and `tenant_names`), for a configuration
    `supported` accepts. `slice_events`: events between two `progress` calls; `log_room`: the
    decode-step log's first size, doubled when full (both change nothing but the speed)."""
    why = supported(config)
    if why is not None:
        raise ValueError(f"the compiled driver does not run this configuration: {why}")
    from reference_scheduler.drivers import compiled_loop

    kind = _policy_kind(config)
    policy = config.policy_factory()
    prof = config.profile
    spec = config.spec
    n = len(arrival_ns)
    n_rep = config.replicas
    n_ten = len(tenant_weight)
    # the divisor of a tenant's charges: VTC's configured weight, else the job's (its tenant's)
    divisor = np.asarray(tenant_weight, dtype=np.float64).copy()
    input_price = output_price = 0.0
    if kind in (VTC, LCF):
        input_price, output_price = float(policy.input_price), float(policy.output_price)
        if policy.weights:  # Vtc.charge: the configured weight, else the job's
            for t, name in enumerate(tenant_names):
                divisor[t] = policy.weights.get(name, divisor[t])
    shift = max(n_rep - 1, 1).bit_length()
    horizon = (NEVER if stop_ns is None else stop_ns) + (1 << 40)
    if stop_ns is None or horizon.bit_length() + shift > 62:
        # the running heap's keys are end << shift | replica, in an int64
        raise ValueError("the compiled driver needs a stop time within int64 keys")
    ints = np.array(
        [
            kind,
            n_rep,
            shift,
            prof.max_num_seqs,
            prof.max_num_batched_tokens,
            int(prof.chunked_prefill),
            prof.admit_every,
            spec.block_size,
            min(config.max_model_len, config.kv_blocks * spec.block_size),
            config.kv_blocks,
            round(prof.front_end_core_ms * 1e6),
            round(prof.idle_wake_ms * 1e6),
            round(prof.idle_after_ms * 1e6),
            -1 if timeout_ns is None else timeout_ns,
            stop_ns,
            int(prof.constant_step_ms is not None),
            int(prof.mixed_step == "sum"),
        ],
        dtype=np.int64,
    )
    floats = np.array(
        [
            prof.a,
            prof.b,
            prof.c,
            prof.d,
            prof.e,
            prof.f,
            prof.floor,
            prof.constant_step_ms or 0.0,
            input_price,
            output_price,
        ],
        dtype=np.float64,
    )
    seqs = prof.max_num_seqs
    arrays = _Arrays(n, n_rep, n_ten, seqs, kind)
    state = np.zeros(N_STATE, dtype=np.int64)
    state[S_LAST_LEFT] = -1
    state[S_IDLE] = n_rep
    arrays.idle_heap[:n_rep] = np.arange(n_rep)
    arrays.rep_free[:] = config.kv_blocks
    cap = max(log_room, 4 * n_rep + 8)
    log_end = np.empty(cap, dtype=np.int64)
    log_rep = np.empty(cap, dtype=np.int32)
    prompt = np.ascontiguousarray(prompt_tokens, dtype=np.int64)
    outs = np.ascontiguousarray(max_tokens, dtype=np.int64)
    arrival = np.ascontiguousarray(arrival_ns, dtype=np.int64)
    ten = np.ascontiguousarray(tenant, dtype=np.int64)
    while True:
        code = compiled_loop.run(
            state,
            ints,
            floats,
            prompt,
            outs,
            arrival,
            ten,
            divisor,
            arrays.jobs(),
            arrays.replicas(),
            arrays.policy(),
            arrays.heaps(),
            log_end,
            log_rep,
            slice_events,
        )
        if progress is not None:
            progress(int(state[S_ENDED]), int(state[S_NOW]))
        if code == 0:
            break
        if code == 2:  # the decode-step log is full: twice the room, and on
            log_end = np.concatenate((log_end, np.empty_like(log_end)))
            log_rep = np.concatenate((log_rep, np.empty_like(log_rep)))
    used = int(state[S_LOG])
    reps = log_rep[:used]
    order = np.argsort(reps, kind="stable")
    ends = log_end[:used][order]
    bounds = np.searchsorted(reps[order], np.arange(n_rep + 1))
    decode_ends = [ends[bounds[r] : bounds[r + 1]] for r in range(n_rep)]
    if progress is not None:
        progress(n, int(state[S_NOW]))
    a = arrays
    return CompiledResult(
        status=a.status,
        replica=a.replica,
        admit_ns=a.admit,
        first_token_ns=a.first_token,
        done_ns=a.done,
        first_step=a.first_step,
        last_step=a.last_step,
        backlog_ns=a.backlog,
        passed_over_ns=a.passed_over,
        wait_since_ns=a.wait_since,
        reject_code=a.reject_code,
        generated=a.generated,
        seg_replica=a.seg_replica,
        seg_lead_ns=a.seg_lead,
        seg_first=a.seg_first,
        seg_count=a.seg_count,
        decode_ends=decode_ends,
        end_ns=int(state[S_NOW]),
        steps=int(a.rep_steps.sum()),
    )


class _Arrays:
    """The loop's arrays: per job, per replica, per queue and per tenant."""

    def __init__(self, n: int, n_rep: int, n_ten: int, seqs: int, kind: int) -> None:
        i64 = np.int64

        def full(size: int | tuple[int, int], value: int) -> np.ndarray:
            return np.full(size, value, dtype=i64)

        # per job
        self.status = np.zeros(n, dtype=np.int8)
        self.replica = full(n, -1)
        self.admit = full(n, -1)
        self.first_token = full(n, -1)
        self.done = full(n, -1)
        self.first_step = full(n, -1)
        self.last_step = full(n, -1)
        self.backlog = full(n, 0)
        self.passed_over = full(n, -1)
        self.wait_since = full(n, -1)
        self.reject_code = full(n, 0)
        self.generated = full(n, 0)
        self.prefill_left = full(n, 0)
        self.blocks = full(n, 0)
        self.seq = full(n, 0)
        self.lead = full(n, -1)
        self.seg_replica = full(n, -1)
        self.seg_lead = full(n, -1)
        self.seg_first = full(n, -1)
        self.seg_count = full(n, -1)
        self.nxt = full(n, -1)  # the next job in its policy queue
        self.inq = np.zeros(n, dtype=np.bool_)  # in a policy queue (not removed)
        self.fresh = full(n, -1)
        # per policy queue: FIFO has one, VTC one per tenant
        queues = 1 if kind == FIFO else n_ten
        self.qhead = full(queues, -1)
        self.qtail = full(queues, -1)
        self.qlive = full(queues, 0)
        # per tenant (VTC)
        self.counters = np.zeros(n_ten, dtype=np.float64)
        self.order = full(n_ten, -1)
        self.backlogged = np.zeros(n_ten, dtype=np.bool_)
        # per replica
        self.rep_batch = full(n_rep, 0)
        self.rep_context = full(n_rep, 0)
        self.rep_decoding = full(n_rep, 0)
        self.rep_pending = full(n_rep, 0)
        self.rep_slots = full(n_rep, 0)
        self.rep_free = full(n_rep, 0)
        self.rep_extra = full(n_rep, 0)
        self.rep_last_end = full(n_rep, -NEVER)  # never ran: idle for as long as it takes
        self.rep_steps = full(n_rep, 0)
        self.pf = full((n_rep, seqs), -1)  # prefilling jobs, admission order
        self.pf_len = full(n_rep, 0)
        # jobs decoding: a min-heap of (last decode step, seq) per replica, and the job
        self.fh_step = full((n_rep, seqs), 0)
        self.fh_seq = full((n_rep, seqs), 0)
        self.fh_job = full((n_rep, seqs), -1)
        self.fh_len = full(n_rep, 0)
        self.td = full((n_rep, n_ten), 0)  # decoding jobs per replica and tenant
        self.run_heap = full(n_rep, 0)  # replicas stepping: end << shift | replica
        self.idle_heap = full(n_rep, 0)

    # compiled_loop's tuples, in the order its functions unpack them
    def jobs(self) -> tuple[np.ndarray, ...]:
        return (
            self.status, self.replica, self.admit, self.first_token, self.done, self.first_step,
            self.last_step, self.backlog, self.passed_over, self.wait_since, self.reject_code,
            self.generated, self.prefill_left, self.blocks, self.seq, self.lead,
            self.seg_replica, self.seg_lead, self.seg_first, self.seg_count, self.nxt,
            self.inq, self.fresh,
        )  # fmt: skip

    def replicas(self) -> tuple[np.ndarray, ...]:
        return (
            self.rep_batch, self.rep_context, self.rep_decoding, self.rep_pending,
            self.rep_slots, self.rep_free, self.rep_extra, self.rep_last_end, self.rep_steps,
            self.pf, self.pf_len, self.fh_step, self.fh_seq, self.fh_job, self.fh_len, self.td,
        )  # fmt: skip

    def policy(self) -> tuple[np.ndarray, ...]:
        return (
            self.qhead, self.qtail, self.qlive, self.nxt, self.inq, self.counters, self.order,
            self.backlogged,
        )  # fmt: skip

    def heaps(self) -> tuple[np.ndarray, ...]:
        return (self.run_heap, self.idle_heap)
