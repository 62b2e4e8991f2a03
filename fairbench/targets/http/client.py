"""A lean HTTP/1.1 client for open-loop load: asyncio protocols, keep-alive pool, chunked SSE.

Why not aiohttp on the hot path: a streamed response costs aiohttp one coroutine switch per
chunk plus its stream-reader machinery (~50–100 µs), and the time a token is stamped is the time
the consuming coroutine happens to run, not when the bytes arrived. Here the response is parsed
as it is read — status line, headers, chunked or length framing, SSE events, the JSON of each
event — and times are the kernel's receive stamps of the bytes (fairbench.targets.http.stamped),
so a busy event loop does not delay them; the user-space time of each read is kept as the
generator's receive delay. The send is stamped when the request's last byte reached the kernel.
The waiting coroutine wakes once, when the response is complete. That is what keeps a 2-core
machine at 1,000+ streamed requests/s with sub-millisecond client-added latency (see
benchmarks/bench_generator.py).

Supports http and https (verification on; `ca_bundle` for a private CA), Content-Length,
chunked and close-delimited bodies, keep-alive reuse,
and bounded buffers (an error body keeps at most 2 KiB; a whole JSON body at most 16 MiB).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from fairbench.targets.http.sse import SSEParser
from fairbench.targets.http.stamped import StampedTransport, open_stamped
from fairbench.targets.http.wire import GATEWAY_TIMING_HEADER, OPENAI, Dialect

now_ns = time.perf_counter_ns
_MAX_BODY = 16 << 20
_MAX_ERROR_BODY = 2048
_MAX_HEAD = 64 << 10
_MAX_SIZE_LINE = 1024  # a chunk size line with extensions; longer is a broken stream
_HEX = b"0123456789abcdefABCDEF"


class Outcome:
    """Everything one response told us, with transport-level timestamps (perf_counter_ns).

    `t_sent`: when the generator sent the request (on an open connection, or began opening one);
    `t_written`: when its last byte reached the kernel (after any connect and TLS handshake).
    Send lag is the generator's own lateness, so it is measured at `t_sent`. Receive times are
    the kernel's stamps; `rx_delay` is how long the bytes that gave the first token (or, without
    tokens, the response's end) waited in the socket before the event loop read them,
    `rx_delay_max` the longest such wait of any read of the response. `rx_error` bounds how far
    that lateness moved the first-token stamp: 0 when the token's bytes were the newest of their
    read (the kernel stamped them, however late the read), else the span in which they may have
    arrived (since the previous read) — see fairbench.targets.http.stamped on merged segments."""

    __slots__ = (
        "body",
        "chunks",
        "detail",
        "extra",
        "http_status",
        "itl_max",
        "kind",
        "retry_after",
        "rx_delay",
        "rx_delay_max",
        "rx_error",
        "status",
        "t_done",
        "t_first_byte",
        "t_first_token",
        "t_last_token",
        "t_sent",
        "t_written",
        "terminal",
        "tokens",
        "usage_completion",
        "usage_prompt",
    )

    def __init__(self, t_sent: int) -> None:
        self.t_sent = t_sent
        self.t_written = 0
        self.t_first_byte = self.t_first_token = self.t_last_token = self.t_done = 0
        self.rx_delay: int | None = None
        self.rx_delay_max = 0
        self.rx_error: int | None = None
        self.chunks = 0  # SSE events that carried text
        self.tokens = 0
        self.itl_max = 0
        self.terminal = False  # a [DONE], finish_reason or usage was seen
        self.status = ""  # "" while running; then ok | error | rejected
        self.kind: str | None = None
        self.detail: str | None = None
        self.http_status: int | None = None
        self.retry_after: float | None = None
        self.usage_completion: int | None = None
        self.usage_prompt: int | None = None
        self.extra: dict[str, Any] = {}
        self.body: bytearray | None = None

    def fail(self, kind: str, detail: str, status: str = "error") -> None:
        if not self.status:
            self.status, self.kind, self.detail = status, kind, detail[:300]


class _Response:
    """Incremental parser for one HTTP/1.1 response."""

    __slots__ = (
        "_buf",
        "_chunk_left",
        "_framing",
        "_length_left",
        "_sse",
        "_state",
        "close_after",
        "dialect",
        "done",
        "events",
        "first_event",
        "last_read",
        "outcome",
        "stream",
    )

    def __init__(self, outcome: Outcome, stream: bool, dialect: Dialect = OPENAI) -> None:
        self.outcome = outcome
        self.stream = stream
        self.dialect = dialect
        self._buf = b""
        self._state = "head"
        self._framing = "close"
        self._length_left = 0
        self._chunk_left = -1  # -1: reading a size line
        self._sse: SSEParser | None = None
        self.close_after = False
        self.done = False
        self.events = 0  # SSE events parsed
        self.first_event = 0  # the number of the event that gave the first token
        self.last_read = 0  # user-space time of the previous read of this response

    def feed(self, data: bytes, t: int) -> None:
        out = self.outcome
        if not out.t_first_byte:
            out.t_first_byte = t
        if self._state == "head":
            self._buf += data
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD:
                    out.fail("bad_stream", "response head too large")
                    self.done = self.close_after = True
                return
            head, data = self._buf[:end], self._buf[end + 4 :]
            self._buf = b""
            self._state = "body"
            self._head(head)
            if self.done:
                return
        if self._framing == "chunked":
            self._chunked(data, t)
        elif self._framing == "length":
            take = data[: self._length_left]
            self._length_left -= len(take)
            self._body(take, t)
            if self._length_left <= 0:
                self._finish(t)
        else:
            self._body(data, t)

    def _head(self, head: bytes) -> None:
        out = self.outcome
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        try:
            status = int(parts[1])
        except (IndexError, ValueError):
            out.fail("bad_stream", f"bad status line {lines[0][:80]!r}")
            self.done = self.close_after = True
            return
        out.http_status = status
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if parts[0] == "HTTP/1.0" or headers.get("connection", "").lower() == "close":
            self.close_after = True
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing = "chunked"
        elif "content-length" in headers:
            self._framing = "length"
            try:
                self._length_left = int(headers["content-length"])
            except ValueError:
                out.fail("bad_stream", f"bad Content-Length {headers['content-length'][:20]!r}")
                self.done = self.close_after = True
                return
            if self._length_left < 0:
                out.fail("bad_stream", "negative Content-Length")
                self.done = self.close_after = True
                return
        else:
            self._framing, self.close_after = "close", True
        gateway = headers.get(GATEWAY_TIMING_HEADER)
        if gateway:
            # fairbench's gateway: its own queue record (dispatcher.timing), final at dispatch
            with contextlib.suppress(ValueError):
                record = orjson.loads(gateway)
                if isinstance(record, dict):
                    out.extra["gateway"] = record
        retry = headers.get("retry-after")
        if retry is not None:
            try:
                out.retry_after = float(retry)
            except ValueError:
                out.retry_after = None
        if status != 200:
            out.body = bytearray()
        elif self.stream:
            self._sse = SSEParser()
        else:
            out.body = bytearray()
        if self._framing == "length" and self._length_left == 0:
            self._finish(out.t_first_byte)

    def _chunked(self, data: bytes, t: int) -> None:
        """Chunked framing: size line, data, CRLF; size 0 ends. The data of every chunk this
        read completes (or continues) is handed on at once — one read's bytes share one stamp,
        so parsing them as one piece loses nothing and costs one pass, not one per chunk."""
        buf = self._buf + data if self._buf else data
        pos, n = 0, len(buf)
        parts: list[bytes] = []
        while True:
            left = self._chunk_left
            if left == -1:  # a size line
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if n - pos > _MAX_SIZE_LINE:  # no size line is this long: a broken stream
                        self._deliver(parts, t)
                        self._bad(f"chunk size line over {_MAX_SIZE_LINE} bytes")
                        return
                    break
                size_text = buf[pos:end].split(b";", 1)[0].strip()
                # hex digits only: int(.., 16) would also take "-6", "+1", "0x10" and "1_0", and
                # a negative size would send the parser back to this line for ever
                if not size_text or size_text.strip(_HEX) or len(size_text) > 15:
                    self._deliver(parts, t)
                    self._bad(f"bad chunk size {size_text[:20]!r}")
                    return
                size = int(size_text, 16)
                if size == 0:
                    self._deliver(parts, t)
                    self._buf = b""
                    if buf[end + 2 : end + 4] != b"\r\n":
                        # trailers, or the final CRLF still to come: their bytes would open the
                        # next response on this connection, so it is not reused
                        self.close_after = True
                    self._finish(t)
                    return
                start = end + 2
                if start + size + 2 <= n:  # the whole chunk and its CRLF are here
                    parts.append(buf[start : start + size])
                    pos = start + size + 2
                    continue
                pos = start
                self._chunk_left = size
            elif left > 0:  # chunk data
                if pos >= n:
                    break
                take = min(left, n - pos)
                parts.append(buf[pos : pos + take])
                pos += take
                self._chunk_left = left - take or -2
            else:  # -2: the CRLF after the data
                if n - pos < 2:
                    break
                pos += 2
                self._chunk_left = -1
        self._buf = buf[pos:]
        self._deliver(parts, t)

    def _bad(self, detail: str) -> None:
        self.outcome.fail("bad_stream", detail)
        self.done = self.close_after = True

    def _deliver(self, parts: list[bytes], t: int) -> None:
        if parts and not self.done:
            self._body(parts[0] if len(parts) == 1 else b"".join(parts), t)

    def _body(self, data: bytes, t: int) -> None:
        if not data:
            return
        out = self.outcome
        if self._sse is None:
            assert out.body is not None
            limit = _MAX_ERROR_BODY if out.http_status != 200 else _MAX_BODY
            if len(out.body) < limit:
                out.body += data[: limit - len(out.body)]
            return
        try:
            events = self._sse.feed(data)
        except ValueError as error:
            out.fail("bad_stream", str(error))
            self.done = self.close_after = True
            return
        on_event = self.dialect.event
        for event in events:  # one event's JSON at a time (inlined: this is the hot loop)
            if out.status:
                return
            self.events += 1
            if event == b"[DONE]":
                out.terminal = True
                continue
            try:
                obj = orjson.loads(event)
            except orjson.JSONDecodeError:
                out.fail("bad_stream", f"not JSON: {event[:80]!r}")
                return
            if obj.__class__ is not dict:
                out.fail("bad_stream", f"not an object: {event[:80]!r}")
                return
            had_token = out.t_first_token
            on_event(out, obj, t)
            if not had_token and out.t_first_token:
                self.first_event = self.events

    def _finish(self, t: int) -> None:
        if self.done:
            return
        self.done = True
        out = self.outcome
        out.t_done = t
        if out.status:
            return
        status = out.http_status or 0
        if status != 200:
            text = bytes(out.body or b"").decode("utf-8", "replace").strip().replace("\n", " ")
            if status in (429, 503):
                out.fail("rate_limited" if status == 429 else "overloaded", text, "rejected")
            else:
                out.fail("http_4xx" if 400 <= status < 500 else "http_5xx", text)
            return
        if self._sse is not None:
            if not out.terminal:
                cut = " (the last event was cut off)" if self._sse.has_partial else ""
                out.fail(
                    "stream_incomplete",
                    f"the stream ended without its terminal event{cut}",
                )
                return
            out.tokens = out.usage_completion if out.usage_completion is not None else out.chunks
            out.status = "ok"
            return
        self._whole()

    def _whole(self) -> None:
        out = self.outcome
        try:
            obj = orjson.loads(bytes(out.body or b""))
        except orjson.JSONDecodeError:
            out.fail("bad_stream", "the response body is not JSON")
            return
        self.dialect.whole(out, obj)

    def connection_lost(self, t: int) -> None:
        if self.done:
            return
        if self._framing == "close" and self._state != "head" and self.outcome.http_status:
            self._finish(t)
            return
        self.done = True
        self.outcome.t_done = t
        if self.outcome.t_first_byte:
            self.outcome.fail("dropped", "the connection closed mid-response")
        else:
            self.outcome.fail("dropped", "the connection closed before any response")


class _Conn:
    """One keep-alive connection: one response at a time, fed by a `StampedTransport`."""

    __slots__ = ("pool", "response", "transport", "waiter")

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: StampedTransport | None = None
        self.response: _Response | None = None
        self.waiter: asyncio.Future[Outcome] | None = None

    def send(self, request: bytes, response: _Response, waiter: asyncio.Future[Outcome]) -> None:
        self.response, self.waiter = response, waiter
        assert self.transport is not None
        t = self.transport.write(request)
        if t:
            response.outcome.t_written = t

    def written(self, t: int) -> None:
        """The request's last byte reached the kernel after a buffered write."""
        if self.response is not None:
            self.response.outcome.t_written = t

    def received(self, data: bytes, t_kernel: int | None, t_user: int) -> None:
        """Bytes stamped at their (newest segment's) kernel arrival; `t_user - t_kernel` is how
        late the event loop read them. A read without a kernel stamp is stamped in user space
        and its delay is unknown (-1 marks it)."""
        response = self.response
        if response is None:
            return  # bytes after a complete response on an idle connection: ignore
        out = response.outcome
        if t_kernel is None:
            t_kernel, delay = t_user, -1
        else:
            delay = t_user - t_kernel
            if delay > out.rx_delay_max:
                out.rx_delay_max = delay
        had_token = out.t_first_token
        response.feed(data, t_kernel)
        if out.rx_delay is None and (out.t_first_token != had_token or response.done):
            out.rx_delay = delay
            if delay >= 0:
                out.rx_error = self._stamp_error(response, had_token, t_kernel)
        response.last_read = t_user
        if response.done:
            self._complete(response)

    @staticmethod
    def _stamp_error(response: _Response, had_token: int, t_kernel: int) -> int:
        """How far a late read can have moved the first-token stamp (see Outcome)."""
        out = response.outcome
        if out.t_first_token == had_token:  # no token: the response's end, its newest bytes
            return 0
        sse = response._sse
        if response.events == response.first_event and not (sse is not None and sse.has_partial):
            return 0  # the token's event ended the read: its own segment's stamp
        return max(0, t_kernel - max(response.last_read, out.t_written or out.t_sent))

    def _complete(self, response: _Response) -> None:
        waiter = self.waiter
        self.response = self.waiter = None
        if response.close_after or response.outcome.kind in ("bad_stream",):
            if self.transport is not None:
                self.transport.close()
        else:
            self.pool.release(self)
        if waiter is not None and not waiter.done():
            waiter.set_result(response.outcome)

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.forget(self)
        response = self.response
        if response is not None:
            response.connection_lost(now_ns())
            self._complete(response)

    def abort(self) -> None:
        self.response = self.waiter = None
        if self.transport is not None:
            self.transport.abort()


class Pool:
    """Keep-alive connections to one origin. No cap: an open loop opens what it needs."""

    def __init__(self, url: str, ca_bundle: str | Path | None = None) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = tls_context(ca_bundle) if parts.scheme == "https" else None
        self.host_header = parts.netloc
        self.idle: list[_Conn] = []
        self.all: set[_Conn] = set()

    def release(self, conn: _Conn) -> None:
        self.idle.append(conn)

    def forget(self, conn: _Conn) -> None:
        self.all.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)

    async def connect(self) -> _Conn:
        conn = _Conn(self)
        conn.transport = await open_stamped(self.host, self.port, conn, self.ssl)
        self.all.add(conn)
        return conn

    async def warm(self, n: int) -> int:
        """Open up to `n` connections ahead of the schedule (wrk does the same), so the first
        requests do not pay for TCP set-up. Returns how many opened."""
        opened = await asyncio.gather(*(self.connect() for _ in range(n)), return_exceptions=True)
        conns = [c for c in opened if isinstance(c, _Conn)]
        self.idle.extend(conns)
        return len(conns)

    def start(
        self, request: bytes, stream: bool, dialect: Dialect = OPENAI
    ) -> tuple[asyncio.Future[Outcome], Outcome]:
        """Send now on an idle connection, or on a new one as soon as it is open."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Outcome] = loop.create_future()
        while self.idle:
            conn = self.idle.pop()
            if conn.transport is not None and not conn.transport.is_closing():
                outcome = Outcome(now_ns())
                conn.send(request, _Response(outcome, stream, dialect), waiter)
                return waiter, outcome
            self.forget(conn)
        outcome = Outcome(now_ns())
        task = loop.create_task(self._connect_and_send(request, stream, outcome, waiter, dialect))
        waiter.add_done_callback(lambda _: None if task.done() else task.cancel())
        return waiter, outcome

    async def _connect_and_send(
        self,
        request: bytes,
        stream: bool,
        outcome: Outcome,
        waiter: asyncio.Future[Outcome],
        dialect: Dialect,
    ) -> None:
        try:
            conn = await self.connect()
        except OSError as error:
            outcome.fail("connect", f"{type(error).__name__}: {error}")
            outcome.t_done = now_ns()
            if not waiter.done():
                waiter.set_result(outcome)
            return
        if waiter.done():  # cancelled (timeout) while connecting
            conn.abort()
            return
        conn.send(request, _Response(outcome, stream, dialect), waiter)

    def abort(self, waiter: asyncio.Future[Outcome]) -> None:
        """A request gave up (timeout, cancel): its connection cannot be reused, and a connection
        still being opened for it must not send it."""
        if not waiter.done():
            waiter.cancel()  # also cancels a pending connect (see start)
        for conn in list(self.all):
            if conn.waiter is waiter:
                conn.abort()
                self.forget(conn)

    def close(self) -> None:
        for conn in list(self.all):
            if conn.transport is not None:
                conn.transport.close()
        self.all.clear()
        self.idle.clear()


def request_bytes(pool: Pool, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {pool.host_header}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Accept: text/event-stream, application/json",
    ]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def tls_context(ca_bundle: str | Path | None = None) -> ssl.SSLContext:
    """Verification on, always: the system's CAs, or only `ca_bundle`'s (a private CA)."""
    return ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
