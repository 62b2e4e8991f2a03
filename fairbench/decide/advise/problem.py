"""What an advice search is asked to do, read off the scenario: the SLO targets every class
must reach, the objectives of the front, the scenario document every configuration is
simulated on, and the profile (with its fidelity figure, when the profile carries one).

It exists so that every refusal that needs no simulation (a live engine's scenario, no SLO to
meet, a bad --trace or --objective) happens here, in one line naming the field or the flag,
before a single trial runs.

Targets. An SLO class says which latencies must hold (`ttft`, `tpot`, `e2e`) and at which
percentile (`percentile`, default 99): "p99 of TTFT within 300 ms" is the same statement as
"at least 99% of requests within 300 ms", so the class's attainment
(`slo_attainment.class.<name>` of the metric registry) must reach `percentile` / 100, unless
`--attainment` sets one share for every class.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fairbench.decide.advise.space import Setting
from fairbench.workload.models import Scenario

DEFAULT_EXTRA_OBJECTIVES = ("goodput:max", "jain_backlogged:max")
SIMULATED_KINDS = ("sim", "reference")  # the reference scheduler, simulated in virtual time


class AdviceRefused(Exception):
    """No advice: one line saying why (exit 2): bad input, or no configuration meets the SLOs
    (which constraint binds)."""


@dataclass(frozen=True)
class Target:
    """One class's constraint: attainment ≥ `share`; `slo` says what attainment counts."""

    cls: str
    share: float
    slo: str  # e.g. "ttft<=300ms tpot<=50ms"
    ttft_s: float | None = None

    @property
    def metric(self) -> str:
        return f"slo_attainment.class.{self.cls}"

    @property
    def text(self) -> str:
        return f"{self.cls} {self.slo}"


@dataclass(frozen=True)
class Ask:
    """What the user asked for: trials, seed, verification seeds, candidates to verify, one
    attainment for every class (None: each class's percentile), the front's objectives
    (None: every target's attainment, goodput, jain_backlogged), worker processes, and the
    `--set` overrides the scenario was read with (repeated in the advised command)."""

    budget: int = 40
    seed: int | None = None
    verify: int = 5
    top: int = 3
    attainment: float | None = None
    objectives: tuple[str, ...] | None = None
    parallel: int = 1
    confidence: float = 0.95
    overrides: tuple[str, ...] = ()  # the --set PATH=VALUE the scenario was read with


@dataclass(frozen=True)
class Problem:
    """A prepared search: the simulated scenario document and where it came from, the space's
    setting, the targets, the objectives, the seeds, and the profile it simulates."""

    data: dict[str, Any]
    source: Path
    setting: Setting
    targets: tuple[Target, ...]
    names: tuple[str, ...]
    senses: tuple[str, ...]
    seed: int
    ask: Ask
    profile: str
    fidelity: str
    notes: tuple[str, ...] = field(default=())
    sets: tuple[str, ...] = field(default=())  # --set items that reproduce the searched scenario

    @property
    def verify_seeds(self) -> list[int]:
        """Seeds the search never ran: seed + 1000 onwards."""
        return [self.seed + 1000 + k for k in range(self.ask.verify)]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:g}ms"


def targets_of(scn: Scenario, attainment: float | None) -> list[Target]:
    """One target per class that the scenario's tenants use and that has a latency SLO."""
    out = []
    present = sorted({t.slo_class for t in scn.tenants})
    for name in present:
        slo = scn.slo_classes.get(name)
        if slo is None or not (slo.ttft or slo.tpot or slo.e2e):
            continue
        parts = [
            f"{k}<={_ms(float(v))}"
            for k, v in (("ttft", slo.ttft), ("tpot", slo.tpot), ("e2e", slo.e2e))
            if v
        ]
        share = attainment if attainment is not None else float(slo.percentile) / 100
        out.append(Target(name, share, " ".join(parts), float(slo.ttft) if slo.ttft else None))
    return out


def objectives_of(
    specs: tuple[str, ...] | None, targets: list[Target]
) -> tuple[list[str], list[str]]:
    """The front's objectives as (names, senses): the user's --objective specs, or every
    target's attainment then goodput and jain_backlogged. AdviceRefused names a bad spec."""
    from fairbench.decide.objectives import ObjectiveError, parse_objectives

    chosen = (
        list(specs)
        if specs
        else [f"{t.metric}:max" for t in targets] + list(DEFAULT_EXTRA_OBJECTIVES)
    )
    try:
        names, senses = parse_objectives(chosen)
    except ObjectiveError as error:
        raise AdviceRefused(str(error)) from None
    return names, senses


def _with_trace(data: dict[str, Any], trace: Path | None) -> tuple[dict[str, Any], list[str]]:
    """The document replaying `trace` in place of its one trace, and that as a --set."""
    if trace is None:
        return data, []
    traces = data.get("traces") or {}
    if len(traces) != 1:
        found = "replays no trace" if not traces else f"replays {len(traces)} traces"
        raise AdviceRefused(
            f"--trace {trace}: the scenario {found}; --trace replaces the path of a scenario's "
            "one trace (edit traces.<name>.path instead)"
        )
    if not trace.is_file():
        raise AdviceRefused(f"--trace {trace}: no such file")
    (name,) = traces
    data["traces"][name]["path"] = str(trace.resolve())
    return data, [f"traces.{name}.path={trace.resolve()}"]


def fidelity_of(profile: Any, base: Path) -> str:
    """How far the profile is from the engine it stands for, as its YAML records it under
    `fit.fidelity` (`mape_pct`, and `against`: what it was measured on, e.g. the fidelity.json
    of `fairbench fidelity REAL SIM`); "fidelity unknown" when it records none."""
    from reference_scheduler.core.costmodel import PROFILE_DIR

    unknown = (
        "fidelity unknown (the profile records no fit.fidelity; measure it with fairbench run "
        "--simulate and fairbench fidelity, docs/simulator.md)"
    )
    if not isinstance(profile, str):
        return unknown + "; an inline profile"
    for path in (PROFILE_DIR / f"{profile}.yaml", Path(profile), base / profile):
        if path.is_file():
            break
    else:
        return unknown
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return unknown
    fid = (doc.get("fit") or {}).get("fidelity") if isinstance(doc, dict) else None
    if isinstance(fid, dict) and isinstance(fid.get("mape_pct"), int | float):
        against = f" against {fid['against']}" if fid.get("against") else ""
        return f"fidelity: MAPE {float(fid['mape_pct']):.1f}% of the simulated figures{against}"
    return unknown


def prepare(
    file: Path, raw: dict[str, Any], scn: Scenario, ask: Ask, trace: Path | None = None
) -> Problem:
    """The search the scenario `raw` (from `file`, validated as `scn`) asks for; AdviceRefused
    (one line) when it cannot be simulated, has no SLO to meet, or a flag is bad."""
    from fairbench.workload.loading import parse_scenario

    own = dict(raw.get("scheduler") or {})
    kind = scn.target.kind
    if kind not in SIMULATED_KINDS or scn.target.upstreams:
        what = "a gateway in front of real engines" if scn.target.upstreams else f"{kind!r}"
        raise AdviceRefused(
            f"{file}: target.kind is {what}: advise tunes the reference scheduler's scheduler: "
            "block in simulation; use a scenario with target: {kind: sim} or {kind: reference}"
        )
    if own.get("engine", "reference") != "reference":
        raise AdviceRefused(
            f"{file}: scheduler.engine is {own['engine']!r}: advise searches the reference "
            "engine's policies and loops; remove engine (or set engine: reference)"
        )
    targets = targets_of(scn, ask.attainment)
    if not targets:
        raise AdviceRefused(
            f"{file}: no SLO class of the scenario's tenants sets ttft, tpot or e2e: there is no "
            "SLO to meet; give the classes targets under slo_classes"
        )
    names, senses = objectives_of(ask.objectives, targets)
    data, sets = _with_trace(json.loads(json.dumps(raw)), trace)
    notes = []
    if kind != "sim":
        notes.append(f"the scenario's target is {kind}; every configuration ran in simulation")
    data["target"] = {"kind": "sim"}
    parse_scenario(data, str(file), file.parent)  # the simulated document must still be valid
    profile = own.get("profile", "h100-llama3-8b")
    profile_name = profile if isinstance(profile, str) else str(profile.get("name", "inline"))
    return Problem(
        data=data,
        source=file,
        setting=Setting.of(scn, own),
        targets=tuple(targets),
        names=tuple(names),
        senses=tuple(senses),
        seed=scn.run.seed if ask.seed is None else ask.seed,
        ask=ask,
        profile=profile_name,
        fidelity=fidelity_of(profile, file.parent),
        notes=tuple(notes),
        sets=(*ask.overrides, *sets),
    )


def scenario_with(problem: Problem, block: dict[str, Any]) -> dict[str, Any]:
    """The simulated scenario document with `block` as its `scheduler:`."""
    data = json.loads(json.dumps(problem.data))
    data["scheduler"] = json.loads(json.dumps(block))
    return data
