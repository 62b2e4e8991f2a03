"""The scenario format's models: workloads, tenants, arrivals, SLO classes, run, target.

Field-level validation is pydantic's (and gives the JSON Schema); the rules across fields live
in fairbench.workload.checks and the reading of files in fairbench.workload.loading. Imports
only fairbench.workload's unit field types.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from fairbench.workload.unit_fields import (
    Finite,
    NonNegRate,
    NonNegSeconds,
    PositiveRate,
    PositiveSeconds,
    Seconds,
    _OrCount,
)


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
    across_tenants: bool = Field(
        True,
        description="true: every tenant of this workload draws from the same prefixes (one "
        "shared system prompt per group); false: each tenant has groups of its own text",
    )


class ConstantTime(_Model):
    dist: Literal["constant"]
    value: NonNegSeconds


class ExponentialTime(_Model):
    dist: Literal["exponential"]
    mean: PositiveSeconds


class UniformTime(_Model):
    """Seconds uniform on [low, high]."""

    dist: Literal["uniform"]
    low: NonNegSeconds
    high: NonNegSeconds

    @model_validator(mode="after")
    def _order(self) -> UniformTime:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


TimeDist = Annotated[ConstantTime | ExponentialTime | UniformTime, Field(discriminator="dist")]


class FanOut(_Model):
    """Every `every`-th step of an agent is `k` model calls sent at once; the next step waits
    for all k (the join)."""

    every: int = Field(ge=2, le=1_000_000, description="step numbers divisible by this fan out")
    k: int = Field(ge=2, le=1024, description="parallel calls in a fan-out step")


class Agent(_Model):
    """An agentic chain (fairbench.workload.sessions): `steps` model calls in sequence, each
    sent `tool_time` after the previous step's calls all returned (a tool ran meanwhile); its
    prompt is the chain so far plus the step's new text (the workload's `prompt_tokens`, e.g. a
    tool's result). With `fan_out`, some steps are k parallel calls, joined."""

    steps: LengthDist
    tool_time: TimeDist = Field(
        default_factory=lambda: ConstantTime(dist="constant", value=0.0),
        description="after a step's calls all returned, before the next step is sent",
    )
    fan_out: FanOut | None = None


class Session(_Model):
    """A workload whose requests are conversations (fairbench.workload.sessions): the arrival
    process is of sessions; each has `turns` turns, turn k+1 sent `think_time` after turn k
    completed, its prompt the conversation so far (earlier prompts and outputs) plus the new
    user text (the workload's `prompt_tokens`). Past `context_limit` prompt tokens the oldest
    are dropped (vLLM's `truncate_prompt_tokens`: the last `context_limit` tokens are kept).
    With `agent` instead of `turns`, the session is an agentic chain of steps."""

    turns: LengthDist | None = None
    agent: Agent | None = None
    think_time: TimeDist = Field(
        default_factory=lambda: ConstantTime(dist="constant", value=0.0),
        description="after a turn completes, before the next is due",
    )
    context_limit: int | None = Field(
        None, ge=1, description="most prompt tokens sent; older ones are dropped"
    )


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
    session: Session | None = Field(None, description="multi-turn conversations")


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
    format: Literal["mooncake", "azure", "burstgpt", "conversation", "bailian"]
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
    sessions: bool | None = Field(
        None,
        description="replay each conversation's rows as one session (docs/sessions.md); "
        "default: true for formats conversation and bailian, false otherwise; burstgpt needs "
        "v2.0's Session ID column",
    )
    context_limit: int | None = Field(
        None,
        ge=1,
        description="with sessions: the most prompt tokens a turn sends; past it the oldest are "
        "dropped and the last context_limit kept (vLLM's truncate_prompt_tokens), as a "
        "workload's session.context_limit does",
    )
    turn_input: Literal["new", "whole"] | None = Field(
        None,
        description="with sessions: a row's input tokens are the turn's new text, or its "
        "whole prompt (the conversation so far included); default: whole for bailian, new "
        "otherwise",
    )

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
    cache_salt: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="vLLM's cache_salt, sent with each request and honoured by the simulator: "
        "mixed into the first prompt block's hash, so tenants of different salts never share "
        "a cached block",
    )
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
    max_num_seqs: int | None = Field(
        None, ge=1, le=1_000_000, description="its capacity in sequences, counted by the gateway"
    )
    kv_cache_tokens: int | None = Field(None, ge=1, description="its KV capacity in tokens")
    profile: str | None = Field(
        None, min_length=1, description="a cost profile (YAML path or name) giving both"
    )


class GatewayDispatch(_Model):
    """`target.dispatch`: the gateway file's `dispatch:` block (`DispatchSpec`), in seconds."""

    scrape_interval_s: Finite = Field(1.0, gt=0)
    stale_after_s: Finite = Field(5.0, gt=0)
    probe_interval_s: Finite = Field(1.0, gt=0)
    fail_after: int = Field(2, ge=1)
    connect_timeout_s: Finite = Field(2.0, gt=0)
    first_byte_timeout_s: Finite = Field(120.0, gt=0)
    idle_timeout_s: Finite = Field(60.0, gt=0)
    total_timeout_s: Finite = Field(600.0, gt=0)
    queue_timeout_s: Finite = Field(5.0, gt=0)


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


class AnalysisSpec(_Model):
    """What the analysis adds beyond the records (fairbench.analysis.isolation)."""

    isolation: Literal["auto", "on", "off"] = Field(
        "auto",
        description="isolation's solo arms (one more simulation per tenant, of its requests "
        "alone; sim targets only): `on` runs them, `off` skips them, `auto` runs them up to "
        "100,000 planned requests; the summary says when they were skipped",
    )


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
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)

    def slo_class_of(self, tenant: Tenant, workload: str) -> str:
        return self.workloads[workload].slo_class or tenant.slo_class

    def mix_of(self, tenant: Tenant) -> dict[str, float]:
        return {tenant.mix: 1.0} if isinstance(tenant.mix, str) else dict(tenant.mix)


# Targets reached over HTTP at a URL the user gives: a `reference` target starts its own server
