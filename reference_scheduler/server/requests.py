"""Request validation for the HTTP server: OpenAI-shaped errors and the body's fields.

Every bad request becomes a `BadRequest` raised here and answered by `error_response` as
`{"error": {"message", "type", "param", "code"}}` with a 4xx status, so a malformed request
never reaches the engine and never takes the server down.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from reference_scheduler.core.policy import Verdict
from reference_scheduler.server.config import ServerConfig, TenantEntry


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


def refusal(verdict: Verdict) -> BadRequest:
    """A refused admission as the client's error, the same from the server and the gateway: a
    400 (the request can never fit) is the request's fault, a 429 the tenant's limit, anything
    else (503) the server's load; Retry-After where the verdict gives one."""
    code = verdict.code if verdict.code in (400, 429, 503) else 503
    kind = {400: "invalid_request_error", 429: "rate_limit_error"}.get(code, "server_overloaded")
    headers = {"Retry-After": str(verdict.retry_after_s)} if verdict.retry_after_s else {}
    return BadRequest(
        code, verdict.reason or "overloaded", kind, code=verdict.reason, headers=headers
    )


def invalid(message: str, param: str | None = None, code: str | None = None) -> BadRequest:
    return BadRequest(400, message, "invalid_request_error", param, code)


def json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 that says why not."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise invalid("The request body is not valid JSON.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    return body


def max_tokens_of(body: dict[str, Any], limit: int, default: int = 16) -> int:
    """The output cap as vLLM reads it: `max_completion_tokens` over `max_tokens` (OpenAI's newer
    name wins when both are given), `default` when neither is."""
    newer = body.get("max_completion_tokens") is not None
    name = "max_completion_tokens" if newer else "max_tokens"
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{name} must be an integer.", name)
    if value < 1 or value > limit:
        raise invalid(f"{name} must be between 1 and {limit}, got {value}.", name)
    return value


def n_of(body: dict[str, Any], most: int) -> int:
    """How many choices the request asks for (`n`, default 1), at most `most`."""
    value = body.get("n")
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid("n must be a positive integer.", "n")
    if value > most:
        raise invalid(
            f"n must be at most {most} here, got {value}"
            + (": this server returns one choice per request." if most == 1 else "."),
            "n",
        )
    return value


def stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("stream must be a boolean.", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise invalid("stream_options must be an object.", "stream_options")
    return stream, bool(options.get("include_usage", False))


def cache_salt_of(body: dict[str, Any]) -> str | None:
    """vLLM's `cache_salt` request field (None: unsalted). vLLM refuses anything but a non-empty
    string with a 400 naming the parameter; so does this server, rather than ignore a salt the
    client meant to isolate its cache with."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise invalid("cache_salt must be a non-empty string if provided.", "cache_salt")
    return salt


def prompt_of_chat(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages must be a non-empty list.", "messages")
    parts = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise invalid(f"messages[{i}] must be an object with a role.", "messages")
        content = message.get("content", "")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise invalid(f"messages[{i}].content must be a string.", "messages")
        parts.append(content)
    return " ".join(parts)


def prompt_of_completion(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise invalid("prompt must be a string.", "prompt")
    return prompt


def tenant_of(request: web.Request, config: ServerConfig) -> TenantEntry:
    """The tenant a request's API key names (401 for a missing or unknown key where keys are
    required); tenancy comes from the key alone."""
    auth = request.headers.get("Authorization", "")
    key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
    if config.keys_required:
        tenant = config.by_key.get(key or "")
        if tenant is None:
            raise BadRequest(
                401,
                "Incorrect or missing API key.",
                "authentication_error",
                code="invalid_api_key",
            )
        return tenant
    return config.default_tenant


def slo_class_of(request: web.Request, tenant: TenantEntry) -> str:
    """The SLO class the request asks for (`X-SLO-Class`), if its tenant may use it (403)."""
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
