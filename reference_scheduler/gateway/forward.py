"""The gateway's side of one upstream request: send it, relay its answer, and classify failures.

Why a module of its own: this is the hot path of every request once it is placed (the body
sent, each SSE chunk read, rewritten where needed and written to the client) and the taxonomy
of what can go wrong there (relay.Failure: retry elsewhere, 504, or an error event once the
client saw bytes). `Forwarding` is mixed into app.Gateway, whose state (the session, the pool,
the dispatcher, the metrics) it uses; app.py keeps the request's life around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from reference_scheduler.core.job import Job
from reference_scheduler.core.sse import SSEError
from reference_scheduler.gateway.config import GatewayConfig
from reference_scheduler.gateway.dispatcher import TIMING_HEADER, Dispatcher
from reference_scheduler.gateway.pool import Pool, Upstream
from reference_scheduler.gateway.relay import (
    SSE_HEADERS,
    Events,
    Failure,
    error_message,
    upstream_body,
    upstream_headers,
    usage_counts,
)
from reference_scheduler.server.config import ServerConfig
from reference_scheduler.server.metrics import GatewayMetrics
from reference_scheduler.server.requests import BadRequest, error_response

log = logging.getLogger("reference_scheduler.gateway")


class _ClientGone(Exception):
    """The client closed its connection while the gateway was writing to it; `response` is the
    one already started (the handler returns it, so nothing else is written)."""

    def __init__(self, response: web.StreamResponse | None = None) -> None:
        super().__init__("client gone")
        self.response = response


class Forwarding:
    """The upstream-facing methods of app.Gateway (mixed in; these attributes are its)."""

    config: GatewayConfig
    server: ServerConfig
    session: aiohttp.ClientSession | None
    pool: Pool
    dispatcher: Dispatcher
    metrics: GatewayMetrics
    keys: list[str | None]

    def now(self) -> int:
        raise NotImplementedError

    def _child(self, metric: Any, *labels: str) -> Any:
        raise NotImplementedError

    def _failed(self, up: Upstream, failure: Failure) -> None:
        self.metrics.upstream_errors.labels(up.name, failure.kind).inc()
        if self.pool.failed(up, failure.kind, failure.health):
            log.warning("upstream %s marked unhealthy after %s", up.name, failure.kind)

    def _scrub(self, text: str) -> str:
        for key in self.keys:
            if key:
                text = text.replace(key, "***")
        return text

    def _headers(self, index: int) -> dict[str, str]:
        """The upstream's request headers (its key), built once: aiohttp copies them into each
        request's own multidict, so one dict serves every request."""
        cache: dict[int, dict[str, str]] = self.__dict__.setdefault("_upstream_headers", {})
        headers = cache.get(index)
        if headers is None:
            headers = cache[index] = upstream_headers(self.keys[index])
        return headers

    async def _open(
        self, job: Job, up: Upstream, path: str, body: dict[str, Any], stream: bool
    ) -> aiohttp.ClientResponse:
        """Send the request; the response once its status is 200 (else a Failure, or the
        upstream's 4xx as a BadRequest: that answer is the request's, not the upstream's)."""
        assert self.session is not None
        spec = up.spec
        payload = upstream_body(
            body,
            spec.model or self.server.spec.model,
            job.priority if spec.priority_field else None,
            stream,
        )
        try:
            resp = await self.session.post(
                spec.url + path,
                data=orjson.dumps(payload),
                headers=self._headers(up.index),
            )
        except TimeoutError:  # aiohttp's connect timeout: the upstream never had the request
            raise Failure("connect_timeout", "no connection", before_first_byte=True) from None
        except aiohttp.ClientError as error:
            raise Failure("connect", type(error).__name__, before_first_byte=True) from None
        if resp.status == 200:
            return resp
        try:
            raw = await resp.content.read(65536)
        except (aiohttp.ClientError, TimeoutError):
            raw = b""
        finally:
            resp.close()
        status = resp.status
        if status in (429, 503):
            raise Failure("overloaded", str(status), before_first_byte=True, health=False)
        if status in (401, 403):
            raise Failure("auth", str(status), before_first_byte=True)
        if 400 <= status < 500:
            raise BadRequest(
                status,
                self._scrub(error_message(raw)),
                "invalid_request_error",
                code="upstream_rejected",
            )
        raise Failure("http_5xx", str(status), before_first_byte=True)

    async def _whole(
        self, job: Job, up: Upstream, path: str, body: dict[str, Any], asked: str
    ) -> tuple[web.StreamResponse, str]:
        """A non-streaming answer: its first byte is its last, so `total_timeout_s` bounds it."""
        sent = self.now()
        try:
            async with asyncio.timeout(self.config.dispatch.total_timeout_s):
                resp = await self._open(job, up, path, body, stream=False)
                try:
                    raw = await resp.read()
                finally:
                    resp.close()
        except BadRequest as error:
            self.pool.succeeded(up)
            return error_response(error), "upstream_4xx"
        except TimeoutError:
            raise _slow("total_timeout_s") from None
        except aiohttp.ClientError as error:
            raise Failure("connect", type(error).__name__, before_first_byte=True) from None
        except asyncio.CancelledError:
            self.metrics.aborts.labels(up.name).inc()
            raise
        self.pool.succeeded(up)
        self._child(self.metrics.first_byte, up.name).observe((self.now() - sent) / 1e9)
        with contextlib.suppress(orjson.JSONDecodeError):
            obj = orjson.loads(raw)
            if isinstance(obj, dict):
                counts = usage_counts(obj.get("usage"))
                if counts is not None:
                    self.dispatcher.settle(job, self.now(), *counts)
                if obj.get("model") != asked:  # what the client asked, never the upstream's
                    obj["model"] = asked
                    raw = orjson.dumps(obj)
        return web.Response(
            body=raw, status=200, content_type="application/json", headers=_timing_header(job)
        ), "finished"

    async def _stream(
        self,
        request: web.Request,
        job: Job,
        up: Upstream,
        path: str,
        body: dict[str, Any],
        usage_on: bool,
        asked: str,
    ) -> tuple[web.StreamResponse, str]:
        """A stream: `first_byte_timeout_s` bounds send -> first byte, `idle_timeout_s` each gap
        between two chunks after it."""
        sent = self.now()
        resp: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(self.config.dispatch.first_byte_timeout_s):
                resp = await self._open(job, up, path, body, stream=True)
                first = await resp.content.readany()
        except BadRequest as error:
            self.pool.succeeded(up)
            return error_response(error), "upstream_4xx"
        except TimeoutError:
            if resp is not None:
                resp.close()
            raise _slow("first_byte_timeout_s") from None
        except aiohttp.ClientError as error:
            if resp is not None:
                resp.close()
            raise Failure("connect", type(error).__name__, before_first_byte=True) from None
        except asyncio.CancelledError:
            if resp is not None:
                resp.close()
            self.metrics.aborts.labels(up.name).inc()
            raise
        assert resp is not None
        if not first:
            resp.close()
            raise Failure("mid_stream", "empty body", before_first_byte=True)
        self._child(self.metrics.first_byte, up.name).observe((self.now() - sent) / 1e9)
        events = Events(keep_usage=usage_on, model=asked)
        response = web.StreamResponse(headers={**SSE_HEADERS, **_timing_header(job)})
        dispatcher = self.dispatcher
        idle = _Idle(self.config.dispatch.idle_timeout_s)
        content = resp.content
        chunk = first
        # the per-token loop's callables, looked up once (the loop runs once per token)
        feed, write, readany = events.feed, response.write, content.readany
        try:
            await self._write(response.prepare(request))
            while chunk:
                out = feed(chunk)
                if events.tokens:
                    dispatcher.charge_decode(job, self.now(), events.tokens)
                if out:
                    try:  # inline, not `_write`: one coroutine a token instead of two
                        await write(out)
                    except ConnectionResetError:
                        raise _ClientGone() from None
                if events.done:
                    break
                # readany returns what is buffered at once, else waits: every wait is bounded
                # by idle, with one timer per stream (`_Idle`), not one per read; b"" at the end
                idle.waiting()
                chunk = await readany()
                idle.woke()
        except _ClientGone:
            resp.close()
            self.metrics.aborts.labels(up.name).inc()
            raise _ClientGone(response) from None
        except asyncio.CancelledError:
            if idle.expired():  # our own timer, not the client: the upstream went quiet
                return await self._broken(response, resp, up, "idle_timeout", health=False)
            resp.close()
            self.metrics.aborts.labels(up.name).inc()
            raise
        except TimeoutError:
            return await self._broken(response, resp, up, "idle_timeout", health=False)
        except (aiohttp.ClientError, SSEError):  # SSEError: an event over the reader's bound
            return await self._broken(response, resp, up, "mid_stream")
        finally:
            idle.stop()
        if not events.done:
            return await self._broken(response, resp, up, "mid_stream")
        self.pool.succeeded(up)
        counts = usage_counts(events.usage)
        if counts is not None:
            dispatcher.settle(job, self.now(), *counts)
        if events.error is not None:
            self.metrics.upstream_errors.labels(up.name, "in_stream").inc()
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        await self._drain(resp)
        return response, "error" if events.error is not None else "finished"

    @staticmethod
    async def _write(write: Any) -> None:
        """A write to the client; its connection being gone is `_ClientGone`, never confused
        with the upstream's connection failing."""
        try:
            await write
        except ConnectionResetError:
            raise _ClientGone() from None

    @staticmethod
    async def _drain(resp: aiohttp.ClientResponse) -> None:
        """Read the upstream's last bytes after [DONE] (the chunked terminator), so its
        connection goes back to the pool instead of being closed; briefly, then give up."""
        try:
            if not resp.content.at_eof():
                async with asyncio.timeout(1.0):
                    await resp.content.read()
            resp.release()
        except (aiohttp.ClientError, TimeoutError):
            resp.close()

    async def _broken(
        self,
        response: web.StreamResponse,
        resp: aiohttp.ClientResponse,
        up: Upstream,
        kind: str,
        health: bool = True,
    ) -> tuple[web.StreamResponse, str]:
        """The upstream failed after the client saw bytes: one error event, then the end (a
        stall, `health=False`, is slow, not broken: it does not count against the upstream)."""
        resp.close()
        self._failed(up, Failure(kind, kind, before_first_byte=False, health=health))
        error = {
            "error": {
                "message": f"upstream failed mid-stream: {kind}",
                "type": "server_error",
                "param": None,
                "code": 502,
            }
        }
        with contextlib.suppress(ConnectionResetError):
            await response.write(b"\n\ndata: " + orjson.dumps(error) + b"\n\n")
            await response.write_eof()
        return response, "error"


class _Idle:
    """`idle_timeout_s` over the waits of one stream, with one timer for the whole stream
    instead of `asyncio.timeout` around each read (which schedules and cancels a timer per
    token: about 5% of the gateway's time under cProfile at 16-token streams, 2 ms a token).

    `waiting()` before a read that waits, `woke()` after it. The timer is armed at the first
    wait; when it fires it looks at the wait in progress: past the limit, it cancels the task
    (`expired()` then tells the cancellation from the client's); not yet, or not waiting, it
    re-arms for the rest. A wait is so bounded by at most the limit, as before."""

    __slots__ = ("_expired", "_handle", "_limit", "_loop", "_since", "_task")

    def __init__(self, limit_s: float) -> None:
        self._limit = limit_s
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._handle: asyncio.TimerHandle | None = None
        self._since: float | None = None  # when the wait in progress began (None: none)
        self._expired = False

    def waiting(self) -> None:
        self._since = now = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_at(now + self._limit, self._check)

    def woke(self) -> None:
        self._since = None

    def _check(self) -> None:
        since, now = self._since, self._loop.time()
        if since is not None and now - since >= self._limit and self._task is not None:
            self._expired = True
            self._handle = None
            self._task.cancel()
            return
        at = (since if since is not None else now) + self._limit
        self._handle = self._loop.call_at(at, self._check)

    def expired(self) -> bool:
        """The task's cancellation was this timer's (it is then taken back: the task goes on
        to answer with the error event)."""
        if self._expired and self._task is not None:
            self._task.uncancel()
        return self._expired

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def _slow(limit: str) -> Failure:
    """A timeout once the upstream has the request: answered 504, never retried (the work may
    be under way there), and not held against the upstream's health."""
    return Failure("timeout", f"{limit} passed", before_first_byte=True, health=False, retry=False)


def _timing_header(job: Job) -> dict[str, str]:
    """The gateway's queue record of `job` for the client (fairbench reads it into the record's
    passed_over_ns / backlog_ns / queue_time_ns: the fairness figures' backlog, issue 33)."""
    return {TIMING_HEADER: orjson.dumps(Dispatcher.timing(job)).decode()}
