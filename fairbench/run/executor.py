"""The open-loop executor: request i goes out at t0 + offset_i, whatever else is in flight.

- Absolute deadlines: each wait is computed from t0 and the plan's offset, never a relative
  sleep, so lateness does not accumulate. Requests whose deadline has passed go out at once.
- No gate in front of the schedule. The send loop only creates a task per request; a slow or
  stalled target cannot delay a later send. (`concurrency_cap` exists for closed-loop
  experiments only; the run then reports itself as closed-loop and records the waiting.)
- Stamps with `time.perf_counter_ns()` (CLOCK_MONOTONIC on Linux, shared by worker processes):
  intended, sent, first byte, first token, last token, done, max inter-token gap.
  Latency is reported from the intended time (coordinated-omission free) and from the send time.
- Every planned request ends as exactly one record: a request task always writes its record (in
  `finally`), and requests never sent because the run was stopped are recorded `cancelled`.
- Stopping (Ctrl-C, SIGTERM, `stop` set): sending stops, in-flight requests get `grace_s`, the
  rest are cancelled and recorded.
- Sessions (a plan with multi-turn conversations, fairbench.plan.sessions): the schedule is
  of sessions — a first turn goes out at its planned time like any request — and inside a
  session the loop is closed: turn k+1 is due when turn k completed plus its think time, its
  prompt the conversation so far with the output turn k actually returned. Its latency (and its
  send lag, which the health check judges) is measured from when it became due. A turn that
  did not finish ends its session: each later turn is recorded `cancelled`, saying which. A
  session belongs to the executor that owns its first turn, whichever shard its later rows are.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairbench.plan.model import Plan, PlannedRequest
from fairbench.plan.sessions import Conversation, Steps, session_steps
from fairbench.run.exec_types import ExecOptions, LiveCounters
from fairbench.run.pacer import make_pacer
from fairbench.run.records import JournalWriter, Record
from fairbench.targets.base import Done, Failed, Started, Target, Token
from fairbench.workload.sessions import step_word

now_ns = time.perf_counter_ns
_PREPARE_NS = 1_500_000  # build requests ahead only while the next send is this far off


@dataclass
class ExecResult:
    t0_ns: int
    loop_lag_ns: np.ndarray  # event-loop wake-up lateness samples
    closed_loop_wait_ns: np.ndarray
    stopped: bool
    records: int
    pacing: str = ""  # which pacer waited for the send times (timerfd | spin | sleep)
    cpu_s: float = 0.0  # this process's CPU time from the first send to the end of the drain


class Executor:
    def __init__(
        self,
        plan: Plan,
        target: Target,
        journal: JournalWriter,
        options: ExecOptions | None = None,
        indices: Sequence[int] | None = None,
        worker: int = 0,
        counters: LiveCounters | None = None,
    ) -> None:
        self.plan = plan
        self.target = target
        self.journal = journal
        self.options = options or ExecOptions()
        self.indices = np.arange(len(plan)) if indices is None else np.asarray(indices)
        self.worker = worker
        self.counters = counters or LiveCounters()
        # with sessions: the schedule holds first turns (and requests outside sessions); the
        # later turns of this executor's sessions follow their predecessors (`_session`)
        self._steps: Steps | None = None
        self._owned = self.indices
        if plan.sessions is not None:
            self._steps = steps = session_steps(plan)
            self.indices = self.indices[plan.sessions["turn"][self.indices] <= 1]
            owned = []
            for i in self.indices:
                step = int(steps.step_of[int(i)])
                owned.extend(steps.chain(step) if step >= 0 else [int(i)])
            self._owned = np.sort(np.asarray(owned, dtype=np.int64))
        self._outcomes: dict[int, Record] = {}  # session turns' records, read by `_session`
        self.counters.planned = len(self._owned)
        # a transport that reads with kernel receive stamps can say how late it read
        self.kernel_stamps = bool(getattr(target, "kernel_stamps", False))
        self.stop = asyncio.Event()
        # Per-request and per-tick state is kept compact: a Python int in a list costs ~36 bytes,
        # which a 30-minute soak at 80 requests/s (and 200 loop ticks/s) sees as a leak.
        self._loop_lags = array("q")  # 8 bytes per monitor tick
        self._cap_waits = array("q")
        self._tasks: set[asyncio.Task[None]] = set()
        self._chains: set[asyncio.Task[None]] = set()  # the sessions still going
        self._written = bytearray(len(plan))  # by request_id (the plan's row): 1 byte each
        self._records = 0

    # ------------------------------------------------------------------ one request

    def _record(self, req: PlannedRequest, intended_ns: int, **fields: Any) -> Record:
        """A request's record, as planned (every record starts here)."""
        if req.session_id >= 0:
            fields.setdefault("session_id", req.session_id)
            fields.setdefault("turn", req.turn)
        return Record(
            req.request_id,
            req.tenant,
            req.slo_class,
            req.workload,
            req.endpoint,
            intended_ns,
            req.prompt_tokens,
            req.max_tokens,
            worker=self.worker,
            **fields,
        )

    def _begin(self, req: PlannedRequest, t_intended: int, t0: int, sent: int) -> Record:
        """The record of a request just sent, and the generator's lateness for it."""
        rec = self._record(req, t_intended - t0)
        rec.t_sent_ns = sent - t0
        self.counters.last_lag_ns = sent - t_intended  # the send lag itself is in the record
        self.counters.sent += 1
        return rec

    async def _one(self, req: PlannedRequest, t_intended: int, t0: int) -> None:
        sent = now_ns()
        rec = self._begin(req, t_intended, t0, sent)
        first = last = None
        itl_max = 0
        tokens = 0
        terminal = None
        deadline_s = (t_intended - sent) / 1e9 + self.options.timeout_s
        try:
            async with asyncio.timeout(max(deadline_s, 0.0)):
                async for event in self.target.send(req):
                    t = now_ns()
                    if type(event) is Token:
                        if first is None:
                            first = t
                        else:
                            gap = t - last  # type: ignore[operator]
                            if gap > itl_max:
                                itl_max = gap
                        last = t
                        tokens += event.n
                        rec.n_chunks += 1
                    elif type(event) is Started:
                        if rec.t_first_byte_ns is None:
                            rec.t_first_byte_ns = t - t0
                    elif type(event) is Done or type(event) is Failed:
                        terminal = event
                        rec.t_done_ns = t - t0
                        break
            self._settle(rec, terminal, tokens, req)
        except TimeoutError:
            rec.status, rec.error_kind = "timeout", None
            rec.error_detail = f"no terminal event within {self.options.timeout_s:g}s"
        except asyncio.CancelledError:
            rec.status = "cancelled"
        except Exception as error:  # a target bug must not lose the record
            rec.status, rec.error_kind = "error", "client"
            rec.error_detail = f"{type(error).__name__}: {error}"[:300]
        finally:
            rec.t_end_ns = now_ns() - t0
            if first is not None:
                rec.t_first_token_ns = first - t0
                rec.t_last_token_ns = last - t0  # type: ignore[operator]
                rec.itl_max_ns = itl_max if rec.n_chunks > 1 else None
            if rec.output_tokens == 0:
                rec.output_tokens = tokens
            self._write(rec)

    @staticmethod
    def _settle(
        rec: Record,
        terminal: Done | Failed | None,
        tokens: int,
        req: PlannedRequest,
        stream_tokens: int | None = None,
    ) -> None:
        """The one rule for a record's status. `tokens`: token events seen (or the usage count
        when the target reports one through Done); `stream_tokens`: token events that reached the
        client, where the transport counted them."""
        if isinstance(terminal, Failed):
            rec.status = terminal.status
            rec.error_kind = terminal.kind
            rec.error_detail = terminal.detail or None
            rec.http_status = terminal.http_status
            rec.retry_after_s = terminal.retry_after_s
            return
        if terminal is None:
            rec.status, rec.error_kind = "error", "stream_incomplete"
            rec.error_detail = "the target ended without a terminal event"
            return
        rec.http_status = 200
        rec.output_tokens = terminal.output_tokens if terminal.output_tokens is not None else tokens
        extra = terminal.extra
        if extra:
            rec.queue_time_ns = _opt_int(extra.get("queue_time_ns"))
            rec.preemptions = _opt_int(extra.get("preemptions"))
            rec.cached_tokens = _opt_int(extra.get("cached_tokens"))
            rec.server_received_ns = _opt_int(extra.get("received_ns"))
            rec.passed_over_ns = _opt_int(extra.get("passed_over_ns"))  # reference scheduler
            rec.backlog_ns = _opt_int(extra.get("backlog_ns"))
            # TTFT after the queue wait, where the server splits it (the reference scheduler)
            rec.prefill_ns = _opt_int(extra.get("prefill_ns"))
            rec.kv_transfer_ns = _opt_int(extra.get("kv_transfer_ns"))
            rec.decode_wait_ns = _opt_int(extra.get("decode_wait_ns"))
            gateway = extra.get("gateway")
            if isinstance(gateway, dict):
                _behind_gateway(rec, gateway)
        delivered = tokens if stream_tokens is None else stream_tokens
        wants_tokens = req.endpoint != "embeddings" and req.max_tokens > 0
        if wants_tokens and (rec.output_tokens == 0 or (req.stream and delivered == 0)):
            # A stream that delivered no token gave the client nothing, whatever usage claims.
            rec.status, rec.error_kind = "error", "no_token"
            rec.error_detail = "a terminal event but no output token reached the client"
            return
        rec.status = "ok"

    async def _one_fast(
        self, req: PlannedRequest, waiter: Any, outcome: Any, t_intended: int, t0: int
    ) -> None:
        """A request already on the wire (the target stamped t_sent); wait for its outcome."""
        rec = self._begin(req, t_intended, t0, outcome.t_sent)
        remaining = (t_intended - outcome.t_sent) / 1e9 + self.options.timeout_s
        try:
            async with asyncio.timeout(max(remaining, 0.0)):
                await asyncio.shield(waiter)
        except TimeoutError:
            self.target.abort(waiter)  # type: ignore[attr-defined]
            rec.status = "timeout"
            rec.error_detail = f"no terminal event within {self.options.timeout_s:g}s"
        except asyncio.CancelledError:
            self.target.abort(waiter)  # type: ignore[attr-defined]
            rec.status = "cancelled"
        else:
            if outcome.status == "ok":
                done = Done(outcome.tokens, outcome.usage_prompt, outcome.extra)
                self._settle(rec, done, outcome.chunks, req, stream_tokens=outcome.chunks)
            else:
                self._settle(
                    rec,
                    Failed(
                        outcome.kind or "client",
                        outcome.detail or "",
                        outcome.status or "error",
                        outcome.http_status,
                        outcome.retry_after,
                    ),
                    0,
                    req,
                )
        finally:
            rec.t_end_ns = now_ns() - t0
            rel = lambda t: t - t0 if t else None  # noqa: E731
            rec.t_written_ns = rel(outcome.t_written)
            if self.kernel_stamps:
                delay = outcome.rx_delay
                rec.rx_delay_ns = delay if delay is not None and delay >= 0 else None
                # judged over responses with a first token: a refusal's stamp moves nothing
                rec.rx_error_ns = outcome.rx_error if rec.status == "ok" else None
                rec.rx_delay_max_ns = outcome.rx_delay_max or None
            rec.t_first_byte_ns = rel(outcome.t_first_byte)
            rec.t_first_token_ns = rel(outcome.t_first_token)
            rec.t_last_token_ns = rel(outcome.t_last_token)
            if rec.status not in ("timeout", "cancelled"):
                rec.t_done_ns = rel(outcome.t_done)
            rec.n_chunks = outcome.chunks
            rec.itl_max_ns = outcome.itl_max if outcome.chunks > 1 else None
            if not rec.output_tokens:
                rec.output_tokens = outcome.tokens or outcome.chunks
            if rec.http_status is None:
                rec.http_status = outcome.http_status
            self._write(rec)

    def _write(self, rec: Record) -> None:
        if self._written[rec.request_id]:  # pragma: no cover - guarded by construction
            raise RuntimeError(f"request {rec.request_id} recorded twice")
        self._written[rec.request_id] = 1
        if rec.session_id is not None:
            self._outcomes[rec.request_id] = rec
        self._records += 1
        self.journal.write(rec)
        counters = self.counters
        counters.done += 1
        counters.by_status[rec.status] = counters.by_status.get(rec.status, 0) + 1
        if rec.status != "ok":
            counters.errors += 1

    # ------------------------------------------------------------------ the schedule

    async def _loop_monitor(self, period_s: float = 0.005) -> None:
        while True:
            before = now_ns()
            await asyncio.sleep(period_s)
            self._loop_lags.append(now_ns() - before - int(period_s * 1e9))

    async def _flusher(self) -> None:
        """Records reach disk within a second. fsync can block for milliseconds, so it runs in a
        thread; the event loop only hands the buffer to the OS."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0.2)
            if self.journal.due():
                fd = self.journal.push()
                if fd is not None:
                    await loop.run_in_executor(None, os.fsync, fd)

    def warm_connections(self) -> int:
        """How many connections to open before t0: the plan's first half-second, plus a few."""
        offsets = self.plan.columns["offset_ns"][self.indices]
        return int(min(1024, np.count_nonzero(offsets < 500_000_000) + 8))

    async def run(self, t0_ns: int | None = None) -> ExecResult:
        plan = self.plan
        offsets = plan.columns["offset_ns"]
        options = self.options
        t0 = t0_ns if t0_ns is not None else now_ns() + int(options.lead_s * 1e9)
        # Fewer, later collections: the run allocates steadily and a full collection of a large
        # heap is a millisecond-scale pause on the send path.
        gc.collect()
        gc.freeze()
        thresholds = gc.get_threshold()
        gc.set_threshold(50_000, 50, 100)
        monitor = asyncio.create_task(self._loop_monitor())
        flusher = asyncio.create_task(self._flusher())
        cap = asyncio.Semaphore(options.concurrency_cap) if options.concurrency_cap else None
        pacer = make_pacer(options.pacing, options.spin_s)
        until = pacer.until
        cpu_start = time.process_time()
        stop = self.stop
        target = self.target
        fast = hasattr(target, "start")
        indices = self.indices
        n = len(indices)
        ready: dict[int, tuple[PlannedRequest, Any]] = {}  # prepared ahead, by position
        ahead = 0  # next position to prepare

        def prepare(position: int) -> tuple[PlannedRequest, Any]:
            req = plan.request(int(indices[position]))
            if req.session_id >= 0:  # a first turn: its prompt as the session sends it
                req = Conversation().as_sent(req)
            return req, (target.prepare(req) if fast else None)  # type: ignore[attr-defined]

        try:
            for position in range(n):
                if stop.is_set():
                    break
                if position >= ahead:
                    ready[position] = prepare(position)
                    ahead = position + 1
                deadline = t0 + int(offsets[indices[position]])
                # Idle time before this deadline builds the next requests, so a burst of
                # arrivals costs one write each, not a prompt rendering each.
                while ahead < n and ahead < position + 256 and deadline - now_ns() > _PREPARE_NS:
                    ready[ahead] = prepare(ahead)
                    ahead += 1
                if deadline > now_ns():
                    await until(deadline)  # I/O keeps flowing meanwhile
                    if stop.is_set():
                        break
                if cap is not None:
                    waited = now_ns()
                    await cap.acquire()
                    self._cap_waits.append(now_ns() - waited)
                req, prepared = ready.pop(position)
                if fast:
                    waiter, outcome = target.start(prepared)  # type: ignore[attr-defined]
                    coro = self._one_fast(req, waiter, outcome, deadline, t0)
                else:
                    coro = self._one(req, deadline, t0)
                if req.session_id >= 0:
                    coro = self._session(req, coro, t0)
                task = asyncio.create_task(self._guarded(coro, cap))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                if req.session_id >= 0:
                    self._chains.add(task)
                    task.add_done_callback(self._chains.discard)
            await self._sessions_end()
            await self._drain(options.grace_s)
        finally:
            if self._tasks:  # interrupted while sending or draining
                for task in list(self._tasks):
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)
            for i in self._owned:  # never sent: first turns and the turns that follow them
                if not self._written[i]:
                    req = plan.request(int(i))
                    self._write(
                        self._record(
                            req,
                            int(offsets[i]),
                            status="cancelled",
                            error_detail="not sent: the run was stopped",
                        )
                    )
            monitor.cancel()
            flusher.cancel()
            pacer.close()
            self.journal.flush()
            gc.set_threshold(*thresholds)
            gc.unfreeze()
        return ExecResult(
            t0,
            np.asarray(self._loop_lags, dtype=np.int64),
            np.asarray(self._cap_waits, dtype=np.int64),
            stop.is_set(),
            self._records,
            pacer.kind,
            time.process_time() - cpu_start,
        )

    async def _session(self, first: PlannedRequest, coro: Any, t0: int) -> None:
        """A session: its first turn (`coro`, already sent), then each next step when every
        call of the last completed, plus its think (tool) time. A step of k calls (an agent's
        fan-out) sends them all at once and waits for all k. The loop inside a session is
        closed, as a user's or an agent's is."""
        steps = self._steps
        assert steps is not None
        plan = self.plan
        conversation = Conversation()
        await coro
        step = int(steps.step_of[first.request_id])
        while (after := int(steps.next[step])) >= 0:
            rows = [int(r) for r in steps.calls(step)]
            recs = [self._outcomes.pop(r) for r in rows]
            failed = next((rec for rec in recs if rec.status != "ok"), None)
            if failed is not None:
                word = step_word(first.workload, self.options.agent_workloads)
                self._end_session(after, f"{word} {failed.turn} ({failed.status})")
                return
            conversation.joined(
                [(plan.request(r), rec.output_tokens) for r, rec in zip(rows, recs, strict=True)]
            )
            done = max(
                rec.t_done_ns if rec.t_done_ns is not None else rec.t_end_ns or 0 for rec in recs
            )
            calls = [conversation.as_sent(plan.request(int(r))) for r in steps.calls(after)]
            due = t0 + done + calls[0].think_ns
            prepared = [self._prepare(req) for req in calls]
            wait = due - now_ns()
            if wait > 0:
                await asyncio.sleep(wait / 1e9)
            if self.stop.is_set():
                return  # the run's final sweep records what was not sent
            await asyncio.gather(
                *(
                    self._send(req, ready, due, t0)
                    for req, ready in zip(calls, prepared, strict=True)
                )
            )
            step = after
        for r in steps.calls(step):
            self._outcomes.pop(int(r), None)

    def _prepare(self, req: PlannedRequest) -> Any:
        return self.target.prepare(req) if hasattr(self.target, "start") else None  # type: ignore[attr-defined]

    def _send(self, req: PlannedRequest, prepared: Any, due: int, t0: int) -> Any:
        """One call of a session's step, sent now (the coroutine that records it)."""
        if hasattr(self.target, "start"):
            waiter, outcome = self.target.start(prepared)  # type: ignore[attr-defined]
            return self._one_fast(req, waiter, outcome, due, t0)
        return self._one(req, due, t0)

    def _end_session(self, step: int, cause: str) -> None:
        """Record every call from `step` on as cancelled, one record each: an earlier step
        (`cause`, e.g. "turn 2 (timeout)") did not finish."""
        assert self._steps is not None
        for row in self._steps.chain(step):
            req = self.plan.request(row)
            self._write(
                self._record(
                    req,
                    int(self.plan.columns["offset_ns"][row]),
                    status="cancelled",
                    error_detail=f"not sent: {cause} of its session ended unfinished",
                )
            )

    async def _sessions_end(self) -> None:
        """Wait for the sessions still going (each turn is bounded by its timeout); a stop
        ends the wait, and the drain then cancels what is left."""
        if not self._chains:
            return
        stop_wait = asyncio.create_task(self.stop.wait())
        try:
            while self._chains and not self.stop.is_set():
                await asyncio.wait(
                    set(self._chains) | {stop_wait}, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            stop_wait.cancel()

    async def _guarded(self, coro: Any, cap: asyncio.Semaphore | None) -> None:
        try:
            await coro
        finally:
            if cap is not None:
                cap.release()

    async def _drain(self, grace_s: float) -> None:
        """Wait for in-flight requests; after `grace_s` past the last send (or the stop), cancel."""
        if not self._tasks:
            return
        stop_wait = asyncio.create_task(self.stop.wait())
        pending = set(self._tasks)
        deadline = time.monotonic() + grace_s
        if not self.stop.is_set():
            # No stop yet: each request runs to its own timeout; the grace starts after the last
            # send, and a stop shortens it.
            while pending and time.monotonic() < deadline and not self.stop.is_set():
                _, pending = await asyncio.wait(
                    pending | {stop_wait},
                    timeout=deadline - time.monotonic(),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                pending.discard(stop_wait)
            if self.stop.is_set():
                deadline = time.monotonic() + grace_s
        if pending and time.monotonic() < deadline:
            _, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        stop_wait.cancel()
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


def _behind_gateway(rec: Record, gateway: dict[str, Any]) -> None:
    """Put fairbench's gateway's queue record (its TIMING header) in front of the engine's.

    The gateway's policy queue comes first: a request passed over there waited for the scheduler
    from that moment; one dispatched at once and passed over by the engine (our reference
    server behind it) waited from the engine's moment, offset by the gateway's queue time. The
    backlog is the two waits' sum, the queue time likewise. An opaque engine behind the gateway
    reports nothing, so the gateway's record is the whole of it."""
    queue, passed, backlog = (
        _opt_int(gateway.get(k)) for k in ("queue_time_ns", "passed_over_ns", "backlog_ns")
    )
    if backlog is None:
        return
    engine_passed, engine_backlog = rec.passed_over_ns, rec.backlog_ns or 0
    if backlog > 0 and passed is not None:
        rec.passed_over_ns = passed
    elif engine_passed is not None and engine_backlog > 0:
        rec.passed_over_ns = (queue or 0) + engine_passed
    else:
        rec.passed_over_ns = None
    rec.backlog_ns = backlog + engine_backlog
    if queue is not None:
        rec.queue_time_ns = queue + (rec.queue_time_ns or 0)


def _opt_int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) else None


ProgressHook = Callable[[LiveCounters], None]
