"""vLLM, SGLang and TGI wire formats, replayed from transcripts through the real transport.

Each fixture in tests/fixtures/engines/ is one response body: recorded from a real vLLM 0.32
here, or written from SGLang's and TGI's source (each file says which). A loopback server
replays it event by event, on whatever path and with whatever body the target sends, and
each test asserts the exact record the executor makes of it — status, error kind, tokens from
the server's own counts, first-token time — and the request body the engine would receive.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from fairbench.targets.openai import OpenAITarget, Priority
from tests.conftest import make_plan
from tests.loopback import execute, serve

FIXTURES = Path(__file__).parent / "fixtures" / "engines"

# fixture -> (http status, content type)
SERVED: dict[str, tuple[int, str]] = {}
seen: list[dict[str, Any]] = []


def events(name: str) -> list[bytes]:
    """The fixture's SSE events (comment lines included: a parser must skip them)."""
    text = (FIXTURES / name).read_bytes()
    return [part + b"\n\n" for part in text.split(b"\n\n") if part.strip()]


async def replay(request: web.Request) -> web.StreamResponse:
    name = request.headers["X-Fixture"]
    body = await request.json()
    seen.append({"path": request.path, "body": body, "fixture": name})
    status = int(request.headers.get("X-Status", "200"))
    if name.endswith(".json"):
        return web.Response(
            status=status, body=(FIXTURES / name).read_bytes(), content_type="application/json"
        )
    resp = web.StreamResponse(status=status, headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for event in events(name):
        await resp.write(event)
        await asyncio.sleep(0.005)  # events arrive apart, as tokens do
    await resp.write_eof()
    return resp


@pytest.fixture
async def server_url() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", replay)
    seen.clear()
    async with serve(app) as url:
        yield url


class FixtureTarget(OpenAITarget):
    fixture = ""
    status = 200

    def request_headers(self, req):  # type: ignore[no-untyped-def]
        headers = super().request_headers(req)
        headers["X-Fixture"] = self.fixture
        headers["X-Status"] = str(self.status)
        return headers


async def one_record(
    url: str,
    kind: str,
    api: str,
    fixture: str,
    *,
    endpoint: str = "chat",
    stream: bool = True,
    status: int = 200,
    priority: Priority | None = None,
    tmp_path: Path,
) -> dict[str, Any]:
    plan = make_plan(rate=1, duration="1s", endpoint=endpoint, output=4, stream=stream)
    assert len(plan) == 1
    target = FixtureTarget(url, model="tiny", kind=kind, api=api, priority=priority)
    target.fixture, target.status = fixture, status
    (row,) = await execute(plan, target, tmp_path / "j.jsonl", timeout_s=5)
    return row


def outcome(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["status"], row["error_kind"], row["output_tokens"])


async def test_vllm_chat_recorded(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url,
        "vllm",
        "openai",
        "vllm_chat_stream.sse",
        priority=Priority("slo_class", {"interactive": 0}, 7),
        tmp_path=tmp_path,
    )
    assert outcome(row) == ("ok", None, 5)
    assert row["n_chunks"] == 5  # the role-only first chunk carries no token
    (req,) = seen
    assert req["path"] == "/v1/chat/completions"
    body = req["body"]
    assert body["priority"] == 0 and body["ignore_eos"] is True and body["max_tokens"] == 4
    assert body["stream_options"] == {"include_usage": True}


async def test_vllm_completions_recorded(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url,
        "vllm",
        "openai",
        "vllm_completions_stream.sse",
        endpoint="completions",
        tmp_path=tmp_path,
    )
    assert outcome(row) == ("ok", None, 4)
    assert seen[0]["path"] == "/v1/completions"
    assert "priority" not in seen[0]["body"]


async def test_vllm_400_is_a_client_error(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url, "vllm", "openai", "vllm_400.json", status=400, tmp_path=tmp_path
    )
    assert outcome(row) == ("error", "http_4xx", 0)
    assert "max_model_len" in row["error_detail"]


async def test_sglang_native_stream(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url,
        "sglang",
        "native",
        "sglang_generate_stream.sse",
        priority=Priority("tenant", {"a": 5}),
        tmp_path=tmp_path,
    )
    # completion_tokens is cumulative: 1, 3, 3, 4 -> 4 tokens over 3 token-bearing events
    assert outcome(row) == ("ok", None, 4)
    assert row["n_chunks"] == 4 and row["cached_tokens"] == 8
    assert row["t_first_token_ns"] < row["t_last_token_ns"]
    (req,) = seen
    assert req["path"] == "/generate"
    body = req["body"]
    assert body["stream"] is True and body["priority"] == 5
    assert body["sampling_params"] == {"max_new_tokens": 4, "ignore_eos": True}
    assert isinstance(body["text"], str) and "messages" not in body


async def test_sglang_native_whole(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url, "sglang", "native", "sglang_generate.json", stream=False, tmp_path=tmp_path
    )
    assert outcome(row) == ("ok", None, 4)
    assert seen[0]["body"]["stream"] is False


async def test_sglang_abort_503_is_a_rejection(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url, "sglang", "native", "sglang_generate_abort_503.sse", tmp_path=tmp_path
    )
    assert outcome(row) == ("rejected", "overloaded", 0)
    assert "queue is full" in row["error_detail"]


async def test_sglang_stream_error(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url, "sglang", "native", "sglang_generate_error.sse", tmp_path=tmp_path
    )
    assert outcome(row) == ("error", "http_4xx", 0)
    assert "context length" in row["error_detail"]


async def test_sglang_openai_chat(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url, "sglang", "openai", "sglang_chat_stream.sse", tmp_path=tmp_path
    )
    # one chunk carries two words: usage (4), not the chunk count (3), is the token count
    assert outcome(row) == ("ok", None, 4)
    assert row["n_chunks"] == 3 and row["cached_tokens"] == 16
    assert seen[0]["path"] == "/v1/chat/completions"


async def test_tgi_native_stream(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url, "tgi", "native", "tgi_generate_stream.sse", tmp_path=tmp_path
    )
    assert outcome(row) == ("ok", None, 4)  # no [DONE]: the generated_text event ends it
    assert row["n_chunks"] == 4
    (req,) = seen
    assert req["path"] == "/generate_stream"
    assert req["body"]["parameters"] == {"max_new_tokens": 4, "details": True}
    assert "ignore_eos" not in json.dumps(req["body"])  # TGI has no such parameter


async def test_tgi_native_whole(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url, "tgi", "native", "tgi_generate.json", stream=False, tmp_path=tmp_path
    )
    assert outcome(row) == ("ok", None, 4)
    assert seen[0]["path"] == "/generate"


async def test_tgi_overloaded_in_stream_is_a_rejection(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url, "tgi", "native", "tgi_generate_stream_overloaded.sse", tmp_path=tmp_path
    )
    assert outcome(row) == ("rejected", "rate_limited", 0)
    assert row["http_status"] == 200  # TGI says it inside a 200 stream


async def test_tgi_429_is_a_rejection(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url, "tgi", "native", "tgi_429.json", stream=False, status=429, tmp_path=tmp_path
    )
    assert outcome(row) == ("rejected", "rate_limited", 0)
    assert row["http_status"] == 429


async def test_tgi_generation_error_mid_stream(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url, "tgi", "native", "tgi_generate_stream_generation_error.sse", tmp_path=tmp_path
    )
    assert outcome(row) == ("error", "http_5xx", 1)
    assert "CUDA out of memory" in row["error_detail"]


async def test_tgi_messages_api(server_url: str, tmp_path: Path) -> None:
    row = await one_record(server_url, "tgi", "openai", "tgi_chat_stream.sse", tmp_path=tmp_path)
    assert outcome(row) == ("ok", None, 3)
    body = seen[0]["body"]
    assert seen[0]["path"] == "/v1/chat/completions"
    assert "ignore_eos" not in body and body["stream_options"] == {"include_usage": True}


async def test_tgi_messages_api_overloaded(server_url: str, tmp_path: Path) -> None:
    row = await one_record(
        server_url, "tgi", "openai", "tgi_chat_overloaded.sse", tmp_path=tmp_path
    )
    # TGI's in-stream code is always 422; the message is what says overload
    assert outcome(row) == ("rejected", "rate_limited", 0)
