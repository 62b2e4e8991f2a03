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

The same class speaks to vLLM, SGLang and TGI (`kind`): their OpenAI-compatible APIs, or with
`api="native"` SGLang's /generate and TGI's /generate_stream (bodies and dialects in
targets/engines.py and targets/wire.py); the engine's priority field from `priority`; prompts
from `renderer` (fairbench.targets.calibrate makes one that the server's tokenizer counts exactly).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fairbench.plan.model import PlannedRequest
from fairbench.targets.engines import Engine, engine
from fairbench.targets.http.client import Outcome, Pool, request_bytes
from fairbench.targets.http.stamped import kernel_stamps_available
from fairbench.targets.http.wire import OPENAI, Dialect

Renderer = Callable[[PlannedRequest], str]


def plan_prompt(req: PlannedRequest) -> str:
    """The plan's own text: exactly `prompt_tokens` reference tokens."""
    return req.prompt()


@dataclass(frozen=True)
class Priority:
    """The engine's per-request priority from the request's SLO class or tenant."""

    by: str  # slo_class | tenant
    values: Mapping[str, int]
    default: int | None = None

    def of(self, req: PlannedRequest) -> int | None:
        key = req.slo_class if self.by == "slo_class" else req.tenant
        return self.values.get(key, self.default)


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
        api: str = "openai",
        priority: Priority | None = None,
        renderer: Renderer = plan_prompt,
        ca_bundle: str | None = None,
        tenant_salts: Mapping[str, str] | None = None,
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
        self.tenant_salts = dict(tenant_salts or {})  # cache_salt per tenant (workload/cache.py)
        self.engine: Engine = engine(kind)
        self.api = api
        self.priority = priority
        self.renderer = renderer
        self.calibration: dict[str, Any] | None = None  # set by fairbench.targets.calibrate
        self.server_version: str | None = None
        self.pool: Pool | None = None
        self.ca_bundle = ca_bundle
        self.kernel_stamps = kernel_stamps_available()

    async def open(self) -> None:
        self.pool = Pool(self.base_url, self.ca_bundle)

    async def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def info(self) -> Mapping[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "base_url": self.base_url,
            "model": self.model,
            "api": self.api,
        }
        if self.ca_bundle:
            out["ca_bundle"] = Path(self.ca_bundle).name  # which file, not where it lives
        if self.server_version:
            out["server_version"] = self.server_version
        if self.priority is not None:
            out["priority"] = {"by": self.priority.by, "values": dict(self.priority.values)}
        if self.calibration is not None:
            out["calibration"] = self.calibration
        return out

    @property
    def native(self) -> bool:
        return self.api == "native" and self.engine.native_body is not None

    def body(self, req: PlannedRequest, prompt: str | None = None) -> dict[str, Any]:
        if prompt is None:
            prompt = self.renderer(req)
        body: dict[str, Any]
        if self.native and req.endpoint != "embeddings":
            assert self.engine.native_body is not None
            body = self.engine.native_body(prompt, req.max_tokens, req.stream, self.ignore_eos)
        elif req.endpoint == "embeddings":
            body = {"model": self.model, "input": prompt}
        else:
            body = {"model": self.model, "max_tokens": req.max_tokens, "stream": req.stream}
            if req.endpoint == "chat":
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                body["prompt"] = prompt
            if req.stream:
                body["stream_options"] = {"include_usage": True}
            if self.ignore_eos and self.engine.ignore_eos:
                body["ignore_eos"] = True
        if self.priority is not None and self.engine.priority_field:
            value = self.priority.of(req)
            if value is not None:
                body["priority"] = value
        salt = self.tenant_salts.get(req.tenant)
        if salt is not None and self.engine.cache_salt and req.endpoint != "embeddings":
            body["cache_salt"] = salt
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

    def path(self, req: PlannedRequest) -> tuple[str, Dialect]:
        stream = req.stream and req.endpoint != "embeddings"
        if self.native and req.endpoint != "embeddings":
            e = self.engine
            path = e.native_stream_path if stream else e.native_whole_path
            assert path is not None
            return self.path_prefix + path, e.native_dialect
        return self.path_prefix + PATHS[req.endpoint], OPENAI

    def prepare(
        self, req: PlannedRequest, prompt: str | None = None
    ) -> tuple[bytes, bool, Dialect]:
        """The request's bytes, built before its deadline so that sending costs one write."""
        assert self.pool is not None, "open() the target first"
        body = json.dumps(self.body(req, prompt), separators=(",", ":")).encode()
        path, dialect = self.path(req)
        stream = req.stream and req.endpoint != "embeddings"
        return request_bytes(self.pool, path, body, self.request_headers(req)), stream, dialect

    def start(self, prepared: tuple[bytes, bool, Dialect]) -> tuple[Any, Outcome]:
        """Send now; the transport stamps t_sent and every later time as bytes arrive."""
        assert self.pool is not None
        return self.pool.start(*prepared)

    def abort(self, waiter: Any) -> None:
        if self.pool is not None:
            self.pool.abort(waiter)
