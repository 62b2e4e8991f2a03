"""What `fairbench advise` searches: the knobs of the reference scheduler's `scheduler:` block,
their ranges, and how one point of the space becomes a block that `fairbench run` takes.

Every knob is sampled on every trial, whether the point's policy reads it or not, so the space
is one fixed box: TPE's multivariate model and the importance figure see the same parameters on
every trial, and a knob that did nothing shows as unimportant instead of vanishing. Only the
block written drops what its policy would ignore (the weights of a FIFO, the tier quotas of a
DWRR), so the advice is a block a person can read and every field in it acts.

The block that is simulated is the block that is advised: values are rounded (three decimals,
quotas floored so that they still sum to at most 1) before the run, not after it. Hardware
facts of the scenario's own block (profile, replicas, max_num_seqs, KV size, admission, prefix
cache, swap bandwidth) are kept as they are: the search tunes the schedule, not the machine.
Pure: no I/O, no optuna import (a trial is anything with optuna's `suggest_*` methods).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from fairbench.workload.models import Scenario

POLICIES = ("fifo", "priority", "dwrr", "vtc", "tiered")
WEIGHTED = ("dwrr", "vtc")  # the searched policies that read per-tenant weights
PREEMPTION = ("none", "cooperative", "swap", "recompute")
LADDERS = (
    "degrade_max_tokens",
    "reject_best_effort",
    "degrade_max_tokens,reject_best_effort",
    "reject_best_effort,degrade_max_tokens",
    "reclaim_borrowed,degrade_max_tokens,reject_best_effort",
)
BUDGET_WINDOW_S = 60.0  # the preemption budget's window: a tenant suffers at most N a minute
# The keys of the scenario's block the search decides; every other key is kept as written.
SEARCHED = ("policy", "preemption", "control")
# The loops' defaults (reference_scheduler/scheduler/control.py): best-effort work is what the
# congestion loop may refuse, batch and best-effort what it may cut.
BEST_EFFORT_CLASSES = ("best-effort",)
DEGRADE_CLASSES = ("batch", "best-effort")


@dataclass(frozen=True)
class Knob:
    """One searched parameter: its name in the trial, its range, and what it sets."""

    name: str
    kind: str  # categorical | float | int
    low: float = 0.0
    high: float = 0.0
    choices: tuple[str, ...] = ()
    log: bool = False
    sets: str = ""

    @property
    def range_text(self) -> str:
        if self.kind == "categorical":
            return " | ".join(self.choices)
        scale = ", log scale" if self.log else ""
        fmt = (lambda v: f"{v:g}") if self.kind == "float" else (lambda v: f"{int(v)}")
        return f"{fmt(self.low)} to {fmt(self.high)}{scale}"


@dataclass(frozen=True)
class Setting:
    """What the space needs to know of the scenario: its classes (most urgent first, by the
    SLO class's `priority`, then name), each tenant's class and weight, the scenario's own
    `scheduler:` block, and whether the control loops may run (not with disaggregation)."""

    classes: tuple[str, ...]
    tenant_class: dict[str, str]
    tenant_weight: dict[str, float]
    own: dict[str, Any]
    ttft_targets: dict[str, float] = field(default_factory=dict)  # class -> seconds
    loops: bool = True

    @classmethod
    def of(cls, scn: Scenario, own: dict[str, Any]) -> Setting:
        present = {t.slo_class for t in scn.tenants}
        ranks = {c: (scn.slo_classes[c].priority if c in scn.slo_classes else 99) for c in present}
        classes = tuple(sorted(present, key=lambda c: (ranks[c], c)))
        ttft = {
            c: float(scn.slo_classes[c].ttft)
            for c in classes
            if c in scn.slo_classes and scn.slo_classes[c].ttft
        }
        return cls(
            classes=classes,
            tenant_class={t.id: t.slo_class for t in scn.tenants},
            tenant_weight={t.id: float(t.weight) for t in scn.tenants},
            own=dict(own),
            ttft_targets=ttft,
            loops=own.get("disaggregation") is None,
        )


def knobs(setting: Setting) -> list[Knob]:
    """The space for this scenario: the common knobs, a weight factor and a tier quota per
    class, and (where the loops may run) both loops' knobs."""
    out = [
        Knob("policy", "categorical", choices=POLICIES, sets="scheduler.policy"),
        *(
            Knob(
                f"weight.{c}",
                "float",
                0.25,
                8.0,
                log=True,
                sets=f"dwrr/vtc weights: each {c} tenant's weight × this",
            )
            for c in setting.classes
        ),
        *(
            Knob(
                f"quota.{c}",
                "float",
                0.05,
                1.0,
                sets=f"tiered: the {c} tier's quota (the quotas are normalised to sum 1)",
            )
            for c in setting.classes
        ),
        Knob("borrow_ratio", "float", 0.0, 2.0, sets="tiered: borrow_ratio (ceiling q·(1+b))"),
        Knob("preemption", "categorical", choices=PREEMPTION, sets="scheduler.preemption.mode"),
        Knob(
            "budget",
            "categorical",
            choices=("none", "on"),
            sets="scheduler.preemption.budget (past it, a job is demoted, not preempted)",
        ),
        Knob(
            "budget_count",
            "int",
            1,
            16,
            log=True,
            sets=f"preemption.budget.count per {BUDGET_WINDOW_S:g} s",
        ),
    ]
    if setting.loops:
        out += [
            Knob("congestion", "categorical", choices=("off", "on"), sets="control.congestion"),
            Knob("q_high", "int", 8, 512, log=True, sets="control.congestion.q_high"),
            Knob("ladder", "categorical", choices=LADDERS, sets="control.congestion.actions"),
            Knob("degrade_to", "int", 32, 1024, log=True, sets="control.congestion.degrade_to"),
            Knob("resource", "categorical", choices=("off", "on"), sets="control.resource"),
            Knob("window_s", "float", 5.0, 120.0, log=True, sets="control.resource.window"),
            Knob("slo_min", "float", 0.8, 0.99, sets="control.resource.slo_min"),
            Knob("weight_step", "float", 0.05, 1.0, sets="control.resource.weight_step"),
            Knob("preemption_quota", "int", 0, 4, sets="control.resource.preemption_quota"),
        ]
    return out


def warm_starts(setting: Setting) -> list[dict[str, Any]]:
    """The first trials: each policy plain (equal weights and quotas, borrow 0.5, no loop),
    without preemption and then with swap preemption (no budget). They are what a person would
    try first, and a search of a small budget otherwise spends it on corners of a 20-knob box;
    the TPE sampler proposes every later trial from what these and the others found. Only the
    knobs a plain configuration reads are fixed: the rest are drawn at random like any
    startup trial's, so the importance figure does not mistake a fixed value shared by the
    warm starts for a value the good trials chose."""
    names = {k.name for k in knobs(setting)}
    off = {k: "off" for k in ("congestion", "resource") if k in names}
    out = []
    for mode in ("none", "swap"):
        for policy in POLICIES:
            start: dict[str, Any] = {"policy": policy, "preemption": mode, **off}
            if mode != "none":
                start["budget"] = "none"
            if policy in WEIGHTED and len(setting.classes) > 1:
                start |= {f"weight.{c}": 1.0 for c in setting.classes}
            if policy == "tiered":
                start |= {f"quota.{c}": 1.0 for c in setting.classes} | {"borrow_ratio": 0.5}
            out.append(start)
    return out


class Suggests(Protocol):
    """optuna's Trial, as far as the space uses it."""

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...
    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float: ...
    def suggest_int(self, name: str, low: int, high: int, *, log: bool = False) -> int: ...


def suggest(trial: Suggests, setting: Setting) -> dict[str, Any]:
    """One point of the space, every knob drawn from `trial` in a fixed order."""
    params: dict[str, Any] = {}
    for knob in knobs(setting):
        if knob.kind == "categorical":
            params[knob.name] = trial.suggest_categorical(knob.name, list(knob.choices))
        elif knob.kind == "float":
            params[knob.name] = trial.suggest_float(knob.name, knob.low, knob.high, log=knob.log)
        else:
            params[knob.name] = trial.suggest_int(
                knob.name, int(knob.low), int(knob.high), log=knob.log
            )
    return params


def _r(value: float) -> float:
    return round(float(value), 3)


def _quotas(params: dict[str, Any], classes: tuple[str, ...]) -> list[float]:
    """The tier quotas, normalised to sum 1 and floored to three decimals (so the sum stays at
    most 1, as the tiered policy requires), none below 0.001."""
    raw = [float(params[f"quota.{c}"]) for c in classes]
    total = sum(raw)
    return [max(0.001, math.floor(q / total * 1000) / 1000) for q in raw]


def policy_spec(params: dict[str, Any], setting: Setting) -> str | dict[str, Any]:
    """The `policy:` of a point: a name, weights for a weighted policy where the tenants span
    more than one class, tiers (most urgent first, one per class) for tiered."""
    name = str(params["policy"])
    if name in WEIGHTED and len(setting.classes) > 1:
        weights = {
            t: _r(w * float(params[f"weight.{setting.tenant_class[t]}"]))
            for t, w in sorted(setting.tenant_weight.items())
        }
        return {"name": name, "weights": weights}
    if name == "tiered":
        tiers = [
            {"name": c, "quota": q, "child": "dwrr"}
            for c, q in zip(setting.classes, _quotas(params, setting.classes), strict=True)
        ]
        return {"name": "tiered", "borrow_ratio": _r(params["borrow_ratio"]), "tiers": tiers}
    return name


def _preemption(params: dict[str, Any], own: dict[str, Any]) -> dict[str, Any] | None:
    mode = str(params["preemption"])
    if mode == "none":
        return None
    kept = {
        k: v
        for k, v in (own.get("preemption") or {}).items()
        if k in ("swap_bandwidth_gbps", "swap_latency_us")
    }
    out: dict[str, Any] = {"mode": mode, **kept}
    if params["budget"] == "on":
        out["budget"] = {"count": int(params["budget_count"]), "window_s": BUDGET_WINDOW_S}
    return out


def _ladder(params: dict[str, Any], setting: Setting, tiered: bool) -> list[str]:
    """The congestion actions that act on this scenario: refusing best-effort work needs a
    best-effort tenant, cutting max_tokens a batch or best-effort one, reclaiming a tiered
    policy (elsewhere the loop would warn that it does nothing)."""
    present = set(setting.tenant_class.values())
    acts = {
        "reject_best_effort": bool(present & set(BEST_EFFORT_CLASSES)),
        "degrade_max_tokens": bool(present & set(DEGRADE_CLASSES)),
        "reclaim_borrowed": tiered,
    }
    return [a for a in str(params["ladder"]).split(",") if acts[a]]


def _resource_acts(params: dict[str, Any], setting: Setting) -> bool:
    """Whether the resource loop can change anything here. It moves a missing tenant's job
    weight, which dwrr, vtc and tiered's dwrr children read (not fifo or priority, and not a
    policy given a `weights` map, which overrides the job's weight), and it grants same-tier
    preemptions (which need preemption). A loop that can do neither is left out of the block."""
    if not setting.ttft_targets:
        return False
    policy = params["policy"]
    reads_weight = policy == "tiered" or (policy in WEIGHTED and len(setting.classes) == 1)
    grants = bool(params["preemption_quota"]) and params["preemption"] != "none"
    return reads_weight or grants


def _control(params: dict[str, Any], setting: Setting, tiered: bool) -> dict[str, Any] | None:
    if not setting.loops:
        return None
    control: dict[str, Any] = {}
    ladder = _ladder(params, setting, tiered)
    if params["congestion"] == "on" and ladder:
        control["congestion"] = {
            "q_high": int(params["q_high"]),
            "actions": ladder,
            "degrade_to": int(params["degrade_to"]),
        }
    if params["resource"] == "on" and _resource_acts(params, setting):
        resource: dict[str, Any] = {
            "window": f"{_r(params['window_s']):g}s",
            "slo_min": _r(params["slo_min"]),
            "ttft": {c: f"{_r(s * 1000):g}ms" for c, s in setting.ttft_targets.items()},
            "weight_step": _r(params["weight_step"]),
        }
        if params["preemption_quota"] and params["preemption"] != "none":
            resource["preemption_quota"] = int(params["preemption_quota"])
        control["resource"] = resource
    return control or None


def scheduler_block(params: dict[str, Any], setting: Setting) -> dict[str, Any]:
    """The `scheduler:` block of a point: the scenario's own block with policy, preemption and
    control replaced by the point's (a knob its policy would ignore is left out)."""
    block = {k: v for k, v in setting.own.items() if k not in SEARCHED}
    policy = policy_spec(params, setting)
    block["policy"] = policy
    preemption = _preemption(params, setting.own)
    if preemption is not None:
        block["preemption"] = preemption
    tiered = isinstance(policy, dict) and policy.get("name") == "tiered"
    control = _control(params, setting, tiered)
    if control is not None:
        block["control"] = control
    return block


def relevant(params: dict[str, Any], setting: Setting) -> dict[str, Any]:
    """The knobs of a point that its block reads, for tables (the rest were drawn, not used)."""
    block = scheduler_block(params, setting)
    policy = params["policy"]
    keep = {"policy", "preemption"}
    if policy in WEIGHTED and len(setting.classes) > 1:
        keep |= {f"weight.{c}" for c in setting.classes}
    if policy == "tiered":
        keep |= {f"quota.{c}" for c in setting.classes} | {"borrow_ratio"}
    if "preemption" in block:
        keep.add("budget")
        if "budget" in block["preemption"]:
            keep.add("budget_count")
    control = block.get("control") or {}
    if setting.loops:
        keep.add("congestion")
        if setting.ttft_targets:
            keep.add("resource")
    if "congestion" in control:
        keep |= {"q_high", "ladder", "degrade_to"}
    if "resource" in control:
        keep |= {"window_s", "slo_min", "weight_step"}
        if "preemption_quota" in control["resource"]:
            keep.add("preemption_quota")
    return {k: v for k, v in params.items() if k in keep}
