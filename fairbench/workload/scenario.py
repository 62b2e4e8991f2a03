"""The scenario file: a whole multi-tenant experiment as YAML, validated before anything runs.

Validation is pydantic (it also gives us the JSON Schema editors autocomplete against); what
users see is not pydantic's report but one line per problem, `field.path: what is wrong (what is
allowed)`, raised as `ScenarioError` and printed by the CLI without a traceback. Cross-field
rules (a tenant's mix names a defined workload, a trace tenant names a defined trace, …) are
checked after the field-level pass so that they can name the exact field too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from fairbench.workload.units import (
    _DURATION_UNITS,
    _NUMBER,
    _RATE_UNITS,
    parse_duration,
    parse_rate,
)
from reference_scheduler.core.validation import lines_from


class ScenarioError(Exception):
    """A scenario that cannot be used. `lines` holds one `path: problem` line per problem."""

    def __init__(self, lines: list[str], source: str | None = None) -> None:
        self.lines = lines
        self.source = source
        prefix = f"{source}: " if source else ""
        super().__init__("\n".join(prefix + line for line in lines))


def _any_case(unit: str) -> str:
    """A regex for `unit` in any case the parser folds to it (it lower-cases its input first).

    Spelled with character classes, not a flag: JSON Schema patterns are ECMA-262 regexes,
    which have no inline `(?i)`."""
    out = []
    for char in unit:
        forms = sorted({c for c in (char, char.upper()) if len(c) == 1 and c.lower() == char})
        out.append(re.escape(forms[0]) if len(forms) == 1 else f"[{''.join(forms)}]")
    return "".join(out)


def _units_alternation(units: dict[str, float]) -> str:
    return "(?:" + "|".join(_any_case(u) for u in sorted(units, key=lambda u: (-len(u), u))) + ")"


# The JSON Schema's patterns for human units, built from fairbench.workload.units' own tables so
# that a unit added there reaches the schema too; tests/test_schema.py checks that they accept
# what the parsers accept. `\d` becomes [0-9]: ECMA-262 and Python disagree on non-ASCII digits.
_SCHEMA_NUMBER = _NUMBER.replace(r"\d", "[0-9]")
DURATION_PATTERN = rf"^\s*{_SCHEMA_NUMBER}\s*{_units_alternation(_DURATION_UNITS)}?\s*$"
RATE_PATTERN = rf"^\s*{_SCHEMA_NUMBER}\s*(?:/\s*{_units_alternation(_RATE_UNITS)}\s*)?$"


@dataclass(frozen=True)
class _OrString:
    """JSON Schema of a number that may also be written as a string in human units.

    pydantic only sees the float the parser returns, so left alone it would tell editors that
    `rate: 6/s` is not a number."""

    pattern: str
    examples: tuple[str, ...]

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        as_string = {"type": "string", "pattern": self.pattern, "examples": list(self.examples)}
        return {"anyOf": [handler(core_schema), as_string]}


@dataclass(frozen=True)
class _OrCount:
    """JSON Schema of a length distribution that may also be a bare token count (`80`)."""

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"anyOf": [{"type": "integer", "minimum": 0}, handler(core_schema)]}


Seconds = Annotated[
    float,
    BeforeValidator(parse_duration),
    _OrString(DURATION_PATTERN, ("300ms", "2s", "1.5min")),
]
PerSecond = Annotated[
    float, BeforeValidator(parse_rate), _OrString(RATE_PATTERN, ("6/s", "20/min"))
]
PositiveSeconds = Annotated[Seconds, Field(gt=0)]
NonNegSeconds = Annotated[Seconds, Field(ge=0)]
PositiveRate = Annotated[PerSecond, Field(gt=0)]
NonNegRate = Annotated[PerSecond, Field(ge=0)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- length distributions


class _Dist(_Model):
    min: int = Field(1, ge=0, description="samples are clipped to at least this")
    max: int = Field(1_000_000, ge=0, description="samples are clipped to at most this")

    @model_validator(mode="after")
    def _bounds(self) -> _Dist:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class ConstantDist(_Dist):
    dist: Literal["constant"]
    value: int = Field(ge=0)
    min: int = Field(0, ge=0)


class UniformDist(_Dist):
    """Integers uniform on [low, high], both ends included."""

    dist: Literal["uniform"]
    low: int = Field(ge=0)
    high: int = Field(ge=0)

    @model_validator(mode="after")
    def _order(self) -> UniformDist:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class NormalDist(_Dist):
    dist: Literal["normal"]
    mean: Finite = Field(gt=0)
    std: Finite = Field(ge=0)


class LogNormalDist(_Dist):
    """Given by its median and p99, the two numbers people know about their prompts."""

    dist: Literal["lognormal"]
    median: Finite = Field(gt=0)
    p99: Finite = Field(gt=0)

    @model_validator(mode="after")
    def _order(self) -> LogNormalDist:
        if self.p99 < self.median:
            raise ValueError(f"p99 ({self.p99}) must be >= median ({self.median})")
        return self


class ExponentialDist(_Dist):
    dist: Literal["exponential"]
    mean: Finite = Field(gt=0)


class EmpiricalDist(_Dist):
    """A discrete distribution; two values make the classic two-point (bimodal) case."""

    dist: Literal["empirical"]
    values: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    weights: list[Annotated[Finite, Field(ge=0)]] | None = None

    @model_validator(mode="after")
    def _weights(self) -> EmpiricalDist:
        if self.weights is not None:
            if len(self.weights) != len(self.values):
                raise ValueError(
                    f"weights has {len(self.weights)} entries but values has {len(self.values)}"
                )
            if sum(self.weights) <= 0:
                raise ValueError("weights must not all be 0")
        return self


def _dist_shorthand(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return {"dist": "constant", "value": value}
    return value


LengthDist = Annotated[
    ConstantDist | UniformDist | NormalDist | LogNormalDist | ExponentialDist | EmpiricalDist,
    Field(discriminator="dist"),
    BeforeValidator(_dist_shorthand),
    _OrCount(),
]


class Prefix(_Model):
    """Shared prompt prefixes, so that prefix caching matters: `groups` distinct prefixes of
    `tokens` tokens, chosen with Zipf popularity P(g) ∝ 1/(g+1)^zipf by a `share` of requests."""

    groups: int = Field(ge=1, le=1_000_000)
    tokens: int = Field(ge=1)
    zipf: Finite = Field(1.0, ge=0)
    share: Finite = Field(1.0, ge=0, le=1)


class Workload(_Model):
    endpoint: Literal["chat", "completions", "embeddings"] = "chat"
    stream: bool | None = Field(None, description="default: true, false for embeddings")
    prompt_tokens: LengthDist
    output_tokens: LengthDist | None = Field(
        None, description="default: constant 128; embeddings produce no output tokens"
    )
    prefix: Prefix | None = None
    slo_class: str | None = Field(None, description="overrides the tenant's class")
    model: str | None = None


# ---------------------------------------------------------------- arrival processes


class ConstantArrival(_Model):
    """Exactly equal gaps of 1/rate."""

    process: Literal["constant"]
    rate: PositiveRate


class PoissonArrival(_Model):
    process: Literal["poisson"]
    rate: PositiveRate


class GammaArrival(_Model):
    """Gamma renewal process: inter-arrival CV `cv` (1 is Poisson, > 1 bursty)."""

    process: Literal["gamma"]
    rate: PositiveRate
    cv: Finite = Field(gt=0)


class OnOffArrival(_Model):
    """`rate` during `on` periods, silence during `off` periods, starting with `on`."""

    process: Literal["onoff"]
    rate: PositiveRate
    on: PositiveSeconds
    off: PositiveSeconds
    within: Literal["poisson", "constant"] = "poisson"


class RampArrival(_Model):
    """Poisson arrivals whose rate goes linearly from `start_rate` to `end_rate` over `over`,
    then stays at `end_rate`."""

    process: Literal["ramp"]
    start_rate: NonNegRate
    end_rate: NonNegRate
    over: PositiveSeconds

    @model_validator(mode="after")
    def _some_rate(self) -> RampArrival:
        if self.start_rate == 0 and self.end_rate == 0:
            raise ValueError("start_rate and end_rate cannot both be 0")
        return self


class TraceArrival(_Model):
    """Rows of a trace declared under `traces:`; `share` picks this tenant's part of a shared
    trace (see the trace's `split`)."""

    process: Literal["trace"]
    trace: str
    share: Finite | None = Field(None, gt=0)


Arrival = Annotated[
    ConstantArrival | PoissonArrival | GammaArrival | OnOffArrival | RampArrival | TraceArrival,
    Field(discriminator="process"),
]


class Phase(_Model):
    """Between `start` and `end` the tenant's rate is multiplied by `multiplier`."""

    start: NonNegSeconds
    end: PositiveSeconds
    multiplier: Finite = Field(ge=0)

    @model_validator(mode="after")
    def _order(self) -> Phase:
        if self.end <= self.start:
            raise ValueError(f"end ({self.end}s) must be after start ({self.start}s)")
        return self


class TraceSpec(_Model):
    format: Literal["mooncake", "azure", "burstgpt"]
    path: str = Field(description="relative to the scenario file")
    time_scale: Finite = Field(1.0, gt=0, description="2 replays twice as slow")
    start: NonNegSeconds = Field(0.0, description="window start, trace time")
    end: Seconds | None = Field(None, gt=0, description="window end, trace time")
    spread: Literal["none", "auto"] | Seconds = Field(
        "none",
        description="spread rows sharing a timestamp over this tick ('auto' detects it)",
    )
    split: Literal["shares", "hash"] = Field(
        "shares",
        description="how rows go to the tenants naming this trace: seeded draw by share, "
        "or a stable hash of the row's leading split_depth block ids (rows sharing that "
        "prefix stay with one tenant; rows without ids hash their row number)",
    )
    split_depth: int = Field(2, ge=1, description="prefix blocks that key a hash split")
    block_tokens: int = Field(512, ge=1, description="tokens per hash id (Mooncake: 512)")

    @field_validator("spread")
    @classmethod
    def _spread_positive(cls, value: object) -> object:
        if isinstance(value, float) and value <= 0:
            raise ValueError("a spread tick must be > 0")
        return value


# ---------------------------------------------------------------- tenants, classes, run


class SLOClass(_Model):
    ttft: PositiveSeconds | None = None
    tpot: PositiveSeconds | None = None
    e2e: PositiveSeconds | None = None
    percentile: Finite = Field(99.0, gt=0, lt=100)
    priority: int = Field(0, description="lower is more urgent (for priority policies)")


DEFAULT_SLO_CLASSES: dict[str, SLOClass] = {
    "interactive": SLOClass(ttft=0.3, tpot=0.05, priority=0),
    "batch": SLOClass(ttft=2.0, priority=1),
    "best-effort": SLOClass(priority=2),
}


class Tenant(_Model):
    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    weight: Finite = Field(1.0, gt=0)
    slo_class: str = "interactive"
    api_key: str | None = None
    headers: dict[str, str] = Field(default_factory=dict, description="extra HTTP headers")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="extra body fields")
    mix: dict[str, Annotated[Finite, Field(ge=0)]] | str
    arrival: Arrival
    phases: list[Phase] = Field(default_factory=list)


class RunSpec(_Model):
    duration: PositiveSeconds | None = None
    requests: int | None = Field(None, ge=1, le=100_000_000)
    warmup: NonNegSeconds = 0.0
    cooldown: NonNegSeconds = 0.0
    seed: int = Field(0, ge=0, le=2**63 - 1)
    timeout: PositiveSeconds = Field(600.0, description="per request, from its intended time")
    grace: NonNegSeconds = Field(30.0, description="after the last send, before cancelling")
    max_unfinished: float = Field(
        0.01,
        ge=0.0,
        le=1.0,
        description="the share of the measurement window's requests that may time out or be "
        "cancelled before the run says its tail is censored",
    )
    pacing: Literal["auto", "timerfd", "spin"] = Field(
        "auto",
        description="how the generator waits for a send time: `timerfd` sleeps in the kernel "
        "until the deadline (no CPU while waiting; Linux), `spin` sleeps to within 1.2 ms and "
        "spins the rest (a core's worth at high rates), `auto` timerfd where there is one",
    )
    concurrency_cap: int | None = Field(
        None,
        ge=1,
        description="closed-loop experiments only: at most this many in flight; the "
        "run is then reported as closed-loop and the waiting is recorded",
    )


class PrioritySpec(_Model):
    """The engine's per-request priority field, set from the request's SLO class or tenant.

    Values are sent as written. vLLM runs lower values first (and only with
    `--scheduling-policy priority`); SGLang runs higher values first unless started with
    `--schedule-low-priority-values-first` (and only with `--enable-priority-scheduling`)."""

    by: Literal["slo_class", "tenant"] = "slo_class"
    values: dict[str, int] = Field(min_length=1)
    default: int | None = Field(None, description="for classes/tenants not in values")


class GatewayUpstream(_Model):
    """One engine behind the gateway (`target.upstreams`): the fields of the gateway file's
    `upstreams:` entries (reference_scheduler/gateway/config.py, `UpstreamSpec`), same names,
    same defaults, so a block moves between the two files unchanged (tests/test_gateway_target.py
    keeps them equal). Kept here, not imported, so that loading a scenario does not load the
    gateway's HTTP stack."""

    url: str = Field(min_length=1, description="the engine's root URL, e.g. http://10.0.0.5:8000")
    name: str | None = Field(
        None, min_length=1, max_length=64, description="its `upstream` label (default u<index>)"
    )
    engine: Literal["vllm", "sglang", "tgi", "none"] = Field(
        "vllm", description="which saturation series its /metrics has (none: do not scrape)"
    )
    model: str | None = Field(None, description="the name it serves (default: target.model)")
    api_key: str | None = None
    api_key_env: str | None = Field(None, min_length=1, description="its key, from this variable")
    max_inflight: int = Field(64, ge=1, le=1_000_000, description="requests in flight to it")
    max_inflight_tokens: int | None = Field(None, ge=1)
    priority_field: bool = Field(False, description="send the tier's rank as `priority`")
    max_waiting: int = Field(0, ge=0, description="saturated while its queue holds more")
    max_kv_usage: Finite = Field(0.95, gt=0, le=1, description="... or its KV cache is this full")


class GatewayDispatch(_Model):
    """`target.dispatch`: the gateway file's `dispatch:` block (`DispatchSpec`), in seconds."""

    scrape_interval_s: Finite = Field(1.0, gt=0)
    stale_after_s: Finite = Field(5.0, gt=0)
    probe_interval_s: Finite = Field(1.0, gt=0)
    fail_after: int = Field(2, ge=1)
    connect_timeout_s: Finite = Field(2.0, gt=0)
    first_byte_timeout_s: Finite = Field(120.0, gt=0)
    idle_timeout_s: Finite = Field(60.0, gt=0)


class TargetSpec(_Model):
    """What to run against. `reference` (default) is the bundled scheduler's HTTP server (with
    `upstreams`, the same scheduler as a gateway in front of real engines); `sim` the same
    scheduler in virtual time; `openai` any OpenAI-compatible server; `vllm`, `sglang`
    and `tgi` those engines, with their priority fields, tokenizers and metrics (docs/engines.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["reference", "sim", "openai", "vllm", "sglang", "tgi"] = "reference"
    base_url: str | None = None
    model: str | None = None
    api: Literal["openai", "native"] = Field(
        "openai",
        description="sglang/tgi: `native` uses SGLang's /generate or TGI's /generate_stream",
    )
    api_key: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    class_extra_body: dict[str, dict[str, Any]] = Field(default_factory=dict)
    ignore_eos: bool = True
    priority: PrioritySpec | None = None
    calibrate: bool = Field(
        True,
        description="vllm/sglang/tgi: render prompts so the server's tokenizer counts exactly "
        "the planned prompt tokens (from its /tokenize, or `tokenizer`)",
    )
    tokenizer: str | None = Field(
        None, description="a tokenizer.json to count tokens with, instead of the server's"
    )
    ca_bundle: str | None = Field(
        None,
        description="https: a PEM file of the CA(s) to trust instead of the system's "
        "(a private CA); certificates are always verified",
    )
    metrics_url: str | None = Field(None, description="default: base_url + /metrics")
    scrape_interval: PositiveSeconds = Field(1.0, description="server metrics, live runs")
    faults: dict[str, Any] | None = Field(
        None,
        description="reference target only: failures to inject (see reference_scheduler/faults.py)",
    )
    upstreams: list[GatewayUpstream] | None = Field(
        None,
        min_length=1,
        description="reference target only: run the scheduler as a gateway in front of these "
        "engines instead of on its simulated GPU (docs/gateway.md)",
    )
    dispatch: GatewayDispatch | None = Field(
        None, description="with upstreams: the gateway's scrape, probe and timeout settings"
    )


class HealthSpec(_Model):
    max_send_lag_p99: PositiveSeconds = Field(0.005, description="above this the run is INVALID")
    max_receive_error_p99: PositiveSeconds = Field(
        0.001,
        description="how far the generator's late reads can have moved first-token stamps "
        "(0 when a token's bytes were the newest of their read, which the kernel stamped on "
        "arrival): above this p99 the run is INVALID; judged where there are kernel stamps",
    )
    min_rate_ratio: Finite = Field(0.99, gt=0, le=1)


class Scenario(_Model):
    name: str = Field("scenario", pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    slo_classes: dict[str, SLOClass] = Field(default_factory=lambda: dict(DEFAULT_SLO_CLASSES))
    workloads: dict[str, Workload] = Field(min_length=1)
    tenants: list[Tenant] = Field(min_length=1)
    traces: dict[str, TraceSpec] = Field(default_factory=dict)
    run: RunSpec = Field(default_factory=RunSpec)
    target: TargetSpec = Field(default_factory=TargetSpec)
    scheduler: dict[str, Any] = Field(default_factory=dict)
    health: HealthSpec = Field(default_factory=HealthSpec)

    def slo_class_of(self, tenant: Tenant, workload: str) -> str:
        return self.workloads[workload].slo_class or tenant.slo_class

    def mix_of(self, tenant: Tenant) -> dict[str, float]:
        return {tenant.mix: 1.0} if isinstance(tenant.mix, str) else dict(tenant.mix)


# Targets reached over HTTP at a URL the user gives: a `reference` target starts its own server
# (unless --target-url points at one) and `sim` has no server at all.
URL_KINDS = ("openai", "vllm", "sglang", "tgi")
_URL_EXAMPLE = "http://127.0.0.1:8000"


def url_problem(url: str, base: bool = True) -> str | None:
    """What is wrong with a server URL, or None: it must be http(s)://host[:port][/path], and
    a `base` URL (paths are appended to it) has no query or fragment."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError:
        return f"not a URL with a valid port (like {_URL_EXAMPLE}), got {url!r}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http:// or https:// URL with a host, like {_URL_EXAMPLE}; got {url!r}"
    if base and (parts.query or parts.fragment):
        return f"must be the server's base URL, without ?query or #fragment; got {url!r}"
    return None


def target_url(scn: Scenario, override: str | None = None) -> str | None:
    """The URL a live run sends to: `override` (`fairbench run --target-url`), else
    `target.base_url`; None where fairbench provides the server (`reference` without an
    override) or there is none (`sim`). An openai/vllm/sglang/tgi target with neither is a
    scenario error, raised here rather than at load time because the URL may come from the
    command line."""
    if scn.target.kind == "sim":
        return None
    if override is not None:
        problem = url_problem(override)
        if problem is not None:
            raise ScenarioError([f"--target-url: {problem}"])
        return override
    if scn.target.kind in URL_KINDS and not scn.target.base_url:
        raise ScenarioError(
            [
                f"target.base_url: a target of kind {scn.target.kind!r} needs the server's "
                f"URL; set target.base_url (e.g. {_URL_EXAMPLE}) or pass fairbench run "
                "--target-url URL"
            ]
        )
    return scn.target.base_url if scn.target.kind in URL_KINDS else None


def _check_target(scn: Scenario) -> list[str]:
    t = scn.target
    problems: list[str] = []
    for name in ("base_url", "metrics_url"):
        url = getattr(t, name)
        problem = None if url is None else url_problem(url, base=name == "base_url")
        if problem is not None:
            problems.append(f"target.{name}: {problem}")
    if t.api == "native" and t.kind not in ("sglang", "tgi"):
        problems.append(
            f"target.api: 'native' is for sglang (/generate) and tgi (/generate_stream); "
            f"a {t.kind} target speaks 'openai'"
        )
    if t.priority is not None:
        if t.kind not in ("vllm", "sglang"):
            why = (
                "TGI has no per-request priority (it serves first come, first served)"
                if t.kind == "tgi"
                else f"a {t.kind} target has no engine priority field"
            )
            problems.append(f"target.priority: {why}; remove it, or use class_extra_body")
        else:
            known = (
                set(scn.slo_classes)
                if t.priority.by == "slo_class"
                else {x.id for x in scn.tenants}
            )
            for name in sorted(set(t.priority.values) - known):
                problems.append(
                    f"target.priority.values: unknown {t.priority.by} {name!r}; "
                    f"defined: {sorted(known)}"
                )
    if t.faults is not None and t.kind != "reference":
        problems.append("target.faults: faults are injected by the reference server only")
    return problems + _check_upstreams(scn)


def _check_upstreams(scn: Scenario) -> list[str]:
    """`target.upstreams`: what the gateway itself would refuse, said here with the scenario's
    field paths, so that `fairbench validate` catches it and a run never starts a gateway that
    exits. What depends on this machine (an `api_key_env` that is set, an engine that answers)
    is the pre-run check's (fairbench.targets.precheck): a run directory's scenario.yaml must
    load anywhere."""
    t = scn.target
    if t.upstreams is None:
        if t.dispatch is not None:
            return ["target.dispatch: only with target.upstreams (the gateway's settings)"]
        return []
    if t.kind != "reference":
        return [
            f"target.upstreams: only kind reference runs the gateway; kind {t.kind!r} sends to "
            "target.base_url (use kind: reference, or remove upstreams)"
        ]
    problems: list[str] = []
    if t.faults is not None:
        problems.append(
            "target.faults: the gateway injects no faults (the simulated engine does); remove "
            "faults, or inject them at the upstreams"
        )
    names: dict[str, int] = {}
    for i, up in enumerate(t.upstreams):
        at = f"target.upstreams[{i}]"
        problem = url_problem(up.url)
        if problem is None and "@" in urlsplit(up.url).netloc:
            problem = "no credentials in the URL (not echoed here); use api_key or api_key_env"
        if problem is None and urlsplit(up.url).path.rstrip("/").endswith("/v1"):
            problem = f"the engine's root URL, without /v1 (the gateway adds it); got {up.url!r}"
        if problem is not None:
            problems.append(f"{at}.url: {problem}")
        if up.api_key is not None and up.api_key_env is not None:
            problems.append(f"{at}.api_key: give api_key or api_key_env, not both")
        name = up.name or f"u{i}"
        if name in names:
            problems.append(f"{at}.name: {name!r} is also upstreams[{names[name]}]'s name")
        names.setdefault(name, i)
    preemption = scn.scheduler.get("preemption")
    mode = preemption.get("mode", "none") if isinstance(preemption, dict) else None
    if mode not in (None, "none"):
        problems.append(
            "scheduler.preemption.mode: the gateway cannot preempt a request running on an "
            "upstream (its work would be lost); use none, and the engine's own priority "
            "scheduling (upstreams' priority_field)"
        )
    return problems


def _cross_check(scn: Scenario) -> list[str]:
    problems: list[str] = _check_target(scn)
    seen: set[str] = set()
    trace_users: dict[str, list[int]] = {}
    for i, tenant in enumerate(scn.tenants):
        at = f"tenants[{i}]"
        if tenant.id in seen:
            problems.append(f"{at}.id: duplicate tenant id {tenant.id!r}; ids must be unique")
        seen.add(tenant.id)
        if tenant.slo_class not in scn.slo_classes:
            problems.append(
                f"{at}.slo_class: unknown class {tenant.slo_class!r}; "
                f"defined: {sorted(scn.slo_classes)}"
            )
        mix = scn.mix_of(tenant)
        for name in mix:
            if name not in scn.workloads:
                problems.append(
                    f"{at}.mix: unknown workload {name!r}; defined: {sorted(scn.workloads)}"
                )
        if not mix or sum(mix.values()) <= 0 or not all(math.isfinite(v) for v in mix.values()):
            problems.append(f"{at}.mix: needs at least one workload with a weight > 0")
        if isinstance(tenant.arrival, TraceArrival):
            if tenant.arrival.trace not in scn.traces:
                problems.append(
                    f"{at}.arrival.trace: unknown trace {tenant.arrival.trace!r}; "
                    f"defined under traces: {sorted(scn.traces)}"
                )
            else:
                trace_users.setdefault(tenant.arrival.trace, []).append(i)
            if tenant.phases:
                problems.append(
                    f"{at}.phases: a trace replay has no rate to change; remove phases "
                    "(use the trace's time_scale or window instead)"
                )
        for j, phase in enumerate(tenant.phases):
            if scn.run.duration is not None and phase.start >= scn.run.duration:
                problems.append(
                    f"{at}.phases[{j}].start: {phase.start}s is past run.duration "
                    f"({scn.run.duration}s)"
                )
    for name, users in trace_users.items():
        if len(users) > 1:
            for i in users:
                if scn.tenants[i].arrival.share is None:  # type: ignore[union-attr]
                    problems.append(
                        f"tenants[{i}].arrival.share: trace {name!r} is shared by "
                        f"{len(users)} tenants; give each a share"
                    )
    for name, wl in scn.workloads.items():
        at = f"workloads.{name}"
        if wl.slo_class is not None and wl.slo_class not in scn.slo_classes:
            problems.append(
                f"{at}.slo_class: unknown class {wl.slo_class!r}; "
                f"defined: {sorted(scn.slo_classes)}"
            )
        if wl.endpoint == "embeddings":
            if wl.stream:
                problems.append(f"{at}.stream: embeddings do not stream; remove it or set false")
            out = wl.output_tokens
            if out is not None and not (isinstance(out, ConstantDist) and out.value == 0):
                problems.append(
                    f"{at}.output_tokens: embeddings produce no output tokens; remove it"
                )
    all_trace = all(isinstance(t.arrival, TraceArrival) for t in scn.tenants)
    if scn.run.duration is None and scn.run.requests is None and not all_trace:
        problems.append(
            "run: needs duration (e.g. '60s') or requests (a count); only a pure trace replay "
            "can end on its own"
        )
    if scn.run.duration is not None and scn.run.warmup + scn.run.cooldown >= scn.run.duration:
        problems.append(
            f"run.warmup: warmup + cooldown ({scn.run.warmup + scn.run.cooldown}s) must be "
            f"shorter than run.duration ({scn.run.duration}s)"
        )
    return problems


def parse_scenario(
    data: object, source: str | None = None, base_dir: Path | None = None
) -> Scenario:
    """Validate an already-parsed YAML document. Trace paths are resolved against `base_dir`."""
    if not isinstance(data, dict):
        raise ScenarioError(
            [f"(top level): must be a mapping of fields, got {type(data).__name__}"], source
        )
    try:
        scn = Scenario.model_validate(data)
    except ValidationError as error:
        raise ScenarioError(lines_from(error), source) from None
    problems = _cross_check(scn)
    if scn.scheduler:
        problems += _check_scheduler_block(scn.scheduler)
        if scn.scheduler.get("engine") == "vllm" and scn.target.kind != "sim":
            problems.append(
                "scheduler.engine: 'vllm' is vLLM's scheduler simulated in virtual time; use "
                "target: {kind: sim}, or target: {kind: vllm} for a real vLLM"
            )
    if scn.target.faults is not None:
        from reference_scheduler.server.faults import FaultSpec

        try:
            FaultSpec.model_validate(scn.target.faults)
        except ValidationError as error:
            problems += [f"target.faults.{line}" for line in lines_from(error)]
    tokenizer = scn.target.tokenizer
    if tokenizer is not None:
        path = Path(tokenizer) if base_dir is None else base_dir / tokenizer
        if not path.is_file():
            problems.append(f"target.tokenizer: no such file {str(path)!r}")
        else:
            target = scn.target.model_copy(update={"tokenizer": str(path.resolve())})
            scn = scn.model_copy(update={"target": target})
    if problems:
        raise ScenarioError(problems, source)
    if base_dir is not None and scn.traces:
        resolved = {
            name: spec.model_copy(update={"path": str((base_dir / spec.path).resolve())})
            if not Path(spec.path).is_absolute()
            else spec
            for name, spec in scn.traces.items()
        }
        scn = scn.model_copy(update={"traces": resolved})
    return scn


def _check_scheduler_block(block: dict[str, Any]) -> list[str]:
    """The `scheduler:` block belongs to the reference scheduler, which validates it itself."""
    from reference_scheduler.scheduler.config import SchedulerConfigError, parse_scheduler_config

    try:
        parse_scheduler_config(block)
    except SchedulerConfigError as error:
        return [
            f"scheduler.{line}" if not line.startswith("scheduler") else line
            for line in error.lines
        ]
    return []


class _Yaml12Loader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true/false. YAML 1.1 also reads on/off/yes/no as booleans, which
    would turn an on/off arrival's `on:` key into `True:`."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def read_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Yaml12Loader)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; raises ScenarioError with one line per problem."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(["file not found"], source) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ScenarioError([f"cannot read: {error}"], source) from None
    try:
        data = read_yaml(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ScenarioError([f"(yaml) {where}: {problem}"], source) from None
    return parse_scenario(data, source, path.parent)


# pydantic writes a bound it cannot push into a validator-wrapped float (the unit fields) under
# its own names; JSON Schema calls them these, and ignores the others without a word.
_BOUND_KEYWORDS = {
    "gt": "exclusiveMinimum",
    "ge": "minimum",
    "lt": "exclusiveMaximum",
    "le": "maximum",
}


def _standard(node: Any) -> Any:
    """The schema with pydantic's own keywords replaced by JSON Schema's (a copy)."""
    if isinstance(node, list):
        return [_standard(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: _standard(value)
        for key, value in node.items()
        # OpenAPI's `discriminator` (not JSON Schema): each branch's `const` tag already says it
        if not (key == "discriminator" and isinstance(value, dict) and "propertyName" in value)
    }
    bounds = {
        key: out.pop(key)
        for key in _BOUND_KEYWORDS
        if isinstance(out.get(key), int | float) and not isinstance(out.get(key), bool)
    }
    if bounds:
        _apply_bounds(out, bounds)
    return out


def _apply_bounds(node: dict[str, Any], bounds: dict[str, float]) -> None:
    """Put pydantic's bounds on the numeric branches: a string in human units carries no
    bound a pattern could check (`fairbench validate` checks its value)."""
    if node.get("type") in ("number", "integer"):
        node.update({_BOUND_KEYWORDS[key]: value for key, value in bounds.items()})
        return
    for branch in node.get("anyOf", []) + node.get("oneOf", []):
        if isinstance(branch, dict):
            _apply_bounds(branch, bounds)


def json_schema() -> dict[str, Any]:
    """The scenario format as a standard JSON Schema (draft 2020-12), for editors and CI.

    Human units are strings with a pattern (`300ms`, `6/s`), numbers stay numbers with their
    bounds, a length may be a bare token count, and the tagged unions are `oneOf`s whose
    branches each require their tag (`dist`, `process`) as a `const`. What the schema cannot
    say (cross-field rules, a unit string's range) `fairbench validate` still checks."""
    schema = _standard(Scenario.model_json_schema())
    schema["title"] = "fairbench scenario"
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
