"""The virtual-time driver: the engine and a policy, run as fast as the CPU allows.

The environment owns time (SimPy's shape): one loop merges the pre-sorted arrival stream with a
heap of replica step ends `(t_ns, replica)`. Arrivals at the same instant as a step end are
processed first, so they can be admitted at that step boundary; ties between replicas break by
replica index; every random draw comes from the config's seed. Same inputs, same trace, bit for
bit.

An idle replica (nothing running) starts a step as soon as work may be admitted: on an arrival,
and after another replica's step released capacity (a tier ceiling can make a job wait while a
replica is idle). Results carry, per job, the timing fields the live executor records, so the
analysis treats simulated and live runs alike.

A client's patience is simulated too, because a live run has it: with `timeout_ns`, a job not
finished `timeout_ns` after its arrival is cancelled in the engine at that instant (the server
does the same when the client disconnects), so it stops holding a batch slot and KV blocks; with
`stop_ns` (the end of the run's grace period), every job still live then is cancelled. At one
instant the order is: arrivals, then timeouts, then the stop, then step ends (a cancellation at
a step boundary frees its capacity for the step that starts there). A job whose last token
comes at or before its cut-off finished in time.

Sessions (closed loop inside a session, open across sessions): with `follow`, each job that
finishes is offered to it, and the jobs it returns (a session's next turn, or an agent's next
step of k calls once the last of its step finished, their arrival set to that done time plus
the think time) join the arrivals then. A job that did not finish
releases nothing. Released jobs are timed out and stopped like the others.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reference_scheduler.core.job import Job
from reference_scheduler.scheduler.config import SchedulerConfig
from reference_scheduler.scheduler.vllm import make_engine


@dataclass(frozen=True)
class SimResult:
    """Per-job outcome arrays (ordered as the input jobs) plus per-replica step timings."""

    jobs: list[Job]
    decode_ends: list[np.ndarray]  # per replica, end time of each decode step
    end_ns: int  # when the last event happened
    steps: int  # iterations run over all replicas
    trace: list[tuple[int, str, int, int]] | None  # (t_ns, event, job id, replica) if asked
    # the control loops' actions, (loop, action) -> count (scheduler/control.py); {} when off
    control: dict[tuple[str, str], int] = field(default_factory=dict)

    def column(self, name: str) -> np.ndarray:
        return np.fromiter(
            (getattr(j, name) for j in self.jobs), dtype=np.int64, count=len(self.jobs)
        )

    def token_times(self, job: Job) -> np.ndarray:
        """Every output token's time for one finished job (first token, then each decode)."""
        if job.first_token_ns < 0 or job.max_tokens == 0:
            return np.empty(0, dtype=np.int64)
        if job.segments:  # preempted: lead tokens and decode runs, segment by segment
            parts = []
            for replica, lead, first, count in job.segments:
                if lead >= 0:
                    parts.append(np.array([lead], dtype=np.int64))
                parts.append(self.decode_ends[replica][first : first + count])
            return np.concatenate(parts).astype(np.int64)
        ends = self.decode_ends[job.replica]
        tail = (
            ends[job.first_step : job.first_step + job.max_tokens - 1]
            if job.first_step >= 0
            else ends[:0]
        )
        return np.concatenate(([job.first_token_ns], tail)).astype(np.int64)

    def itl_max_ns(self) -> np.ndarray:
        """Largest gap between consecutive tokens of each job (-1 for fewer than 2 tokens)."""
        out = np.full(len(self.jobs), -1, dtype=np.int64)
        per_replica: dict[int, list[int]] = {}
        for i, job in enumerate(self.jobs):
            if job.status != "finished" or job.max_tokens < 2:
                continue
            if job.segments:
                times = self.token_times(job)
                out[i] = int(np.diff(times).max()) if len(times) > 1 else -1
            elif job.first_step >= 0:
                per_replica.setdefault(job.replica, []).append(i)
        for r, idx in per_replica.items():
            out[np.asarray(idx)] = decode_itl_max(
                self.decode_ends[r],
                np.array([self.jobs[i].first_step for i in idx]),
                np.array([self.jobs[i].max_tokens for i in idx]),
                np.array([self.jobs[i].first_token_ns for i in idx]),
            )
        return out


def decode_itl_max(
    ends: np.ndarray, first_step: np.ndarray, tokens: np.ndarray, first_token_ns: np.ndarray
) -> np.ndarray:
    """Largest gap between consecutive tokens of jobs of ≥ 2 tokens that decoded on one
    replica without a preemption: `ends` its decode steps' end times, a job's second token at
    the end of its `first_step`, then one a step. The first token to the second, or the
    largest of the steps' gaps it spans (a sparse table: one range max per job)."""
    lead = ends[first_step] - first_token_ns  # first token -> second token
    lo, hi = first_step, first_step + tokens - 2  # gaps[lo:hi] join decode steps lo..hi
    return np.maximum(lead, _range_max(_sparse_max(np.diff(ends)), lo, hi))


def _sparse_max(values: np.ndarray) -> list[np.ndarray]:
    table = [values]
    span = 1
    while 2 * span <= len(values):
        prev = table[-1]
        table.append(np.maximum(prev[:-span], prev[span:]))
        span *= 2
    return table


def _range_max(table: list[np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo:hi]) per pair; -1 where the range is empty."""
    out = np.full(len(lo), -1, dtype=np.int64)
    ok = hi > lo
    if not ok.any():
        return out
    length = hi[ok] - lo[ok]
    level = np.floor(np.log2(length)).astype(np.int64)
    result = np.empty(int(ok.sum()), dtype=np.int64)
    for lv in np.unique(level):
        sel = level == lv
        row = table[lv]
        a = lo[ok][sel]
        b = hi[ok][sel] - (1 << int(lv))
        result[sel] = np.maximum(row[a], row[b])
    out[ok] = result
    return out


def simulate(
    jobs: Iterable[Job],
    config: SchedulerConfig,
    trace: bool = False,
    timeout_ns: int | None = None,
    stop_ns: int | None = None,
    follow: Callable[[Job], Job | list[Job] | None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Run `jobs` (sorted by arrival_ns) through the configured engine in virtual time.

    `timeout_ns`: each job is cancelled that long after its arrival unless finished by then;
    `stop_ns`: every job still live at that instant is cancelled and the simulation ends;
    `follow(job)`: a finished job's successor, or None (sessions; see the module's docstring).
    `progress(ended, now_ns)`: told every 4,096 events how many jobs have ended (finished,
    rejected or cancelled) and the virtual time, for a person watching; it changes nothing.
    Released jobs are not in the result's `jobs`: the caller holds them."""
    jobs = list(jobs)
    if config.spec.disaggregation is not None:  # a prefill pool and a decode pool
        from reference_scheduler.drivers.disaggregated import simulate_disaggregated

        if follow is not None:
            raise ValueError("scheduler.disaggregation: sessions run colocated only, for now")
        return SimResult(*simulate_disaggregated(jobs, config, timeout_ns, stop_ns), None)
    # scheduler.engine: reference or vllm; no /metrics reads the waiting counts per group here
    engine = make_engine(config, group_counts=False)
    policy = engine.policy
    step = engine.step
    n_rep = len(engine.replicas)
    # Replicas stepping, a min-heap of one int each, step end << shift | replica: it orders as
    # (step end, replica) did, and an int compares and sifts faster than a tuple (issue 35).
    shift = max(n_rep - 1, 1).bit_length()
    mask = (1 << shift) - 1
    running: list[int] = []
    idle = list(range(n_rep))  # min-heap of idle replica indices
    log: list[tuple[int, str, int, int]] | None = [] if trace else None
    heappush, heappop, heapreplace = heapq.heappush, heapq.heappop, heapq.heapreplace

    def record(res: object, r: int) -> None:
        assert log is not None
        for job in res.preempted:  # type: ignore[attr-defined]
            log.append((res.start_ns, "preempt", job.id, r))  # type: ignore[attr-defined]
        for job in res.admitted:  # type: ignore[attr-defined]
            log.append((res.start_ns, "admit", job.id, r))  # type: ignore[attr-defined]
        for job in res.first_tokens:  # type: ignore[attr-defined]
            log.append((res.end_ns, "first_token", job.id, r))  # type: ignore[attr-defined]
        for job in res.finished:  # type: ignore[attr-defined]
            log.append((res.end_ns, "finish", job.id, r))  # type: ignore[attr-defined]

    released: list[tuple[int, int, Job]] = []  # (arrival, id, job) offered by `follow`
    late: list[tuple[int, int, Job]] = []  # (timeout due, id, job) of released jobs submitted
    joined: list[Job] = []  # released jobs submitted, for the stop

    def finished(res: object) -> None:
        assert follow is not None
        for job in res.finished:  # type: ignore[attr-defined]
            nxt = follow(job)
            for call in (nxt,) if isinstance(nxt, Job) else nxt or ():
                heappush(released, (call.arrival_ns, call.id, call))

    def started(res: Any, r: int) -> None:
        """Replica r stepped: its events logged, the jobs its finished ones release offered,
        the ended counted, and the replica busy until the step's end."""
        if log is not None:
            record(res, r)
        if follow is not None:
            finished(res)
        ended[0] += len(res.finished)
        heappush(running, res.end_ns << shift | r)

    def kick(now: int) -> None:
        """Start a step on idle replicas while the queue may have work for them."""
        tried = []
        while idle and len(policy):
            r = heappop(idle)
            res = step(r, now)
            if res is None:
                tried.append(r)
                break  # the policy holds its jobs back (tier ceiling): no idle replica helps
            started(res, r)
        for r in tried:
            heappush(idle, r)

    ended = [0]  # jobs finished, rejected or cancelled, for `progress`

    i, n = 0, len(jobs)
    now = 0
    live = ("waiting", "running", "preempted")
    cancel = engine.cancel
    submit = engine.submit
    d = 0  # next job whose timeout is due (arrivals are sorted, so deadlines are too)
    never = 1 << 62
    never_key = never << shift
    patience = never if timeout_ns is None else timeout_ns  # no timeout: due past the stop
    stop_at = never if stop_ns is None else stop_ns
    events = 0
    while i < n or running or released:
        events += 1
        if progress is not None and not events & 4095:
            progress(ended[0], now)
        if follow is None:
            # Without sessions (nothing joins the arrivals, no released job times out) the next
            # event is the next arrival or step end unless a timeout or the stop comes first:
            # taken here with two compares; the checks below, which give the same order, run
            # only when a timeout or the stop is next (issue 35: this loop runs per event).
            limit = jobs[d].arrival_ns + patience if d < i else never
            if stop_at < limit:
                limit = stop_at
            key = running[0] if running else never_key
            if i < n and jobs[i].arrival_ns << shift <= key:  # arrivals go before step ends
                if jobs[i].arrival_ns <= limit:
                    while True:  # this arrival, and the next ones while they still come first
                        job = jobs[i]
                        now = job.arrival_ns
                        i += 1
                        verdict = submit(job, now)
                        if verdict.accepted:
                            if log is not None:
                                log.append((now, "arrive", job.id, -1))
                            if idle:
                                kick(now)
                        else:
                            ended[0] += 1
                            if log is not None:
                                log.append((now, "reject", job.id, -1))
                        if i == n:
                            break
                        t = jobs[i].arrival_ns
                        if (
                            (running and t << shift > running[0])
                            or t > stop_at
                            or (d < i and t > jobs[d].arrival_ns + patience)
                        ):
                            break
                    continue
            elif key < limit << shift:  # step ends, while before the next arrival, timeout, stop
                t = jobs[i].arrival_ns if i < n else never
                bound = (t if t < limit else limit) << shift  # a step end before it: key < bound
                while running and running[0] < bound:
                    key = running[0]
                    now, r = key >> shift, key & mask
                    if progress is not None:
                        events += 1
                        if not events & 4095:
                            progress(ended[0], now)
                    res = step(r, now)
                    if res is None:
                        heappop(running)
                        heappush(idle, r)
                        continue
                    heapreplace(running, res.end_ns << shift | r)  # one sift: each key is unique
                    if log is not None:
                        record(res, r)
                    if res.finished:
                        ended[0] += len(res.finished)
                        if idle and len(policy):
                            kick(now)
                continue
        t_list = jobs[i].arrival_ns if i < n else never
        t_arrive = min(t_list, released[0][0]) if released else t_list
        t_step = running[0] >> shift if running else never
        t_due = jobs[d].arrival_ns + timeout_ns if timeout_ns is not None and d < i else never
        if late and late[0][0] < t_due:
            t_due = late[0][0]
        if t_due < t_arrive and t_due <= stop_at and t_due <= t_step:
            if late and late[0][0] == t_due:
                job = heappop(late)[2]
            else:
                job = jobs[d]
                d += 1
            now = t_due
            if job.status in live:
                ended[0] += cancel(job, now)
                if log is not None:
                    log.append((now, "timeout", job.id, job.replica))
            continue
        if stop_at < t_arrive and stop_at <= t_step:
            now = stop_at
            for job in jobs[:i] + joined:
                if job.status in live:
                    cancel(job, now)
                    if log is not None:
                        log.append((now, "cancel", job.id, job.replica))
            break
        if t_arrive < never and (not running or t_arrive <= running[0] >> shift):
            head = released[0] if released else None
            if head is not None and (
                t_list > head[0] or (t_list == head[0] and jobs[i].id > head[1])
            ):
                job = heappop(released)[2]
                joined.append(job)
                if timeout_ns is not None:
                    heappush(late, (job.arrival_ns + timeout_ns, job.id, job))
            else:
                job = jobs[i]
                i += 1
            now = job.arrival_ns
            verdict = submit(job, now)
            ended[0] += not verdict.accepted
            if log is not None:
                log.append((now, "arrive" if verdict.accepted else "reject", job.id, -1))
            if verdict.accepted and idle:
                kick(now)
            continue
        key = heappop(running)  # a step end (with a timeout or the stop at the same instant)
        now, r = key >> shift, key & mask
        res = step(r, now)
        if res is None:
            heappush(idle, r)
            continue
        started(res, r)
        if res.finished and idle and len(policy):
            kick(now)
    if progress is not None:
        progress(len(jobs) + len(joined), now)  # the stop cancelled whatever was left
    decode_ends = [np.asarray(rep.decode_ends, dtype=np.int64) for rep in engine.replicas]
    control = getattr(engine, "control", None)
    if control is not None and log is not None:  # its actions join the trace, in time order
        log.extend((t, f"control:{loop}:{action}", job, -1) for t, loop, action, job in control.log)
        log.sort(key=lambda event: event[0])
    counts = dict(control.counts) if control is not None else {}
    steps = sum(rep.steps for rep in engine.replicas)
    return SimResult(jobs, decode_ends, now, steps, log, counts)
