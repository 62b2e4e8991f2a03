"""Admission from the gateway's own count (issue #36 item 4): gateway/capacity.py.

What would break: a burst forwarded whole to an engine because its last scrape said it was idle
(the engine's FCFS queue, not the policy, would order the excess); a capacity from a profile or
an engine's description not read; the scrape's correction not lowering an engine that queues,
lowering it on one passing queue, or never giving the capacity back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from reference_scheduler.core.job import Job
from reference_scheduler.gateway.app import GATEWAY, start_gateway
from reference_scheduler.gateway.capacity import Capacity, learn_description
from reference_scheduler.gateway.config import parse_gateway_config
from reference_scheduler.gateway.dispatcher import Dispatcher
from reference_scheduler.gateway.pool import Pool
from reference_scheduler.scheduler.config import SchedulerConfigError, parse_scheduler_config
from reference_scheduler.server.app import build_app
from reference_scheduler.server.config import parse_server_config
from tests.loopback import serve

REPO = Path(__file__).resolve().parents[1]
VLLM_METRICS = (REPO / "tests/fixtures/engines/vllm_metrics.prom").read_text()
WAITING = 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0'


def _pool(**up: Any) -> Pool:
    cfg = parse_gateway_config({"upstreams": [{"url": "http://127.0.0.1:1", **up}]})
    return Pool(list(cfg.upstreams), cfg.dispatch)


def _scrape(waiting: int) -> str:
    return VLLM_METRICS.replace(WAITING, WAITING.replace("0.0", f"{waiting}.0"))


def _jobs(dispatcher: Dispatcher, n: int, prompt: int = 5, output: int = 5) -> list[Job]:
    jobs = [Job(i, "a", "interactive", prompt, output, 0) for i in range(n)]
    for job in jobs:
        assert dispatcher.submit(job, 0).accepted
    return jobs


# ---------------------------------------------------------------------- the pure parts


def test_a_known_capacity_admits_before_any_scrape_and_stops_at_max_num_seqs() -> None:
    known = _pool(engine="vllm", max_num_seqs=4)
    dispatcher = Dispatcher(parse_scheduler_config({"policy": "fifo"}), known)
    _jobs(dispatcher, 10)
    # never scraped, but the count is in charge: 4 go, 6 wait at the gateway
    assert len(dispatcher.pick(0)) == 4 and dispatcher.waiting() == 6
    assert known.upstreams[0].inflight == 4
    # the old rule, with no capacity known: never scraped is not room
    blind = _pool(engine="vllm")
    dispatcher = Dispatcher(parse_scheduler_config({"policy": "fifo"}), blind)
    _jobs(dispatcher, 10)
    assert dispatcher.pick(0) == []
    blind.read_scrape(blind.upstreams[0], VLLM_METRICS, 0)
    assert len(dispatcher.pick(0)) == 10  # one idle scrape, and the whole burst goes


def test_max_inflight_still_bounds_a_larger_capacity() -> None:
    pool = _pool(engine="none", max_num_seqs=16, max_inflight=3)
    assert pool.upstreams[0].limit == 3


def test_the_kv_budget_counts_prompt_and_reserved_output() -> None:
    pool = _pool(engine="none", kv_cache_tokens=100, max_kv_usage=0.9)  # a budget of 90
    dispatcher = Dispatcher(parse_scheduler_config({"policy": "fifo"}), pool)
    jobs = _jobs(dispatcher, 3, prompt=20, output=20)  # 40 tokens each
    assert [j.id for j, _ in dispatcher.pick(0)] == [0, 1]  # 80 in; 120 would not fit
    dispatcher.finish(jobs[0], 1)
    assert [j.id for j, _ in dispatcher.pick(1)] == [2]
    # a job larger than the whole budget is never stuck: it goes alone
    for job in jobs[1:]:
        dispatcher.finish(job, 2)
    big = Job(9, "a", "interactive", 150, 50, 0)
    small = Job(10, "a", "interactive", 1, 1, 0)
    assert dispatcher.submit(big, 3).accepted and dispatcher.submit(small, 3).accepted
    assert [j.id for j, _ in dispatcher.pick(3)] == [9]  # and nothing joins it
    dispatcher.finish(big, 4)
    assert [j.id for j, _ in dispatcher.pick(4)] == [10]


def test_vllms_kv_size_is_read_from_its_metrics() -> None:
    pool = _pool(engine="vllm")
    up = pool.upstreams[0]
    assert up.capacity.kv_tokens is None
    pool.read_scrape(up, VLLM_METRICS, 0)
    # the fixture: block_size 128 x num_gpu_blocks 4096
    assert up.capacity.kv_tokens == 128 * 4096
    assert up.capacity.kv_from == "/metrics vllm:cache_config_info"
    # the KV size alone is not the engine's sequence limit: staleness still holds it back
    assert not up.capacity.known
    assert up.saturation(10**12, pool.stale_ns) == "stale"
    # the file's number wins over the engine's
    pool = _pool(engine="vllm", kv_cache_tokens=1000)
    pool.read_scrape(pool.upstreams[0], VLLM_METRICS, 0)
    assert pool.upstreams[0].capacity.kv_tokens == 1000


def test_the_scrape_lowers_a_queueing_engine_twice_seen_and_heals() -> None:
    pool = _pool(engine="vllm", max_num_seqs=8)
    up = pool.upstreams[0]
    up.inflight = 8
    pool.read_scrape(up, _scrape(3), 0)
    # one scrape with a queue: saturated now, but not lowered (requests sent just before a
    # scrape wait for the engine's next step)
    assert up.saturation(0, pool.stale_ns) == "waiting" and up.limit == 8
    pool.read_scrape(up, _scrape(3), 1)
    assert up.limit == 5 and up.capacity.lowered == 1  # it ran 8 - 3
    up.inflight = 5
    pool.read_scrape(up, _scrape(0), 2)
    assert up.limit == 7  # half of what was taken comes back per clean scrape
    pool.read_scrape(up, _scrape(0), 3)
    pool.read_scrape(up, _scrape(0), 4)
    assert up.limit == 8
    # a queue that is all someone else's: at least one request still goes
    up.inflight = 0
    pool.read_scrape(up, _scrape(50), 5)
    pool.read_scrape(up, _scrape(50), 6)
    assert up.limit == 1
    # a stale scrape with the capacity known: the count stays in charge, uncorrected
    assert up.saturation(10**12, pool.stale_ns) is None


def test_capacity_from_a_profile(tmp_path: Path) -> None:
    fitted = tmp_path / "gpu0.yaml"
    fitted.write_text(
        yaml.safe_dump({"name": "gpu0", "a": 1.0, "max_num_seqs": 6, "kv_cache_tokens": 4096})
    )
    cap = _pool(engine="none", profile=str(fitted)).upstreams[0].capacity
    assert (cap.seqs, cap.kv_tokens) == (6, 4096) and cap.seqs_from == f"profile {fitted}"
    # the file's own numbers win over the profile's
    cap = _pool(engine="none", profile=str(fitted), max_num_seqs=2).upstreams[0].capacity
    assert (cap.seqs, cap.kv_tokens) == (2, 4096)
    # a shipped profile, by name
    shipped = yaml.safe_load(
        (REPO / "reference_scheduler/profiles/h100-llama3-8b.yaml").read_text()
    )
    cap = _pool(engine="none", profile="h100-llama3-8b").upstreams[0].capacity
    assert cap.seqs == shipped.get("max_num_seqs", 256)


def test_a_bad_profile_is_one_line_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(SchedulerConfigError) as info:
        _pool(profile=str(tmp_path / "nope.yaml"))
    (line,) = info.value.lines
    assert line.startswith("upstreams[0].profile: ") and "\n" not in line
    with pytest.raises(SchedulerConfigError) as info:
        _pool(max_num_seqs=0)
    assert any("max_num_seqs" in p for p in info.value.lines)


def test_sglang_and_tgi_describe_their_capacity() -> None:
    cap = Capacity()
    learn_description(cap, "sglang", {"max_running_requests": 48, "max_total_num_tokens": 9000})
    assert (cap.seqs, cap.kv_tokens) == (48, 9000)
    cap = Capacity()
    learn_description(cap, "tgi", {"max_batch_size": None, "max_batch_total_tokens": 16000})
    assert (cap.seqs, cap.kv_tokens) == (None, 16000)  # the v3 router says no batch size
    cap = Capacity()
    cap.set_seqs(4, "max_num_seqs")
    learn_description(cap, "sglang", {"max_running_requests": 48})
    assert cap.seqs == 4  # the file wins


# ---------------------------------------------------------------------- a burst, end to end

S = 4  # the reference engine's max_num_seqs
N = 12  # the burst


class Counted:
    """The reference server, with what is in flight to it counted at its door, and a vLLM-named
    /metrics: what queues in its engine (in flight beyond its S sequences) as
    vllm:num_requests_waiting, which is what the gateway scrapes."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        profile = {
            "name": "slow",
            "constant_step_ms": 10.0,
            "max_num_seqs": S,
            "kv_cache_tokens": 100_000,
        }
        cfg = parse_server_config(
            {"model": "m", "scheduler": {"policy": "fifo", "profile": profile}}
        )
        self.app = build_app(cfg)
        self.app.middlewares.append(self.count)

    @web.middleware
    async def count(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path == "/metrics":
            waiting = max(0, self.active - S)
            return web.Response(text=f"vllm:num_requests_waiting {waiting}.0\n")
        if request.method != "POST":
            return await handler(request)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            return await handler(request)
        finally:
            self.active -= 1


async def _burst(upstream: dict[str, Any]) -> tuple[Counted, int, list[int], str]:
    """N streamed requests at once through a gateway in front of one Counted server: the
    server, the most the gateway held in its queue, the statuses and the gateway's /metrics
    after."""
    engine = Counted()
    async with serve(engine.app) as up_url:
        data = {
            "model": "m",
            "tenants": [{"id": "t", "api_key": "sk-t"}],
            "scheduler": {"policy": "fifo"},
            "upstreams": [{"url": up_url, "engine": "vllm", **upstream}],
        }
        runner, url = await start_gateway(parse_gateway_config(data), "127.0.0.1", 0)
        gw = runner.app[GATEWAY]
        held = 0
        try:
            up = gw.pool.upstreams[0]
            for _ in range(500):  # the first scrape (at start), so the old rule has room
                if up.scraped_ns is not None:
                    break
                await asyncio.sleep(0.01)
            assert up.scraped_ns is not None
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "one two three"}],
                "max_tokens": 20,  # 20 steps of 10 ms: 0.2 s a request at least
                "stream": True,
            }
            headers = {"Authorization": "Bearer sk-t", "Content-Type": "application/json"}

            async def one(session: aiohttp.ClientSession) -> int:
                async with session.post(
                    url + "/v1/chat/completions", data=json.dumps(body), headers=headers
                ) as r:
                    await r.read()
                    return r.status

            async with aiohttp.ClientSession() as session:
                tasks = [asyncio.create_task(one(session)) for _ in range(N)]
                while not all(t.done() for t in tasks):
                    held = max(held, gw.dispatcher.waiting())
                    await asyncio.sleep(0.002)
                statuses = [t.result() for t in tasks]
                metrics = await (await session.get(url + "/metrics")).text()
        finally:
            await runner.cleanup()
    return engine, held, statuses, metrics


async def test_a_burst_waits_at_the_gateway_not_in_the_engine() -> None:
    engine, held, statuses, metrics = await _burst({"max_num_seqs": S})
    assert statuses == [200] * N
    assert f'gateway_upstream_capacity{{kind="seqs",upstream="u0"}} {S}.0' in metrics
    assert f'gateway_upstream_capacity{{kind="effective_seqs",upstream="u0"}} {S}.0' in metrics
    assert engine.peak <= S, engine.peak  # the engine never had more than it runs
    assert held >= (N - S) // 2, held  # the excess waited at the gateway, in the policy's queue


async def test_the_scrape_alone_forwards_the_whole_burst() -> None:
    """The rule before the count: the last scrape said idle, so every request of the burst went
    to the engine, which queued N - S of them in its own FCFS queue."""
    engine, _, statuses, metrics = await _burst({})
    assert "gateway_upstream_capacity{" not in metrics  # nothing known, nothing shown
    assert statuses == [200] * N
    assert engine.peak == N, engine.peak


async def test_an_sglang_upstream_is_asked_for_its_capacity_once() -> None:
    """engine: sglang: the watcher reads /get_server_info once and the count takes its
    max_running_requests and max_total_num_tokens (the file gave neither)."""
    asked = []

    async def info(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"max_running_requests": 3, "max_total_num_tokens": 5000})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="sglang:num_queue_reqs 0.0\nsglang:token_usage 0.1\n")

    app = web.Application()
    app.router.add_get("/get_server_info", info)
    app.router.add_get("/metrics", metrics)
    async with serve(app) as up_url:
        data = {
            "model": "m",
            "upstreams": [{"url": up_url, "engine": "sglang"}],
            "dispatch": {"scrape_interval_s": 0.05},
        }
        runner, _ = await start_gateway(parse_gateway_config(data), "127.0.0.1", 0)
        try:
            cap = runner.app[GATEWAY].pool.upstreams[0].capacity
            for _ in range(500):
                if cap.known:
                    break
                await asyncio.sleep(0.01)
            for _ in range(10):  # a few more watcher rounds: it does not ask again
                await asyncio.sleep(0.05)
        finally:
            await runner.cleanup()
    assert (cap.seqs, cap.kv_tokens) == (3, 5000)
    assert cap.seqs_from == "/get_server_info max_running_requests"
    assert asked == ["/get_server_info"]
