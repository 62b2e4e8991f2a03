"""Any OpenAI-compatible server: /v1/chat/completions, /v1/completions, /v1/embeddings.

Streaming uses SSE with `stream_options.include_usage`, so the output token count comes from
the server's usage report, not from counting chunks (a chunk can carry several tokens, or none).
Success needs a terminal event: `[DONE]`, a `finish_reason`, or a usage report; a stream that
just stops is `stream_incomplete`, and a success with zero output tokens where tokens were asked
for is `no_token` (both are errors, not successes — see STYLE.md's pitfalls).

Tenancy reaches the server as `Authorization: Bearer <tenant api_key>` (the target's own key
for tenants without one), plus the target's headers and extra body fields (`class_extra_body`
per SLO class, e.g. `{interactive: {priority: 0}}` for vLLM's priority field). `ignore_eos` is
sent by default so output lengths follow the plan. One connection pool, no connection cap (a
cap would close the open loop), large read buffers for long contexts.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp

from fairbench.plan import PlannedRequest
from fairbench.sse import SSEParser
from fairbench.targets.base import ONE_TOKEN, STARTED, Done, Failed, TargetEvent

_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
_MAX_ERROR_BODY = 2048


def retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None  # an HTTP date; we keep only delta-seconds


class OpenAITarget:
    def __init__(
        self,
        base_url: str,
        model: str = "default",
        api_key: str | None = None,
        tenant_keys: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        class_extra_body: Mapping[str, Mapping[str, Any]] | None = None,
        ignore_eos: bool = True,
        kind: str = "openai",
        class_header: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self.model = model
        self.api_key = api_key
        self.tenant_keys = dict(tenant_keys or {})
        self.headers = dict(headers or {})
        self.extra_body = dict(extra_body or {})
        self.class_extra_body = {k: dict(v) for k, v in (class_extra_body or {}).items()}
        self.ignore_eos = ignore_eos
        self.kind = kind
        self.class_header = class_header  # e.g. X-SLO-Class for the reference server
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            read_bufsize=1 << 20,
            auto_decompress=False,
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    def info(self) -> Mapping[str, str]:
        return {"kind": self.kind, "base_url": self.base_url, "model": self.model}

    def body(self, req: PlannedRequest) -> dict[str, Any]:
        prompt = req.prompt()
        body: dict[str, Any]
        if req.endpoint == "embeddings":
            body = {"model": self.model, "input": prompt}
        else:
            body = {"model": self.model, "max_tokens": req.max_tokens, "stream": req.stream}
            if req.endpoint == "chat":
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                body["prompt"] = prompt
            if req.stream:
                body["stream_options"] = {"include_usage": True}
            if self.ignore_eos:
                body["ignore_eos"] = True
        body.update(self.extra_body)
        body.update(self.class_extra_body.get(req.slo_class, {}))
        return body

    def request_headers(self, req: PlannedRequest) -> dict[str, str]:
        headers = dict(self.headers)
        key = self.tenant_keys.get(req.tenant, self.api_key)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        if self.class_header:
            headers[self.class_header] = req.slo_class
        headers["X-Request-Id"] = f"fb-{req.request_id}"  # lets server logs join our records
        return headers

    async def send(self, req: PlannedRequest) -> AsyncIterator[TargetEvent]:
        assert self.session is not None, "open() the target first"
        url = self.base_url + _PATHS[req.endpoint]
        try:
            async with self.session.post(
                url, json=self.body(req), headers=self.request_headers(req)
            ) as resp:
                yield STARTED
                if resp.status != 200:
                    text = (await resp.content.read(_MAX_ERROR_BODY)).decode("utf-8", "replace")
                    yield _http_failure(resp.status, text, resp.headers)
                    return
                if req.stream and req.endpoint != "embeddings":
                    async for event in _stream(resp):
                        yield event
                else:
                    yield await _whole(resp, req)
        except aiohttp.ClientConnectorError as error:
            yield Failed("connect", str(error))
        except (
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientPayloadError,
            aiohttp.ClientOSError,
            ConnectionResetError,
        ) as error:
            yield Failed("dropped", f"{type(error).__name__}: {error}")


def _http_failure(status: int, text: str, headers: Mapping[str, str]) -> Failed:
    detail = text.strip().replace("\n", " ")[:300]
    if status in (429, 503):
        return Failed(
            "overloaded" if status == 503 else "rate_limited",
            detail,
            "rejected",
            status,
            retry_after(headers),
        )
    kind = "http_4xx" if 400 <= status < 500 else "http_5xx"
    return Failed(kind, detail, "error", status, retry_after(headers))


async def _stream(resp: aiohttp.ClientResponse) -> AsyncIterator[TargetEvent]:
    parser = SSEParser()
    terminal = False
    usage: Mapping[str, Any] | None = None
    extra: dict[str, Any] = {}
    async for chunk in resp.content.iter_any():
        for data in parser.feed(chunk):
            if data == b"[DONE]":
                terminal = True
                continue
            try:
                obj = json.loads(data)
            except ValueError:
                yield Failed("bad_stream", f"not JSON: {data[:80]!r}")
                return
            if not isinstance(obj, dict):
                yield Failed("bad_stream", f"not an object: {data[:80]!r}")
                return
            if "error" in obj:
                yield Failed("http_5xx", f"error in stream: {str(obj['error'])[:200]}")
                return
            for choice in obj.get("choices") or ():
                delta = choice.get("delta")
                text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                if text:
                    yield ONE_TOKEN
                if choice.get("finish_reason"):
                    terminal = True
            if obj.get("usage"):
                usage = obj["usage"]
                terminal = True
            if isinstance(obj.get("fairbench"), dict):
                extra.update(obj["fairbench"])
    if not terminal:
        partial = " (the last event was cut off)" if parser.has_partial else ""
        yield Failed(
            "stream_incomplete",
            f"the stream ended without [DONE], a finish_reason or a usage report{partial}",
        )
        return
    yield Done(_int(usage, "completion_tokens"), _int(usage, "prompt_tokens"), extra)


async def _whole(resp: aiohttp.ClientResponse, req: PlannedRequest) -> TargetEvent:
    try:
        obj = json.loads(await resp.read())
    except ValueError:
        return Failed("bad_stream", "the response body is not JSON")
    if not isinstance(obj, dict):
        return Failed("bad_stream", "the response body is not a JSON object")
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    if req.endpoint == "embeddings":
        if not obj.get("data"):
            return Failed("no_token", "no embedding in the response")
        return Done(0, _int(usage, "prompt_tokens"))
    out = _int(usage, "completion_tokens")
    if out is None:
        out = sum(1 for c in obj.get("choices") or () if c.get("text") or c.get("message"))
    return Done(out, _int(usage, "prompt_tokens"), dict(obj.get("fairbench") or {}))


def _int(obj: Mapping[str, Any] | None, key: str) -> int | None:
    if not obj:
        return None
    value = obj.get(key)
    return int(value) if isinstance(value, int | float) else None
