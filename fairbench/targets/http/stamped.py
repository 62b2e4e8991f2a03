"""A socket transport that stamps every read with the kernel's receive time.

Why: the time a token is stamped must be when its bytes reached this machine, not when the event
loop got round to reading them. asyncio's (and uvloop's) transports read with `recv`, which
drops the kernel's timestamp, so a loop busy with other streams, a GC pause or a spinning
neighbour adds its delay to TTFT unseen. This transport reads with `recvmsg` on a socket with
`SO_TIMESTAMPNS` set; the kernel stamps each segment when it is queued to the socket (for
loopback, inside the sender's write). The user-space time of the read is kept beside it; the
difference is the generator's own receive delay, which the run records per request and bounds
(fairbench.analysis.health).

What the kernel cannot tell: Linux's TCP merges segments that wait in the receive queue into one
(`tcp_try_coalesce`, which keeps the newest segment's stamp), so a read that finds several
writes waiting — the loop was late by more than the gap between them — gets the newest one's
arrival for all of them, even when read one byte at a time. Such bytes are stamped at the newest
arrival: never earlier than truth, and exact for a write that had the socket to itself (the
usual case for a first token, which follows the response head and a prefill). So the receive
delay is how late the loop read the newest bytes; a loop that is late at all is what the bound
catches, and tests/test_kernel_stamps.py pins both behaviours.

Kernel stamps are on CLOCK_REALTIME; `KernelClock` maps them onto the run's monotonic timeline
(`time.perf_counter_ns`, CLOCK_MONOTONIC on Linux) with an offset re-measured every second and
whenever a stamp does not fit its read (the wall clock was stepped): a stamp that maps after
the read, or more than 10 s before it, is mapped again with a fresh offset, and if it still does
not fit it is replaced by the read's user-space time and counted.

TLS runs over the same reads (`ssl.SSLObject` on memory BIOs), so a stamp is the ciphertext's
arrival and HTTPS endpoints get kernel stamps too. The send side writes straight to the socket;
`write` returns the moment the request's last byte went to the kernel (0 while some is still
buffered; the protocol's `written` then gets it when the buffer drains).

Where the platform has no `SO_TIMESTAMPNS` (not Linux), reads are stamped in user space and the
transport says so (`kernel` is False); the run states which stamps it used.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
import struct
import sys
import time
from typing import Any, Protocol

now_ns = time.perf_counter_ns

_LINUX_SO_TIMESTAMPNS = 35  # Python exposes the constant only from 3.12
SO_TIMESTAMPNS: int | None = getattr(
    socket, "SO_TIMESTAMPNS", _LINUX_SO_TIMESTAMPNS if sys.platform == "linux" else None
)
_ANC_SIZE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0
_TIMESPEC = struct.Struct("@qq")
_READ_SIZE = 256 * 1024
_STEP_NS = 10 * 1_000_000_000  # a stamp this far before its read is a wall-clock step
HANDSHAKE_TIMEOUT_S = 60.0


class KernelClock:
    """CLOCK_REALTIME (the kernel's receive stamps) → the perf_counter_ns timeline."""

    __slots__ = ("_at", "offset_ns", "rejected", "uncertainty_ns")

    def __init__(self) -> None:
        self.rejected = 0  # stamps replaced by the user-space time (see module docstring)
        self.refresh()

    def refresh(self) -> None:
        """The offset from the tightest of five bracketed readings."""
        best: tuple[int, int] | None = None
        for _ in range(5):
            a = now_ns()
            real = time.time_ns()
            b = now_ns()
            if best is None or b - a < best[0]:
                best = (b - a, real - (a + b) // 2)
        assert best is not None
        self.uncertainty_ns = best[0] // 2 + 1
        self.offset_ns = best[1]
        self._at = now_ns()

    def mono(self, real_ns: int, t_user: int) -> int:
        """A kernel stamp on the monotonic timeline, checked against the read's own time. A
        stamp that maps after its read, or implausibly long before it, means the wall clock
        stepped since the offset was measured: measure again, and if it still does not fit,
        use the read's own time (counted in `rejected`)."""
        if t_user - self._at > 1_000_000_000:
            self.refresh()
        t = real_ns - self.offset_ns
        if t > t_user + self.uncertainty_ns + 50_000 or t_user - t > _STEP_NS:
            self.refresh()
            t = real_ns - self.offset_ns
            if t > t_user + self.uncertainty_ns + 50_000 or t_user - t > _STEP_NS:
                self.rejected += 1
                return t_user
        return min(t, t_user)  # never later than the read itself


CLOCK = KernelClock()  # one per process: every connection maps stamps the same way


def _stamp(anc: list[tuple[int, int, bytes]], t_user: int) -> int | None:
    """The kernel's receive stamp in a read's ancillary data, on the monotonic timeline; None
    where it carries none (see `kernel_stamps_available`)."""
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(raw)
            return CLOCK.mono(sec * 1_000_000_000 + nsec, t_user)
    return None


class StampedProtocol(Protocol):
    """What the transport calls: bytes with (kernel, user-space) receive times."""

    def received(self, data: bytes, t_kernel: int | None, t_user: int) -> None: ...
    def written(self, t: int) -> None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...


def enable_kernel_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to timestamp this socket's receives; False where it cannot."""
    if SO_TIMESTAMPNS is None or not _ANC_SIZE:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


class StampedTransport:
    """One connection: non-blocking socket reads via the loop's reader callback."""

    __slots__ = (
        "_awaiting",
        "_closing",
        "_fd",
        "_incoming",
        "_loop",
        "_outgoing",
        "_pending",
        "_protocol",
        "_sock",
        "_ssl",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol: StampedProtocol,
        tls: tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO] | None = None,
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._ssl, self._incoming, self._outgoing = tls if tls else (None, None, None)
        self._pending = bytearray()
        self._closing = False
        self._awaiting = False
        loop.add_reader(self._fd, self._read_ready)

    # ------------------------------------------------------------------ receive

    def _read_ready(self) -> None:
        try:
            data, anc, _, _ = self._sock.recvmsg(_READ_SIZE, _ANC_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._lost(error)
            return
        t_user = now_ns()
        if not data:
            self._lost(None)
            return
        t_kernel = _stamp(anc, t_user) if anc else None
        ended: Exception | bool | None = False  # the TLS stream ended (or failed) in this read
        if self._ssl is not None:
            data, ended = self._decrypt(data)
        if data and not self._closing:
            try:
                self._protocol.received(data, t_kernel, t_user)
            except Exception as error:  # a parser bug must end this response, not hang it
                self._lost(error)
                return
        if ended is not False:
            self._lost(ended)  # after the bytes that came with the close were delivered

    def _decrypt(self, data: bytes) -> tuple[bytes, Exception | bool | None]:
        """The plaintext in this read, and whether the TLS stream ended in it: False if not,
        None for a clean close (close_notify), the error otherwise. Plaintext that came before
        the end is returned either way: a response followed by close_notify is a response."""
        assert self._ssl is not None and self._incoming is not None
        self._incoming.write(data)
        parts = []
        ended: Exception | bool | None = False
        while True:
            try:
                chunk = self._ssl.read(_READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                ended = None
                break
            except ssl.SSLError as error:
                ended = error
                break
            if not chunk:
                ended = None
                break
            parts.append(chunk)
        if ended is False:
            self._flush_tls()  # a read can produce records to send (key updates, alerts)
        return b"".join(parts), ended

    # ------------------------------------------------------------------ send

    def write(self, data: bytes) -> int:
        """Send `data`; returns when its last byte reached the kernel, or 0 if some is still
        buffered (the protocol's `written` gets the time once it drains)."""
        if self._closing:
            return 0
        if self._ssl is not None:
            assert self._outgoing is not None
            self._ssl.write(data)
            data = self._outgoing.read()
        if self._pending:
            self._pending += data
            self._awaiting = True
            return 0
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as error:
            self._lost(error)
            return 0
        if sent == len(data):
            return now_ns()
        self._pending += data[sent:]
        self._awaiting = True
        self._loop.add_writer(self._fd, self._write_ready)
        return 0

    def _flush_tls(self) -> None:
        if self._outgoing is not None and self._outgoing.pending and not self._closing:
            idle = not self._pending
            self._pending += self._outgoing.read()
            if idle:
                self._write_ready()

    def _write_ready(self) -> None:
        try:
            sent = self._sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            self._loop.add_writer(self._fd, self._write_ready)
            return
        except OSError as error:
            self._lost(error)
            return
        del self._pending[:sent]
        if self._pending:
            self._loop.add_writer(self._fd, self._write_ready)
            return
        self._loop.remove_writer(self._fd)
        if self._awaiting:  # a request's last byte, not a TLS-internal record
            self._awaiting = False
            self._protocol.written(now_ns())

    # ------------------------------------------------------------------ close

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Close now (an HTTP client has nothing left to flush when it closes)."""
        self._lost(None)

    abort = close

    def _lost(self, error: Exception | None) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, error)


async def open_stamped(
    host: str,
    port: int,
    protocol: StampedProtocol,
    tls: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> StampedTransport:
    """Connect (and TLS-handshake), then hand the socket to a `StampedTransport`.

    Raises OSError (ssl.SSLError included: a certificate that fails verification) on failure."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    sock: socket.socket | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
            break
        except OSError as failed:
            sock.close()
            sock, error = None, failed
        except BaseException:  # cancelled (the request timed out) while connecting
            sock.close()
            raise
    if sock is None:
        raise error or OSError(f"cannot resolve {host}:{port}")
    enable_kernel_stamps(sock)  # where it cannot, reads come unstamped (see _stamp)
    try:
        tls_state = None
        if tls:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):  # asyncio's own default
                tls_state = await _handshake(loop, sock, tls, server_hostname or host)
    except TimeoutError:
        sock.close()
        raise OSError(f"TLS handshake with {host}:{port} timed out") from None
    except BaseException:
        sock.close()
        raise
    return StampedTransport(loop, sock, protocol, tls_state)


async def _handshake(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, context: ssl.SSLContext, hostname: str
) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_hostname=hostname)
    while True:
        try:
            obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            pass
        if outgoing.pending:
            await loop.sock_sendall(sock, outgoing.read())
        data = await loop.sock_recv(sock, 65536)
        if not data:
            raise ConnectionResetError("the server closed the connection in the TLS handshake")
        incoming.write(data)
    if outgoing.pending:
        await loop.sock_sendall(sock, outgoing.read())
    return obj, incoming, outgoing


_KEEPER: list[socket.socket] = []  # the probe's sockets, kept open: see kernel_stamps_available


@functools.cache
def kernel_stamps_available() -> bool:
    """Whether TCP reads here come with kernel receive stamps: probed once, on a loopback pair.

    Linux switches receive timestamping on for the whole system lazily (a deferred static key)
    when the first socket asks, and off again when the last one closes; packets that arrive
    meanwhile carry no stamp. So the probe waits (up to ~0.5 s) until a stamp arrives, and keeps
    its socket open for the life of the process, so a run's first requests are stamped too."""
    if SO_TIMESTAMPNS is None or not _ANC_SIZE:
        return False
    try:
        listener = socket.create_server(("127.0.0.1", 0))
        sender = socket.create_connection(listener.getsockname(), timeout=2)
        receiver, _ = listener.accept()
        listener.close()
    except OSError:
        return False
    if not enable_kernel_stamps(receiver):
        sender.close()
        receiver.close()
        return False
    receiver.settimeout(2)
    for _ in range(100):
        try:
            sender.send(b"x")
            _, anc, _, _ = receiver.recvmsg(16, _ANC_SIZE)
        except OSError:
            break
        if anc:
            _KEEPER.extend((sender, receiver))
            return True
        time.sleep(0.005)
    sender.close()
    receiver.close()
    return False


def describe() -> dict[str, Any]:
    """What run.json states about the receive stamps this process takes."""
    kernel = kernel_stamps_available()
    return {
        "receive": "kernel SO_TIMESTAMPNS (CLOCK_REALTIME mapped to CLOCK_MONOTONIC)"
        if kernel
        else "user space (no kernel receive timestamps on this platform)",
        "kernel": kernel,
        "send": "t_sent_ns when the generator sent the request (send lag); t_written_ns when "
        "its last byte was written to the socket (after any connect and TLS handshake)",
        "clock_offset_uncertainty_ns": CLOCK.uncertainty_ns,
        # stamps that did not fit their read even after a fresh offset (a wall-clock step), and
        # were replaced by the read's own time: counted in this process
        "stamps_replaced": CLOCK.rejected,
    }
