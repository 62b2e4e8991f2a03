"""The gateway's HTTP app: the served scheduler's front (tenancy, validation, admission, policy)
with upstream engines behind it instead of the simulated engine.

A request's life: tenancy from its API key and validation exactly as the server does them
(server/config.py, server/requests.py: a malformed request is answered 4xx here and never reaches
an upstream) -> `Dispatcher.submit` (admission: 429/503 with Retry-After) -> wait until `pick`
places it on an upstream with room -> relay: the upstream's bytes are written to the client as
they arrive -> `Dispatcher.finish`, in a `finally`, whatever happened. Each handler owns its job
from start to end, so a request is answered once: retried at most once on another upstream
while the client has seen nothing, an error event once it has.

The client going away (aiohttp cancels the handler, or a write fails) closes the upstream
connection, which is how vLLM, SGLang and TGI learn to abort a request, and is counted. The
watcher task scrapes each upstream's /metrics (saturation) and probes /health of unhealthy ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import Counter

from reference_scheduler.core.job import Job
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
from reference_scheduler.gateway.tokens import TokenCounter
from reference_scheduler.server.config import TenantEntry
from reference_scheduler.server.http import openai_errors, serve_until_cancelled, start_app
from reference_scheduler.server.metrics import GatewayMetrics
from reference_scheduler.server.requests import (
    BadRequest,
    error_response,
    invalid,
    json_object,
    max_tokens_of,
    n_of,
    prompt_of_chat,
    prompt_of_completion,
    slo_class_of,
    stream_flags,
    tenant_of,
)

log = logging.getLogger("reference_scheduler.gateway")


class _ClientGone(Exception):
    """The client closed its connection while the gateway was writing to it; `response` is the
    one already started (the handler returns it, so nothing else is written)."""

    def __init__(self, response: web.StreamResponse | None = None) -> None:
        super().__init__("client gone")
        self.response = response


def _timing_header(job: Job) -> dict[str, str]:
    """The gateway's queue record of `job` for the client (fairbench reads it into the record's
    passed_over_ns / backlog_ns / queue_time_ns: the fairness figures' backlog, issue 33)."""
    return {TIMING_HEADER: orjson.dumps(Dispatcher.timing(job)).decode()}


class _NoUpstream(Exception):
    """No upstream became healthy within `queue_timeout_s` of the request's wait."""


class Gateway:
    def __init__(self, config: GatewayConfig, clock: Callable[[], int] = time.perf_counter_ns):
        self.config = config
        self.server = config.server
        self.clock = clock
        self.base = clock()
        self.metrics = GatewayMetrics()
        self.pool = Pool(list(config.upstreams), config.dispatch)
        self.dispatcher = Dispatcher(config.server.scheduler, self.pool)
        self.keys = [up.key() for up in config.upstreams]
        self.ids = itertools.count()
        self.waiters: dict[int, asyncio.Future[None]] = {}
        self.session: aiohttp.ClientSession | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.scrape_failing: set[int] = set()  # upstreams whose scrape failure was logged
        self.tokens = TokenCounter(config.spec.tokenizer)
        self.no_tokenize: set[int] = set()  # upstreams that answered /tokenize with 404
        # Bad input (a malformed body, a prompt that can never fit) is the client's error, not
        # an admission decision: counted apart from scheduler_admission_rejections.
        self.bad_requests = Counter(
            "gateway_bad_requests",
            "Requests refused as malformed or impossible (4xx), by status",
            ["code"],
            registry=self.metrics.registry,
        )

    def now(self) -> int:
        return self.clock() - self.base

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        d = self.config.dispatch
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=d.connect_timeout_s,
            sock_connect=d.connect_timeout_s,
            sock_read=None,  # first byte, idle and total are bounded per request (_whole, _stream)
        )
        self.session = aiohttp.ClientSession(
            timeout=timeout,
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            auto_decompress=False,
        )
        self.watcher = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.watcher
        if self.session is not None:
            await self.session.close()

    # -------------------------------------------------------------- dispatch

    def pump(self) -> None:
        """Place every job that can leave the queue now and wake its handler."""
        placed = self.dispatcher.pick(self.now())
        for job, _up in placed:
            waiter = self.waiters.pop(job.id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        if placed:
            self.metrics.queue_depth(self.dispatcher.waiting())

    async def _placed(self, job: Job) -> Upstream:
        """Wait until the job is placed. While no upstream is healthy it waits at most
        `queue_timeout_s` (then `_NoUpstream`); waiting for a busy healthy pool is admission's to
        bound, not this."""
        waiter = asyncio.get_running_loop().create_future()
        self.waiters[job.id] = waiter
        self.pump()
        limit = self.config.dispatch.queue_timeout_s
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(waiter), limit)
                break
            except TimeoutError:
                if not any(up.healthy for up in self.pool.upstreams):
                    raise _NoUpstream() from None
        return self.pool.upstreams[job.replica]

    # -------------------------------------------------------------- tenancy and parsing

    def tenant_of(self, request: web.Request) -> TenantEntry:
        return tenant_of(request, self.server)

    def slo_class_of(self, request: web.Request, tenant: TenantEntry) -> str:
        return slo_class_of(request, tenant)

    async def _job(
        self, request: web.Request, raw: bytes, chat: bool
    ) -> tuple[Job, dict[str, Any], str]:
        """The job, the body to send upstream and the model name the client is answered with."""
        tenant = self.tenant_of(request)
        cls = self.slo_class_of(request, tenant)
        body = json_object(raw)
        model = body.get("model")
        if model is not None and model != self.server.spec.model:
            raise invalid(f"The model `{model}` does not exist.", "model", "model_not_found")
        prompt = prompt_of_chat(body) if chat else prompt_of_completion(body)
        limit = self.server.spec.max_tokens_limit
        max_tokens = max_tokens_of(body, limit, self.config.spec.default_max_tokens)
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = max_tokens  # sent upstream, so what is reserved is what runs
        choices = n_of(body, 128)
        stream_flags(body)
        n = await self.tokens.count(
            prompt,
            self._upstream_model(0),
            body["messages"] if chat else None,
            self._tokenize_post(),
        )
        if n < 1:
            raise invalid("The prompt is empty.", "prompt")
        context = self.tokens.max_model_len
        if context is not None and n + max_tokens > context:
            raise invalid(
                f"This model's maximum context length is {context} tokens; the request has {n} "
                f"prompt tokens and asks for {max_tokens} more.",
                "messages" if chat else "prompt",
                "context_length_exceeded",
            )
        job = Job(
            next(self.ids),
            tenant.id,
            cls,
            n,
            max_tokens * choices,  # n choices: n answers of up to max_tokens each are reserved
            self.now(),
            weight=tenant.weight,
            priority=self.server.spec.slo_classes[cls],
        )
        return job, body, model if isinstance(model, str) else self.server.spec.model

    def _upstream_model(self, index: int) -> str:
        return self.pool.upstreams[index].spec.model or self.server.spec.model

    def _tokenize_post(self) -> Callable[[str, dict[str, Any]], Any] | None:
        """A POST to the first healthy upstream that has /tokenize, or None (estimate then)."""
        if self.tokens.source != "upstream" or self.session is None:
            return None
        up = next(
            (u for u in self.pool.upstreams if u.healthy and u.index not in self.no_tokenize),
            None,
        )
        if up is None:
            return None
        session = self.session
        timeout = aiohttp.ClientTimeout(total=self.config.dispatch.connect_timeout_s)

        async def post(path: str, body: dict[str, Any]) -> Any:
            body = dict(body, model=self._upstream_model(up.index))
            try:
                async with session.post(
                    up.spec.url + path,
                    data=orjson.dumps(body),
                    headers=upstream_headers(self.keys[up.index]),
                    timeout=timeout,
                ) as resp:
                    if resp.status == 404:
                        self.no_tokenize.add(up.index)
                    if resp.status != 200:
                        return None
                    return orjson.loads(await resp.read())
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
                return None

        return post

    # -------------------------------------------------------------- generation

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "/v1/completions", chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "/v1/chat/completions", chat=True)

    async def _generate(self, request: web.Request, path: str, chat: bool) -> web.StreamResponse:
        try:
            job, body, asked = await self._job(request, await request.read(), chat)
        except BadRequest as error:
            self.bad_requests.labels(str(error.status)).inc()
            return error_response(error)
        verdict = self.dispatcher.submit(job, self.now())
        if not verdict.accepted:
            if verdict.code == 400:
                self.bad_requests.labels("400").inc()  # can never fit: bad input, not load
            else:
                self.metrics.rejected(verdict.code)
            kind = "rate_limit_error" if verdict.code == 429 else "server_overloaded"
            if verdict.code == 400:
                kind = "invalid_request_error"
            headers = {"Retry-After": str(verdict.retry_after_s)} if verdict.retry_after_s else {}
            status = verdict.code if verdict.code in (400, 429, 503) else 503
            return error_response(
                BadRequest(
                    status,
                    verdict.reason or "overloaded",
                    kind,
                    code=verdict.reason,
                    headers=headers,
                )
            )
        self.metrics.queue_depth(self.dispatcher.waiting())
        stream_on, usage_on = stream_flags(body)
        outcome = "error"
        try:
            up = await self._placed(job)
            self.metrics.admitted(job)
            self.metrics.dispatch_wait.labels(up.name).observe(
                (job.admit_ns - job.arrival_ns) / 1e9
            )
            while True:
                try:
                    if stream_on:
                        response, outcome = await self._stream(
                            request, job, up, path, body, usage_on, asked
                        )
                    else:
                        response, outcome = await self._whole(job, up, path, body, asked)
                    return response
                except Failure as failure:
                    self._failed(up, failure)
                    if not failure.retry:
                        # The upstream accepted the request and may still be working on it:
                        # another upstream would do the work twice; the client gets a 504.
                        return error_response(
                            BadRequest(
                                504,
                                f"upstream timed out: {failure.detail}",
                                "server_error",
                                code="upstream_timeout",
                            )
                        )
                    if not self.dispatcher.requeue(job, self.now()):
                        if failure.kind == "overloaded":
                            return error_response(
                                BadRequest(
                                    503,
                                    "every upstream is overloaded",
                                    "server_overloaded",
                                    code="upstream_overloaded",
                                    headers={"Retry-After": "1"},
                                )
                            )
                        return error_response(
                            BadRequest(
                                502,
                                f"upstream failed: {failure.kind}",
                                "server_error",
                                code="upstream_error",
                            )
                        )
                    self.metrics.retries.labels(up.name).inc()
                    up = await self._placed(job)
        except _NoUpstream:
            d = self.config.dispatch
            self.metrics.rejected(503)
            return error_response(
                BadRequest(
                    503,
                    "no healthy upstream within queue_timeout_s",
                    "server_overloaded",
                    code="no_healthy_upstream",
                    headers={"Retry-After": str(max(1, round(d.queue_timeout_s)))},
                )
            )
        except _ClientGone as gone:
            outcome = "cancelled"
            return gone.response or web.Response(status=499)  # the connection is gone
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self.waiters.pop(job.id, None)
            if self.dispatcher.finish(job, self.now(), outcome):
                self.metrics.requests.labels(job.tenant, job.slo_class, outcome).inc()
                if outcome == "cancelled":
                    self.metrics.cancelled.inc()
                if job.generated:
                    self.metrics.tokens.labels(job.tenant).inc(job.generated)
            self.pump()

    def _failed(self, up: Upstream, failure: Failure) -> None:
        self.metrics.upstream_errors.labels(up.name, failure.kind).inc()
        if self.pool.failed(up, failure.kind, failure.health):
            log.warning("upstream %s marked unhealthy after %s", up.name, failure.kind)

    def _scrub(self, text: str) -> str:
        for key in self.keys:
            if key:
                text = text.replace(key, "***")
        return text

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
                headers=upstream_headers(self.keys[up.index]),
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
        self.metrics.first_byte.labels(up.name).observe((self.now() - sent) / 1e9)
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
        self.metrics.first_byte.labels(up.name).observe((self.now() - sent) / 1e9)
        events = Events(keep_usage=usage_on, model=asked)
        response = web.StreamResponse(headers={**SSE_HEADERS, **_timing_header(job)})
        dispatcher = self.dispatcher
        idle = self.config.dispatch.idle_timeout_s
        chunk = first
        try:
            await self._write(response.prepare(request))
            while chunk:
                out = events.feed(chunk)
                if events.tokens:
                    dispatcher.charge_decode(job, self.now(), events.tokens)
                if out:
                    await self._write(response.write(out))
                if events.done:
                    break
                async with asyncio.timeout(idle):
                    chunk = await resp.content.readany()
        except _ClientGone:
            resp.close()
            self.metrics.aborts.labels(up.name).inc()
            raise _ClientGone(response) from None
        except asyncio.CancelledError:
            resp.close()
            self.metrics.aborts.labels(up.name).inc()
            raise
        except TimeoutError:
            return await self._broken(response, resp, up, "idle_timeout", health=False)
        except aiohttp.ClientError:
            return await self._broken(response, resp, up, "mid_stream")
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

    # -------------------------------------------------------------- the watcher

    async def _watch(self) -> None:
        """Scrape each upstream's /metrics and probe unhealthy ones, each on its own interval."""
        d = self.config.dispatch
        tick = min(d.scrape_interval_s, d.probe_interval_s)
        scrape_due = [0] * len(self.pool.upstreams)
        probe_due = [0] * len(self.pool.upstreams)
        while True:
            now = self.now()
            jobs = []
            for up in self.pool.upstreams:
                if up.scraped and now >= scrape_due[up.index]:
                    scrape_due[up.index] = now + int(d.scrape_interval_s * 1e9)
                    jobs.append(self._scrape(up))
                if not up.healthy and now >= probe_due[up.index]:
                    probe_due[up.index] = now + int(d.probe_interval_s * 1e9)
                    jobs.append(self._probe(up))
            if jobs:
                await asyncio.gather(*jobs, return_exceptions=True)
                self.pump()
            await asyncio.sleep(tick)

    async def _get(self, up: Upstream, path: str) -> tuple[int, str]:
        assert self.session is not None
        headers = upstream_headers(self.keys[up.index])
        timeout = aiohttp.ClientTimeout(total=self.config.dispatch.connect_timeout_s * 2)
        async with self.session.get(up.spec.url + path, headers=headers, timeout=timeout) as resp:
            return resp.status, await resp.text()

    async def _scrape(self, up: Upstream) -> None:
        why = ""
        try:
            status, text = await self._get(up, "/metrics")
            if status == 200:
                self.pool.read_scrape(up, text, self.now())
            else:
                why = f"HTTP {status}"
        except (aiohttp.ClientError, TimeoutError) as error:
            why = type(error).__name__
        if why and up.index not in self.scrape_failing:
            self.scrape_failing.add(up.index)
            log.warning(
                "upstream %s: /metrics scrape failed (%s); it counts as saturated once its last "
                "good scrape is older than stale_after_s (engine: none turns scraping off)",
                up.name,
                why,
            )
        elif not why:
            self.scrape_failing.discard(up.index)

    async def _probe(self, up: Upstream) -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, asyncio.TimeoutError):
            status, _ = await self._get(up, "/health")
            if status == 200:
                up.healthy = True
                up.failures = 0
                log.warning("upstream %s is healthy again", up.name)

    # -------------------------------------------------------------- the rest

    async def models(self, request: web.Request) -> web.Response:
        model = self.server.spec.model
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": model, "object": "model", "created": 0, "owned_by": "gateway"}],
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        healthy = [up.name for up in self.pool.upstreams if up.healthy]
        status = 200 if healthy else 503
        return web.json_response(
            {"status": "ok" if healthy else "no healthy upstream", "tokenizer": self.tokens.kind},
            status=status,
        )

    async def prometheus(self, request: web.Request) -> web.Response:
        self.metrics.refresh(self.dispatcher)
        self.metrics.depth.set(self.dispatcher.waiting())
        self.metrics.refresh_pool(self.pool, self.now())
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")


def _slow(limit: str) -> Failure:
    """A timeout once the upstream has the request: answered 504, never retried (the work may
    be under way there), and not held against the upstream's health."""
    return Failure("timeout", f"{limit} passed", before_first_byte=True, health=False, retry=False)


GATEWAY = web.AppKey("gateway", Gateway)


def build_gateway_app(config: GatewayConfig) -> web.Application:
    gateway = Gateway(config)
    app = web.Application(middlewares=[openai_errors], client_max_size=64 * 1024 * 1024)
    app[GATEWAY] = gateway

    async def on_startup(app: web.Application) -> None:
        await gateway.start()

    async def on_cleanup(app: web.Application) -> None:
        await gateway.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/v1/completions", gateway.completions)
    app.router.add_post("/v1/chat/completions", gateway.chat)
    app.router.add_get("/v1/models", gateway.models)
    app.router.add_get("/health", gateway.health)
    app.router.add_get("/metrics", gateway.prometheus)
    return app


async def start_gateway(
    config: GatewayConfig, host: str | None = None, port: int | None = None
) -> tuple[web.AppRunner, str]:
    """Start the app; (runner, base URL). Handlers are cancelled when their client goes away,
    which is how a request waiting in the queue, or on its upstream, learns of it."""
    app = build_gateway_app(config)
    spec = config.server.spec
    return await start_app(app, host or spec.host, spec.port if port is None else port)


async def serve_gateway(
    config: GatewayConfig,
    host: str | None = None,
    port: int | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    runner, url = await start_gateway(config, host, port)
    await serve_until_cancelled(runner, url, ready)


__all__ = ["GATEWAY", "Gateway", "build_gateway_app", "serve_gateway", "start_gateway"]
