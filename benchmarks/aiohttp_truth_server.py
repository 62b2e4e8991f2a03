"""A plain aiohttp streaming server with a per-request truth log — the kind of HTTP front a real
engine has (vLLM's and SGLang's are asyncio servers), not a busy-polling one on a pinned core.

Each POST streams `--tokens` completion chunks on an absolute schedule — the first `--ttft`
after the request was read, then one every `--itl` — and the log records, per X-Request-Id:
when the handler had the request (`t_read_ns`), when the first token's write returned
(`t_first_written_ns`), and how late the server itself was writing it (`lateness_ns`, against
its own schedule). All on perf_counter_ns (CLOCK_MONOTONIC), the generator's clock. The log is
written as CSV on SIGTERM. With `--cert`/`--key` it serves HTTPS.

    python benchmarks/aiohttp_truth_server.py --log truth.csv [--ttft 0.02 --itl 0.005
        --tokens 32] [--cert server.pem --key server.key]

Prints its port on the first line.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
import time

from aiohttp import web

now_ns = time.perf_counter_ns


def chunk(text: str, finish: str | None = None) -> bytes:
    finish_json = "null" if finish is None else f'"{finish}"'
    return (
        'data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"'
        + text
        + '","finish_reason":'
        + finish_json
        + "}]}\n\n"
    ).encode()


USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":16,"completion_tokens":32}}\n\n'


async def serve(args: argparse.Namespace) -> None:
    ttft, itl, tokens = int(args.ttft * 1e9), int(args.itl * 1e9), args.tokens
    token, last = chunk(" tok"), chunk(" tok", "length")
    log: list[tuple[str, int, int, int]] = []

    async def sleep_until(t: int) -> None:
        delay = t - now_ns()
        if delay > 0:
            await asyncio.sleep(delay / 1e9)

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        t_read = now_ns()
        rid = request.headers.get("X-Request-Id", "")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        due = t_read + ttft
        t_first = lateness = 0
        for i in range(tokens):
            await sleep_until(due)
            await response.write(last if i == tokens - 1 else token)
            if i == 0:
                t_first = now_ns()
                lateness = t_first - due
            due += itl
        await response.write(USAGE + b"data: [DONE]\n\n")
        await response.write_eof()
        log.append((rid, t_read, t_first, lateness))
        return response

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tls = None
    if args.cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.cert, args.key)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls, backlog=4096)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)  # type: ignore[union-attr]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    with open(args.log, "w", encoding="utf-8") as handle:
        handle.write("request_id,t_read_ns,t_first_written_ns,lateness_ns\n")
        for row in log:
            handle.write(",".join(map(str, row)) + "\n")
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--ttft", type=float, default=0.02)
    parser.add_argument("--itl", type=float, default=0.005)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    args = parser.parse_args()
    try:
        import uvloop  # what uvicorn (vLLM, SGLang) runs on where it is installed

        uvloop.run(serve(args))
    except ImportError:
        asyncio.run(serve(args))


if __name__ == "__main__":
    main()
