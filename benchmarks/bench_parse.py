"""What the transport's response parser costs per streamed response, with no network.

The generator's CPU per request is mostly per-read work: the kernel hands over a token's bytes,
the loop wakes, and the parser frames HTTP chunks, SSE events and each event's JSON. This feeds
one vLLM-shaped completions stream (head, `--tokens` chunked events, a usage event, `[DONE]`)
through `_Conn.received` exactly as reads deliver it, in two shapes:

- `one event per read` — a quiet machine, where every token arrives and is read on its own;
- `N events per read` (`--per-read`, default 3) — a busy one, where reads merge segments.

Printed: CPU µs per response (process time, best of 5 batches, so a neighbour's load moves it
little) for each shape, and the ratio of the merged shape to the one-event baseline. The
network, the event loop's wake-ups and the kernel are not in it: benchmarks/bench_generator.py
measures the whole generator against server truth.

    python benchmarks/bench_parse.py [--tokens 32] [--per-read 3] [--responses 20000]
"""

from __future__ import annotations

import argparse
import time

import orjson
from _common import finish, show

from fairbench.targets.http.client import Outcome, _Conn, _Response


def _chunk(obj: object) -> bytes:
    data = b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"
    return b"%x\r\n" % len(data) + data + b"\r\n"


def stream(tokens: int) -> tuple[bytes, list[bytes]]:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\ndate: x\r\nserver: uvicorn\r\n\r\n"
    )
    events = [
        _chunk(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "text": " tok",
                        "logprobs": None,
                        "finish_reason": None if i < tokens - 1 else "length",
                        "stop_reason": None,
                    }
                ],
                "usage": None,
            }
        )
        for i in range(tokens)
    ]
    events.append(
        _chunk(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1,
                "model": "m",
                "choices": [],
                "usage": {
                    "prompt_tokens": 16,
                    "completion_tokens": tokens,
                    "total_tokens": 16 + tokens,
                },
            }
        )
    )
    events.append(_chunk(b"[DONE]") + b"0\r\n\r\n")
    return head, events


class _Pool:
    def release(self, conn: object) -> None:
        pass

    def forget(self, conn: object) -> None:
        pass


def per_response_us(reads: list[bytes], tokens: int, n: int) -> float:
    def one() -> None:
        conn = _Conn(_Pool())  # type: ignore[arg-type]
        out = Outcome(1)
        conn.response = _Response(out, True)
        t = 1000
        for data in reads:
            t += 5000
            conn.received(data, t, t + 100)
        if out.status != "ok" or out.tokens != tokens:
            raise SystemExit(f"the parser got {out.status} {out.kind} {out.detail}")

    for _ in range(min(n, 2000)):
        one()
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(n):
            one()
        best = min(best, (time.process_time() - start) / n * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--per-read", type=int, default=3)
    parser.add_argument("--responses", type=int, default=20000)
    args = parser.parse_args()
    if args.tokens < 1 or args.per_read < 1 or args.responses < 1:
        parser.error("--tokens, --per-read and --responses take 1 or more")
    head, events = stream(args.tokens)
    single = [head + events[0], *events[1:]]
    k = args.per_read
    merged = [head + events[0]] + [b"".join(events[i : i + k]) for i in range(1, len(events), k)]
    base = per_response_us(single, args.tokens, args.responses)
    batched = per_response_us(merged, args.tokens, args.responses)
    show(
        f"parser CPU per {args.tokens}-token streamed response (no network)",
        ["reads", "per response", "µs / response", "ratio to one event per read"],
        [
            ["one event per read", f"{len(single)} reads", f"{base:.1f}", "1.00x"],
            [
                f"{k} events per read",
                f"{len(merged)} reads",
                f"{batched:.1f}",
                f"{batched / base:.2f}x",
            ],
        ],
    )
    finish()


if __name__ == "__main__":
    main()
