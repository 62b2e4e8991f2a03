"""The gateway (reference_scheduler/gateway): the policy queue in front of real engines.

Upstreams here are tiny aiohttp engines on 127.0.0.1 (tests/loopback.py) that speak vLLM's chat
SSE and are told how to behave: hold a request at a gate, fail before or after the first byte,
stall, report saturation on /metrics, go down and come back. Every wait is a bounded loop;
nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from fairbench.targets.http.sse import parse_events
from reference_scheduler.core.job import Job
from reference_scheduler.gateway.app import GATEWAY, Gateway, start_gateway
from reference_scheduler.gateway.config import parse_gateway_config
from reference_scheduler.gateway.dispatcher import Dispatcher
from reference_scheduler.gateway.pool import Pool
from reference_scheduler.gateway.relay import Events
from reference_scheduler.scheduler.config import SchedulerConfigError, parse_scheduler_config
from tests.loopback import reference_process, serve

REPO = Path(__file__).resolve().parents[1]
UPSTREAM_KEY = "sk-upstream-SECRET-0123456789"


class Engine:
    """A scripted OpenAI-compatible upstream (chat completions, vLLM's chunk shape)."""

    def __init__(self, tokens: int = 3) -> None:
        self.tokens = tokens
        self.mode = "ok"  # ok | fail500 | drop | die_after_first | stall | overloaded | echo_key
        self.gate: asyncio.Event | None = None  # set: answer; unset: hold every request
        self.after_first: asyncio.Event | None = None  # hold after the first token
        self.requests: list[dict[str, Any]] = []
        self.active = 0
        self.peak = 0
        self.finished = 0
        self.aborted = 0
        self.alive = True
        self.metrics_text = ""
        self.metrics_status = 200

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.alive else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(status=self.metrics_status, text=self.metrics_text)

    @staticmethod
    def chunk(content: str | None = None, role: bool = False) -> bytes:
        delta = {"role": "assistant", "content": ""} if role else {"content": content}
        obj = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "up",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"body": body, "headers": dict(request.headers)})
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            return await self._answer(request, body)
        finally:
            self.active -= 1

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if self.gate is not None:
            await self.gate.wait()
        if self.mode == "fail500" or not self.alive:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if self.mode == "overloaded":
            return web.json_response({"error": {"message": "full"}}, status=503)
        if self.mode == "echo_key":
            auth = request.headers.get("Authorization", "")
            return web.json_response({"message": f"bad request from {auth}"}, status=400)
        if self.mode == "drop":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if not body.get("stream"):
            self.finished += 1
            return web.json_response(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "x y z"}}],
                    "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(self.chunk(role=True) + self.chunk(" t0"))
        if self.mode == "die_after_first":
            assert request.transport is not None
            request.transport.abort()
            return response
        if self.mode == "stall":  # keep writing comments until the gateway goes away
            try:
                for _ in range(500):
                    await asyncio.sleep(0.01)
                    await response.write(b": keep-alive\n\n")
            except ConnectionResetError:
                self.aborted += 1
            return response
        if self.after_first is not None:
            await self.after_first.wait()
        for i in range(1, self.tokens):
            await response.write(self.chunk(f" t{i}"))
        usage = body.get("stream_options", {}).get("include_usage")
        if usage:
            tail = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": {"prompt_tokens": 4, "completion_tokens": self.tokens, "total_tokens": 9},
            }
            await response.write(b"data: " + orjson.dumps(tail) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        self.finished += 1
        return response


def config(upstreams: list[str], **extra: Any) -> dict[str, Any]:
    ups = []
    for i, url in enumerate(upstreams):
        up: dict[str, Any] = {"url": url, "engine": "none", "max_inflight": 4}
        if i < len(extra.get("up", [])):
            up.update(extra["up"][i])
        ups.append(up)
    return {
        "model": "m",
        "tenants": extra.get(
            "tenants",
            [
                {"id": "flood", "api_key": "sk-flood"},
                {"id": "polite", "api_key": "sk-polite", "classes": ["interactive", "batch"]},
            ],
        ),
        "scheduler": {"policy": extra.get("policy", "fifo")},
        "upstreams": ups,
        "dispatch": {"probe_interval_s": 0.05, "scrape_interval_s": 0.05, **extra.get("d", {})},
    }


@asynccontextmanager
async def gateway(data: dict[str, Any]) -> AsyncIterator[tuple[Gateway, str]]:
    runner, url = await start_gateway(parse_gateway_config(data), "127.0.0.1", 0)
    try:
        yield runner.app[GATEWAY], url
    finally:
        await runner.cleanup()


@asynccontextmanager
async def engines(*engines: Engine) -> AsyncIterator[list[str]]:
    urls: list[str] = []
    managers = [serve(e.app()) for e in engines]
    try:
        for m in managers:
            urls.append(await m.__aenter__())
        yield urls
    finally:
        for m in reversed(managers[: len(urls)]):
            await m.__aexit__(None, None, None)


@asynccontextmanager
async def rig(
    upstreams: list[Engine], **cfg: Any
) -> AsyncIterator[tuple[Gateway, str, aiohttp.ClientSession]]:
    """Upstreams, a gateway in front of them (config(...) options) and a client session."""
    async with engines(*upstreams) as urls:
        data = config(urls, **cfg)
        async with gateway(data) as (gw, url), aiohttp.ClientSession() as session:
            yield gw, url, session


async def until(cond: Callable[[], bool], what: str, tries: int = 500) -> None:
    """Wait for a condition, a bounded number of short sleeps (no duration is asserted)."""
    for _ in range(tries):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def chat(text: str = "hello there", stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 3,
        "stream": stream,
        **extra,
    }


def auth(key: str = "sk-flood") -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def post(
    session: aiohttp.ClientSession, url: str, body: Any, key: str = "sk-flood", **kw: Any
) -> tuple[int, bytes, dict[str, str]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**auth(key), "Content-Type": "application/json", **kw.pop("headers", {})}
    async with session.post(url + "/v1/chat/completions", data=data, headers=headers) as r:
        return r.status, await r.read(), dict(r.headers)


def contents(raw: bytes) -> list[str]:
    out = []
    for event in parse_events(raw):
        if event.startswith(b"{"):
            obj = json.loads(event)
            for choice in obj.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    out.append(choice["delta"]["content"])
    return out


# ---------------------------------------------------------------------- the pure parts


def _jobs(dispatcher: Dispatcher, n: int, tenant: str = "a", cost: int = 10) -> list[Job]:
    jobs = [Job(i, tenant, "interactive", cost - 5, 5, 0) for i in range(n)]
    for job in jobs:
        assert dispatcher.submit(job, 0).accepted
    return jobs


def _pool(*ups: dict[str, Any], **dispatch: Any) -> Pool:
    cfg = parse_gateway_config(
        {
            "upstreams": [{"url": "http://127.0.0.1:1", "engine": "none", **u} for u in ups],
            "dispatch": dispatch,
        }
    )
    return Pool(list(cfg.upstreams), cfg.dispatch)


def test_least_loaded_with_room_ties_to_the_lowest_index() -> None:
    pool = _pool({"max_inflight": 2}, {"max_inflight": 4}, {"max_inflight": 4})
    dispatcher = Dispatcher(parse_scheduler_config({"policy": "fifo"}), pool)
    _jobs(dispatcher, 10)
    placed = [up.index for _, up in dispatcher.pick(0)]
    # loads 0,0,0 -> u0; then u1 (0 < 0.5), u2, then u1 (.25 < .5 = u0), ...
    assert placed == [0, 1, 2, 1, 2, 0, 1, 2, 1, 2]
    assert [u.inflight for u in pool.upstreams] == [2, 4, 4]
    assert dispatcher.waiting() == 0 and dispatcher.pick(0) == []


def test_token_budget_holds_the_policy_order() -> None:
    pool = _pool({"max_inflight": 10, "max_inflight_tokens": 25})
    dispatcher = Dispatcher(parse_scheduler_config({"policy": "fifo"}), pool)
    big = Job(0, "a", "interactive", 15, 5, 0)  # 20 tokens
    small = Job(1, "a", "interactive", 1, 1, 0)
    first = Job(2, "a", "interactive", 5, 5, 0)  # 10 tokens
    for job in (first, big, small):
        dispatcher.submit(job, 0)
    assert [j.id for j, _ in dispatcher.pick(0)] == [2]  # 10 in; big (20) does not fit
    assert dispatcher.pick(0) == []  # and small does not overtake it
    dispatcher.finish(first, 1)
    assert [j.id for j, _ in dispatcher.pick(1)] == [0, 1]  # 20 + 2 fit in 25
    too_big = Job(3, "a", "interactive", 20, 10, 0)
    verdict = dispatcher.submit(too_big, 2)
    assert not verdict.accepted and verdict.code == 400  # could never fit anywhere


def test_saturation_from_scrapes_and_staleness() -> None:
    pool = _pool({"engine": "vllm", "max_waiting": 2}, stale_after_s=1.0)
    up = pool.upstreams[0]
    assert up.saturation(0, pool.stale_ns) == "stale"  # never scraped: not knowing is not room
    text = (REPO / "tests/fixtures/engines/vllm_metrics.prom").read_text()
    pool.read_scrape(up, text, 0)
    assert up.saturation(0, pool.stale_ns) is None  # the fixture's engine is idle
    busy = text.replace(
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0',
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0',
    )
    pool.read_scrape(up, busy, 0)
    assert up.waiting == 3.0 and up.saturation(0, pool.stale_ns) == "waiting"
    full = text.replace(
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.97',
    )
    pool.read_scrape(up, full, 0)
    assert up.saturation(0, pool.stale_ns) == "kv"
    pool.read_scrape(up, text, 0)
    assert up.saturation(999_999_999, pool.stale_ns) is None
    assert up.saturation(1_000_000_001, pool.stale_ns) == "stale"
    assert pool.choose(1, 1_000_000_001) is None


def test_retry_once_elsewhere_and_finish_is_idempotent() -> None:
    pool = _pool({"max_inflight": 1}, {"max_inflight": 1})
    dispatcher = Dispatcher(parse_scheduler_config({"policy": "vtc"}), pool)
    (job,) = _jobs(dispatcher, 1)
    [(_, up)] = dispatcher.pick(0)
    assert up.index == 0
    assert dispatcher.requeue(job, 1)
    assert pool.upstreams[0].inflight == 0 and job.status == "retry"
    [(again, up)] = dispatcher.pick(1)
    assert again is job and up.index == 1  # never the upstream it failed on
    assert not dispatcher.requeue(job, 2)  # once only
    assert dispatcher.finish(job, 3) and not dispatcher.finish(job, 4)
    assert [u.inflight for u in pool.upstreams] == [0, 0]
    assert dispatcher.policy.stats()["counter:a"] == 5  # the prefill, charged once


def test_config_errors_are_one_line_each() -> None:
    with pytest.raises(SchedulerConfigError) as err:
        parse_gateway_config({"upstreams": []})
    assert len(err.value.lines) == 1 and err.value.lines[0].startswith("upstreams")
    with pytest.raises(SchedulerConfigError) as err:
        parse_gateway_config({"upstreams": [{"url": "http://u:p@h:1"}]})
    assert err.value.lines[0].startswith("upstreams[0].url")
    with pytest.raises(SchedulerConfigError) as err:
        parse_gateway_config(
            {
                "upstreams": [{"url": "http://h:1"}],
                "scheduler": {"preemption": {"mode": "swap"}},
            }
        )
    assert err.value.lines[0].startswith("scheduler.preemption.mode")


def test_cli_bad_config_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "g.yaml"
    bad.write_text("upstreams:\n  - url: ftp://x\n")
    done = subprocess.run(
        [sys.executable, "-m", "reference_scheduler", "gateway", str(bad)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "upstreams[0].url" in lines[0] and "Traceback" not in done.stderr


def test_events_forward_whole_events_and_drop_unasked_usage() -> None:
    events = Events(keep_usage=False)
    a = Engine.chunk(" hi")
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
    assert events.feed(a[:10]) == b""  # half an event is held
    assert events.feed(a[10:] + usage[:5]) == a and events.tokens == 1
    assert events.feed(usage[5:] + b"data: [DONE]\n\n") == b"data: [DONE]\n\n"
    assert events.usage == {"prompt_tokens": 1, "completion_tokens": 1} and events.done


# ---------------------------------------------------------------------- over loopback


async def test_relay_streams_token_by_token_and_keeps_usage() -> None:
    engine = Engine(tokens=4)
    engine.after_first = asyncio.Event()
    async with rig([engine]) as (_gw, url, session):
        body = chat(stream_options={"include_usage": True})
        async with session.post(url + "/v1/chat/completions", json=body, headers=auth()) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/event-stream")
            seen = b""
            while b" t0" not in seen:
                chunk = await r.content.readany()
                assert chunk, "the stream ended before its first token"
                seen += chunk
            assert engine.finished == 0  # the first token arrived while the upstream works
            engine.after_first.set()
            seen += await r.content.read()
    assert contents(seen) == [" t0", " t1", " t2", " t3"]
    usage = [json.loads(e) for e in parse_events(seen) if b'"usage"' in e]
    assert usage[-1]["usage"]["completion_tokens"] == 4
    assert seen.rstrip().endswith(b"data: [DONE]")


async def test_usage_is_asked_for_but_not_forwarded_unless_the_client_asked() -> None:
    engine = Engine()
    async with rig([engine], policy="vtc") as (gw, url, session):
        status, raw, _ = await post(session, url, chat())
    assert status == 200 and b'"usage"' not in raw and contents(raw) == [" t0", " t1", " t2"]
    assert engine.requests[0]["body"]["stream_options"] == {"include_usage": True}
    # VTC was charged what the upstream reported: prompt 4 (> the estimate 2) + 2 x 3 output
    assert gw.dispatcher.policy.stats()["counter:flood"] == 4 + 2 * 3


@pytest.mark.parametrize(("policy", "polite_first"), [("fifo", False), ("vtc", True)])
async def test_vtc_dispatches_the_polite_tenant_first(policy: str, polite_first: bool) -> None:
    engine = Engine(tokens=2)
    async with rig([engine], policy=policy, up=[{"max_inflight": 1}]) as (gw, url, session):
        # polite was served before (so VTC knows it), then flood fills the queue
        assert (await post(session, url, chat("p0"), key="sk-polite"))[0] == 200
        engine.gate = asyncio.Event()
        tasks = [asyncio.create_task(post(session, url, chat("f0")))]
        await until(lambda: len(engine.requests) == 2, "f0 reached the upstream")
        for i in range(1, 5):
            tasks.append(asyncio.create_task(post(session, url, chat(f"f{i}"))))
            await until(lambda i=i: gw.dispatcher.waiting() == i, f"f{i} queued")
        for i in (1, 2):
            tasks.append(asyncio.create_task(post(session, url, chat(f"p{i}"), key="sk-polite")))
            await until(lambda i=i: gw.dispatcher.waiting() == 4 + i, f"p{i} queued")
        engine.gate.set()
        results = await asyncio.gather(*tasks)
    assert all(status == 200 for status, _, _ in results)
    order = [r["body"]["messages"][0]["content"] for r in engine.requests]
    assert order[:2] == ["p0", "f0"]
    if polite_first:
        assert order[2] == "p1"  # lifted to flood's counter, ahead on the tie; then they alternate
        assert order.index("p2") < order.index("f3")
    else:
        assert order[2:] == ["f1", "f2", "f3", "f4", "p1", "p2"]
    assert engine.peak == 1


async def test_inflight_budget_is_never_exceeded() -> None:
    a, b = Engine(), Engine()
    a.gate, b.gate = asyncio.Event(), asyncio.Event()
    limits = [{"max_inflight": 2}, {"max_inflight": 3}]
    async with rig([a, b], up=limits) as (gw, url, session):
        tasks = [asyncio.create_task(post(session, url, chat(f"r{i}"))) for i in range(12)]
        await until(lambda: len(a.requests) + len(b.requests) == 5, "both upstreams full")
        assert gw.dispatcher.waiting() == 7  # the rest wait at the gateway, not upstream
        a.gate.set()
        b.gate.set()
        results = await asyncio.gather(*tasks)
        metrics = await (await session.get(url + "/metrics")).text()
    assert [s for s, _, _ in results] == [200] * 12
    assert a.peak <= 2 and b.peak <= 3 and len(a.requests) + len(b.requests) == 12
    assert 'gateway_inflight{upstream="u0"} 0.0' in metrics
    assert (
        'scheduler_requests_total{outcome="finished",slo_class="interactive",tenant="flood"} 12.0'
        in metrics
    )


async def test_failure_before_the_first_byte_is_retried_once_elsewhere() -> None:
    bad, good = Engine(), Engine()
    for mode in ("fail500", "drop"):
        bad.mode = mode
        bad.requests.clear()
        good.requests.clear()
        async with rig([bad, good], d={"fail_after": 5}) as (_gw, url, session):
            status, raw, _ = await post(session, url, chat())
            metrics = await (await session.get(url + "/metrics")).text()
        assert status == 200 and contents(raw) == [" t0", " t1", " t2"], mode
        assert len(bad.requests) == 1 and len(good.requests) == 1, mode
        assert 'gateway_retries_total{upstream="u0"} 1.0' in metrics


async def test_two_failures_before_the_first_byte_are_one_error() -> None:
    a, b = Engine(), Engine()
    a.mode = b.mode = "fail500"
    async with rig([a, b]) as (gw, url, session):
        status, raw, _ = await post(session, url, chat())
    assert status == 502 and json.loads(raw)["error"]["code"] == "upstream_error"
    assert len(a.requests) == 1 and len(b.requests) == 1  # retried once, not more
    assert [u.inflight for u in gw.pool.upstreams] == [0, 0]


async def test_failure_after_the_first_byte_is_an_error_to_the_client() -> None:
    bad, other = Engine(), Engine()
    bad.mode = "die_after_first"
    async with rig([bad, other]) as (gw, url, session):
        status, raw, _ = await post(session, url, chat())
        metrics = await (await session.get(url + "/metrics")).text()
    assert status == 200 and contents(raw) == [" t0"]
    assert json.loads(parse_events(raw)[-1])["error"]["type"] == "server_error"
    assert b"[DONE]" not in raw
    assert other.requests == []  # the client saw bytes: never sent again
    assert 'gateway_upstream_errors_total{kind="mid_stream",upstream="u0"} 1.0' in metrics
    assert gw.pool.upstreams[0].inflight == 0


async def test_client_disconnect_aborts_the_upstream_request() -> None:
    engine = Engine()
    engine.mode = "stall"
    async with rig([engine]) as (gw, url, session):
        r = await session.post(url + "/v1/chat/completions", json=chat(), headers=auth())
        seen = b""
        while b" t0" not in seen:
            seen += await r.content.readany()
        r.close()  # the client goes away mid-stream
        await until(lambda: engine.aborted == 1, "the upstream saw its request closed")
        await until(lambda: gw.pool.upstreams[0].inflight == 0, "the slot is released")
        metrics = await (await session.get(url + "/metrics")).text()
    assert 'gateway_upstream_aborts_total{upstream="u0"} 1.0' in metrics
    assert "scheduler_cancelled_total 1.0" in metrics


async def test_client_gone_while_queued_never_reaches_an_upstream() -> None:
    engine = Engine()
    engine.gate = asyncio.Event()
    async with rig([engine], up=[{"max_inflight": 1}]) as (gw, url, session):
        first = asyncio.create_task(post(session, url, chat("first")))
        await until(lambda: len(engine.requests) == 1, "first dispatched")
        queued = asyncio.create_task(post(session, url, chat("queued")))
        await until(lambda: gw.dispatcher.waiting() == 1, "second queued")
        queued.cancel()
        await until(lambda: gw.dispatcher.waiting() == 0, "queue emptied")
        engine.gate.set()
        assert (await first)[0] == 200
    assert [r["body"]["messages"][0]["content"] for r in engine.requests] == ["first"]


async def test_unhealthy_upstream_is_skipped_and_probed_back() -> None:
    down, up = Engine(), Engine()
    down.alive = False
    async with rig([down, up], d={"fail_after": 1}) as (gw, url, session):
        assert (await post(session, url, chat()))[0] == 200  # failed on u0, retried on u1
        assert not gw.pool.upstreams[0].healthy
        for _ in range(3):  # the tie would pick u0: unhealthy, it is skipped
            assert (await post(session, url, chat()))[0] == 200
        assert len(down.requests) == 1 and len(up.requests) == 4
        down.alive = True
        await until(lambda: gw.pool.upstreams[0].healthy, "the probe brought u0 back")
        assert (await post(session, url, chat()))[0] == 200
        health = await session.get(url + "/health")
    assert len(down.requests) == 2 and down.finished == 1
    assert health.status == 200


async def test_saturated_upstream_gets_nothing_until_its_metrics_clear() -> None:
    vllm, spare = Engine(), Engine()
    fixture = (REPO / "tests/fixtures/engines/vllm_metrics.prom").read_text()
    vllm.metrics_text = fixture.replace(
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0',
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 7.0',
    )
    async with rig([vllm, spare], up=[{"engine": "vllm"}]) as (gw, url, session):
        await until(lambda: gw.pool.upstreams[0].scraped_ns is not None, "first scrape")
        for _ in range(3):
            assert (await post(session, url, chat()))[0] == 200
        assert vllm.requests == [] and len(spare.requests) == 3
        metrics = await (await session.get(url + "/metrics")).text()
        assert 'gateway_upstream_saturated{reason="waiting",upstream="u0"} 1.0' in metrics
        vllm.metrics_text = fixture
        await until(lambda: gw.pool.upstreams[0].waiting == 0, "the queue cleared")
        assert (await post(session, url, chat()))[0] == 200
    assert len(vllm.requests) == 1  # ties go to the lowest index again


async def test_malformed_requests_never_reach_an_upstream() -> None:
    engine = Engine()
    async with rig([engine]) as (_gw, url, session):
        cases: list[tuple[Any, str, dict[str, str], int, str | None]] = [
            (b"{not json", "sk-flood", {}, 400, None),
            ({"model": "m", "messages": []}, "sk-flood", {}, 400, "messages"),
            (chat(max_tokens=-1), "sk-flood", {}, 400, "max_tokens"),
            (chat(model="other"), "sk-flood", {}, 400, "model"),
            (chat(stream="yes"), "sk-flood", {}, 400, "stream"),
            (chat(), "sk-nobody", {}, 401, None),
            (chat(), "sk-flood", {"X-SLO-Class": "batch"}, 403, "X-SLO-Class"),
        ]
        for body, key, headers, want, param in cases:
            status, raw, _ = await post(session, url, body, key=key, headers=headers)
            error = json.loads(raw)["error"]
            assert status == want and error["param"] == param, (body, raw)
            assert {"message", "type", "param", "code"} <= set(error)
    assert engine.requests == []


async def test_keys_never_cross_the_gateway(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    engine = Engine()
    async with engines(engine) as urls:
        data = config(urls, up=[{"api_key": UPSTREAM_KEY, "priority_field": True}])
        async with gateway(data) as (_gw, url), aiohttp.ClientSession() as session:
            batch = {"X-SLO-Class": "batch"}
            seen = [await post(session, url, chat(priority=-100), "sk-polite", headers=batch)]
            seen.append(await post(session, url, chat(stream=False)))
            engine.mode = "echo_key"  # an upstream 4xx that quotes our key back
            seen.append(await post(session, url, chat()))
            metrics = await (await session.get(url + "/metrics")).text()
            health = await (await session.get(url + "/health")).text()
    assert engine.requests[0]["headers"]["Authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert engine.requests[0]["body"]["priority"] == 1  # batch's rank, not the client's -100
    for request in engine.requests:
        assert "sk-polite" not in json.dumps(request) and "sk-flood" not in json.dumps(request)
    status, raw, _ = seen[2]
    assert status == 400 and b"***" in raw
    visible = "".join(f"{s}{r!r}{h}" for s, r, h in seen) + metrics + health + caplog.text
    assert UPSTREAM_KEY not in visible
    assert UPSTREAM_KEY not in repr(parse_gateway_config(data).upstreams)


async def test_whole_responses_pass_through() -> None:
    engine = Engine()
    async with rig([engine]) as (_gw, url, session):
        status, raw, headers = await post(session, url, chat(stream=False))
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert json.loads(raw)["usage"]["completion_tokens"] == 3
    assert "stream_options" not in engine.requests[0]["body"]


def test_shipped_gateway_configs_match_the_ab_scenario() -> None:
    """scenarios/gateway/*.yaml parse, differ only in the policy, and give the A/B scenario's
    tenants the keys it sends (docs/gateway.md runs them together)."""
    import yaml

    from fairbench.workload.scenario import load_scenario
    from reference_scheduler.gateway.config import load_gateway_config

    fifo = load_gateway_config(REPO / "scenarios/gateway/pool-fifo.yaml")
    vtc = load_gateway_config(REPO / "scenarios/gateway/pool-vtc.yaml")
    assert fifo.server.scheduler.spec.policy == "fifo" and vtc.server.scheduler.spec.policy == "vtc"
    a, b = (
        yaml.safe_load((REPO / f"scenarios/gateway/pool-{p}.yaml").read_text())
        for p in ("fifo", "vtc")
    )
    del a["scheduler"]["policy"], b["scheduler"]["policy"]
    assert a == b
    scn = load_scenario(REPO / "scenarios/gateway-ab.yaml")
    keys = {t.api_key: t.id for t in fifo.server.spec.tenants}
    assert {t.api_key: t.id for t in scn.tenants} == keys
    assert scn.target.base_url == f"http://127.0.0.1:{fifo.server.spec.port}"


def test_the_gateway_command_serves(tmp_path: Path) -> None:
    """`python -m reference_scheduler gateway CONFIG --port 0` prints its URL first and serves
    /health and /metrics (no upstream needs to answer for that)."""
    import urllib.request

    path = tmp_path / "g.yaml"
    path.write_text(
        json.dumps({"model": "m", "upstreams": [{"url": "http://127.0.0.1:9", "engine": "none"}]})
    )
    with reference_process("gateway", path) as url:
        with urllib.request.urlopen(url + "/health", timeout=30) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
            assert b'gateway_upstream_healthy{upstream="u0"} 1.0' in resp.read()


async def test_an_upstream_whose_metrics_fail_counts_as_saturated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="reference_scheduler.gateway")
    broken, spare = Engine(), Engine()
    broken.metrics_status = 500
    async with rig([broken, spare], up=[{"engine": "vllm"}]) as (gw, url, session):
        await until(lambda: "scrape failed (HTTP 500)" in caplog.text, "the failure is logged")
        for _ in range(2):
            assert (await post(session, url, chat()))[0] == 200
    assert broken.requests == [] and len(spare.requests) == 2
    assert gw.pool.upstreams[0].saturation(gw.now(), gw.pool.stale_ns) == "stale"
    assert caplog.text.count("scrape failed") == 1  # once per failing spell, not per scrape


async def test_tiers_order_dispatch_and_set_the_engines_priority() -> None:
    """Under the `priority` policy an interactive request queued after batch ones leaves first,
    and each request carries its tier's rank as the engine's `priority`."""
    engine = Engine(tokens=1)
    engine.gate = asyncio.Event()
    batch = {"X-SLO-Class": "batch"}
    ups = [{"max_inflight": 1, "priority_field": True}]
    async with rig([engine], policy="priority", up=ups) as (gw, url, session):
        tasks = [asyncio.create_task(post(session, url, chat("b0"), "sk-polite", headers=batch))]
        await until(lambda: len(engine.requests) == 1, "b0 dispatched")
        for i, (text, key, headers) in enumerate(
            [("b1", "sk-polite", batch), ("b2", "sk-polite", batch), ("i1", "sk-flood", {})]
        ):
            tasks.append(asyncio.create_task(post(session, url, chat(text), key, headers=headers)))
            await until(lambda i=i: gw.dispatcher.waiting() == i + 1, f"{text} queued")
        engine.gate.set()
        assert [s for s, _, _ in await asyncio.gather(*tasks)] == [200] * 4
    sent = [(r["body"]["messages"][0]["content"], r["body"]["priority"]) for r in engine.requests]
    assert sent == [("b0", 1), ("i1", 0), ("b1", 1), ("b2", 1)]
