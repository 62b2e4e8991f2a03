"""A streaming server cheap enough never to be the bottleneck, with a server-side truth log.

A raw asyncio protocol (uvloop): it reads a request, then writes pre-encoded SSE chunks on an
absolute schedule — first token `ttft` after the request was read, then one every `itl` — and
logs, per request, when it read the request and when it wrote the first token (perf_counter_ns,
CLOCK_MONOTONIC, the same clock the generator uses). Usage: run as a process; it prints its port
on the first line and writes the truth log (CSV) on SIGTERM.

It busy-polls (one core, pin it): an idle process sleeping in epoll takes up to a millisecond to
wake on this kind of VM, and event-loop timers are millisecond-grained, so a sleeping server would
charge its own wake-up to the client and write tokens late. Here due tokens come off a heap
checked on every spin, and reads are picked up within microseconds.

    python benchmarks/sse_truth_server.py --log truth.csv [--ttft 0.02 --itl 0.005 --tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import signal
import time

now_ns = time.perf_counter_ns


def chunk(text: str, finish: str | None = None) -> bytes:
    finish_json = "null" if finish is None else f'"{finish}"'
    body = (
        '{"id":"x","object":"text_completion","choices":[{"index":0,"text":"'
        + text
        + '","finish_reason":'
        + finish_json
        + "}]}"
    )
    data = f"data: {body}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class Server:
    def __init__(self, ttft: float, itl: float, tokens: int) -> None:
        self.ttft_ns, self.itl_ns, self.tokens = int(ttft * 1e9), int(itl * 1e9), tokens
        self.head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        self.token = chunk(" tok")
        self.last = chunk(" tok", "length")
        usage = (
            '{"id":"x","object":"text_completion","choices":[],"usage":{"prompt_tokens":1,'
            f'"completion_tokens":{tokens},"total_tokens":{tokens + 1}}}}}'
        )
        tail = f"data: {usage}\n\n".encode() + b"data: [DONE]\n\n"
        self.tail = f"{len(tail):x}\r\n".encode() + tail + b"\r\n0\r\n\r\n"
        self.log: list[tuple[str, int, int, int]] = []  # id, read, first written, max lateness
        self.heap: list[tuple[int, int, _Stream]] = []


class Conn(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            length, rid = 0, "?"
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.lower() == "content-length":
                    length = int(value)
                elif name.lower() == "x-request-id":
                    rid = value.strip()
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.respond(rid, now_ns())

    def respond(self, rid: str, t_read: int) -> None:
        assert self.transport is not None
        self.transport.write(self.server.head)
        _Stream(self.server, self.transport, rid, t_read).schedule(0)


class _Stream:
    """One response's token schedule."""

    __slots__ = ("first", "k", "late", "rid", "server", "t_read", "transport")

    def __init__(self, server: Server, transport: asyncio.Transport, rid: str, t_read: int) -> None:
        self.server, self.transport, self.rid, self.t_read = server, transport, rid, t_read
        self.k = self.first = self.late = 0

    def due(self, k: int) -> int:
        return self.t_read + self.server.ttft_ns + k * self.server.itl_ns

    def schedule(self, k: int) -> None:
        heapq.heappush(self.server.heap, (self.due(k), id(self), self))

    def send(self, t: int) -> None:
        if self.transport.is_closing():  # the client left (fairbench's pre-run GET /v1/models)
            return
        server, k = self.server, self.k
        self.late = max(self.late, t - self.due(k))
        if k == 0:
            self.first = t
        last = k == server.tokens - 1
        self.transport.write(server.last if last else server.token)
        self.k = k + 1
        if last:
            self.transport.write(server.tail)
            server.log.append((self.rid, self.t_read, self.first, self.late))
        else:
            self.schedule(k + 1)


async def pump(server: Server, stop: asyncio.Event) -> None:
    """Busy-poll: send due tokens, then yield once to let the loop read sockets."""
    heap = server.heap
    while not stop.is_set():
        t = now_ns()
        while heap and heap[0][0] <= t:
            heapq.heappop(heap)[2].send(t)
        await asyncio.sleep(0)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--ttft", type=float, default=0.02)
    parser.add_argument("--itl", type=float, default=0.005)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    server = Server(args.ttft, args.itl, args.tokens)
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 100, 1000)  # this server makes no cycles; keep collections rare
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: Conn(server), "127.0.0.1", 0, backlog=4096)
    print(srv.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await pump(server, stop)
    with open(args.log, "w", encoding="utf-8") as handle:
        handle.write("request_id,t_read_ns,t_first_written_ns,max_lateness_ns\n")
        for row in server.log:
            handle.write(",".join(map(str, row)) + "\n")


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
