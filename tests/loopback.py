"""The suite's one loopback HTTP server and its one way to execute a plan against a target.

`serve(app)` runs an aiohttp app on 127.0.0.1 (a free port) inside the test's event loop;
`serve_in_thread(app)` runs it on a loop of its own, for tests that call `run_scenario` (which
needs the main thread for its signal handlers) or that call it synchronously. With
`reference=True` the app is started as the reference server starts itself
(reference_scheduler.server.http.start_app: a client that disconnects cancels its handler), for
`build_app(config)` of the reference server. `free_port()` is a port nothing listens on, for a
refused connection or a server started in a subprocess; `reference_process(command, config)`
is `python -m reference_scheduler serve|gateway CONFIG` in a subprocess on a free port, for
the tests of the command itself. `execute(plan, target, journal)` is the
run helper: open the target, run the executor, close everything, return the journal's records.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from fairbench.plan import Plan
from fairbench.run.executor import ExecOptions, Executor
from fairbench.run.records import JournalWriter, read_journal
from fairbench.targets.base import Target
from reference_scheduler.server.http import start_app
from tests.cli import REPO


def free_port() -> int:
    """A port nothing listens on: bound (so the kernel picked a free one), then closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _start(app: web.Application, reference: bool = False) -> tuple[web.AppRunner, str]:
    if reference:
        return await start_app(app, "127.0.0.1", 0)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@asynccontextmanager
async def serve(app: web.Application, reference: bool = False) -> AsyncIterator[str]:
    """The app's base URL while the block runs, on the current event loop."""
    runner, url = await _start(app, reference)
    try:
        yield url
    finally:
        await runner.cleanup()


@contextmanager
def serve_in_thread(app: web.Application, reference: bool = False) -> Iterator[str]:
    """The app's base URL while the block runs, served from a thread with its own loop."""
    loop = asyncio.new_event_loop()
    runner, url = loop.run_until_complete(_start(app, reference))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield url
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@contextmanager
def reference_process(command: str, config: Path) -> Iterator[str]:
    """`python -m reference_scheduler COMMAND CONFIG --port 0` (serve or gateway) while the
    block runs: its base URL, as the first line it prints says; terminated at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "reference_scheduler", command, str(config), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip().removeprefix("listening on ")
        assert url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def execute(
    plan: Plan, target: Target, journal: Path, **options: Any
) -> list[dict[str, Any]]:
    """Run the whole plan against the target (opened and closed here); its records."""
    await target.open()
    writer = JournalWriter(journal)
    try:
        await Executor(plan, target, writer, ExecOptions(**options)).run()
    finally:
        await target.close()
        writer.close()
    return read_journal(journal)
