"""The wire between the gateway and one upstream: the body it is sent, and its SSE, event by event.

Streaming passthrough means an event is written to the client as soon as it is complete (the
bytes up to its blank line), never held until the end; the relay only looks inside each event
to count tokens for the policy's charges and to read `usage`. The upstream is always asked for
usage (`stream_options.include_usage`), because VTC charges what was served; the usage-only
chunk (empty `choices`) reaches the client only if the client asked for usage itself.

What the client sent is not what the upstream gets: the model name becomes the upstream's, the
engine's `priority` field is the gateway's to set (from the tier, or removed: a client must not
pick its own priority), and the client's API key (its tenancy at the gateway) is replaced by
the upstream's own key, which never travels the other way.
"""

from __future__ import annotations

from typing import Any

import orjson

from reference_scheduler.core.sse import SSEParser

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class Failure(Exception):
    """An attempt on one upstream that failed. `before_first_byte`: the client has seen nothing,
    so another upstream may be tried; `health`: it counts against the upstream's health (an
    overloaded answer does not: the upstream is alive, just full); `retry`: another upstream may
    take it (False once this one accepted the request and may be working on it)."""

    def __init__(
        self,
        kind: str,
        detail: str,
        *,
        before_first_byte: bool,
        health: bool = True,
        retry: bool = True,
    ):
        super().__init__(detail)
        self.retry = retry
        self.kind = kind
        self.detail = detail
        self.before_first_byte = before_first_byte
        self.health = health


def upstream_body(
    body: dict[str, Any], model: str, priority: int | None, stream: bool
) -> dict[str, Any]:
    out = dict(body)
    out["model"] = model
    out.pop("priority", None)
    if priority is not None:
        out["priority"] = priority
    if stream:
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        out["stream_options"] = options
    return out


def upstream_headers(key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


class Events:
    """Reads an upstream's SSE byte stream event by event (core/sse.py, the project's one SSE
    reader) and what the gateway needs from each event.

    `feed(chunk)` returns the bytes to forward now: every event completed by the chunk, minus
    the usage-only chunk when the client did not ask for usage. Afterwards `tokens` says how
    many content chunks were seen in it (a token each, as vLLM streams them; `usage` corrects
    the count at the end), `usage` holds the last usage report, `done` whether `[DONE]` came, and
    `error` the first in-stream error object. With `model`, each event's `model` is rewritten to
    it (the name the client asked for, not the upstream's). An event over the reader's bound
    (4 MiB) raises ValueError: a broken stream."""

    __slots__ = ("_model", "_parser", "done", "error", "keep_usage", "tokens", "usage")

    def __init__(self, keep_usage: bool, model: str | None = None) -> None:
        self._model = model
        self._parser = SSEParser()
        self.keep_usage = keep_usage
        self.tokens = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: Any = None

    def feed(self, chunk: bytes) -> bytes:
        self.tokens = 0
        events = self._parser.feed_raw(chunk)
        if len(events) == 1:  # the usual read: one token's event
            return self._read(*events[0]) or b""
        out = [self._read(raw, data) for raw, data in events]
        return b"".join(part for part in out if part is not None)

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished event are held (the stream must not end here)."""
        return self._parser.has_partial

    def _read(self, raw: bytes, payload: bytes) -> bytes | None:
        """Read one event: its bytes to forward it as it is, other bytes to forward instead
        (the model renamed), None to drop it."""
        if not payload:
            return raw  # comments, keep-alives, other fields: passed through untouched
        if payload == b"[DONE]":
            self.done = True
            return raw
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return raw  # not ours to judge; the client sees what the engine sent
        if not isinstance(obj, dict):
            return raw
        out = raw
        model = self._model
        if model is not None and "model" in obj and obj["model"] != model:
            obj["model"] = model
            out = b"data: " + orjson.dumps(obj) + b"\n\n"
        if "error" in obj and self.error is None:
            self.error = obj["error"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = obj.get("choices")
        if isinstance(choices, list):
            if not choices:
                return out if self.keep_usage or usage is None else None
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta")
                text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                if text:
                    self.tokens += 1
        return out


def usage_counts(usage: Any) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from a usage object, if it has them."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        return prompt, completion
    return None


def error_message(raw: bytes) -> str:
    """An upstream error body's message (OpenAI's, vLLM's or TGI's shape), shortened."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:200].decode("utf-8", "replace")
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        if isinstance(obj.get("message"), str):
            return obj["message"][:300]
        return str(err)[:300]
    return str(obj)[:300]
