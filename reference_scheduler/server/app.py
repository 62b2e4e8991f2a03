"""The reference scheduler's OpenAI-compatible HTTP server (aiohttp), over the real-time driver.

Endpoints: POST /v1/completions, /v1/chat/completions (SSE in vLLM's chunk shape, with
`stream_options.include_usage`, or whole responses), /v1/embeddings; GET /v1/models, /health,
/metrics (Prometheus), /openapi.json. Errors are OpenAI-shaped
(reference_scheduler.server.requests): 4xx for bad input, and the server stays up. Tenancy comes
from the API key alone (see reference_scheduler.server.config).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from reference_scheduler.core.job import Job
from reference_scheduler.core.tokenizer import VOCAB, count_tokens, token_ids
from reference_scheduler.drivers.realtime import RealtimeDriver, Stream
from reference_scheduler.drivers.realtime_disaggregated import driver_for
from reference_scheduler.server.config import ServerConfig, TenantEntry
from reference_scheduler.server.faults import FaultRule, Faults
from reference_scheduler.server.http import openai_app, serve_until_cancelled, start_app
from reference_scheduler.server.metrics import SchedulerMetrics
from reference_scheduler.server.openapi import OPENAPI
from reference_scheduler.server.requests import (
    BadRequest,
    cache_salt_of,
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
        try:
            return tenant_of(request, self.config)
        except BadRequest as error:
            self.metrics.rejected(error.status)
            raise

    def slo_class_of(self, request: web.Request, tenant: TenantEntry) -> str:
        return slo_class_of(request, tenant)

    async def body_of(self, request: web.Request) -> dict[str, Any]:
        body = json_object(await request.read())
        model = body.get("model")
        if model is not None and model != self.config.spec.model:
            raise invalid(f"The model `{model}` does not exist.", "model", "model_not_found")
        return body

    def _max_tokens(self, body: dict[str, Any]) -> int:
        return max_tokens_of(body, self.config.spec.max_tokens_limit)

    def _job(
        self,
        tenant: TenantEntry,
        cls: str,
        prompt: str,
        max_tokens: int,
        cache_salt: str | None = None,
    ) -> Job:
        """The request as the scheduler's job. Its prompt blocks are hashed chained (block k's
        hash covers blocks 0..k), the chain started from the `cache_salt` when there is one:
        vLLM's rule (the salt is an extra key of the first block only, every later block chains
        on it), so requests of different salts share no cached block, and requests of one salt
        share exactly what they would unsalted."""
        assert self.driver is not None
        n = count_tokens(prompt)
        if n < 1:
            raise invalid("The prompt is empty.", "prompt")
        limit = self.driver.engine.max_model_len
        if n + max_tokens > limit:
            raise invalid(
                f"This model's maximum context length is {limit} tokens; the request "
                f"has {n} prompt tokens and asks for {max_tokens} more.",
                "messages",
                "context_length_exceeded",
            )
        ids = token_ids(prompt)
        block = self.driver.engine.block_size
        hashes = []
        h = 0 if cache_salt is None else hash(("cache_salt", cache_salt))
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
            prompt = prompt_of_chat(body) if chat else prompt_of_completion(body)
            max_tokens = self._max_tokens(body)
            n_of(body, 1)  # one choice per request: a 400 that says so, never a silent one
            stream_on, usage_on = stream_flags(body)
            job = self._job(tenant, cls, prompt, max_tokens, cache_salt_of(body))
        except BadRequest as error:
            return error_response(error)
        assert self.driver is not None
        key = request.headers.get("X-Request-Id") or f"job-{job.id}"
        fault = self.faults.pick(key, tenant.id, stream_on)
        injected = self._fault_response(fault)
        if injected is not None:
            return injected
        stream, verdict = self.driver.submit(job)
        if stream is None:
            return error_response(refusal(verdict))
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
            # when this server read the request, on its own clock (only differences mean
            # anything): lets the client check the rate the server saw, not only what it sent
            "received_ns": job.arrival_ns,
            "queue_time_ns": job.admit_ns - job.arrival_ns if job.admit_ns >= 0 else None,
            # contention as the scheduler saw it (scheduler/passover.py), from its receipt
            "passed_over_ns": (
                job.passed_over_ns - job.arrival_ns if job.passed_over_ns >= 0 else None
            ),
            "backlog_ns": job.backlog_ns,
            "preemptions": job.preemptions,
            "cached_tokens": job.cached_tokens,
            "tier": job.slo_class,
            # TTFT after the queue wait, as the simulator's records split it (core/job.py):
            # prefill, KV transfer and decode wait (both 0 when colocated)
            **(
                job.ttft_parts()
                if job.status == "finished" and job.admit_ns >= 0
                else dict.fromkeys(("prefill_ns", "kv_transfer_ns", "decode_wait_ns"))
            ),
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
                raise invalid("input must be a string.", "input")
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
        self.driver.refresh(self.metrics)
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(OPENAPI)


API = web.AppKey("api", Api)


def build_app(config: ServerConfig) -> web.Application:
    api = Api(config)

    async def on_startup() -> None:
        api.driver = driver_for(config.scheduler, api.metrics)
        api.driver.start()

    async def on_cleanup() -> None:
        if api.driver is not None:
            await api.driver.stop()

    app = openai_app(
        on_startup,
        on_cleanup,
        posts={
            "/v1/completions": api.completions,
            "/v1/chat/completions": api.chat,
            "/v1/embeddings": api.embeddings,
        },
        gets={
            "/v1/models": api.models,
            "/health": api.health,
            "/metrics": api.prometheus,
            "/openapi.json": api.openapi,
        },
    )
    app[API] = api
    return app


async def serve(
    config: ServerConfig,
    host: str | None = None,
    port: int | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    app = build_app(config)
    spec = config.spec
    runner, url = await start_app(app, host or spec.host, spec.port if port is None else port)
    await serve_until_cancelled(runner, url, ready)


__all__ = ["Api", "build_app", "serve"]
