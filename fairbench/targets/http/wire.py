"""What an engine's response means: one dialect per wire format, read inside the transport.

The transport (fastclient.py) frames HTTP and SSE and stamps times; a dialect turns each JSON
event (or a whole JSON body) into facts on the Outcome: tokens arrived, the stream's terminal,
the server's own token counts, and failures. Three dialects:

- `openai`  — OpenAI-compatible chat/completions/embeddings (vLLM, SGLang, TGI's Messages API,
  our reference server). Tokens from `usage` (`stream_options.include_usage`), not chunk counts.
- `tgi`     — TGI's native `/generate_stream`: one event per token (`token`), the last carries
  `generated_text` and, with `parameters.details`, `details.generated_tokens` / `input_length`.
  No `[DONE]`: the `generated_text` event is the terminal.
- `sglang`  — SGLang's native `/generate` stream: each event repeats the request's state —
  `meta_info.completion_tokens` is cumulative, `text` cumulative unless the server streams
  increments — so tokens arrived are the growth of `completion_tokens`; `finish_reason` not
  null is the terminal; `[DONE]` follows.

Overload is a rejection wherever an engine says it, not an error: HTTP 429/503 (transport), and
in-stream errors that carry a 429/503 code or say "overloaded" — TGI reports
`max_concurrent_requests` inside a 200 stream (`error_type: overloaded`, or on its Messages API
`{"error": {"message": "Model is overloaded", "http_status_code": 422}}`), SGLang aborts a
queued request with `finish_reason: {type: abort, status_code: 503}`. The fixtures in
tests/fixtures/engines/ record each form with the source it was taken from.
"""

from __future__ import annotations

from typing import Any, Protocol

_REJECT_CODES = (429, 503)


# fairbench's gateway answers with its own queue record of the request in this header (JSON:
# queue_time_ns, passed_over_ns, backlog_ns; reference_scheduler/gateway TIMING_HEADER)
GATEWAY_TIMING_HEADER = "x-fairbench-gateway"


class Sink(Protocol):
    """The Outcome fields a dialect writes (fastclient.Outcome)."""

    chunks: int
    extra: dict[str, Any]
    terminal: bool
    usage_completion: int | None
    usage_prompt: int | None
    tokens: int
    status: str

    def fail(self, kind: str, detail: str, status: str = "error") -> None: ...


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def tokens_arrived(out: Any, t: int, n: int = 1) -> None:
    """n tokens arrived at t: stamps first/last token and the largest gap between events."""
    if n <= 0:
        return
    if out.t_first_token:
        gap = t - out.t_last_token
        if gap > out.itl_max:
            out.itl_max = gap
    else:
        out.t_first_token = t
    out.t_last_token = t
    out.chunks += n


def fail_from_code(out: Sink, code: int | None, detail: str, default: str = "http_5xx") -> None:
    """A failure the server described with an HTTP-like code: 429/503 are rejections."""
    text = f"error in stream: {detail}"[:300]
    if code in _REJECT_CODES or "overloaded" in detail.lower():
        out.fail("rate_limited" if code != 503 else "overloaded", text, "rejected")
    elif code is not None and 400 <= code < 500:
        out.fail("http_4xx", text)
    elif code is not None and code >= 500:
        out.fail("http_5xx", text)
    else:
        out.fail(default, text)


def stream_error(out: Sink, error: object, obj: dict[str, Any], default: str) -> None:
    """An `error` member in an event, in any of the engines' shapes."""
    if isinstance(error, dict):
        message = str(error.get("message", error))
        code = _int(error.get("code")) or _int(error.get("http_status_code"))
        code = code or _int(error.get("status_code"))
    else:
        message = str(error)
        code = _int(obj.get("code")) or _int(obj.get("status_code"))
    kind = str(obj.get("error_type") or "")
    if kind == "overloaded":
        code = 429  # TGI's answer past max_concurrent_requests
    elif kind == "validation" and code is None:
        code = 422
    fail_from_code(out, code, message, default)


class Dialect(Protocol):
    name: str

    def event(self, out: Any, obj: dict[str, Any], t: int) -> None: ...
    def whole(self, out: Any, obj: Any) -> None: ...


class OpenAIDialect:
    name = "openai"

    def event(self, out: Any, obj: dict[str, Any], t: int) -> None:
        if "error" in obj:
            stream_error(out, obj["error"], obj, "http_5xx")
            return
        for choice in obj.get("choices") or ():
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if text:
                tokens_arrived(out, t)
            if choice.get("finish_reason"):
                out.terminal = True
        usage = obj.get("usage")
        if usage:
            out.terminal = True
            out.usage_completion = _int(usage.get("completion_tokens"))
            out.usage_prompt = _int(usage.get("prompt_tokens"))
            _cached(out, usage)
        extra = obj.get("fairbench")
        if isinstance(extra, dict):
            out.extra.update(extra)

    def whole(self, out: Any, obj: Any) -> None:
        if not isinstance(obj, dict):
            out.fail("bad_stream", "the response body is not a JSON object")
            return
        if "error" in obj:
            stream_error(out, obj["error"], obj, "http_5xx")
            return
        usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
        out.usage_prompt = _int(usage.get("prompt_tokens"))
        out.usage_completion = _int(usage.get("completion_tokens"))
        _cached(out, usage)
        if isinstance(obj.get("fairbench"), dict):
            out.extra.update(obj["fairbench"])
        if "data" in obj:  # embeddings
            out.tokens = 0
            if obj.get("data"):
                out.status = "ok"
            else:
                out.fail("no_token", "no embedding in the response")
            return
        out.tokens = (
            out.usage_completion
            if out.usage_completion is not None
            else sum(1 for c in obj.get("choices") or () if c.get("text") or c.get("message"))
        )
        out.terminal = True
        out.status = "ok"


def _cached(out: Any, usage: dict[str, Any]) -> None:
    """vLLM (with --enable-prompt-tokens-details) and SGLang report prefix-cache hits here."""
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and _int(details.get("cached_tokens")) is not None:
        out.extra.setdefault("cached_tokens", _int(details["cached_tokens"]))


def _body_object(out: Any, obj: Any, default: str) -> dict[str, Any] | None:
    """A native non-streamed answer as one object (some versions wrap it in a one-element
    list), or None once a failure is recorded: not an object, or an error body."""
    if isinstance(obj, list) and len(obj) == 1:
        obj = obj[0]
    if not isinstance(obj, dict):
        out.fail("bad_stream", "the response body is not a JSON object")
        return None
    if "error" in obj or obj.get("object") == "error":
        stream_error(out, obj.get("error", obj.get("message")), obj, default)
        return None
    return obj


class TGIDialect:
    """TGI's native /generate and /generate_stream (router/src/server.rs, lib.rs)."""

    name = "tgi"

    def event(self, out: Any, obj: dict[str, Any], t: int) -> None:
        if "error" in obj:
            stream_error(out, obj["error"], obj, "http_5xx")
            return
        if isinstance(obj.get("token"), dict):
            tokens_arrived(out, t)
        details = obj.get("details")
        if isinstance(details, dict):
            out.usage_completion = _int(details.get("generated_tokens"))
            out.usage_prompt = _int(details.get("input_length"))
        if obj.get("generated_text") is not None:
            out.terminal = True  # TGI sends no [DONE] on /generate_stream

    def whole(self, out: Any, obj: Any) -> None:
        obj = _body_object(out, obj, "http_5xx")
        if obj is None:
            return
        if obj.get("generated_text") is None:
            out.fail("bad_stream", "no generated_text in the response")
            return
        details = obj.get("details") if isinstance(obj.get("details"), dict) else {}
        out.usage_completion = _int(details.get("generated_tokens"))
        prefill = details.get("prefill")
        if isinstance(prefill, list) and prefill:
            out.usage_prompt = len(prefill)
        out.tokens = out.usage_completion if out.usage_completion is not None else 0
        out.terminal = True
        out.status = "ok"


class SGLangDialect:
    """SGLang's native /generate (srt/entrypoints/http_server.py, tokenizer_manager)."""

    name = "sglang"

    def event(self, out: Any, obj: dict[str, Any], t: int) -> None:
        if "error" in obj:
            # The native stream wraps a ValueError (an input problem; 400 without streaming).
            stream_error(out, obj["error"], obj, "http_4xx")
            return
        meta = obj.get("meta_info")
        if not isinstance(meta, dict):
            out.fail("bad_stream", "an event without meta_info")
            return
        done = _int(meta.get("completion_tokens"))
        if done is not None:
            before = out.usage_completion or 0
            tokens_arrived(out, t, done - before)
            out.usage_completion = max(done, before)
        prompt = _int(meta.get("prompt_tokens"))
        if prompt is not None:
            out.usage_prompt = prompt
        cached = _int(meta.get("cached_tokens"))
        if cached is not None:
            out.extra["cached_tokens"] = cached
        finish = meta.get("finish_reason")
        if finish is not None:
            if isinstance(finish, dict) and finish.get("type") == "abort":
                code = _int(finish.get("status_code"))
                fail_from_code(out, code, str(finish.get("message", "aborted")), "http_5xx")
                return
            out.terminal = True

    def whole(self, out: Any, obj: Any) -> None:
        obj = _body_object(out, obj, "http_4xx")
        if obj is None:
            return
        meta = obj.get("meta_info") if isinstance(obj.get("meta_info"), dict) else {}
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":
            fail_from_code(out, _int(finish.get("status_code")), str(finish.get("message")))
            return
        out.usage_completion = _int(meta.get("completion_tokens"))
        out.usage_prompt = _int(meta.get("prompt_tokens"))
        if _int(meta.get("cached_tokens")) is not None:
            out.extra["cached_tokens"] = _int(meta["cached_tokens"])
        out.tokens = out.usage_completion or 0
        out.terminal = True
        out.status = "ok"


OPENAI = OpenAIDialect()
TGI = TGIDialect()
SGLANG = SGLangDialect()
