"""Waiting for a request's send time without burning a core.

Why not sleep then spin: event-loop timers are millisecond-grained (uvloop's, and asyncio's
epoll timeout), so sub-millisecond sends used to need the last ~1.2 ms spun with `sleep(0)`. At a
few hundred requests/s that spin is most of a core — taken from the server under test on a small
machine, and on a busy one it spends the generator's share of the CPU scheduler, so the kernel
runs it later when it matters.

Here the wait is a Linux `timerfd` armed at the absolute deadline (CLOCK_MONOTONIC, the clock of
`time.perf_counter_ns`, with TFD_TIMER_ABSTIME) and watched by the event loop like any socket:
the kernel's high-resolution timer makes the fd readable at the deadline, and epoll wakes the
loop at once, whatever the loop's own timer granularity. Nothing runs while it waits.

`SpinPacer` is the old way (sleep to within `spin_s`, then spin), kept for platforms without
timerfd and for comparing the two (benchmarks/bench_generator.py); `make_pacer` picks.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
import time
from typing import Protocol

now_ns = time.perf_counter_ns

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Pacer(Protocol):
    """`await pacer.until(deadline_ns)` returns at (or just after) the deadline."""

    kind: str

    async def until(self, deadline_ns: int) -> None: ...
    def close(self) -> None: ...


class SpinPacer:
    """Sleep on the loop's timer to within `spin_s`, then yield (`sleep(0)`) until the deadline;
    I/O keeps flowing while it spins."""

    def __init__(self, spin_s: float = 0.0012) -> None:
        self.spin = int(spin_s * 1e9)
        self.kind = "spin" if self.spin else "sleep"

    async def until(self, deadline_ns: int) -> None:
        delay = deadline_ns - now_ns()
        if delay > self.spin:
            await asyncio.sleep((delay - self.spin) / 1e9)
        while self.spin and now_ns() < deadline_ns:
            await asyncio.sleep(0)

    def close(self) -> None:
        pass


class TimerfdPacer:
    """One timerfd per executor, re-armed for each deadline; the loop watches it."""

    kind = "timerfd"

    def __init__(self) -> None:
        libc = _libc()
        if libc is None:
            raise OSError("timerfd is not available")
        self._settime = libc.timerfd_settime
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._fd = fd
        self._spec = _Itimerspec()
        self._spec_ref = ctypes.byref(self._spec)
        self._waiter: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._fired)

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def until(self, deadline_ns: int) -> None:
        if deadline_ns <= now_ns():
            return
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(deadline_ns, 1_000_000_000)
        if self._settime(self._fd, _TFD_TIMER_ABSTIME, self._spec_ref, None) != 0:
            await SpinPacer().until(deadline_ns)  # pragma: no cover - arming never fails here
            return
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            if self._waiter is waiter:  # cancelled (a stop): disarm
                self._waiter = None
                self._spec.it_value.tv_sec = self._spec.it_value.tv_nsec = 0
                self._settime(self._fd, 0, self._spec_ref, None)

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


_LIBC: ctypes.CDLL | bool | None = False


def _libc() -> ctypes.CDLL | None:
    global _LIBC
    if _LIBC is False:
        _LIBC = None
        if sys.platform == "linux":
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                lib.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
                lib.timerfd_settime.argtypes = [
                    ctypes.c_int,
                    ctypes.c_int,
                    ctypes.POINTER(_Itimerspec),
                    ctypes.c_void_p,
                ]
                _LIBC = lib
            except (OSError, AttributeError):
                _LIBC = None
    return _LIBC  # type: ignore[return-value]


PACINGS = ("auto", "timerfd", "spin")


def resolve(pacing: str = "auto") -> str:
    """Which pacer `make_pacer(pacing)` gives on this platform: `timerfd` or `spin`."""
    if pacing not in PACINGS:
        raise ValueError(f"pacing must be one of {', '.join(PACINGS)}, not {pacing!r}")
    monotonic = time.get_clock_info("perf_counter").implementation == (
        "clock_gettime(CLOCK_MONOTONIC)"
    )
    if pacing == "spin" or not monotonic or _libc() is None:
        if pacing == "timerfd":
            raise OSError("pacing: timerfd needs Linux (use auto or spin)")
        return "spin"
    return "timerfd"


def make_pacer(pacing: str = "auto", spin_s: float = 0.0012) -> Pacer:
    """`auto`: timerfd where the platform has it, else sleep-then-spin. Call inside the loop."""
    if resolve(pacing) == "timerfd":
        try:
            return TimerfdPacer()
        except OSError:
            if pacing == "timerfd":
                raise
    return SpinPacer(spin_s)
