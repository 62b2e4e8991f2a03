"""A streaming server cheap enough never to be the bottleneck, with a server-side truth log.

A raw asyncio protocol (uvloop): it reads a request, then writes pre-encoded SSE chunks on an
absolute schedule — first token `ttft` after the request was read, then one every `itl` — and
logs, per request, when it read the request and when it wrote the first token (perf_counter_ns,
CLOCK_MONOTONIC, the same clock the generator uses). Usage: run as a process; it prints its port
on the first line and writes the truth log (CSV) on SIGTERM.

    python benchmarks/sse_truth_server.py --log truth.csv [--ttft 0.02 --itl 0.005 --tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
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
        server, transport = self.server, self.transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        transport.write(server.head)
        state = {"k": 0, "first": 0, "late": 0}
        base_loop = loop.time()
        base = t_read

        def send() -> None:
            k = state["k"]
            due = base + server.ttft_ns + k * server.itl_ns
            t = now_ns()
            state["late"] = max(state["late"], t - due)
            if k == 0:
                state["first"] = t
            last = k == server.tokens - 1
            transport.write(server.last if last else server.token)
            state["k"] = k + 1
            if last:
                transport.write(server.tail)
                server.log.append((rid, t_read, state["first"], state["late"]))
            else:
                due_next = base + server.ttft_ns + (k + 1) * server.itl_ns
                loop.call_at(base_loop + (due_next - t_read) / 1e9, send)

        loop.call_at(base_loop + server.ttft_ns / 1e9, send)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--ttft", type=float, default=0.02)
    parser.add_argument("--itl", type=float, default=0.005)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    server = Server(args.ttft, args.itl, args.tokens)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: Conn(server), "127.0.0.1", 0, backlog=4096)
    print(srv.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    with open(args.log, "w", encoding="utf-8") as handle:
        handle.write("request_id,t_read_ns,t_first_written_ns,max_lateness_ns\n")
        for row in server.log:
            handle.write(",".join(map(str, row)) + "\n")


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
