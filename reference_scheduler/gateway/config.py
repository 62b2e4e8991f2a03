"""The gateway's configuration file (`python -m reference_scheduler gateway CONFIG`).

It is the served scheduler's file (server/config.py: model, host, port, scheduler, tenants,
slo_classes, max_tokens_limit) plus where admitted requests go:

    upstreams:
      - url: http://10.0.0.5:8000      # an OpenAI-compatible engine (vLLM, SGLang, TGI)
        name: gpu0                     # the `upstream` label on /metrics (default u<index>)
        engine: vllm                   # which saturation series to read: vllm | sglang | tgi | none
        model: meta-llama/Llama-3.1-8B-Instruct   # the upstream's model name (default: `model`)
        api_key_env: GPU0_KEY          # or api_key: sk-...; sent to that upstream only, never
                                       # echoed to a client, logged or put on /metrics
        max_inflight: 64               # requests in flight to it, at most
        max_inflight_tokens: 200000    # optional: prompt + max_tokens in flight, at most
        max_num_seqs: 64               # optional: the engine's capacity (capacity.py), counted
        kv_cache_tokens: 524288        # by the gateway itself: sequences, and KV blocks x size
        profile: gpu0.yaml             # ... or read from a cost profile (`fairbench profile`)
        priority_field: true           # send the tier's rank as the engine's `priority`
        max_waiting: 0                 # saturated while its own queue holds more than this
        max_kv_usage: 0.95             # ... or its KV cache is at least this full
    dispatch:
      scrape_interval_s: 1.0           # read each upstream's /metrics this often (engine != none)
      stale_after_s: 5.0               # a scrape older than this counts as saturated
      probe_interval_s: 1.0            # probe an unhealthy upstream's /health this often
      fail_after: 2                    # consecutive failures that mark an upstream unhealthy
      connect_timeout_s: 2.0
      first_byte_timeout_s: 120.0      # send -> first body byte of a stream (a long prefill)
      idle_timeout_s: 60.0             # between two body chunks, once streaming (never before)
      total_timeout_s: 600.0           # send -> whole answer, for a non-streaming request
      queue_timeout_s: 5.0             # with no healthy upstream, wait this long, then 503
    tokenizer: upstream                # estimate (default) | upstream | a tokenizer.json path
    default_max_tokens: 1024           # injected (and sent upstream) when a request names none

A timeout after the upstream accepted the request is answered 504 and not retried (the upstream
may still be working on it; a second upstream would do the work twice), and it does not count
against the upstream's health: slow is not broken.

The gateway cannot preempt a request that runs on an upstream (its work would be lost), so
`scheduler.preemption` must stay `none`; an engine's own priority scheduling (vLLM's
`--scheduling-policy priority`, fed by `priority_field`) is where preemption happens.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from reference_scheduler.core.validation import lines_from
from reference_scheduler.gateway.capacity import from_profile
from reference_scheduler.scheduler.config import SchedulerConfigError
from reference_scheduler.server.config import ServerConfig, ServerSpec, parse_server_config

# What "saturated" reads on each engine's /metrics (names checked against the fixtures in
# tests/fixtures/engines/*.prom): (queue length, KV usage in [0, 1] or None).
SATURATION_SERIES: dict[str, tuple[str, str | None]] = {
    "vllm": ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
    "sglang": ("sglang:num_queue_reqs", "sglang:token_usage"),
    "tgi": ("tgi_queue_size", None),
}


class UpstreamSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    url: str = Field(min_length=1)
    name: str | None = Field(None, min_length=1, max_length=64)
    engine: Literal["vllm", "sglang", "tgi", "none"] = "vllm"
    model: str | None = None
    api_key: SecretStr | None = None
    api_key_env: str | None = Field(None, min_length=1)
    max_inflight: int = Field(64, ge=1, le=1_000_000)
    max_inflight_tokens: int | None = Field(None, ge=1)
    priority_field: bool = False
    max_waiting: int = Field(0, ge=0)
    max_kv_usage: float = Field(0.95, gt=0, le=1, allow_inf_nan=False)
    max_num_seqs: int | None = Field(None, ge=1, le=1_000_000)
    kv_cache_tokens: int | None = Field(None, ge=1)
    profile: str | None = Field(None, min_length=1)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or "@" in value:
            raise ValueError("must be http(s)://host:port with no credentials (use api_key)")
        return value.rstrip("/")

    def key(self) -> str | None:
        """The upstream's API key (from the file or the named environment variable)."""
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_env is not None:
            return os.environ.get(self.api_key_env) or None
        return None


class DispatchSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    scrape_interval_s: float = Field(1.0, gt=0, allow_inf_nan=False)
    stale_after_s: float = Field(5.0, gt=0, allow_inf_nan=False)
    probe_interval_s: float = Field(1.0, gt=0, allow_inf_nan=False)
    fail_after: int = Field(2, ge=1)
    connect_timeout_s: float = Field(2.0, gt=0, allow_inf_nan=False)
    first_byte_timeout_s: float = Field(120.0, gt=0, allow_inf_nan=False)
    idle_timeout_s: float = Field(60.0, gt=0, allow_inf_nan=False)
    total_timeout_s: float = Field(600.0, gt=0, allow_inf_nan=False)
    queue_timeout_s: float = Field(5.0, gt=0, allow_inf_nan=False)


class GatewaySpec(ServerSpec):
    upstreams: list[UpstreamSpec] = Field(min_length=1)
    dispatch: DispatchSpec = Field(default_factory=DispatchSpec)
    tokenizer: str = Field("estimate", min_length=1)
    default_max_tokens: int = Field(1024, ge=1)


class GatewayConfig:
    """A validated gateway file: the server's tenancy and scheduler, plus the upstream pool."""

    def __init__(self, spec: GatewaySpec, server: ServerConfig) -> None:
        self.spec = spec
        self.server = server
        self.upstreams = spec.upstreams
        self.dispatch = spec.dispatch

    def upstream_name(self, index: int) -> str:
        return self.upstreams[index].name or f"u{index}"


def parse_gateway_config(data: Any) -> GatewayConfig:
    """One line per problem (`field.path: what is wrong`), as SchedulerConfigError."""
    data = data or {}
    if not isinstance(data, dict):
        raise SchedulerConfigError(["the file must be a mapping (upstreams:, tenants:, ...)"])
    try:
        spec = GatewaySpec.model_validate(data)
    except ValidationError as error:
        raise SchedulerConfigError(lines_from(error)) from None
    server = parse_server_config({k: v for k, v in data.items() if k in ServerSpec.model_fields})
    problems = []
    pre = server.scheduler.spec.preemption
    if pre is not None and pre.mode != "none":
        problems.append(
            "scheduler.preemption.mode: the gateway cannot preempt a request running on an "
            "upstream; use none (set the engine's own priority scheduling instead)"
        )
    for i, up in enumerate(spec.upstreams):
        if up.api_key_env is not None and not os.environ.get(up.api_key_env):
            problems.append(f"upstreams[{i}].api_key_env: environment variable is not set")
        if up.profile is not None:
            try:
                from_profile(up.profile)
            except ValueError as error:
                problems.append(
                    f"upstreams[{i}].profile: {error}; name a `fairbench profile` YAML or a "
                    "shipped profile, or give max_num_seqs and kv_cache_tokens instead"
                )
    if spec.tokenizer not in ("estimate", "upstream"):
        try:
            from tokenizers import Tokenizer

            Tokenizer.from_file(spec.tokenizer)
        except Exception:  # any unreadable file gets the same answer
            problems.append(
                f"tokenizer: cannot read a tokenizer.json at {spec.tokenizer!r}; use estimate, "
                "upstream (the engine's /tokenize) or the path of a tokenizer.json"
            )
    if spec.default_max_tokens > server.spec.max_tokens_limit:
        problems.append(
            f"default_max_tokens: {spec.default_max_tokens} is above max_tokens_limit "
            f"({server.spec.max_tokens_limit}); lower it or raise the limit"
        )
    names = [spec_.name or f"u{i}" for i, spec_ in enumerate(spec.upstreams)]
    if len(names) != len(set(names)):
        problems.append("upstreams: two upstreams share a name")
    if problems:
        raise SchedulerConfigError(problems)
    return GatewayConfig(spec, server)


def load_gateway_config(path: str | Path) -> GatewayConfig:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise SchedulerConfigError([f"{where}not valid YAML"]) from None
    return parse_gateway_config(data)
