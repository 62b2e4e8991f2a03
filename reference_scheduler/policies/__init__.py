"""The policy registry (an explicit dictionary) and the named presets the field uses.

A policy spec is a name (`"fifo"`, `"dwrr"`, a preset) or a mapping `{name: ..., options...}`;
`child:` nests a spec (dwrr, sfq), `tiers:` lists tiers (tiered).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

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

_THREE_TIERS = ("interactive", "batch", "best-effort")

PRESETS: dict[str, dict[str, Any]] = {
    # DWRR across tenants, WFQ across each tenant's workloads inside it.
    "dwrr-wfq": {"name": "dwrr", "child": {"name": "wfq", "key": "flow"}},
    # HTB-style tiers, stochastic fair queueing inside each tier.
    "htb-sfq": {
        "name": "tiered",
        "borrow_ratio": 0.5,
        "tiers": [
            {"name": n, "quota": q, "child": "sfq"}
            for n, q in zip(_THREE_TIERS, (0.5, 0.3, 0.2), strict=True)
        ],
    },
    # The three-tier layout: 30/50/20 quotas, DWRR across tenants inside each tier.
    "three-tier": {
        "name": "tiered",
        "borrow_ratio": 0.5,
        "tiers": [
            {"name": n, "quota": q, "child": "dwrr"}
            for n, q in zip(_THREE_TIERS, (0.3, 0.5, 0.2), strict=True)
        ],
    },
}


class PolicySpecError(ValueError):
    """A policy spec that cannot be built; the message names the option."""


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


def policy_factory(spec: Any, where: str = "policy") -> Callable[[], Policy]:
    """Validate `spec` now and return a factory of fresh policies built from it."""
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
    if "child" in params:
        options["child"] = policy_factory(options.get("child", "fifo"), f"{where}.child")
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
                    policy_factory(tier.get("child", "dwrr"), f"{at}.child"),
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


__all__ = ["POLICIES", "PRESETS", "PolicySpecError", "build_policy", "policy_factory"]
