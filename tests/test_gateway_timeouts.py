"""Issue 36 item 3: timeouts that mean what they say.

`first_byte_timeout_s` bounds send -> first byte of a stream and `idle_timeout_s` only the gaps
after it (the socket read timeout no longer cuts a long prefill or a slow non-streaming answer);
`total_timeout_s` bounds a non-streaming answer. A timeout once an upstream has the request is a
504, not retried elsewhere (the work may be under way) and not held against the upstream's
health. With no healthy upstream a request waits at most `queue_timeout_s`, then 503 with
Retry-After. Durations here are the configuration's, never asserted on the wall clock.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from tests.test_gateway import Engine, chat, post, rig


class Slow(Engine):
    """The scripted engine, answering after `delay` seconds (headers included)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        await asyncio.sleep(self.delay)
        return await super()._answer(request, body)


async def test_a_slow_answer_within_its_bounds_is_served() -> None:
    # Both answers take longer than idle_timeout_s: only the first byte's and the total's
    # bounds apply before the first byte.
    engine = Slow(0.4)
    d = {"idle_timeout_s": 0.1, "first_byte_timeout_s": 30, "total_timeout_s": 30}
    async with rig([engine], d=d) as (_gw, url, session):
        whole = await post(session, url, chat(stream=False))
        streamed = await post(session, url, chat(stream=True))
    assert whole[0] == 200 and streamed[0] == 200
    assert b"[DONE]" in streamed[1]
    assert engine.finished == 2


async def test_past_the_bound_is_504_not_retried_and_the_upstream_stays_healthy() -> None:
    slow, spare = Slow(2.0), Engine()
    d = {"first_byte_timeout_s": 0.2, "total_timeout_s": 0.2, "fail_after": 1}
    async with rig([slow, spare], d=d) as (gw, url, session):
        answers = [
            await post(session, url, chat(stream=False)),
            await post(session, url, chat(stream=True)),
        ]
        ups = gw.pool.upstreams
        healthy = [up.healthy for up in ups]
    for status, raw, _ in answers:
        assert status == 504, raw
        assert json.loads(raw)["error"]["code"] == "upstream_timeout"
    assert healthy == [True, True]  # slow is not broken
    # both went to the slow one first (the least loaded, lowest index) and neither was retried
    assert len(slow.requests) == 2 and not spare.requests


async def test_a_stall_between_chunks_is_the_idle_timeout() -> None:
    engine = Engine()
    engine.after_first = asyncio.Event()  # the first token, then nothing
    d = {"idle_timeout_s": 0.2, "fail_after": 1}
    async with rig([engine], d=d) as (gw, url, session):
        status, raw, _ = await post(session, url, chat(stream=True))
        healthy = gw.pool.upstreams[0].healthy
        engine.after_first.set()
    assert status == 200  # the stream had started
    assert b"idle_timeout" in raw
    assert healthy


class Paced(Engine):
    """The scripted engine, streaming each token `gap` seconds after the one before."""

    def __init__(self, tokens: int, gap: float) -> None:
        super().__init__(tokens)
        self.gap = gap

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(self.tokens):
            if i:
                await asyncio.sleep(self.gap)
            await response.write(self.chunk(f" t{i}"))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        self.finished += 1
        return response


async def test_idle_bounds_each_gap_not_the_stream() -> None:
    """A stream of gaps each under `idle_timeout_s`, whose whole runs past it several times, is
    served to its end: the one timer a stream keeps (forward._Idle) re-arms for the wait in
    progress rather than cutting the stream at the limit after its first wait."""
    engine = Paced(tokens=8, gap=0.06)
    d = {"idle_timeout_s": 0.15, "fail_after": 1}
    async with rig([engine], d=d) as (gw, url, session):
        status, raw, _ = await post(session, url, chat(stream=True))
        healthy = gw.pool.upstreams[0].healthy
    assert status == 200 and b"idle_timeout" not in raw, raw
    assert raw.count(b'"content"') == 8 and raw.endswith(b"data: [DONE]\n\n"), raw
    assert healthy and engine.finished == 1


async def test_no_healthy_upstream_is_503_after_queue_timeout() -> None:
    engine = Engine()
    engine.alive = False  # its /health says 503, so the probe never brings it back
    async with rig([engine], d={"queue_timeout_s": 0.2}) as (gw, url, session):
        gw.pool.upstreams[0].healthy = False
        status, raw, headers = await post(session, url, chat())
        waiting = gw.dispatcher.waiting()
    assert status == 503, raw
    assert json.loads(raw)["error"]["code"] == "no_healthy_upstream"
    assert headers["Retry-After"] == "1"
    assert waiting == 0  # it left the queue
    assert not engine.requests
