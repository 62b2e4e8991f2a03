"""The policy registry (an explicit dictionary) and the named presets the field uses.

A policy spec is a name (`"fifo"`, `"dwrr"`, a preset) or a mapping `{name: ..., options...}`;
`child:` nests a spec (dwrr, sfq), `tiers:` lists tiers (tiered).

Some defaults only make sense relative to the engine pool, so the factory derives them from the
pool's capacity when the scheduler config gives it one (`Pool`, from the cost-model profile and
the replica count), and says so in one line when a configured value makes a policy degenerate:
- wfq `rate` (the fluid reference server's speed, in cost units per second): the pool's decode
  throughput at a full batch in tokens/s, or that divided by `NOMINAL_REQUEST_TOKENS` for
  `cost: requests`. A rate 10× too high makes GPS virtual time outrun service, so every job
  opens a fresh busy period and WFQ orders by arrival (FIFO); 10× too low and finish tags never
  forget past service (a new or returning flow jumps the queue).
- dwrr / sfq `quantum` (cost units a turn earns): 1 request for `cost: requests`, 1,024 tokens
  otherwise (the class default). A request quantum larger than the pool's batch slots lets one
  tenant's turn fill the engine: exhaustive polling, not round robin.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reference_scheduler.core.costmodel import Profile
from reference_scheduler.core.policy import Policy
from reference_scheduler.policies.dwrr import Dwrr
from reference_scheduler.policies.fifo import Fifo
from reference_scheduler.policies.priority import Priority
from reference_scheduler.policies.sfq import Sfq
from reference_scheduler.policies.tiered import Tiered, TierSpec
from reference_scheduler.policies.vtc import Lcf, Vtc
from reference_scheduler.policies.wfq import Wfq

POLICIES: dict[str, type] = {
    "fifo": Fifo,
    "priority": Priority,
    "dwrr": Dwrr,
    "wfq": Wfq,
    "sfq": Sfq,
    "vtc": Vtc,
    "lcf": Lcf,
    "tiered": Tiered,
}


def _three_tiers(quotas: tuple[float, float, float], child: str) -> dict[str, Any]:
    """Interactive, batch and best-effort tiers with these quotas, each running `child` inside,
    borrowing up to half again their quota (HTB-style ceilings)."""
    names = ("interactive", "batch", "best-effort")
    tiers = [{"name": n, "quota": q, "child": child} for n, q in zip(names, quotas, strict=True)]
    return {"name": "tiered", "borrow_ratio": 0.5, "tiers": tiers}


PRESETS: dict[str, dict[str, Any]] = {
    # DWRR across tenants, WFQ across each tenant's workloads inside it.
    "dwrr-wfq": {"name": "dwrr", "child": {"name": "wfq", "key": "flow"}},
    # HTB-style tiers, stochastic fair queueing inside each tier.
    "htb-sfq": _three_tiers((0.5, 0.3, 0.2), "sfq"),
    # The three-tier layout: 30/50/20 quotas, DWRR across tenants inside each tier.
    "three-tier": _three_tiers((0.3, 0.5, 0.2), "dwrr"),
}


class PolicySpecError(ValueError):
    """A policy spec that cannot be built; the message names the option."""


NOMINAL_REQUEST_TOKENS = 512  # what one request is taken to cost when a rate is in requests/s
DEGENERATE_FACTOR = 10.0  # a wfq rate this far off the pool's capacity is warned about


@dataclass(frozen=True)
class Pool:
    """What a policy may know of the engine pool it orders work for (from the scheduler config):
    `tokens_per_s`, the pool's decode throughput at a full batch (None when the profile costs
    nothing); `slots`, the sequences it runs at once; `name`, for messages."""

    tokens_per_s: float | None
    slots: int
    name: str = "the pool"


def pool_of(profile: Profile, replicas: int) -> Pool:
    """The pool's capacity from its cost model: `replicas` engines each decoding a full batch of
    `max_num_seqs` sequences (context not counted, so an upper bound: a rate derived from it
    errs towards the fast side, never towards FIFO by orders of magnitude)."""
    batch = profile.max_num_seqs
    step_ms = profile.step_ms(0, batch, 0)
    rate = replicas * batch * 1000.0 / step_ms if step_ms > 0 else None
    return Pool(rate, replicas * batch, f"{profile.name} × {replicas}")


def _rate_per_s(pool: Pool, cost: str) -> float | None:
    if pool.tokens_per_s is None:
        return None
    return pool.tokens_per_s / NOMINAL_REQUEST_TOKENS if cost == "requests" else pool.tokens_per_s


def _derive(
    cls: type, options: dict[str, Any], where: str, pool: Pool | None, warnings: list[str]
) -> None:
    """Fill pool-relative defaults into `options`; append a line per degenerate setting."""
    if pool is None:
        return
    cost = str(options.get("cost", "tokens"))
    if cls is Wfq:
        derived = _rate_per_s(pool, cost)
        if derived is None:
            return
        unit = "requests/s" if cost == "requests" else "tokens/s"
        rate = options.get("rate")
        if rate is None:
            options["rate"] = derived
        elif isinstance(rate, int | float) and rate > 0:
            ratio = float(rate) / derived
            if ratio > DEGENERATE_FACTOR:
                warnings.append(
                    f"{where}.rate: wfq's rate {rate:g} {unit} is {ratio:.0f}× what the pool "
                    f"serves (~{derived:.4g} {unit}, {pool.name}): GPS virtual time outruns "
                    "service, so wfq orders by arrival (FIFO); omit rate to derive it"
                )
            elif ratio < 1 / DEGENERATE_FACTOR:
                warnings.append(
                    f"{where}.rate: wfq's rate {rate:g} {unit} is 1/{1 / ratio:.0f} of what the "
                    f"pool serves (~{derived:.4g} {unit}, {pool.name}): finish tags never forget "
                    "past service, so a new or returning flow jumps the queue; omit rate to "
                    "derive it"
                )
    elif issubclass(cls, Dwrr) and cost == "requests":
        quantum = options.get("quantum")
        if isinstance(quantum, int | float) and quantum > pool.slots:
            warnings.append(
                f"{where}.quantum: {cls.name}'s quantum {quantum:g} with cost: requests lets one "
                f"turn take up to {quantum:g} requests (the pool runs {pool.slots} at once): "
                "exhaustive polling, not round robin; use quantum: 1 (the default for requests)"
            )


def _normalize(spec: Any, where: str) -> dict[str, Any]:
    if isinstance(spec, str):
        if spec in PRESETS:
            return dict(PRESETS[spec])
        if spec in POLICIES:
            return {"name": spec}
        raise PolicySpecError(
            f"{where}: unknown policy {spec!r}; known: {sorted(POLICIES)}, presets: "
            f"{sorted(PRESETS)}"
        )
    if isinstance(spec, Mapping):
        name = spec.get("name")
        if not isinstance(name, str):
            raise PolicySpecError(f"{where}.name: a policy spec needs a name")
        base = _normalize(name, f"{where}.name")
        return {**base, **{k: v for k, v in spec.items() if k != "name"}, "name": base["name"]}
    raise PolicySpecError(f"{where}: must be a policy name or a mapping, got {spec!r}")


def policy_factory(
    spec: Any,
    where: str = "policy",
    pool: Pool | None = None,
    warnings: list[str] | None = None,
) -> Callable[[], Policy]:
    """Validate `spec` now and return a factory of fresh policies built from it. With `pool`,
    pool-relative defaults are derived and degenerate settings reported into `warnings`."""
    if warnings is None:
        warnings = []
    norm = _normalize(spec, where)
    cls = POLICIES[norm["name"]]
    options = {k: v for k, v in norm.items() if k != "name"}
    params = inspect.signature(cls.__init__).parameters
    for key in options:
        if key not in params or key == "self":
            allowed = sorted(p for p in params if p not in ("self", "tiers", "child"))
            if "child" in params:
                allowed.append("child")
            if "tiers" in params:
                allowed.append("tiers")
            raise PolicySpecError(
                f"{where}.{key}: not an option of {norm['name']}; options: {sorted(allowed)}"
            )
    _derive(cls, options, where, pool, warnings)
    if "child" in params:
        options["child"] = policy_factory(
            options.get("child", "fifo"), f"{where}.child", pool, warnings
        )
    if cls is Tiered:
        tiers = options.get("tiers")
        if not isinstance(tiers, list) or not tiers:
            raise PolicySpecError(f"{where}.tiers: tiered needs a list of tiers")
        specs = []
        for i, tier in enumerate(tiers):
            at = f"{where}.tiers[{i}]"
            if not isinstance(tier, Mapping) or "name" not in tier or "quota" not in tier:
                raise PolicySpecError(f"{at}: a tier needs name and quota")
            unknown = set(tier) - {"name", "quota", "classes", "child"}
            if unknown:
                raise PolicySpecError(
                    f"{at}.{sorted(unknown)[0]}: not a tier field (name, quota, classes, child)"
                )
            classes = tier.get("classes") or [tier["name"]]
            specs.append(
                TierSpec(
                    str(tier["name"]),
                    float(tier["quota"]),
                    policy_factory(tier.get("child", "dwrr"), f"{at}.child", pool, warnings),
                    tuple(str(c) for c in classes),
                )
            )
        options["tiers"] = specs

    def build() -> Policy:
        try:
            return cls(**options)
        except (TypeError, ValueError) as error:
            raise PolicySpecError(f"{where}: {error}") from None

    build()  # fail now, with the field's name, rather than mid-run
    return build


def build_policy(spec: Any) -> Policy:
    return policy_factory(spec)()


__all__ = [
    "NOMINAL_REQUEST_TOKENS",
    "POLICIES",
    "PRESETS",
    "PolicySpecError",
    "Pool",
    "build_policy",
    "policy_factory",
    "pool_of",
]
