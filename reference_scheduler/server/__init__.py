"""The OpenAI-compatible HTTP server over the real-time driver: the app (`app`), its config and
tenancy (`config`), request validation and OpenAI-shaped errors (`requests`), Prometheus SLIs
(`metrics`), seeded fault injection (`faults`) and the OpenAPI document (`openapi`). Imports
everything below it; only `__main__` and fairbench's reference target (as a process) use it."""

from reference_scheduler.server.app import build_app, serve
from reference_scheduler.server.config import ServerConfig, load_server_config, parse_server_config

__all__ = ["ServerConfig", "build_app", "load_server_config", "parse_server_config", "serve"]
