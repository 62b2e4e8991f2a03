"""Any OpenAI-compatible server: /v1/chat/completions, /v1/completions, /v1/embeddings.

Transport: fairbench's lean HTTP/1.1 client (targets/fastclient.py): request bytes are built
before the deadline (`prepare`), sent at it (`start`), and every time is stamped as bytes arrive.

Streaming uses SSE with `stream_options.include_usage`, so the output token count comes from
the server's usage report, not from counting chunks (a chunk can carry several tokens, or none).
Success needs a terminal event: `[DONE]`, a `finish_reason`, or a usage report; a stream that
just stops is `stream_incomplete`, and a success with zero output tokens where tokens were asked
for is `no_token` (both are errors, not successes — see STYLE.md's pitfalls).

Tenancy reaches the server as `Authorization: Bearer <tenant api_key>` (the target's own key
for tenants without one), plus the target's headers and extra body fields (`class_extra_body`
per SLO class, e.g. `{interactive: {priority: 0}}` for vLLM's priority field; a tenant's own
`headers` and `extra_body`). `ignore_eos` is
sent by default so output lengths follow the plan. One keep-alive pool and no connection cap (a
cap would close the open loop).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from fairbench.plan import PlannedRequest
from fairbench.targets.fastclient import Outcome, Pool, request_bytes

PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}


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
        tenant_headers: Mapping[str, Mapping[str, str]] | None = None,
        tenant_extra_body: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self.path_prefix = urlsplit(self.base_url).path.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.tenant_keys = dict(tenant_keys or {})
        self.headers = dict(headers or {})
        self.extra_body = dict(extra_body or {})
        self.class_extra_body = {k: dict(v) for k, v in (class_extra_body or {}).items()}
        self.ignore_eos = ignore_eos
        self.kind = kind
        self.class_header = class_header  # e.g. X-SLO-Class for the reference server
        self.tenant_headers = {k: dict(v) for k, v in (tenant_headers or {}).items()}
        self.tenant_extra_body = {k: dict(v) for k, v in (tenant_extra_body or {}).items()}
        self.pool: Pool | None = None

    async def open(self) -> None:
        self.pool = Pool(self.base_url)

    async def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

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
        body.update(self.tenant_extra_body.get(req.tenant, {}))
        body.update(self.class_extra_body.get(req.slo_class, {}))
        return body

    def request_headers(self, req: PlannedRequest) -> dict[str, str]:
        headers = dict(self.headers)
        headers.update(self.tenant_headers.get(req.tenant, {}))
        key = self.tenant_keys.get(req.tenant, self.api_key)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        if self.class_header:
            headers[self.class_header] = req.slo_class
        headers["X-Request-Id"] = f"fb-{req.request_id}"  # lets server logs join our records
        return headers

    async def warm(self, connections: int) -> int:
        assert self.pool is not None, "open() the target first"
        return await self.pool.warm(connections)

    def prepare(self, req: PlannedRequest) -> tuple[bytes, bool]:
        """The request's bytes, built before its deadline so that sending costs one write."""
        assert self.pool is not None, "open() the target first"
        body = json.dumps(self.body(req), separators=(",", ":")).encode()
        path = self.path_prefix + PATHS[req.endpoint]
        stream = req.stream and req.endpoint != "embeddings"
        return request_bytes(self.pool, path, body, self.request_headers(req)), stream

    def start(self, prepared: tuple[bytes, bool]) -> tuple[Any, Outcome]:
        """Send now; the transport stamps t_sent and every later time as bytes arrive."""
        assert self.pool is not None
        return self.pool.start(*prepared)

    def abort(self, waiter: Any) -> None:
        if self.pool is not None:
            self.pool.abort(waiter)
