"""`python -m reference_scheduler serve CONFIG [--host H] [--port P]`, and
`python -m reference_scheduler gateway CONFIG [--host H] [--port P]` (docs/gateway.md).

Prints `listening on http://HOST:PORT` as its first line (with --port 0, the port it got), so a
parent process can find it. Bad configuration prints one line per problem and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any

from reference_scheduler.gateway import load_gateway_config, serve_gateway
from reference_scheduler.scheduler.config import SchedulerConfigError
from reference_scheduler.server.app import serve
from reference_scheduler.server.config import load_server_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_scheduler")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_cmd = sub.add_parser("serve", help="run the HTTP server")
    serve_cmd.add_argument("config")
    serve_cmd.add_argument("--host", default=None)
    serve_cmd.add_argument("--port", type=int, default=None)
    gateway_cmd = sub.add_parser("gateway", help="run the scheduler in front of real engines")
    gateway_cmd.add_argument("config")
    gateway_cmd.add_argument("--host", default=None)
    gateway_cmd.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        config: Any = (
            load_gateway_config(args.config)
            if args.command == "gateway"
            else load_server_config(args.config)
        )
    except FileNotFoundError:
        print(f"{args.config}: file not found", file=sys.stderr)
        return 2
    except SchedulerConfigError as error:
        for line in error.lines:
            print(f"{args.config}: {line}", file=sys.stderr)
        return 2

    def ready(url: str) -> None:
        print(f"listening on {url}", flush=True)

    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        if args.command == "gateway":
            runner(serve_gateway(config, args.host, args.port, ready))
        else:
            runner(serve(config, args.host, args.port, ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
