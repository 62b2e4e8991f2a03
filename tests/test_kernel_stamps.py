"""Kernel receive stamps, the generator's receive delay, and HTTPS through the same transport.

The server here is a plain threaded socket server that stamps its own writes on the same
monotonic clock, so the assertions are orderings of instants, not timing thresholds: the
kernel's receive stamp lies between the server's stamps around its write, and a user-space
stamp taken after a 50 ms block of the event loop is at least 50 ms later than that — whatever
the machine's load. Each ordering holds to within `CLOCK_SLACK_NS`: the kernel stamps on
CLOCK_REALTIME, and `stamped.KernelClock` maps them onto the monotonic timeline through an
offset read between two monotonic readings, known to half that bracket (microseconds; on a
loaded CI machine a 50 ms wait came out 49.9915 ms, 8.5 µs short).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fairbench.analysis.health import generator_health
from fairbench.plan.materialize import materialize
from fairbench.run.records import records_frame
from fairbench.targets.http.client import Pool, request_bytes
from fairbench.targets.http.stamped import kernel_stamps_available
from fairbench.targets.openai import OpenAITarget
from fairbench.workload.loading import parse_scenario
from tests.loopback import execute

now_ns = time.perf_counter_ns
BLOCK_S = 0.05
MERGE_GAP_S = 0.02
CLOCK_SLACK_NS = 100_000  # the stamp's mapping error allowed: 0.2% of the 50 ms block
BLOCK_NS = BLOCK_S * 1e9 - CLOCK_SLACK_NS  # the least receive delay a 50 ms block can show

pytestmark = pytest.mark.skipif(
    not kernel_stamps_available(), reason="no SO_TIMESTAMPNS on this platform (Linux has it)"
)


class SSEServer:
    """Answers every POST with a 3-token SSE stream. Gated (the default), each answer is a
    hand-off with the client: the server says it has the request (`seen`), waits until the
    client's loop is blocked (`gate`), writes the first token — the write bracketed by
    `wrote_before`/`wrote_after` — says so (`written`) and sends the rest once `release`d."""

    def __init__(
        self, tls: ssl.SSLContext | None = None, gated: bool = True, merge: bool = False
    ) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.tls = tls
        self.gated = gated
        self.merge = merge  # write a second token 20 ms after the first, before `written`
        self.seen: queue.Queue[int] = queue.Queue()
        self.gate: queue.Queue[int] = queue.Queue()
        self.written: queue.Queue[int] = queue.Queue()
        self.release: queue.Queue[int] = queue.Queue()
        self.wrote_before: list[int] = []
        self.wrote_after: list[int] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self.listener.settimeout(30)
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, raw: socket.socket) -> None:
        conn: Any = raw
        # without it Nagle holds a small write until the last one is ACKed, which the client's
        # delayed ACK can put off by 40 ms: the bytes then arrive (and are stamped) that late
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(raw, server_side=True)
            conn.settimeout(30)
            while True:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                header, _, body = head.partition(b"\r\n\r\n")
                length = 0
                for line in header.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                while len(body) < length:
                    body += conn.recv(65536)
                self._answer(conn)
        except (OSError, ssl.SSLError):
            return
        finally:
            raw.close()

    def _answer(self, conn: Any) -> None:
        def chunk(obj: dict[str, Any] | str) -> bytes:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            event = f"data: {data}\n\n".encode()
            return f"{len(event):x}\r\n".encode() + event + b"\r\n"

        token = {"choices": [{"index": 0, "text": " x", "finish_reason": None}]}
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        if self.gated:
            self.seen.put(1)
            self.gate.get(timeout=10)
        self.wrote_before.append(now_ns())
        conn.sendall(chunk(token))
        self.wrote_after.append(now_ns())
        if self.merge:  # a second token joins the first while the client's loop is blocked
            time.sleep(MERGE_GAP_S)
            conn.sendall(chunk(token))
        if self.gated:
            self.written.put(1)
            self.release.get(timeout=10)
        usage = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
        last = {"choices": [{"index": 0, "text": " y", "finish_reason": "length"}]}
        rest = b"" if self.merge else chunk(token)
        conn.sendall(rest + chunk(last) + chunk({"choices": [], "usage": usage}))
        conn.sendall(chunk("[DONE]") + b"0\r\n\r\n")

    def close(self) -> None:
        self.listener.close()

    def block_reads(self, release: bool = True) -> int:
        """Call ON the client's event loop once the server has the request: the loop is blocked
        before the first token is written and stays so 50 ms after; returns when that ended.
        `release`: let the server send the rest now (else the caller does, later)."""
        self.seen.get(timeout=10)
        self.gate.put(1)
        self.written.get(timeout=10)
        time.sleep(BLOCK_S)
        ended = now_ns()
        if release:
            self.release.put(1)
        return ended


@contextmanager
def sse_server(
    tls: ssl.SSLContext | None = None, gated: bool = True, merge: bool = False
) -> Iterator[SSEServer]:
    server = SSEServer(tls, gated, merge)
    try:
        yield server
    finally:
        server.close()


async def _one_request(url: str, server: SSEServer, ca: str | None = None) -> tuple[Any, int]:
    pool = Pool(url, ca)
    try:
        await pool.warm(1)
        body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 3, "stream": True}).encode()
        waiter, outcome = pool.start(request_bytes(pool, "/v1/completions", body, {}), True)
        ended: list[int] = []
        asyncio.get_running_loop().call_soon(lambda: ended.append(server.block_reads(False)))
        # the rest is sent once the first token was read, so it has that read to itself
        while not outcome.t_first_token and not waiter.done():
            await asyncio.sleep(0.001)
        server.release.put(1)
        await asyncio.wait_for(waiter, 20)
        return outcome, ended[0]
    finally:
        pool.close()


def test_a_blocked_event_loop_does_not_move_the_kernel_stamped_first_token() -> None:
    with sse_server() as server:
        outcome, block_ended = asyncio.run(_one_request(server.url, server))
    assert outcome.status == "ok", (outcome.kind, outcome.detail)
    # the kernel stamped the token when the server's write queued it, not when we read it
    assert (
        server.wrote_before[0] - CLOCK_SLACK_NS
        <= outcome.t_first_token
        <= server.wrote_after[0] + CLOCK_SLACK_NS
    )
    # the loop read it only after the block; the difference is recorded as the receive delay
    assert outcome.rx_delay is not None
    assert outcome.t_first_token + outcome.rx_delay >= block_ended - CLOCK_SLACK_NS
    assert outcome.rx_delay >= BLOCK_NS
    assert outcome.rx_delay_max >= outcome.rx_delay
    assert outcome.rx_error == 0  # the token had its read to itself: its stamp is exact
    # the send is stamped once the request's bytes were written, before any answer came
    assert 0 < outcome.t_sent < outcome.t_first_byte <= outcome.t_first_token


@pytest.mark.parametrize("merge", [False, True], ids=["alone", "merged"])
def test_late_reads_are_invalid_only_when_they_moved_the_stamps(
    tmp_path: Path, merge: bool
) -> None:
    """Every first token waits 50 ms in the socket. Alone there, its kernel stamp is exact and
    the run is valid (the delay is reported); when a second token joins it before the read, the
    kernel stamps both at the second's arrival, and the run is INVALID for receive error."""
    scn = parse_scenario(
        {
            "name": "rx",
            "workloads": {"c": {"endpoint": "completions", "prompt_tokens": 4, "output_tokens": 3}},
            "tenants": [{"id": "t", "mix": "c", "arrival": {"process": "constant", "rate": 5}}],
            "run": {"requests": 3, "seed": 1, "timeout": "20s", "grace": "20s"},
            "target": {"kind": "openai", "base_url": "http://127.0.0.1:1", "model": "m"},
            "health": {"max_send_lag_p99": "10s", "min_rate_ratio": 0.01},
        }
    )
    plan = materialize(scn)
    with sse_server(merge=merge) as server:

        async def go() -> list[dict[str, Any]]:
            target = OpenAITarget(server.url, model="m")

            firsts: list[Any] = []  # the outcomes whose first token was read, in order

            def first_tokens_read() -> int:
                # counted per response: on a loaded machine the previous request can still be
                # in flight, and its token must not release this one's rest
                pool = target.pool
                for c in pool.all if pool is not None else ():
                    out = c.response.outcome if c.response is not None else None
                    if out is not None and out.t_first_token and all(o is not out for o in firsts):
                        firsts.append(out)
                return len(firsts)

            async def blocker() -> None:  # each first token sits in the socket for 50 ms
                for i in range(len(plan)):
                    while server.seen.empty():
                        await asyncio.sleep(0.001)
                    server.block_reads(release=False)  # on the loop: blocks every read
                    while first_tokens_read() <= i:  # then the rest, in reads of its own
                        await asyncio.sleep(0.001)
                    server.release.put(1)

            task = asyncio.create_task(blocker())
            rows = await execute(plan, target, tmp_path / "j.jsonl")
            task.cancel()
            return rows

        rows = asyncio.run(go())
    frame = records_frame(rows)
    assert (frame["status"] == "ok").all(), frame[["status", "error_detail"]]
    assert (frame["rx_delay_ns"] >= BLOCK_NS).all()  # from the newest bytes' arrival
    health = generator_health(frame, scn, np.zeros(1, dtype=np.int64))
    assert health["receive_delay_ms"]["p99"] >= BLOCK_NS / 1e6
    if not merge:
        assert (frame["rx_error_ns"] == 0).all()
        assert health["valid"], health["invalid_reasons"]
        return
    assert (frame["rx_error_ns"] >= MERGE_GAP_S * 1e9 - CLOCK_SLACK_NS).all()
    assert not health["valid"]
    assert any("receive error p99" in r for r in health["invalid_reasons"]), health
    # the same run judged with a bound above the error is valid: the reason is the error alone
    loose = scn.model_copy(
        update={"health": scn.health.model_copy(update={"max_receive_error_p99": 5.0})}
    )
    assert generator_health(frame, loose, np.zeros(1, dtype=np.int64))["valid"]


def test_receive_delay_is_not_judged_where_it_was_not_measured() -> None:
    scn = parse_scenario(
        {
            "workloads": {"c": {"endpoint": "completions", "prompt_tokens": 4, "output_tokens": 3}},
            "tenants": [{"id": "t", "mix": "c", "arrival": {"process": "constant", "rate": 5}}],
            "run": {"requests": 4},
        }
    )
    frame = records_frame(
        [
            {
                "request_id": i,
                "tenant": "t",
                "slo_class": "interactive",
                "workload": "c",
                "endpoint": "completions",
                "t_intended_ns": i * 200_000_000,
                "t_sent_ns": i * 200_000_000,
                "prompt_tokens": 4,
                "max_tokens": 3,
                "status": "ok",
                "output_tokens": 3,
            }
            for i in range(4)
        ]
    )
    health = generator_health(frame, scn)
    assert health["receive_delay_ms"] is None and health["receive_error_ms"] is None
    assert health["valid"], health


# ---------------------------------------------------------------------------------- HTTPS


@pytest.fixture(scope="module")
def ca() -> Any:
    trustme = pytest.importorskip("trustme", reason="pip install -e '.[dev]' brings trustme")
    return trustme.CA()


def _server_tls(ca: Any) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


def test_https_with_a_private_ca_gets_kernel_stamps_too(ca: Any, tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    with sse_server(_server_tls(ca)) as server:
        outcome, block_ended = asyncio.run(_one_request(server.url, server, str(bundle)))
    assert outcome.status == "ok", (outcome.kind, outcome.detail)
    assert outcome.tokens == 3
    # a TLS record's stamp is its ciphertext's arrival: still before the loop's late read
    assert (
        server.wrote_before[0] - CLOCK_SLACK_NS
        <= outcome.t_first_token
        <= server.wrote_after[0] + CLOCK_SLACK_NS
    )
    assert outcome.t_first_token + outcome.rx_delay >= block_ended - CLOCK_SLACK_NS


def test_https_verifies_certificates_by_default(ca: Any) -> None:
    with sse_server(_server_tls(ca), gated=False) as server:

        async def go() -> Any:
            pool = Pool(server.url)  # the system's CAs: ours is not among them
            try:
                body = b'{"model": "m", "prompt": "hi", "max_tokens": 3, "stream": true}'
                waiter, _ = pool.start(request_bytes(pool, "/v1/completions", body, {}), True)
                return await asyncio.wait_for(waiter, 20)
            finally:
                pool.close()

        outcome = asyncio.run(go())
    assert outcome.status == "error" and outcome.kind == "connect"
    assert "CERTIFICATE_VERIFY_FAILED" in outcome.detail


def test_the_precheck_names_an_untrusted_certificate_in_one_line(ca: Any, tmp_path: Path) -> None:
    from tests.cli import run_cli

    with sse_server(_server_tls(ca), gated=False) as server:
        scenario = tmp_path / "tls.yaml"
        scenario.write_text(
            json.dumps(
                {
                    "workloads": {"c": {"endpoint": "completions", "prompt_tokens": 4}},
                    "tenants": [
                        {"id": "t", "mix": "c", "arrival": {"process": "constant", "rate": 1}}
                    ],
                    "run": {"requests": 1},
                    "target": {"kind": "openai", "base_url": server.url, "model": "m"},
                }
            )
        )
        proc = run_cli("run", str(scenario), "--out", str(tmp_path / "run"), "--quiet")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "certificate failed verification" in lines[0] and "target.ca_bundle" in lines[0]
    assert not (tmp_path / "run" / "records.parquet").exists()


def test_records_carry_receive_delay_columns() -> None:
    frame = records_frame([])
    assert {"rx_delay_ns", "rx_delay_max_ns", "rx_error_ns", "server_received_ns"} <= set(
        frame.columns
    )
    assert isinstance(frame, pd.DataFrame)


# ---------------------------------------------------------- what the transport must not lose


def _raw_server(answer: bytes, tls: ssl.SSLContext | None = None, delay_s: float = 0.0) -> Any:
    """A one-shot server: reads a request, writes `answer`, then closes (TLS: with
    close_notify, in the same flight as the answer)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        raw, _ = listener.accept()
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            time.sleep(delay_s)  # before the handshake: a slow connection set-up
            conn: Any = tls.wrap_socket(raw, server_side=True) if tls else raw
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            conn.sendall(answer)
            if tls:
                conn.unwrap()  # close_notify right behind the response
            conn.close()
        except (OSError, ssl.SSLError):
            raw.close()
        finally:
            listener.close()

    threading.Thread(target=run, daemon=True).start()
    return listener.getsockname()[1]


async def _ask(url: str, ca: str | None = None, stream: bool = False) -> Any:
    pool = Pool(url, ca)
    try:
        body = b'{"model": "m", "prompt": "hi", "max_tokens": 1}'
        waiter, _ = pool.start(request_bytes(pool, "/v1/completions", body, {}), stream)
        outcome = await asyncio.wait_for(waiter, 20)
        return outcome, len(pool.all)
    finally:
        pool.close()


REFUSAL = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b'Retry-After: 2\r\nContent-Length: 38\r\n\r\n{"error": {"message": "slow down !!"}}'
)


def test_a_tls_answer_followed_by_close_notify_is_kept(ca: Any) -> None:
    """A server that answers and closes at once (a 429 under overload) sends the answer and its
    close_notify together: the answer is the outcome, not 'the connection closed'."""
    port = _raw_server(REFUSAL, _server_tls(ca))
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "ca.pem"
        ca.cert_pem.write_to_path(str(bundle))
        outcome, _ = asyncio.run(_ask(f"https://127.0.0.1:{port}", str(bundle)))
    assert outcome.status == "rejected" and outcome.kind == "rate_limited", outcome.detail
    assert outcome.http_status == 429 and outcome.retry_after == 2.0


@pytest.mark.parametrize(
    "answer, detail",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n{}", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n{}", "negative Content-Length"),
        (b"garbage\r\n\r\n", "bad status line"),
    ],
)
def test_a_malformed_answer_ends_as_one_error_and_frees_its_connection(
    answer: bytes, detail: str
) -> None:
    port = _raw_server(answer)
    outcome, _ = asyncio.run(_ask(f"http://127.0.0.1:{port}"))
    assert outcome.status == "error" and outcome.kind == "bad_stream", outcome.detail
    assert detail in outcome.detail


def test_an_exception_in_the_parser_drops_the_response_instead_of_hanging_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fairbench.targets.http import client

    def broken(self: Any, data: bytes, t: int) -> None:
        raise RuntimeError("a parser bug")

    monkeypatch.setattr(client._Response, "feed", broken)
    port = _raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    outcome, registered = asyncio.run(_ask(f"http://127.0.0.1:{port}"))
    assert outcome.status == "error" and outcome.kind == "dropped", outcome.detail
    assert registered == 0  # the connection is gone from the pool, not left half-open


def test_send_lag_is_the_generators_lateness_not_the_connection_set_up(ca: Any) -> None:
    """On a new connection, t_sent is when the generator sent the request; t_written, when its
    last byte reached the socket — after the (here 200 ms slow) TLS handshake."""
    slow = 0.2
    port = _raw_server(REFUSAL, _server_tls(ca), delay_s=slow)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "ca.pem"
        ca.cert_pem.write_to_path(str(bundle))

        async def go() -> tuple[Any, int]:
            started = now_ns()
            outcome, _ = await _ask(f"https://127.0.0.1:{port}", str(bundle))
            return outcome, started

        outcome, started = asyncio.run(go())
    assert outcome.http_status == 429
    assert started <= outcome.t_sent < started + slow * 1e9  # sent at once
    assert outcome.t_written - outcome.t_sent >= slow * 1e9  # written after the handshake


# ------------------------------------------------------------------ the pacer


@pytest.mark.parametrize("pacing", ["timerfd", "spin"])
def test_the_pacer_never_returns_before_its_deadline(pacing: str) -> None:
    from fairbench.run.pacer import make_pacer

    async def go() -> list[tuple[int, int]]:
        pacer = make_pacer(pacing)
        out = []
        try:
            for delay_ns in (0, -1_000_000, 300_000, 2_000_000, 7_000_000):
                deadline = now_ns() + delay_ns
                await pacer.until(deadline)
                out.append((deadline, now_ns()))
        finally:
            pacer.close()
        return out

    for deadline, woke in asyncio.run(go()):
        assert woke >= deadline


def test_a_cancelled_timerfd_wait_leaves_the_pacer_usable() -> None:
    from fairbench.run.pacer import make_pacer

    async def go() -> bool:
        pacer = make_pacer("timerfd")
        try:
            wait = asyncio.create_task(pacer.until(now_ns() + 10_000_000_000))
            await asyncio.sleep(0.01)
            wait.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await wait
            deadline = now_ns() + 1_000_000
            await asyncio.wait_for(pacer.until(deadline), 5)
            return now_ns() >= deadline
        finally:
            pacer.close()

    assert asyncio.run(go())


# ------------------------------------------------------------------ the rate the server saw


def _frame(received: list[int | None], status: str = "ok") -> pd.DataFrame:
    return records_frame(
        [
            {
                "request_id": i,
                "tenant": "t",
                "slo_class": "interactive",
                "workload": "c",
                "endpoint": "completions",
                "t_intended_ns": i * 10_000_000,
                "t_sent_ns": i * 10_000_000,
                "prompt_tokens": 4,
                "max_tokens": 3,
                "status": status if r is not None else "rejected",
                "output_tokens": 3,
                "server_received_ns": r,
            }
            for i, r in enumerate(received)
        ]
    )


def test_the_server_seen_rate_fails_a_run_whose_requests_reached_the_server_late() -> None:
    scn = parse_scenario(
        {
            "workloads": {"c": {"endpoint": "completions", "prompt_tokens": 4, "output_tokens": 3}},
            "tenants": [{"id": "t", "mix": "c", "arrival": {"process": "constant", "rate": 100}}],
            "run": {"requests": 100},
        }
    )
    on_time = [5_000 + i * 10_000_000 for i in range(100)]
    assert generator_health(_frame(on_time), scn)["valid"]
    # rejected requests carry no server time: the rate is judged over those that do
    with_refusals = [r if i % 3 else None for i, r in enumerate(on_time)]
    health = generator_health(_frame(with_refusals), scn)
    assert health["tenants"]["t"]["server_seen_rate_ratio"] == pytest.approx(1.0, abs=1e-3)
    # the server read them at 95% of the pace the generator sent them
    slow = [int(i * 10_000_000 / 0.95) for i in range(100)]
    health = generator_health(_frame(slow), scn)
    assert not health["valid"]
    assert any("the server received 0.950" in r for r in health["invalid_reasons"]), health
