"""The real-time driver and its OpenAI-compatible HTTP server (aiohttp).

The same engine as the simulator; only the step that sleeps differs (SimPy's rt.py idea). Each
replica runs a loop: ask the engine for a step at `now`, sleep until the step's absolute end
time (coarse sleep, then a short spin: event-loop timers are millisecond-grained), then deliver
its events to the waiting streams. The next step starts at the previous
step's end on the engine's timeline; when the event loop wakes late, the lateness is measured
(`scheduler_step_lag_seconds`) and the next step starts at the real time instead, so a driver
that falls behind says so rather than silently compressing time.

Endpoints: POST /v1/completions, /v1/chat/completions (SSE in vLLM's chunk shape, with
`stream_options.include_usage`, or whole responses), /v1/embeddings; GET /v1/models, /health,
/metrics (Prometheus), /openapi.json. Errors are OpenAI-shaped:
`{"error": {"message", "type", "param", "code"}}`, 4xx for bad input, and the server stays up.
Tenancy comes from the API key alone (see server_config).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from reference_scheduler.engine import Engine, StepResult
from reference_scheduler.faults import FaultRule, Faults
from reference_scheduler.job import Job
from reference_scheduler.metrics import SchedulerMetrics
from reference_scheduler.openapi import OPENAPI
from reference_scheduler.server_config import ServerConfig, TenantEntry
from reference_scheduler.tokenizer import VOCAB, count_tokens, token_ids

SPIN_NS = 1_200_000  # sleep until this close to a step's end, then spin (yielding to I/O)


class Stream:
    """What one request's handler waits on: token counts, then a final status."""

    __slots__ = ("event", "finished", "job", "tokens")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.tokens = 0  # delivered, not yet taken by the handler
        self.finished = False
        self.event = asyncio.Event()

    def push(self, n: int, finished: bool) -> None:
        self.tokens += n
        self.finished = self.finished or finished
        self.event.set()

    async def take(self) -> tuple[int, bool]:
        while not self.tokens and not self.finished:
            self.event.clear()
            await self.event.wait()
        n, self.tokens = self.tokens, 0
        return n, self.finished


class RealtimeDriver:
    def __init__(
        self,
        config: ServerConfig,
        metrics: SchedulerMetrics,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.config = config
        self.engine = Engine(config.scheduler, keep_history=False)
        self.metrics = metrics
        self.clock = clock
        self.base = clock()
        self.streams: dict[int, Stream] = {}
        self.wake = [asyncio.Event() for _ in self.engine.replicas]
        self.tasks: list[asyncio.Task[None]] = []
        self.ids = itertools.count()

    def now(self) -> int:
        return self.clock() - self.base

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._replica(r)) for r in range(len(self.wake))]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def submit(self, job: Job) -> tuple[Stream | None, Any]:
        verdict = self.engine.submit(job, self.now())
        if not verdict.accepted:
            self.metrics.rejected(verdict.code)
            return None, verdict
        stream = Stream(job)
        self.streams[job.id] = stream
        for event in self.wake:
            event.set()
        self.metrics.queue_depth(len(self.engine.policy))
        return stream, verdict

    def cancel(self, job: Job) -> None:
        if self.engine.cancel(job, self.now()):
            self.metrics.cancelled.inc()
        self.streams.pop(job.id, None)

    async def _replica(self, r: int) -> None:
        engine = self.engine
        step_at = self.now()
        while True:
            res = engine.step(r, max(step_at, self.now()))
            if res is None:
                self.wake[r].clear()
                await self.wake[r].wait()
                step_at = self.now()
                continue
            due = self.base + res.end_ns
            delay = due - self.clock() - SPIN_NS
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            while self.clock() < due:  # timers are millisecond-grained: spin the last stretch
                await asyncio.sleep(0)
            lag = self.clock() - due
            self.metrics.step(res, max(lag, 0), engine.policy)
            self._deliver(r, res)
            step_at = res.end_ns

    def _deliver(self, r: int, res: StepResult) -> None:
        streams = self.streams
        for job in res.admitted:
            self.metrics.admitted(job)
        first = {job.id for job in res.first_tokens}
        finished = {job.id for job in res.finished}
        for job in res.first_tokens:
            stream = streams.get(job.id)
            if stream is not None:
                stream.push(1 if job.max_tokens else 0, job.id in finished)
        if res.n_decode:
            for job in self.engine.decoding_jobs(r):
                stream = streams.get(job.id)
                if stream is not None:
                    stream.push(1, False)
        for job in res.finished:
            self.metrics.finished(job)
            if job.id not in first:
                stream = streams.get(job.id)
                if stream is not None:
                    stream.push(1, True)
        if finished:
            self.metrics.queue_depth(len(self.engine.policy))
            for event in self.wake:
                event.set()


# ---------------------------------------------------------------- HTTP


class BadRequest(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code, self.headers = param, code, headers or {}


def error_response(error: BadRequest) -> web.Response:
    body = {
        "error": {
            "message": error.message,
            "type": error.kind,
            "param": error.param,
            "code": error.code,
        }
    }
    return web.json_response(body, status=error.status, headers=error.headers)


def _invalid(message: str, param: str | None = None, code: str | None = None) -> BadRequest:
    return BadRequest(400, message, "invalid_request_error", param, code)


class Api:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = SchedulerMetrics()
        self.faults = Faults(config.spec.faults)
        self.metrics.faults = self.faults
        self.driver: RealtimeDriver | None = None
        self.created = int(time.time())

    # -------------------------------------------------------------- tenancy and parsing

    def tenant_of(self, request: web.Request) -> TenantEntry:
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if self.config.keys_required:
            tenant = self.config.by_key.get(key or "")
            if tenant is None:
                self.metrics.rejected(401)
                raise BadRequest(
                    401,
                    "Incorrect or missing API key.",
                    "authentication_error",
                    code="invalid_api_key",
                )
            return tenant
        return self.config.default_tenant

    def slo_class_of(self, request: web.Request, tenant: TenantEntry) -> str:
        asked = request.headers.get("X-SLO-Class")
        if asked is None:
            return tenant.classes[0]
        if asked not in tenant.classes:
            raise BadRequest(
                403,
                f"tenant may not use SLO class {asked!r}; allowed: {tenant.classes}",
                "permission_error",
                "X-SLO-Class",
            )
        return asked

    async def body_of(self, request: web.Request) -> dict[str, Any]:
        try:
            raw = await request.read()
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise _invalid("The request body is not valid JSON.", code="invalid_json") from None
        if not isinstance(body, dict):
            raise _invalid("The request body must be a JSON object.")
        model = body.get("model")
        if model is not None and model != self.config.spec.model:
            raise _invalid(f"The model `{model}` does not exist.", "model", "model_not_found")
        return body

    def _max_tokens(self, body: dict[str, Any]) -> int:
        value = body.get("max_tokens", body.get("max_completion_tokens", 16))
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid("max_tokens must be an integer.", "max_tokens")
        if value < 1 or value > self.config.spec.max_tokens_limit:
            raise _invalid(
                f"max_tokens must be between 1 and {self.config.spec.max_tokens_limit}"
                f", got {value}.",
                "max_tokens",
            )
        return value

    @staticmethod
    def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise _invalid("stream must be a boolean.", "stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise _invalid("stream_options must be an object.", "stream_options")
        return stream, bool(options.get("include_usage", False))

    def _prompt_of_chat(self, body: dict[str, Any]) -> str:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _invalid("messages must be a non-empty list.", "messages")
        parts = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise _invalid(f"messages[{i}] must be an object with a role.", "messages")
            content = message.get("content", "")
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise _invalid(f"messages[{i}].content must be a string.", "messages")
            parts.append(content)
        return " ".join(parts)

    @staticmethod
    def _prompt_of_completion(body: dict[str, Any]) -> str:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise _invalid("prompt must be a string.", "prompt")
        return prompt

    def _job(self, tenant: TenantEntry, cls: str, prompt: str, max_tokens: int) -> Job:
        assert self.driver is not None
        n = count_tokens(prompt)
        if n < 1:
            raise _invalid("The prompt is empty.", "prompt")
        limit = self.driver.engine.max_model_len
        if n + max_tokens > limit:
            raise _invalid(
                f"This model's maximum context length is {limit} tokens; the request "
                f"has {n} prompt tokens and asks for {max_tokens} more.",
                "messages",
                "context_length_exceeded",
            )
        ids = token_ids(prompt)
        block = self.driver.engine.block_size
        hashes = []
        h = 0
        for start in range(0, len(ids) - len(ids) % block, block):
            h = hash((h, tuple(ids[start : start + block])))
            hashes.append(h)
        return Job(
            next(self.driver.ids),
            tenant.id,
            cls,
            n,
            max_tokens,
            self.driver.now(),
            weight=tenant.weight,
            priority=self.config.spec.slo_classes[cls],
            block_hashes=tuple(hashes),
        )

    # -------------------------------------------------------------- generation

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            tenant = self.tenant_of(request)
            cls = self.slo_class_of(request, tenant)
            body = await self.body_of(request)
            prompt = self._prompt_of_chat(body) if chat else self._prompt_of_completion(body)
            max_tokens = self._max_tokens(body)
            stream_on, usage_on = self._stream_flags(body)
            job = self._job(tenant, cls, prompt, max_tokens)
        except BadRequest as error:
            return error_response(error)
        assert self.driver is not None
        key = request.headers.get("X-Request-Id") or f"job-{job.id}"
        fault = self.faults.pick(key, tenant.id, stream_on)
        refusal = self._fault_response(fault)
        if refusal is not None:
            return refusal
        stream, verdict = self.driver.submit(job)
        if stream is None:
            kind = "rate_limit_error" if verdict.code == 429 else "server_overloaded"
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
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{job.id}"
        try:
            if stream_on:
                return await self._sse(request, job, stream, rid, chat, usage_on, fault)
            if fault is not None and fault.kind == "stall_first_token":
                await asyncio.sleep(fault.seconds)
            return await self._whole(job, stream, rid, chat)
        finally:
            if job.status in ("waiting", "running"):
                self.driver.cancel(job)  # the client went away
            self.driver.streams.pop(job.id, None)

    def _text(self, job: Job, start: int, n: int) -> str:
        return "".join(
            " " + VOCAB[(job.id * 7919 + i) % len(VOCAB)] for i in range(start, start + n)
        )

    def _timing(self, job: Job) -> dict[str, Any]:
        return {
            "queue_time_ns": job.admit_ns - job.arrival_ns if job.admit_ns >= 0 else None,
            "preemptions": job.preemptions,
            "cached_tokens": job.cached_tokens,
            "tier": job.slo_class,
        }

    def _usage(self, job: Job, produced: int) -> dict[str, int]:
        return {
            "prompt_tokens": job.prompt_tokens,
            "completion_tokens": produced,
            "total_tokens": job.prompt_tokens + produced,
        }

    def _fault_response(self, fault: FaultRule | None) -> web.Response | None:
        """Injected HTTP-level failures: the request never reaches the scheduler."""
        if fault is None or fault.kind not in ("http_500", "overload_503", "rate_limit_429"):
            return None
        status = {"http_500": 500, "overload_503": 503, "rate_limit_429": 429}[fault.kind]
        headers = {} if status == 500 else {"Retry-After": str(fault.retry_after_s)}
        kind = {500: "server_error", 503: "server_overloaded", 429: "rate_limit_error"}[status]
        return error_response(
            BadRequest(
                status,
                f"injected fault: {fault.kind}",
                kind,
                code="injected_fault",
                headers=headers,
            )
        )

    async def _sse(
        self,
        request: web.Request,
        job: Job,
        stream: Stream,
        rid: str,
        chat: bool,
        usage_on: bool,
        fault: FaultRule | None = None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        model, created = self.config.spec.model, self.created
        kind = "chat.completion.chunk" if chat else "text_completion"

        # vLLM's chunk shape, built from constant bytes around the token text: this runs once
        # per token per stream, and a dict-to-JSON round trip per token costs more than the
        # rest of the path together.
        head = (
            b'data: {"id":'
            + orjson.dumps(rid)
            + b',"object":"'
            + kind.encode()
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(model)
            + b',"choices":[{"index":0,'
        )
        finishes = {None: b"null", "length": b'"length"'}

        def chunk(text: str | None, finish: str | None, role: bool = False) -> bytes:
            end = finishes[finish]
            if chat:
                if role:
                    delta = b'{"role":"assistant","content":""}'
                else:
                    delta = b'{"content":' + orjson.dumps(text) + b"}"
                return (
                    head
                    + b'"delta":'
                    + delta
                    + b',"logprobs":null,"finish_reason":'
                    + end
                    + b"}]}\n\n"
                )
            return (
                head + b'"text":' + orjson.dumps(text or "") + b',"logprobs":null,'
                b'"finish_reason":' + end + b',"stop_reason":null}]}\n\n'
            )

        produced = 0
        kind_of = fault.kind if fault is not None else ""
        write = response.write
        if kind_of == "slow_loris":
            write = self._dribble(response, fault.bytes_per_s)  # type: ignore[union-attr]
        if kind_of == "stall_first_token":
            await asyncio.sleep(fault.seconds)  # type: ignore[union-attr]
        if chat:
            await write(chunk(None, None, role=True))
        half = max(1, job.max_tokens // 2)
        while True:
            n, finished = await stream.take()
            if n:
                text = self._text(job, produced, n)
                produced += n
                last = finished and produced >= job.max_tokens
                payload = chunk(text, "length" if last and kind_of != "missing_done" else None)
                if produced >= half and kind_of in (
                    "drop_mid_stream",
                    "bad_json",
                    "truncated_event",
                    "stall_mid_stream",
                ):
                    return await self._break_stream(request, response, payload, fault)  # type: ignore[arg-type]
                await write(payload)
            if finished:
                break
        if kind_of == "missing_done":  # a clean end with no terminal event
            await response.write_eof()
            return response
        tail: dict[str, Any] = {}
        if usage_on:
            tail = {
                "id": rid,
                "object": kind,
                "created": created,
                "model": model,
                "choices": [],
                "usage": self._usage(job, produced),
            }
        if self.config.spec.timing_extension:
            tail = tail or {
                "id": rid,
                "object": kind,
                "created": created,
                "model": model,
                "choices": [],
            }
            tail["fairbench"] = self._timing(job)
        if tail:
            await response.write(
                b"data: " + json.dumps(tail, separators=(",", ":")).encode() + b"\n\n"
            )
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    @staticmethod
    def _dribble(response: web.StreamResponse, bytes_per_s: float):  # type: ignore[no-untyped-def]
        async def write(data: bytes) -> None:
            for k in range(len(data)):
                await response.write(data[k : k + 1])
                await asyncio.sleep(1.0 / bytes_per_s)

        return write

    async def _break_stream(
        self, request: web.Request, response: web.StreamResponse, payload: bytes, fault: FaultRule
    ) -> web.StreamResponse:
        """Mid-stream faults: cut the connection, send a malformed or truncated event, or stall."""
        if fault.kind == "stall_mid_stream":
            await asyncio.sleep(fault.seconds)
            await response.write(payload)
        elif fault.kind == "drop_mid_stream":
            if request.transport is not None:
                request.transport.abort()  # the connection dies; no clean end
            return response
        elif fault.kind == "bad_json":
            await response.write(b"data: {not json at all\n\n")
        elif fault.kind == "truncated_event":
            await response.write(payload[: len(payload) // 2])  # cut off, then a clean end
        await response.write_eof()
        return response

    async def _whole(self, job: Job, stream: Stream, rid: str, chat: bool) -> web.Response:
        produced = 0
        while True:
            n, finished = await stream.take()
            produced += n
            if finished:
                break
        text = self._text(job, 0, produced)
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        body: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": self.created,
            "model": self.config.spec.model,
            "choices": [choice],
            "usage": self._usage(job, produced),
        }
        headers = {}
        if self.config.spec.timing_extension:
            body["fairbench"] = self._timing(job)
            headers["X-Fairbench-Timing"] = json.dumps(self._timing(job))
        return web.json_response(body, headers=headers)

    async def embeddings(self, request: web.Request) -> web.Response:
        try:
            tenant = self.tenant_of(request)
            cls = self.slo_class_of(request, tenant)
            body = await self.body_of(request)
            text = body.get("input")
            if isinstance(text, list) and len(text) == 1 and isinstance(text[0], str):
                text = text[0]
            if not isinstance(text, str):
                raise _invalid("input must be a string.", "input")
            job = self._job(tenant, cls, text, 1)
            job.max_tokens = 0
        except BadRequest as error:
            return error_response(error)
        assert self.driver is not None
        stream, verdict = self.driver.submit(job)
        if stream is None:
            headers = {"Retry-After": str(verdict.retry_after_s)} if verdict.retry_after_s else {}
            return error_response(
                BadRequest(
                    verdict.code or 503,
                    verdict.reason or "overloaded",
                    "server_overloaded",
                    headers=headers,
                )
            )
        try:
            await stream.take()
        finally:
            if job.status in ("waiting", "running"):
                self.driver.cancel(job)
            self.driver.streams.pop(job.id, None)
        digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=32).digest()
        vector = [round((b - 127.5) / 127.5, 6) for b in digest[:16]]
        return web.json_response(
            {
                "object": "list",
                "model": self.config.spec.model,
                "data": [{"object": "embedding", "index": 0, "embedding": vector}],
                "usage": {"prompt_tokens": job.prompt_tokens, "total_tokens": job.prompt_tokens},
            }
        )

    # -------------------------------------------------------------- the rest

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.spec.model,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "fairbench",
                    }
                ],
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def prometheus(self, request: web.Request) -> web.Response:
        assert self.driver is not None
        self.metrics.refresh(self.driver.engine)
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(OPENAPI)


@web.middleware
async def _errors(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
    """Unknown routes and wrong methods get OpenAI-shaped errors too; nothing brings us down."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        kind = "not_found_error" if error.status == 404 else "invalid_request_error"
        return error_response(BadRequest(error.status, error.reason, kind))
    except BadRequest as error:
        return error_response(error)


API = web.AppKey("api", Api)


def build_app(config: ServerConfig) -> web.Application:
    api = Api(config)
    app = web.Application(middlewares=[_errors], client_max_size=64 * 1024 * 1024)
    app[API] = api

    async def on_startup(app: web.Application) -> None:
        api.driver = RealtimeDriver(config, api.metrics)
        api.driver.start()

    async def on_cleanup(app: web.Application) -> None:
        if api.driver is not None:
            await api.driver.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/v1/completions", api.completions)
    app.router.add_post("/v1/chat/completions", api.chat)
    app.router.add_post("/v1/embeddings", api.embeddings)
    app.router.add_get("/v1/models", api.models)
    app.router.add_get("/health", api.health)
    app.router.add_get("/metrics", api.prometheus)
    app.router.add_get("/openapi.json", api.openapi)
    return app


async def serve(
    config: ServerConfig,
    host: str | None = None,
    port: int | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    app = build_app(config)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host or config.spec.host, config.spec.port if port is None else port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname() if sockets else (host, port)
    url = f"http://{bound[0]}:{bound[1]}"
    if ready is not None:
        ready(url)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


__all__ = ["Api", "RealtimeDriver", "build_app", "serve"]
