"""The OpenAI target against an in-process aiohttp server scripted to misbehave."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from fairbench.plan import Plan
from fairbench.run.records import read_journal
from fairbench.targets.openai import OpenAITarget
from tests.conftest import make_plan
from tests.loopback import execute, serve


def chunk(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def delta(text: str, finish: str | None = None) -> bytes:
    return chunk({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})


USAGE = chunk({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
MODES = [
    "ok",
    "ok_crlf_split",
    "drop",
    "no_done",
    "status_429",
    "status_500",
    "bad_json",
    "zero_tokens",
    "usage_counts",
    "error_event",
]


async def scripted(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["priority"] == 1
    seen_keys.append(request.headers.get("Authorization"))
    mode = request.headers["X-Mode"]
    if mode == "status_429":
        return web.json_response(
            {"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "3"}
        )
    if mode == "status_500":
        return web.Response(status=500, text="internal error")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if mode == "drop":
        await resp.write(delta("a"))
        assert request.transport is not None
        request.transport.close()  # the connection dies mid-stream
        return resp
    if mode == "bad_json":
        await resp.write(b"data: {not json\n\n")
        return resp
    if mode == "error_event":
        await resp.write(chunk({"error": {"message": "engine died"}}))
        return resp
    pieces = [delta("a"), delta("b"), delta("c"), delta("d"), delta("e", "length")]
    if mode == "zero_tokens":
        pieces = [
            chunk(
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "finish_reason": "length",
                        }
                    ]
                }
            )
        ]
    if mode == "no_done":
        pieces = pieces[:3]  # stops early: no finish_reason, no usage, no [DONE]
    if mode == "usage_counts":
        pieces = [delta("abc"), delta("de", "length")]  # 2 chunks, 5 tokens per usage
    payload = b"".join(pieces)
    if mode != "no_done":
        payload += USAGE + b"data: [DONE]\n\n"
    if mode == "ok_crlf_split":
        payload = payload.replace(b"\n", b"\r\n")
        for k in range(0, len(payload), 7):  # tiny writes split everything, \r\n included
            await resp.write(payload[k : k + 7])
            await asyncio.sleep(0)
    else:
        await resp.write(payload)
    return resp


seen_keys: list[str | None] = []


@pytest.fixture
async def server_url() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", scripted)
    async with serve(app) as url:
        yield url


class ModeTarget(OpenAITarget):
    """Sends request i with X-Mode = MODES[i % len(MODES)]."""

    def request_headers(self, req):  # type: ignore[no-untyped-def]
        headers = super().request_headers(req)
        headers["X-Mode"] = MODES[req.request_id % len(MODES)]
        return headers


EXPECTED = {
    "ok": ("ok", None, 5),
    "ok_crlf_split": ("ok", None, 5),
    "drop": ("error", "dropped", 1),
    "no_done": ("error", "stream_incomplete", 3),
    "status_429": ("rejected", "rate_limited", 0),
    "status_500": ("error", "http_5xx", 0),
    "bad_json": ("error", "bad_stream", 0),
    "zero_tokens": ("error", "no_token", 5),  # usage claims 5; no token reached the client
    "usage_counts": ("ok", None, 5),
    "error_event": ("error", "http_5xx", 0),
}


async def run_against(target: OpenAITarget, plan: Plan, tmp_path: Path) -> None:
    await execute(plan, target, tmp_path / "j.jsonl", timeout_s=5)


async def test_stream_shapes_and_failures(server_url: str, tmp_path: Path) -> None:
    plan = make_plan(rate=40, duration="0.5s")
    target = ModeTarget(
        server_url + "/v1",
        model="m",
        api_key="k-default",
        tenant_keys={"a": "k-tenant-a"},
        class_extra_body={"interactive": {"priority": 1}},
    )
    await run_against(target, plan, tmp_path)
    rows = {r["request_id"]: r for r in read_journal(tmp_path / "j.jsonl")}
    assert len(rows) == len(plan) == 20
    for i, row in rows.items():
        mode = MODES[i % len(MODES)]
        status, kind, tokens = EXPECTED[mode]
        assert (row["status"], row["error_kind"], row["output_tokens"]) == (status, kind, tokens), (
            mode,
            row,
        )
    assert rows[MODES.index("status_429")]["retry_after_s"] == 3.0
    assert rows[MODES.index("status_429")]["http_status"] == 429
    assert rows[MODES.index("usage_counts")]["n_chunks"] == 2  # usage, not chunks, counts
    assert set(seen_keys) == {"Bearer k-tenant-a"}


async def test_connect_error_is_recorded(tmp_path: Path) -> None:
    plan = make_plan(rate=10, duration="0.3s")
    target = OpenAITarget("http://127.0.0.1:9")  # nothing listens on the discard port
    await run_against(target, plan, tmp_path)
    rows = read_journal(tmp_path / "j.jsonl")
    assert rows and all((r["status"], r["error_kind"]) == ("error", "connect") for r in rows)
