"""The `scheduler:` block: one configuration for both the simulated and the served scheduler.

    scheduler:
      engine: reference            # reference (this package's policies) | vllm (vLLM V1's own)
      policy: dwrr                 # a policy, a preset, or {name: ..., options}
      profile: h100-llama3-8b      # a shipped profile, a YAML path, or inline coefficients
      replicas: 1                  # engine replicas behind the one global queue
      max_num_seqs: 256            # these four override the profile's engine defaults
      max_num_batched_tokens: 8192
      chunked_prefill: true
      kv_cache_tokens: 400000
      block_size: 16
      step_noise_cv: 0.0           # seeded lognormal noise on step times
      seed: 0
      admission: {max_queue: 5000, max_queue_per_tenant: 500, shed_best_effort_depth: 2000,
                  degrade_depth: 1000, degrade_max_tokens: 256}       # see admission.py
      prefix_cache: {blocks: 2048, protected_classes: [interactive]}  # see prefix_cache.py
      preemption: {mode: swap, swap_bandwidth_gbps: 50, budget: {count: 3, window_s: 60}}
      disaggregation: {prefill_replicas: 2, decode_replicas: 2,
                       kv_transfer: {bandwidth: 50GB/s, latency: 1ms,
                                     jitter: {dist: lognormal, median: 2ms, p99: 80ms}}}
      control: {congestion: {q_high: 200, actions: [degrade_max_tokens, reject_best_effort]},
                resource: {window: 30s, slo_min: 0.95}}            # see control.py

Validated up front; a problem is reported as `scheduler.<field>: ...` on one line. A setting
that is valid but makes a policy degenerate (see reference_scheduler.policies) is not an error;
it is a warning line in `SchedulerConfig.warnings`, which a run carries into its summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reference_scheduler.core.admission import AdmissionSpec
from reference_scheduler.core.costmodel import Profile, ProfileError, load_profile
from reference_scheduler.core.policy import Policy
from reference_scheduler.core.preemption import PreemptionSpec
from reference_scheduler.core.prefix_cache import PrefixCacheSpec
from reference_scheduler.core.validation import lines_from
from reference_scheduler.policies import PRESETS, PolicySpecError, policy_factory, pool_of
from reference_scheduler.scheduler.control import ControlSpec
from reference_scheduler.scheduler.disaggregation import DisaggregationSpec


class SchedulerConfigError(Exception):
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__("\n".join(lines))


class SchedulerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal["reference", "vllm"] = "reference"
    policy: str | dict[str, Any] = "dwrr"
    profile: str | dict[str, Any] = "h100-llama3-8b"
    replicas: int = Field(1, ge=1, le=100_000)
    max_num_seqs: int | None = Field(None, ge=1, le=1_000_000)
    max_num_batched_tokens: int | None = Field(None, ge=1, le=10_000_000)
    chunked_prefill: bool | None = None
    admit_every: int | None = Field(None, ge=1, le=10_000)
    kv_cache_tokens: int | None = Field(None, ge=1, le=10**10)
    block_size: int = Field(16, ge=1, le=4096)
    max_model_len: int | None = Field(None, ge=1)
    step_noise_cv: float = Field(0.0, ge=0, le=10, allow_inf_nan=False)
    seed: int = Field(0, ge=0, le=2**63 - 1)
    admission: AdmissionSpec | None = None
    prefix_cache: PrefixCacheSpec | None = None
    # engine: vllm only: vLLM's automatic prefix caching over its own KV blocks
    # (scheduler/vllm_cache.py). Off by default, as `--no-enable-prefix-caching` runs (the
    # fidelity protocol's); vLLM V1's own default is on.
    prefix_caching: bool = False
    preemption: PreemptionSpec | None = None
    # a prefill pool and a decode pool joined by a KV link (disaggregation.py); None: colocated
    disaggregation: DisaggregationSpec | None = None
    # the congestion and resource loops (control.py); None: neither
    control: ControlSpec | None = None
    tier_ranks: dict[str, int] = Field(
        default_factory=lambda: {"interactive": 0, "batch": 1, "best-effort": 2},
        description="tier name -> rank (lower is more urgent); demotion moves one rank down",
    )


@dataclass(frozen=True)
class SchedulerConfig:
    """A validated, resolved configuration: the profile loaded, the policy factory built."""

    spec: SchedulerSpec
    profile: Profile
    policy_factory: Callable[[], Policy]
    warnings: tuple[str, ...] = ()  # one line each: a setting that makes a policy degenerate

    @property
    def engine(self) -> str:
        return self.spec.engine

    @property
    def replicas(self) -> int:
        return self.spec.replicas

    @property
    def prefix_caching(self) -> bool:
        """Whether the engine caches prompt blocks (so jobs need their block hashes): the
        reference engine's `prefix_cache` pool, or vLLM's `prefix_caching`."""
        return self.spec.prefix_cache is not None or self.spec.prefix_caching

    @property
    def kv_blocks(self) -> int:
        return self.profile.kv_cache_tokens // self.spec.block_size

    @property
    def max_model_len(self) -> int:
        limit = self.spec.max_model_len
        cap = self.profile.kv_cache_tokens
        return min(limit, cap) if limit else cap


# vLLM's `--scheduling-policy` values -> the reference policy that orders waiting jobs alike.
VLLM_POLICIES = {"fcfs": "fifo", "priority": "priority"}

# Fields of the block that vLLM has no equivalent of, and what to do instead.
_NOT_VLLM = {
    "admission": "vLLM has no admission limits; remove it",
    "prefix_cache": "vLLM caches in its own KV blocks; use prefix_caching: true",
    "preemption": "vLLM V1 always preempts by recompute; remove it",
    "tier_ranks": "vLLM orders by the request priority only; remove it",
    "admit_every": "vLLM V1 schedules waiting requests every step; remove it",
    "disaggregation": "prefill/decode pools run the reference engine; remove it",
    "control": "the control loops run in the reference engine; remove it",
}


def _vllm_problems(spec: SchedulerSpec, block: dict[str, Any]) -> list[str]:
    problems = []
    if not isinstance(spec.policy, str) or spec.policy not in VLLM_POLICIES:
        problems.append(
            f"scheduler.policy: engine: vllm takes vLLM's --scheduling-policy, one of "
            f"{sorted(VLLM_POLICIES)}; got {spec.policy!r}"
        )
    if spec.replicas != 1:
        problems.append("scheduler.replicas: engine: vllm simulates one vLLM instance; use 1")
    for name, why in _NOT_VLLM.items():
        if block.get(name) is not None:
            problems.append(f"scheduler.{name}: not used with engine: vllm ({why})")
    return problems


def _parse_vllm(spec: SchedulerSpec, block: dict[str, Any]) -> SchedulerConfig:
    """`engine: vllm` (`vllm.VllmEngine`, a model of vLLM V1's own scheduler; docs/simulator.md).

    The profile is read as for the reference engine (`engine.Engine`, which runs any policy of
    `policies/`). `policy` is vLLM's `--scheduling-policy`, `fcfs` or `priority` (a request's
    priority is its SLO class's `priority`, lower first). The fields vLLM has no equivalent of
    (admission, prefix_cache, preemption modes, tier ranks, admit_every, replicas) are refused
    rather than silently ignored, so a scenario never claims a vLLM behaviour the model lacks."""
    problems = _vllm_problems(spec, block)
    profile = None
    try:
        profile = load_profile(spec.profile)
    except ProfileError as error:
        problems.append(str(error))
    if problems or profile is None:
        raise SchedulerConfigError(problems)
    overrides = {
        name: getattr(spec, name)
        for name in ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "kv_cache_tokens")
        if getattr(spec, name) is not None
    }
    # The reference policy that orders waiting jobs the same way (the engine keeps its own queue).
    factory = policy_factory(VLLM_POLICIES[str(spec.policy)])
    return SchedulerConfig(spec, replace(profile, **overrides), factory)


def parse_scheduler_config(block: dict[str, Any] | None) -> SchedulerConfig:
    try:
        spec = SchedulerSpec.model_validate(block or {})
    except ValidationError as error:
        raise SchedulerConfigError(lines_from(error)) from None
    if spec.engine == "vllm":
        return _parse_vllm(spec, block or {})
    problems: list[str] = []
    if spec.prefix_caching:
        problems.append(
            "scheduler.prefix_caching: vLLM's switch, for engine: vllm; the reference engine's "
            "cache is prefix_cache: {blocks: N}"
        )
    profile = None
    try:
        profile = load_profile(spec.profile)
    except ProfileError as error:
        problems.append(str(error))
    overrides = {
        name: getattr(spec, name)
        for name in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "chunked_prefill",
            "admit_every",
            "kv_cache_tokens",
        )
        if getattr(spec, name) is not None
    }
    if profile is not None:
        profile = replace(profile, **overrides)
    factory = None
    warnings: list[str] = []
    try:
        pool = pool_of(profile, spec.replicas) if profile is not None else None
        factory = policy_factory(spec.policy, pool=pool, warnings=warnings)
    except PolicySpecError as error:
        problems.append(str(error))
    if problems or profile is None or factory is None:
        raise SchedulerConfigError(problems)
    if spec.control is not None and spec.disaggregation is not None:
        raise SchedulerConfigError(
            ["scheduler.control: the control loops run colocated only, for now; remove it"]
        )
    cong = spec.control.congestion if spec.control is not None else None
    if cong is not None and "reclaim_borrowed" in cong.actions and not _tiered(spec.policy):
        warnings.append(
            "control.congestion.actions: reclaim_borrowed does nothing without a tiered policy "
            "(no tier lends quota); remove it or use tiered"
        )
    res = spec.control.resource if spec.control is not None else None
    if (
        res is not None
        and res.preemption_quota
        and (spec.preemption or PreemptionSpec()).mode == "none"
    ):
        warnings.append(
            "control.resource.preemption_quota: grants nothing without preemption; set "
            "scheduler.preemption.mode (cooperative, swap or recompute) or remove it"
        )
    return SchedulerConfig(spec, profile, factory, tuple(f"scheduler.{w}" for w in warnings))


def _tiered(policy: str | dict[str, Any]) -> bool:
    """Whether a policy spec (a name, a preset or a mapping) is the tiered policy."""
    name = policy if isinstance(policy, str) else policy.get("name")
    if isinstance(name, str) and name in PRESETS:
        name = PRESETS[name]["name"]
    return name == "tiered"
