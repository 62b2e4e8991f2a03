"""Issue 36 item 2: every OpenAI field as the engines read it, through the gateway.

`max_completion_tokens` over `max_tokens` (vLLM's order), a default cap injected and sent
upstream when neither is given (so what is reserved is what runs), `n` reserved n times (the
reference server refuses n > 1 with a 400 naming `n`), the response's `model` the one the client
asked for, unknown fields passed through, bad input counted apart from admission rejections.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from reference_scheduler.core.tokenizer import count_tokens
from tests.promtext import sample_sum, samples
from tests.test_gateway import Engine, chat, config, engines, gateway, post, rig, until


async def _held(engine: Engine, gw: Any, url: str, session: aiohttp.ClientSession, body: Any):
    """Send `body` while the engine holds every request; (the reservation in flight, the body
    the upstream got, the answer once released)."""
    engine.gate = asyncio.Event()
    task = asyncio.create_task(post(session, url, body))
    await until(lambda: engine.requests, "the request reached the upstream")
    held = gw.pool.upstreams[0].inflight_tokens
    sent = engine.requests[-1]["body"]
    engine.gate.set()
    return held, sent, await task


async def test_max_completion_tokens_wins_over_max_tokens() -> None:
    engine = Engine()
    async with rig([engine]) as (gw, url, session):
        body = chat("hello there", max_tokens=3, max_completion_tokens=7)
        held, sent, (status, _, _) = await _held(engine, gw, url, session, body)
    assert status == 200
    assert held == count_tokens("hello there") + 7
    assert sent["max_completion_tokens"] == 7


async def test_a_default_cap_is_injected_and_sent_upstream() -> None:
    engine = Engine()
    body = chat("hello there")
    del body["max_tokens"]
    async with engines(engine) as urls:
        data = {**config(urls), "default_max_tokens": 40}
        async with gateway(data) as (gw, url), aiohttp.ClientSession() as session:
            held, sent, (status, _, _) = await _held(engine, gw, url, session, body)
    assert status == 200
    assert sent["max_tokens"] == 40
    assert held == count_tokens("hello there") + 40


async def test_n_choices_are_reserved_n_times() -> None:
    engine = Engine()
    async with rig([engine]) as (gw, url, session):
        held, sent, (status, _, _) = await _held(engine, gw, url, session, chat("hi", n=3))
    assert status == 200
    assert sent["n"] == 3
    assert held == 1 + 3 * 3


async def test_model_is_rewritten_to_what_the_client_asked() -> None:
    engine = Engine()  # answers with model "up"
    async with rig([engine], up=[{"model": "up"}]) as (_gw, url, session):
        status, raw, _ = await post(session, url, chat(stream=True))
        assert status == 200 and b'"up"' not in raw and b'"model":"m"' in raw
        status, raw, _ = await post(session, url, chat(stream=False))
        assert status == 200 and json.loads(raw)["model"] == "m"
    assert all(r["body"]["model"] == "up" for r in engine.requests)


async def test_unknown_fields_pass_through() -> None:
    engine = Engine()
    async with rig([engine]) as (_gw, url, session):
        status, _, _ = await post(session, url, chat(top_k=5, repetition_penalty=1.1))
    assert status == 200
    assert engine.requests[0]["body"]["top_k"] == 5
    assert engine.requests[0]["body"]["repetition_penalty"] == 1.1


async def test_bad_input_is_counted_apart_from_rejections() -> None:
    engine = Engine()
    async with rig([engine], up=[{"max_inflight_tokens": 50}]) as (_gw, url, session):
        bad = [
            chat(max_completion_tokens=0),
            chat(n=0),
            chat("word " * 60),  # can never fit the 50-token budget
        ]
        answers = [await post(session, url, body) for body in bad]
        async with session.get(url + "/metrics") as r:
            text = await r.text()
    assert [a[0] for a in answers] == [400, 400, 400]
    params = [json.loads(a[1])["error"]["param"] for a in answers[:2]]
    assert params == ["max_completion_tokens", "n"]
    assert not engine.requests
    assert sample_sum(text, "gateway_bad_requests_total") == 3
    assert samples(text, "scheduler_admission_rejections_total") == []


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": NaN}',
        b'{"messages": [], "n": 123456789012345678901234567890}',
        b'["not", "an", "object"]',
        b"{not json",
        b'{"a": 1, "a": 2}',
    ],
)
def test_the_gateway_reads_a_body_as_the_server_does(raw: bytes) -> None:
    """The gateway parses bodies with orjson (faster) and falls back to the server's reader
    (server/requests.json_object) where orjson refuses: the same object or the same 400 for
    every body, including those only the json module takes (NaN, integers past 64 bits)."""
    from reference_scheduler.gateway.app import _json_body
    from reference_scheduler.server.requests import BadRequest, json_object

    def outcome(read: Any) -> Any:
        try:
            return ("ok", repr(read(raw)))
        except BadRequest as error:
            return ("error", error.status, str(error))

    assert outcome(_json_body) == outcome(json_object)
