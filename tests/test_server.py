"""The reference server, driven by the official openai client and by raw aiohttp."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from fairbench.targets.http.sse import parse_events
from reference_scheduler.server.app import build_app, serve
from reference_scheduler.server.config import parse_server_config
from tests import loopback

KEYS = {"sk-alice": "alice", "sk-bob": "bob"}
CONFIG = {
    "model": "ref",
    "scheduler": {
        "policy": "vtc",
        "profile": {"constant_step_ms": 1.0, "kv_cache_tokens": 20000, "max_num_seqs": 8},
    },
    "tenants": [
        {"id": "alice", "api_key": "sk-alice", "weight": 1, "classes": ["interactive", "batch"]},
        {"id": "bob", "api_key": "sk-bob", "weight": 1, "classes": ["batch"]},
    ],
    "timing_extension": True,
    "max_tokens_limit": 4096,
}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with loopback.serve_in_thread(build_app(parse_server_config(CONFIG)), reference=True) as url:
        yield url


def client(url: str, key: str = "sk-alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=20)


def test_streaming_chat_with_the_official_client(server: str) -> None:
    stream = client(server).chat.completions.create(
        model="ref",
        messages=[{"role": "user", "content": "ka ke ki ko ku"}],
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for event in stream:
        if event.choices:
            text += event.choices[0].delta.content or ""
            finish = event.choices[0].finish_reason or finish
        if event.usage:
            usage = event.usage
    assert len(text.split()) == 7 and finish == "length"
    assert usage is not None and usage.completion_tokens == 7 and usage.prompt_tokens == 5


def test_streaming_completion_and_whole_responses(server: str) -> None:
    c = client(server)
    tokens = [
        e.choices[0].text
        for e in c.completions.create(model="ref", prompt="ba be bi", max_tokens=4, stream=True)
        if e.choices
    ]
    assert len("".join(tokens).split()) == 4
    whole = c.completions.create(model="ref", prompt="ba be bi", max_tokens=3)
    assert whole.usage.completion_tokens == 3 and len(whole.choices[0].text.split()) == 3
    chat = c.chat.completions.create(
        model="ref", messages=[{"role": "user", "content": "x y"}], max_tokens=2
    )
    assert chat.choices[0].message.content and chat.usage.prompt_tokens == 2


def test_embeddings(server: str) -> None:
    result = client(server).embeddings.create(model="ref", input="ka ke ki")
    assert len(result.data) == 1 and len(result.data[0].embedding) == 16
    assert result.usage.prompt_tokens == 3


def test_models_health_metrics_openapi(server: str) -> None:
    assert [m.id for m in client(server).models.list()] == ["ref"]

    async def fetch() -> tuple[int, str, dict[str, Any]]:
        async with aiohttp.ClientSession() as s:
            async with s.get(server + "/health") as r:
                health = r.status
            async with s.get(server + "/metrics") as r:
                metrics = await r.text()
            async with s.get(server + "/openapi.json") as r:
                spec = await r.json()
        return health, metrics, spec

    health, metrics, spec = asyncio.run(fetch())
    assert health == 200
    assert "scheduler_wait_time_seconds_bucket" in metrics
    assert 'scheduler_throughput_tokens_total{tenant="alice"}' in metrics
    assert 'scheduler_vtc_counter{tenant="alice"}' in metrics
    assert set(spec["paths"]) >= {"/v1/completions", "/v1/chat/completions", "/v1/embeddings"}


BAD = [
    ("not json", {}, 400, "invalid_json"),
    (json.dumps([1, 2]), {}, 400, None),
    (json.dumps({"prompt": 3, "max_tokens": 5}), {}, 400, None),
    (json.dumps({"prompt": "a", "max_tokens": -1}), {}, 400, None),
    (json.dumps({"prompt": "a", "max_tokens": 10**9}), {}, 400, None),
    (json.dumps({"prompt": "a", "max_tokens": "5"}), {}, 400, None),
    (json.dumps({"prompt": "a", "max_tokens": 5, "model": "gpt-5"}), {}, 400, "model_not_found"),
    (json.dumps({"prompt": "a " * 20000, "max_tokens": 5}), {}, 400, "context_length_exceeded"),
    (json.dumps({"prompt": "a", "max_tokens": 5, "stream": "yes"}), {}, 400, None),
    (
        json.dumps({"prompt": "a", "max_tokens": 5}),
        {"Authorization": "Bearer sk-eve"},
        401,
        "invalid_api_key",
    ),
    (json.dumps({"prompt": "a", "max_tokens": 5}), {"Authorization": ""}, 401, "invalid_api_key"),
    (
        json.dumps({"prompt": "a", "max_tokens": 5}),
        {"Authorization": "Bearer sk-bob", "X-SLO-Class": "interactive"},
        403,
        None,
    ),
]


@pytest.mark.parametrize(("body", "headers", "status", "code"), BAD)
def test_bad_requests_get_openai_errors_and_the_server_stays_up(
    server: str, body: str, headers: dict[str, str], status: int, code: str | None
) -> None:
    async def go() -> tuple[int, dict[str, Any]]:
        h = {"Authorization": "Bearer sk-alice", "Content-Type": "application/json", **headers}
        async with (
            aiohttp.ClientSession() as s,
            s.post(server + "/v1/completions", data=body, headers=h) as r,
        ):
            return r.status, await r.json()

    got, payload = asyncio.run(go())
    assert got == status
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    if code:
        assert payload["error"]["code"] == code
    if status == 400:  # the request's fault, never the server's load
        assert payload["error"]["type"] == "invalid_request_error"
    # and a well-behaved request still works
    assert client(server).completions.create(model="ref", prompt="a", max_tokens=1).usage


def test_unknown_route_and_method_are_openai_shaped(server: str) -> None:
    async def go() -> list[tuple[int, dict[str, Any]]]:
        out = []
        async with aiohttp.ClientSession() as s:
            for method, path in (("GET", "/v1/nope"), ("GET", "/v1/completions")):
                async with s.request(method, server + path) as r:
                    out.append((r.status, await r.json()))
        return out

    (s1, b1), (s2, b2) = asyncio.run(go())
    assert s1 == 404 and b1["error"]["type"] == "not_found_error"
    assert s2 == 405 and "message" in b2["error"]


def test_tenant_comes_from_the_key_not_from_headers_or_body(server: str) -> None:
    """bob claims alice's identity in headers and body; the server charges bob."""

    async def go() -> str:
        h = {"Authorization": "Bearer sk-bob", "X-Tenant": "alice", "OpenAI-Organization": "alice"}
        body = {"prompt": "a b", "max_tokens": 30, "user": "alice", "tenant": "alice"}
        async with aiohttp.ClientSession() as s:
            async with s.post(server + "/v1/completions", json=body, headers=h) as r:
                assert r.status == 200
            async with s.get(server + "/metrics") as r:
                return await r.text()

    text = asyncio.run(go())
    bob_tokens = [
        line
        for line in text.splitlines()
        if line.startswith('scheduler_throughput_tokens_total{tenant="bob"}')
    ]
    assert bob_tokens and float(bob_tokens[0].split()[-1]) >= 30


def test_timing_extension_in_the_final_chunk(server: str) -> None:
    async def go() -> list[dict[str, Any]]:
        body = {
            "prompt": "a b",
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        events = []
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                server + "/v1/completions", json=body, headers={"Authorization": "Bearer sk-alice"}
            ) as r,
        ):
            raw = await r.text()
        for payload in parse_events(raw.encode()):
            if payload != b"[DONE]":
                events.append(json.loads(payload))
        assert raw.rstrip().endswith("data: [DONE]")
        return events

    events = asyncio.run(go())
    final = events[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 3
    assert final["fairbench"]["queue_time_ns"] >= 0 and final["fairbench"]["tier"] == "interactive"


def test_admission_refusal_is_503_with_retry_after_over_http() -> None:
    """One slot, 300 ms per request, a queue of one: the third concurrent request is refused."""
    config = parse_server_config(
        {
            "model": "ref",
            "scheduler": {
                "policy": "fifo",
                "profile": {"constant_step_ms": 100.0, "kv_cache_tokens": 10000, "max_num_seqs": 1},
                "admission": {"max_queue": 1},
                "prefix_cache": {"blocks": 64},
            },
        }
    )

    async def go() -> tuple[list[tuple[int, dict[str, Any], str | None]], str]:
        async with (
            loopback.serve(build_app(config), reference=True) as url,
            aiohttp.ClientSession() as s,
        ):

            async def one(delay: float) -> tuple[int, dict[str, Any], str | None]:
                await asyncio.sleep(delay)
                body = {"prompt": "ka ke", "max_tokens": 3}
                async with s.post(url + "/v1/completions", json=body) as r:
                    return r.status, await r.json(), r.headers.get("Retry-After")

            results = await asyncio.gather(one(0), one(0.05), one(0.1))
            async with s.get(url + "/metrics") as r:
                metrics = await r.text()
        return results, metrics

    results, metrics = asyncio.run(go())
    statuses = [r[0] for r in results]
    assert statuses == [200, 200, 503]
    _, body, retry = results[2]
    assert body["error"]["code"] == "queue_full" and retry is not None and int(retry) >= 1
    assert 'scheduler_admission_refusals_total{reason="queue_full"} 1.0' in metrics
    assert "scheduler_prefix_cache_queries_tokens_total" in metrics
    assert "scheduler_demotions_total 0.0" in metrics
    assert 'scheduler_queue_depth_by{dimension="tenant",name="default"}' in metrics


def test_binds_loopback_unless_told_otherwise() -> None:
    config = parse_server_config({**CONFIG, "port": 0})
    assert config.spec.host == "127.0.0.1"
    urls: list[str] = []
    ready = threading.Event()
    loop = asyncio.new_event_loop()

    def run() -> None:
        asyncio.set_event_loop(loop)

        def on_ready(url: str) -> None:
            urls.append(url)
            ready.set()

        task = loop.create_task(serve(config, None, None, on_ready))
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        assert urls[0].startswith("http://127.0.0.1:"), urls
    finally:
        for task in asyncio.all_tasks(loop):
            loop.call_soon_threadsafe(task.cancel)
        thread.join(5)
