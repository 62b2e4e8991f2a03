"""The `sim` target: the reference scheduler in virtual time, no HTTP and no sleeping.

The plan becomes jobs (tenant weight, class rank, workload as flow); the simulator's per-job
timings become records with the live executor's columns, so the analysis treats simulated and
live runs alike. The generator is exact here: t_sent = t_intended, send lag 0.

The run's client-side limits apply as they do live (fairbench.run.executor): a request not
finished `run.timeout` after its intended time is a `timeout`, and whatever is still in flight
`run.grace` after the last send is `cancelled`; either way the job is cancelled inside the
simulated engine at that instant, as the reference server cancels a job whose client
disconnects, so it stops holding capacity. What admission's degradation capped is recorded as
the live client sees it: the planned `max_tokens`, the served `output_tokens`.
"""

from __future__ import annotations

import gc
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from fairbench.plan.model import ENDPOINTS, Plan
from fairbench.targets.sim_compiled import JobColumns, simulate_plan, use_compiled
from fairbench.workload.models import Scenario
from reference_scheduler.core.job import Job, ttft_parts
from reference_scheduler.core.prefix_cache import salted
from reference_scheduler.drivers.virtual import SimResult, decode_itl_max, simulate
from reference_scheduler.scheduler.config import parse_scheduler_config


def block_hashes(plan: Plan, i: int, block_size: int) -> tuple[int, ...]:
    """Ids of request i's full prompt blocks, equal exactly where prompt text is shared.

    Synthetic prefixes: block k of group g of workload w is the same everywhere. Trace blocks
    (Mooncake ids, chained, `plan.block_tokens` each) split into engine blocks. The rest of a
    prompt is the request's own (ids derived from its prompt seed)."""
    c = plan.columns
    n_full = int(c["prompt_tokens"][i]) // block_size
    ids: list[int] = []
    if plan.block_offsets is not None and plan.block_values is not None:
        per = max(plan.block_tokens // block_size, 1)
        for trace_block in plan.block_values[plan.block_offsets[i] : plan.block_offsets[i + 1]]:
            ids.extend(int(trace_block) * 4096 + sub for sub in range(per))
    elif c["prefix_group"][i] >= 0:
        key = (int(c["workload"][i]) << 32) | int(c["prefix_group"][i])
        shared = int(c["prefix_tokens"][i]) // block_size
        ids.extend(-((key << 20) | k) - 1 for k in range(shared))
    own = int(c["prompt_seed"][i]) << 16
    ids.extend(own | k for k in range(len(ids), n_full))
    return tuple(ids[:n_full])


def plan_jobs(
    plan: Plan, scn: Scenario, block_size: int | None = None, delay_ns: int = 0
) -> list[Job]:
    """Jobs for the simulator; with `block_size` (a prefix cache is on), their block hashes,
    salted by their tenant's `cache_salt`.
    Each arrives `delay_ns` after its planned send: the profile's request overhead (the time
    a live request spends in HTTP and the API server before the engine's scheduler sees it)."""
    weights = {t.id: t.weight for t in scn.tenants}
    ranks = {name: c.priority for name, c in scn.slo_classes.items()}
    c = plan.columns
    # columns as Python lists, and Job called positionally by map (C, no frame per job): per
    # element numpy access, and keyword arguments parsed per call, cost about as much as
    # building the Job (issue 35). A tenant's weight and a class's rank are looked up per code,
    # the same objects the dicts hold.
    tenant_codes, class_codes = c["tenant"].tolist(), c["slo_class"].tolist()
    jobs = list(
        map(
            Job,
            range(len(plan)),
            plan.names("tenant").tolist(),
            plan.names("slo_class").tolist(),
            c["prompt_tokens"].tolist(),
            c["max_tokens"].tolist(),
            (np.asarray(c["offset_ns"], dtype=np.int64) + delay_ns).tolist(),
            map([weights.get(name) for name in plan.tenants].__getitem__, tenant_codes),
            map([ranks.get(name) for name in plan.slo_classes].__getitem__, class_codes),
            plan.names("workload").tolist(),
        )
    )
    if block_size is not None:
        salts = {t.id: t.cache_salt for t in scn.tenants}  # vLLM's cache_salt (workload/cache.py)
        for i, job in enumerate(jobs):
            job.block_hashes = salted(block_hashes(plan, i, block_size), salts[job.tenant])
    return jobs


def _seen(result: SimResult, job: Job, cut_ns: int) -> np.ndarray:
    """The times of the job's output tokens that reached the client by `cut_ns`."""
    if job.status == "finished" or job.segments:
        times = result.token_times(job)
    elif job.first_token_ns >= 0:
        times = np.array([job.first_token_ns], dtype=np.int64)
    else:
        times = np.empty(0, dtype=np.int64)
    return times[times <= cut_ns]


def _last_token_ns(result: SimResult, job: Job) -> int | None:
    """The last of `result.token_times(job)` (None if there is none), read without building
    the array: one index into the replica's decode-step ends when the job was never
    preempted, as nearly every job is (issue 35: the records' largest per-job cost)."""
    if job.segments:
        times = result.token_times(job)
        return int(times[-1]) if len(times) else None
    if job.first_token_ns < 0 or job.max_tokens == 0:
        return None
    if job.first_step >= 0:
        ends = result.decode_ends[job.replica]
        hi = min(job.first_step + job.max_tokens - 1, len(ends))
        if hi > job.first_step:
            return int(ends[hi - 1])
    return int(job.first_token_ns)


def records_from(
    result: SimResult,
    plan: Plan,
    timeout_ns: int | None = None,
    stop_ns: int | None = None,
) -> list[dict[str, Any]]:
    """One record per job, with the columns and the status rule of the live executor.

    A job that finished by its cut-off (`timeout_ns` after its planned send, or `stop_ns`, the
    end of the grace period, whichever comes first) is `ok`; one still unfinished then is `timeout`
    (its own deadline came first) or `cancelled` (the run ended first), recorded as the live
    executor records them: no t_done, the tokens that had arrived by then (first, last, count,
    largest gap), and nothing of what the server would only report at the end (queue time,
    preemptions, cached tokens). `max_tokens` is the plan's; `output_tokens` is what was served,
    which admission's degradation may have capped. The sim's response starts with its first
    token: first byte and HTTP 200 are stamped then."""
    itl = result.itl_max_ns().tolist()  # lists: per-element numpy access is slow (issue 35)
    workloads, endpoints = plan.names("workload").tolist(), plan.names("endpoint").tolist()
    planned, offsets = plan.columns["max_tokens"].tolist(), plan.columns["offset_ns"].tolist()
    never = 1 << 62
    stop = never if stop_ns is None else stop_ns
    timeout_s = (timeout_ns or 0) / 1e9
    rows = []
    for i, job in enumerate(result.jobs):
        sent = offsets[i]  # the planned send: the job arrives at the engine later by the
        # profile's request overhead, which every latency, as live, includes
        row: dict[str, Any] = {
            "request_id": job.id,
            "tenant": job.tenant,
            "slo_class": job.slo_class,
            "workload": workloads[i],
            "endpoint": endpoints[i],
            "t_intended_ns": sent,
            "t_sent_ns": sent,
            "prompt_tokens": job.prompt_tokens,
            "max_tokens": planned[i],
            "output_tokens": 0,
            "n_chunks": 0,
            "worker": 0,
        }
        if job.status != "rejected":  # the scheduler's own contention signal (passover.py)
            waited = job.backlog_ns
            if job.wait_since_ns >= 0:  # still waiting when the simulation ended
                waited += max(0, result.end_ns - job.wait_since_ns)
            row["backlog_ns"] = int(waited)
            if job.passed_over_ns >= 0:
                row["passed_over_ns"] = int(job.passed_over_ns - sent)
        deadline = sent + timeout_ns if timeout_ns is not None else never
        cut = min(deadline, stop)
        if job.status == "rejected":
            code = job.reject_code
            row.update(
                status="rejected" if code in (429, 503) else "error",
                http_status=code,
                retry_after_s=float(job.retry_after_s),
                error_kind={429: "rate_limited", 503: "overloaded"}.get(code, "http_4xx"),
                error_detail="rejected by the scheduler",
            )
        elif job.status == "finished" and job.done_ns <= cut:
            row.update(
                status="ok",
                http_status=200,
                t_first_byte_ns=job.first_token_ns,
                t_first_token_ns=job.first_token_ns if job.max_tokens else None,
                t_last_token_ns=_last_token_ns(result, job),
                t_done_ns=job.done_ns,
                t_end_ns=job.done_ns,
                output_tokens=job.max_tokens,
                n_chunks=job.max_tokens,
                itl_max_ns=itl[i] if itl[i] >= 0 else None,
                queue_time_ns=job.admit_ns - job.arrival_ns,
                preemptions=job.preemptions,
                cached_tokens=job.cached_tokens,
                **ttft_parts(job),
            )
        elif cut < never:
            seen = _seen(result, job, cut)
            row.update(
                status="timeout" if deadline <= stop else "cancelled",
                error_detail=(
                    f"no terminal event within {timeout_s:g}s" if deadline <= stop else None
                ),
                output_tokens=len(seen),
                n_chunks=len(seen),
                t_end_ns=int(cut),  # when the client stopped waiting: the censoring time
            )
            if len(seen):
                row.update(
                    http_status=200,
                    t_first_byte_ns=int(seen[0]),
                    t_first_token_ns=int(seen[0]),
                    t_last_token_ns=int(seen[-1]),
                    itl_max_ns=int(np.diff(seen).max()) if len(seen) > 1 else None,
                )
        else:
            row.update(status="cancelled", error_detail=f"left {job.status} by the simulation")
        rows.append(row)
    return rows


# the int fields of a job that the records read (job_fields)
_INT_FIELDS = (
    "id",
    "prompt_tokens",
    "backlog_ns",
    "wait_since_ns",
    "passed_over_ns",
    "reject_code",
    "first_token_ns",
    "max_tokens",
    "done_ns",
    "admit_ns",
    "arrival_ns",
    "preemptions",
    "cached_tokens",
    "prefill_done_ns",
    "kv_arrived_ns",
    "decode_admit_ns",
    "replica",
    "first_step",
)


def _int_fields(jobs: list[Job], chunk: int = 1 << 15) -> dict[str, np.ndarray]:
    """Every `_INT_FIELDS` field of the jobs, one array each. One pass over the jobs, each
    job's fields read by one C call (attrgetter) into a row of a small 2-D block, copied
    into the fields' own arrays a block at a time: 16 generator passes were most of the
    records stage (issue 35). Separate, contiguous arrays, not views of one n × 18 table:
    strided columns made every later pass over them miss the cache (the columns stage 0.15
    -> 1.6 CPU s at 1.9M), and each array is freed as soon as its column is built."""
    n, k = len(jobs), len(_INT_FIELDS)
    out = [np.empty(n, dtype=np.int64) for _ in range(k)]
    get = operator.attrgetter(*_INT_FIELDS)
    for a in range(0, n, chunk):
        part = jobs[a : a + chunk]
        # the tuples' ints chained into one flat run: numpy reads plain int64s faster than
        # rows of a subarray dtype (0.35 -> 0.28 CPU s for 400k jobs, the same values)
        flat = chain.from_iterable(map(get, part))
        block = np.fromiter(flat, dtype=np.int64, count=len(part) * k).reshape(len(part), k)
        for j in range(k):
            out[j][a : a + len(part)] = block[:, j]
    return dict(zip(_INT_FIELDS, out, strict=True))


def _by_replica(replica: np.ndarray, pick: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """The jobs at `pick` grouped by replica, (replica, their indices), from one stable sort:
    not a mask over all of them per replica (80 at fleet size). The stable order is unique,
    so a narrower integer gives the same one: NumPy radix-sorts 16-bit keys, O(n), where
    int64 keys were merge-sorted (1.76M jobs: 0.14 -> 0.03 CPU s, twice a run, issue 35)."""
    rep = replica[pick]
    if len(rep) and int(rep.min()) >= -(2**15) and int(rep.max()) < 2**15:
        rep = rep.astype(np.int16)
    order = np.argsort(rep, kind="stable")
    pick = pick[order]
    for chunk in np.split(pick, np.flatnonzero(np.diff(rep[order])) + 1):
        if len(chunk):
            yield int(replica[chunk[0]]), chunk


def _last_token_column(
    result: SimResult,
    last: np.ndarray,
    pick: np.ndarray,
    replica: np.ndarray,
    first_step: np.ndarray,
    served: np.ndarray,
) -> None:
    """`_last_token_ns` of the jobs at `pick` (finished, never preempted, with a first token
    and output), written into `last`: per replica one fancy index into its decode-step ends."""
    for r, idx in _by_replica(replica, pick[first_step[pick] >= 0]):
        ends = result.decode_ends[r]
        hi = np.minimum(first_step[idx] + served[idx] - 1, len(ends))
        has = hi > first_step[idx]
        last[idx[has]] = ends[hi[has] - 1]


def _itl_max(
    result: SimResult,
    job_at: Callable[[int], Job],
    eligible: np.ndarray,
    preempted: np.ndarray,
    replica: np.ndarray,
    first_step: np.ndarray,
    first: np.ndarray,
    served: np.ndarray,
) -> np.ndarray:
    """`result.itl_max_ns()` (the same `decode_itl_max`, value for value:
    tests/test_sim_record_columns.py) from the fields job_fields already read, `eligible`
    the finished jobs of ≥ 2 tokens: its loop over every job to group them by replica cost
    as much as the rest of the stage."""
    out = np.full(len(eligible), -1, dtype=np.int64)
    for i in np.flatnonzero(eligible & preempted).tolist():
        times = result.token_times(job_at(i))
        out[i] = int(np.diff(times).max()) if len(times) > 1 else -1
    for r, idx in _by_replica(replica, np.flatnonzero(eligible & ~preempted & (first_step >= 0))):
        out[idx] = decode_itl_max(result.decode_ends[r], first_step[idx], served[idx], first[idx])
    return out


def record_columns(
    result: SimResult,
    plan: Plan,
    timeout_ns: int | None = None,
    stop_ns: int | None = None,
) -> dict[str, tuple[Any, np.ndarray | None]]:
    """`records_from`'s records as columns: name -> (values, null mask or None), values an
    int64/float64 array or a list of str/None, rows in the jobs' order; a column left out is
    all null. fairbench.run.records.records_table makes the Arrow table. Built column by
    column from the jobs, with no Python object per record: at fleet size the per-record dicts
    were about 1 KB each, 2 GB of the run's peak for 1.9M requests (issue 35). The rule is
    `records_from`'s, value for value (tests/test_sim_record_columns.py holds the two equal);
    the rare jobs cut off mid-stream (timeout, cancelled) go through its per-job code."""
    return columns_of(job_fields(result, plan, timeout_ns, stop_ns), plan)


def job_fields(
    result: SimResult, plan: Plan, timeout_ns: int | None = None, stop_ns: int | None = None
) -> dict[str, Any]:
    """What `record_columns` reads of the jobs, as arrays (and the few cut-off jobs' token
    times): once it is taken, the jobs can go before the columns are built (`run_sim` drops
    them: at fleet size they are 960 MB, and the columns 600 MB more, issue 35)."""
    jobs, n = result.jobs, len(result.jobs)
    return fields_from(
        JobColumns(
            view=result,
            job_at=jobs.__getitem__,
            raw=_int_fields(jobs),
            status_of=np.fromiter(map(operator.attrgetter("status"), jobs), dtype=object, count=n),
            retry=np.fromiter(
                map(operator.attrgetter("retry_after_s"), jobs), dtype=np.float64, count=n
            ),
            preempted=np.fromiter(map(bool, map(operator.attrgetter("segments"), jobs)), bool, n),
            steps=result.steps,
        ),
        plan,
        timeout_ns,
        stop_ns,
    )


def fields_from(
    run: JobColumns, plan: Plan, timeout_ns: int | None, stop_ns: int | None
) -> dict[str, Any]:
    """`job_fields` from a run's columns (`sim_compiled.JobColumns`): the Python engine's
    jobs read into them (`job_fields`), or the compiled simulator's, which has no Job per
    request. Job i is read one by one only where it must be (preempted, or cut off
    mid-stream), and their token times come from `run.view`'s decode-step ends."""
    result, job_at, raw, status_of = run.view, run.job_at, run.raw, run.status_of
    retry, preempted = run.retry, run.preempted
    n = len(status_of)
    never = 1 << 62
    stop = never if stop_ns is None else stop_ns
    sent = np.asarray(plan.columns["offset_ns"], dtype=np.int64)
    rejected, finished = status_of == "rejected", status_of == "finished"
    done, first, served = raw["done_ns"], raw["first_token_ns"], raw["max_tokens"]
    deadline = sent + timeout_ns if timeout_ns is not None else np.full(n, never, np.int64)
    cut = np.minimum(deadline, stop)
    ok = finished & (done <= cut)
    open_ = ~rejected & ~ok
    cut_short = open_ & (cut < never)  # timeout or cancelled at the cut, per job below
    left = open_ & (cut >= never)  # never ended: the simulation left it
    # the last token: one index per never-preempted job; the preempted through token_times
    last = np.zeros(n, np.int64)
    has_last = ok & (first >= 0) & (served != 0)
    plain = np.flatnonzero(has_last & ~preempted)
    last[plain] = first[plain]  # no decode step: the first token is the last
    replica, first_step = raw["replica"], raw["first_step"]
    _last_token_column(result, last, plain, replica, first_step, served)
    eligible = finished & (served >= 2)
    itl = _itl_max(result, job_at, eligible, preempted, replica, first_step, first, served)
    for i in np.flatnonzero(ok & preempted).tolist():
        value = _last_token_ns(result, job_at(i))
        has_last[i] = value is not None
        last[i] = value or 0
    # cut off before any token: nothing was seen, read without a Job (a never-preempted job's
    # tokens all come at or after its first, and one that never started has none). Why: the
    # 10-minute fleet under three-tier cuts off 164,550 requests at the end, 155,343 of them
    # before any token, and a Job and a token array for each were 0.7 of the records' CPU s
    # (issue 35)
    unseen = cut_short & ~preempted & (((first < 0) & ~finished) | (first > cut))
    seen_at_cut = {
        i: _seen(result, job_at(i), int(cut[i]))
        for i in np.flatnonzero(cut_short & ~unseen).tolist()
    }
    left_status = {i: status_of[i] for i in np.flatnonzero(left).tolist()}
    return {
        "n": n,
        "end_ns": result.end_ns,
        "raw": raw,
        "sent": sent,
        "rejected": rejected,
        "retry": retry,
        "deadline": deadline,
        "stop": stop,
        "cut": cut,
        "ok": ok,
        "cut_short": cut_short,
        "itl": itl,
        "last": last,
        "has_last": has_last,
        "seen_at_cut": seen_at_cut,
        "unseen": unseen,
        "left_status": left_status,
        "timeout_ns": timeout_ns,
    }


_STATUS = ("ok", "cancelled", "rejected", "error", "timeout")  # a record's status, as codes


def _strings(codes: np.ndarray, names: Sequence[str]) -> pa.Array:
    """The string column names[codes], built in Arrow from the codes: the same values as an
    array of a str per record, without those 1.9M Python objects per column (issue 35). A take
    from the names, not a dictionary array cast to strings: the same array, a sixth of the
    time (1.9M codes: 0.018 against 0.105 CPU s)."""
    return pa.array(names, type=pa.string()).take(pa.array(np.asarray(codes, dtype=np.int32)))


def columns_of(fields: dict[str, Any], plan: Plan) -> dict[str, tuple[Any, np.ndarray | None]]:
    """`record_columns` from its `job_fields`, with no job left (the fields are consumed)."""
    n, raw, sent, rejected = fields["n"], fields["raw"], fields["sent"], fields["rejected"]
    deadline, stop, cut, ok = fields["deadline"], fields["stop"], fields["cut"], fields["ok"]
    cut_short, itl, last, has_last = (
        fields["cut_short"],
        fields["itl"],
        fields["last"],
        fields["has_last"],
    )
    first, served, done = raw["first_token_ns"], raw["max_tokens"], raw["done_ns"]
    timeout_ns = fields["timeout_ns"]
    ints: dict[str, np.ndarray] = {}
    nulls: dict[str, np.ndarray] = {}

    def put(name: str, values: np.ndarray, valid: np.ndarray, owned: bool = True) -> None:
        """The column `values` where valid, 0 (and null) elsewhere. `owned`: nothing reads
        `values` after (a temporary, or a field consumed here), so it is zeroed in place;
        a new 1.9M-row array per column had its pages faulted in, most of this stage's CPU
        at fleet size (0.9 of 1.0 s, issue 35)."""
        invalid = ~valid
        if owned:
            np.copyto(values, 0, where=invalid)
            ints[name] = values
        else:
            ints[name] = np.where(valid, values, 0)
        nulls[name] = invalid

    ints["request_id"] = raw.pop("id")
    ints["t_intended_ns"] = ints["t_sent_ns"] = sent
    ints["prompt_tokens"] = raw.pop("prompt_tokens")
    ints["max_tokens"] = np.asarray(plan.columns["max_tokens"], dtype=np.int64)
    ints["worker"] = np.zeros(n, np.int64)
    waited, wait_since = raw.pop("backlog_ns"), raw.pop("wait_since_ns")
    waited += np.where(wait_since >= 0, np.maximum(0, fields["end_ns"] - wait_since), 0)
    put("backlog_ns", waited, ~rejected)
    passed = raw.pop("passed_over_ns")
    put("passed_over_ns", passed - sent, ~rejected & (passed >= 0))
    code = raw.pop("reject_code")
    put("http_status", np.where(rejected, code, 200), rejected | ok)
    put("t_first_byte_ns", first, ok, owned=False)
    put("t_first_token_ns", first, ok & (served != 0), owned=False)
    put("t_done_ns", done, ok, owned=False)
    put("t_end_ns", np.where(ok, done, cut), ok | cut_short)
    ints["output_tokens"] = ints["n_chunks"] = np.where(ok, served, 0)  # one array: equal
    put("itl_max_ns", itl, ok & (itl >= 0))
    admit = raw.pop("admit_ns")
    put("queue_time_ns", admit - raw.pop("arrival_ns"), ok)
    put("preemptions", raw.pop("preemptions"), ok)
    put("cached_tokens", raw.pop("cached_tokens"), ok)
    # ttft_parts, vectorized: colocated (no prefill_done), finished in the prefill pool (no KV
    # arrival), or disaggregated
    pre_done, kv = raw.pop("prefill_done_ns"), raw.pop("kv_arrived_ns")
    colocated, disagg = pre_done < 0, (pre_done >= 0) & (kv >= 0)
    end = np.where(first >= 0, first, done)
    put("prefill_ns", np.where(colocated, end, pre_done) - admit, ok)
    put("kv_transfer_ns", np.where(disagg, kv - pre_done, 0), ok)
    put("decode_wait_ns", np.where(disagg, raw.pop("decode_admit_ns") - kv, 0), ok)
    texts: dict[str, list[str | None]] = {"error_kind": [None] * n, "error_detail": [None] * n}
    state = np.where(ok, _STATUS.index("ok"), _STATUS.index("cancelled")).astype(np.int32)
    kinds = {429: "rate_limited", 503: "overloaded"}
    for i in np.flatnonzero(rejected).tolist():
        c = int(code[i])
        state[i] = _STATUS.index("rejected" if c in (429, 503) else "error")
        texts["error_kind"][i] = kinds.get(c, "http_4xx")
        texts["error_detail"][i] = "rejected by the scheduler"
    for i, status in fields["left_status"].items():
        texts["error_detail"][i] = f"left {status} by the simulation"
    timeout_s = (timeout_ns or 0) / 1e9
    timed_out_text = f"no terminal event within {timeout_s:g}s"
    # cut off with no token seen: the loop below for len(seen) 0, of which only a timeout needs
    # writing (an unfinished request is already cancelled with no output)
    late = fields["unseen"] & (deadline <= stop)
    state[late] = _STATUS.index("timeout")
    details = texts["error_detail"]
    for i in np.flatnonzero(late).tolist():
        details[i] = timed_out_text
    for i, seen in fields["seen_at_cut"].items():  # the client stopped waiting mid-stream
        timed_out = bool(deadline[i] <= stop)
        state[i] = _STATUS.index("timeout" if timed_out else "cancelled")
        if timed_out:
            details[i] = timed_out_text
        ints["output_tokens"][i] = len(seen)
        if len(seen):
            for name in ("t_first_byte_ns", "t_first_token_ns"):
                ints[name][i], nulls[name][i] = int(seen[0]), False
            ints["http_status"][i], nulls["http_status"][i] = 200, False
            last[i], has_last[i] = int(seen[-1]), True
            if len(seen) > 1:
                ints["itl_max_ns"][i] = int(np.diff(seen).max())
                nulls["itl_max_ns"][i] = False
    put("t_last_token_ns", last, has_last)
    columns: dict[str, tuple[Any, np.ndarray | None]] = {
        name: (values, nulls.get(name)) for name, values in ints.items()
    }
    columns["retry_after_s"] = (np.where(rejected, fields["retry"], 0.0), ~rejected)
    # the plan's names from its codes, in Arrow (a job's tenant and class are the plan's,
    # plan_jobs made them so, and the engine never changes them): no pass over the jobs and
    # no str per record for Arrow to read back, 2 passes and 4 columns at 1.9M (issue 35)
    for name, names in (
        ("tenant", plan.tenants),
        ("slo_class", plan.slo_classes),
        ("workload", plan.workloads),
        ("endpoint", ENDPOINTS),
    ):
        columns[name] = (_strings(plan.columns[name], names), None)
    columns["status"] = (_strings(state, _STATUS), None)
    for name, strings in texts.items():
        columns[name] = (strings, None)
    return columns


def cut_offs(plan: Plan, scn: Scenario) -> tuple[int, int]:
    """The run's per-request timeout and the end of its grace period (ns on the plan's clock):
    the grace starts at the last send, which in the sim is the last planned offset."""
    offsets = plan.columns["offset_ns"]
    last = int(offsets.max()) if len(offsets) else 0
    return round(scn.run.timeout * 1e9), last + round(scn.run.grace * 1e9)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off while the jobs are made and simulated. Every job lives to
    the end of the run, yet each burst of allocations set off a collection that walked all
    those made so far again: plan_jobs took 0.33 CPU s for the fleet's 96,097 jobs with it,
    0.10 without (issue 35). The simulation makes no garbage cycles of note (peak RSS the same);
    the collector runs again afterwards, as it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def run_sim(
    plan: Plan,
    scn: Scenario,
    progress: Callable[[int, int], None] | None = None,
    columns: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """Simulate the plan in virtual time, honouring `run.timeout` and `run.grace` as a live run
    does; the info names the set-up and carries the scheduler's warnings. `progress(ended,
    now_ns)` is told now and then how many requests have ended and the virtual time (a
    person's progress bar; it changes nothing). The records are a list of dicts, or with
    `columns` (the pipeline's way: no object per record) `record_columns`' columns; a plan with
    sessions gives the list either way (its records are edited per turn)."""
    if plan.sessions is not None:  # multi-turn: closed loop inside each session
        from fairbench.targets.sim_sessions import run_sim_sessions

        return run_sim_sessions(plan, scn, plan_jobs, records_from)
    config = parse_scheduler_config(scn.scheduler)
    block_size = config.spec.block_size if config.prefix_caching else None
    timeout_ns, stop_ns = cut_offs(plan, scn)
    delay_ns = round(config.profile.request_overhead_ms * 1e6)
    if columns and use_compiled(config):  # the same records, no Job per request
        run = simulate_plan(plan, scn, config, timeout_ns, stop_ns, delay_ns, progress)
        steps = run.steps
        fields = fields_from(run, plan, timeout_ns, stop_ns)
        del run
        return columns_of(fields, plan), _info(config, steps, {})
    with collector_paused():
        result = simulate(
            plan_jobs(plan, scn, block_size, delay_ns),
            config,
            # the engine cancels a job timeout_ns after its arrival; the client's clock started
            # at the send, delay_ns earlier
            timeout_ns=None if timeout_ns is None else max(0, timeout_ns - delay_ns),
            stop_ns=stop_ns,
            progress=progress,
        )
        info = _info(config, result.steps, result.control)
        if columns:  # the jobs go once read, before the columns are built (job_fields)
            fields = job_fields(result, plan, timeout_ns, stop_ns)
            del result
            rows: Any = columns_of(fields, plan)
        else:
            rows = records_from(result, plan, timeout_ns, stop_ns)
            del result  # the jobs go before the collector is back: it would walk them all once
    return rows, info


def _info(config: Any, steps: int, control: dict[tuple[str, str], int]) -> dict[str, Any]:
    """The run's target info: the set-up, the steps run, the scheduler's warnings and the
    control loops' actions (reference_scheduler/.../control.py) if any."""
    info: dict[str, Any] = {
        "kind": "sim",
        "policy": str(config.spec.policy),
        "profile": config.profile.name,
        "request_overhead_ms": str(config.profile.request_overhead_ms),
        "front_end_core_ms": str(config.profile.front_end_core_ms),
        "idle_wake_ms": str(config.profile.idle_wake_ms),
        "replicas": str(config.replicas),
        "steps": str(steps),
    }
    if config.warnings:
        info["warnings"] = list(config.warnings)
    if control:
        info["control_actions"] = {f"{loop}/{act}": n for (loop, act), n in control.items()}
    return info
