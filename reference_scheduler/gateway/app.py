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
upstream side of a placed request (send, relay, failures) is forward.py's, mixed in; the
watcher task (watch.py) scrapes each upstream's /metrics (saturation, and the correction of
the gateway's own count: capacity.py) and probes /health of unhealthy ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import Counter, Gauge

from reference_scheduler.core.job import Job
from reference_scheduler.gateway.config import GatewayConfig
from reference_scheduler.gateway.dispatcher import Dispatcher
from reference_scheduler.gateway.forward import Forwarding, _ClientGone
from reference_scheduler.gateway.pool import Pool, Upstream
from reference_scheduler.gateway.relay import (
    Failure,
    upstream_headers,
)
from reference_scheduler.gateway.tokens import TokenCounter
from reference_scheduler.gateway.watch import Watcher
from reference_scheduler.server.config import TenantEntry
from reference_scheduler.server.http import openai_app, serve_until_cancelled, start_app
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
    refusal,
    slo_class_of,
    stream_flags,
    tenant_of,
)

log = logging.getLogger("reference_scheduler.gateway")


class _NoUpstream(Exception):
    """No upstream became healthy within `queue_timeout_s` of the request's wait."""


class Gateway(Forwarding):
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
        self.watch = Watcher(self.pool, config.dispatch, self.keys, self.now, self.pump)
        self.watcher: asyncio.Task[None] | None = None
        self.tokens = TokenCounter(config.spec.tokenizer)
        self.no_tokenize: set[int] = set()  # upstreams that answered /tokenize with 404
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # `_child`'s
        # Bad input (a malformed body, a prompt that can never fit) is the client's error, not
        # an admission decision: counted apart from scheduler_admission_rejections.
        self.bad_requests = Counter(
            "gateway_bad_requests",
            "Requests refused as malformed or impossible (4xx), by status",
            ["code"],
            registry=self.metrics.registry,
        )
        # What admission counts against (capacity.py): the engine's sequences, the corrected
        # figure, and its KV tokens; a series appears once its number is known.
        self.capacity = Gauge(
            "gateway_upstream_capacity",
            "An upstream's capacity as the gateway counts it: seqs, effective_seqs, kv_tokens",
            ["upstream", "kind"],
            registry=self.metrics.registry,
        )

    def now(self) -> int:
        return self.clock() - self.base

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, kept: prometheus_client's labels() takes a lock and builds
        its key on every call (five a request were 1% of the gateway's time under cProfile);
        the child it returns is the same object each time, and the gateway never removes one."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

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
        self.watcher = asyncio.create_task(self.watch.run(self.session))

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
        bound, not this. A job placed at once (the usual case below saturation) returns without
        a future, a shield or a timer (about 5% of the gateway's Python time at 500 req/s, by
        cProfile: benchmarks/bench_gateway.py --profile)."""
        self.pump()
        if job.status == "running":
            return self.pool.upstreams[job.replica]
        waiter = asyncio.get_running_loop().create_future()
        self.waiters[job.id] = waiter
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
        body = _json_body(raw)
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
        if self.tokens.source == "upstream":
            n = await self.tokens.count(
                prompt,
                self._upstream_model(0),
                body["messages"] if chat else None,
                self._tokenize_post(),
            )
        else:  # counted here, no round trip: no coroutine to create and await per request
            n = self.tokens.local(prompt)
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
            return error_response(refusal(verdict))
        self.metrics.queue_depth(self.dispatcher.waiting())
        stream_on, usage_on = stream_flags(body)
        outcome = "error"
        try:
            up = await self._placed(job)
            waited = (job.admit_ns - job.arrival_ns) / 1e9
            self._child(self.metrics.wait, job.tenant, job.slo_class).observe(waited)
            self._child(self.metrics.dispatch_wait, up.name).observe(waited)
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
                self._child(self.metrics.requests, job.tenant, job.slo_class, outcome).inc()
                if outcome == "cancelled":
                    self.metrics.cancelled.inc()
                if job.generated:
                    self._child(self.metrics.tokens, job.tenant).inc(job.generated)
            self.pump()

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
        for up in self.pool.upstreams:
            cap = up.capacity
            for kind, value in (
                ("seqs", cap.seqs),
                ("effective_seqs", cap.effective_seqs),
                ("kv_tokens", cap.kv_tokens),
            ):
                if value is not None:
                    self.capacity.labels(up.name, kind).set(value)
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")


# A run of 20 digits or more: an integer orjson would read as a float (past 64 bits), where the
# json module keeps it whole (`_json_body` leaves such bodies to json).
_LONG_NUMBER = re.compile(rb"\d{20}")


def _json_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object: orjson where it parses it to one (3-5 times faster than the
    json module on a request's body), else the server's own reader, so what is refused, and
    how, is the server's, and what is passed on is what json reads (json also takes NaN and
    Infinity, which orjson refuses, and keeps integers past 64 bits whole, which orjson turns
    into floats)."""
    if _LONG_NUMBER.search(raw):
        return json_object(raw)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json_object(raw)
    return body if isinstance(body, dict) else json_object(raw)


GATEWAY = web.AppKey("gateway", Gateway)


def build_gateway_app(config: GatewayConfig) -> web.Application:
    gateway = Gateway(config)
    app = openai_app(
        gateway.start,
        gateway.stop,
        posts={"/v1/completions": gateway.completions, "/v1/chat/completions": gateway.chat},
        gets={
            "/v1/models": gateway.models,
            "/health": gateway.health,
            "/metrics": gateway.prometheus,
        },
    )
    app[GATEWAY] = gateway
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
