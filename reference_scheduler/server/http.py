"""What every HTTP front of the reference scheduler shares: OpenAI-shaped errors for anything
that goes wrong (unknown routes and wrong methods included), the app's wiring (`openai_app`),
and starting an app on a port and serving it until cancelled. The server and the gateway both
use it, so a bad request looks the same to a client whichever one it reached."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from reference_scheduler.server.requests import BadRequest, error_response


@web.middleware
async def openai_errors(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
    """Unknown routes and wrong methods get OpenAI-shaped errors too; nothing brings us down."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        kind = "not_found_error" if error.status == 404 else "invalid_request_error"
        return error_response(BadRequest(error.status, error.reason, kind))
    except BadRequest as error:
        return error_response(error)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def openai_app(
    on_startup: Callable[[], Awaitable[None]],
    on_cleanup: Callable[[], Awaitable[None]],
    posts: Mapping[str, Handler],
    gets: Mapping[str, Handler],
) -> web.Application:
    """An app with OpenAI-shaped errors, a 64 MiB body limit, its start and stop hooks, and its
    routes (path -> handler)."""
    app = web.Application(middlewares=[openai_errors], client_max_size=64 * 1024 * 1024)

    async def startup(_: web.Application) -> None:
        await on_startup()

    async def cleanup(_: web.Application) -> None:
        await on_cleanup()

    app.on_startup.append(startup)
    app.on_cleanup.append(cleanup)
    for path, handler in posts.items():
        app.router.add_post(path, handler)
    for path, handler in gets.items():
        app.router.add_get(path, handler)
    return app


async def start_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Start the app; (runner, base URL). A client that disconnects cancels its handler, whose
    `finally` cancels its work at once, even work still queued."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    bound = sockets[0].getsockname() if sockets else (host, port)
    return runner, f"http://{bound[0]}:{bound[1]}"


async def serve_until_cancelled(
    runner: web.AppRunner, url: str, ready: Callable[[str], None] | None
) -> None:
    if ready is not None:
        ready(url)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
