"""A client that goes away stops costing the reference server capacity, wherever its job is.

The simulator cancels a timed-out request in the engine at its deadline; the live server must do
the same when the client disconnects, including for a job still waiting in the queue (it has
written nothing yet, so only the disconnect itself can tell the server). Otherwise the live
server would admit and prefill work nobody waits for, and sim and live would diverge.
"""

from __future__ import annotations

import asyncio
import json

from reference_scheduler.server.app import build_app
from reference_scheduler.server.config import parse_server_config
from tests.loopback import serve
from tests.promtext import sample_sum

CONFIG = {
    "model": "ref",
    "scheduler": {
        "policy": "fifo",
        "profile": {"constant_step_ms": 20.0, "kv_cache_tokens": 20000, "max_num_seqs": 1},
    },
    "tenants": [{"id": "a", "api_key": "sk-a", "classes": ["interactive"]}],
}


def request_bytes(port: int, max_tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": "ref",
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": max_tokens,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer sk-a\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def gauge(port: int, name: str) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    text = (await reader.read()).decode()
    writer.close()
    return sample_sum(text.split("\r\n\r\n", 1)[1], name)


def test_a_queued_request_whose_client_leaves_is_cancelled_at_once() -> None:
    async def main() -> tuple[float, float, float]:
        async with serve(build_app(parse_server_config(CONFIG)), reference=True) as url:
            return await departure(int(url.rsplit(":", 1)[1]))

    waiting_before, depth, running = asyncio.run(main())
    assert waiting_before == 1
    assert depth == 0, "the queued job of a departed client is still waiting"
    assert running == 1  # A (never disconnected until now) kept its slot


async def departure(port: int) -> tuple[float, float, float]:
    """A holds the server's only slot for 20 s, B queues behind it, then B's client leaves: the
    queue depth before B left, the depth after, and the running count (A's)."""
    _, a = await asyncio.open_connection("127.0.0.1", port)
    a.write(request_bytes(port, 1000))
    _, b = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(500):  # bounded: until A runs and B waits
        if await gauge(port, "scheduler_running") == 1:
            break
        await asyncio.sleep(0.01)
    b.write(request_bytes(port, 5))
    for _ in range(500):
        if await gauge(port, "scheduler_queue_depth") == 1:
            break
        await asyncio.sleep(0.01)
    waiting_before = await gauge(port, "scheduler_queue_depth")
    b.transport.abort()  # B's client gives up while B is queued
    depth = waiting_before
    for _ in range(500):  # A is still running throughout: only B's disconnect can act
        depth = await gauge(port, "scheduler_queue_depth")
        if depth == 0:
            break
        await asyncio.sleep(0.01)
    running = await gauge(port, "scheduler_running")
    a.transport.abort()
    return waiting_before, depth, running
