"""The reference scheduler in front of real engines: a request-level gateway.

The same tenancy, admission, policies and tiers as the served scheduler, but admitted requests
go to upstream OpenAI-compatible engines (vLLM, SGLang, TGI) instead of the simulated engine:
`config` (the file), `capacity` (each engine's sequences and KV tokens, counted by the gateway
and corrected by its scrapes), `pool` (each upstream's budget, health and saturation),
`dispatcher` (the policy queue in front of the pool, with no clock), `relay` (the wire to one
upstream, SSE event by event), `forward` (sending a placed request and relaying its answer),
`watch` (scrapes, probes, descriptions) and `app` (aiohttp). Imports everything below it but
`drivers`; only `__main__` uses it.
"""

from reference_scheduler.gateway.app import Gateway, build_gateway_app, serve_gateway, start_gateway
from reference_scheduler.gateway.config import (
    GatewayConfig,
    load_gateway_config,
    parse_gateway_config,
)

__all__ = [
    "Gateway",
    "GatewayConfig",
    "build_gateway_app",
    "load_gateway_config",
    "parse_gateway_config",
    "serve_gateway",
    "start_gateway",
]
