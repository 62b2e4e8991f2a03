"""The suite's one loopback HTTP server and its one way to execute a plan against a target.

`serve(app)` runs an aiohttp app on 127.0.0.1 (a free port) inside the test's event loop;
`serve_in_thread(app)` runs it on a loop of its own, for tests that call `run_scenario` (which
needs the main thread for its signal handlers). `execute(plan, target, journal)` is the run
helper: open the target, run the executor, close everything, return the journal's records.
"""

from __future__ import annotations

import asyncio
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


async def _start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """The app's base URL while the block runs, on the current event loop."""
    runner, url = await _start(app)
    try:
        yield url
    finally:
        await runner.cleanup()


@contextmanager
def serve_in_thread(app: web.Application) -> Iterator[str]:
    """The app's base URL while the block runs, served from a thread with its own loop."""
    loop = asyncio.new_event_loop()
    runner, url = loop.run_until_complete(_start(app))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield url
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


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
