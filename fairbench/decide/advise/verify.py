"""Verification: the search's candidates and the scenario's own configuration, each run on the
same seeds the search never saw, with intervals across those seeds, and the recommendation.

Why new seeds: the search picked its candidates on one plan, so their figures on that plan are
biased upward (the winner's curse: among 40 configurations, the best on one plan is partly the
luckiest on it). A fresh plan per seed is an independent replicate of the whole run, so the
verification's figures are unbiased and their spread is the run-to-run noise.

Intervals. For each configuration and each target, the attainment of the k verification runs,
`mean ± t(k−1)·s/√k` (Student t over k independent seeds, clipped to [0, 1]); the gain over the
scenario's own configuration is the same on the k paired differences (both configurations ran
each seed's plan, byte for byte, so the pairing removes the plan's own luck). Fewer than two
seeds give no interval, and say so. The confidence is the ask's (95% by default).

The recommendation is the configuration, the scenario's own included, with the most headroom
(the smallest `mean attainment − needed` over the targets) among those whose mean attainment
meets every target on the verification seeds; `confident` says whether every interval's low end
clears its target too. None meets: no recommendation (the caller refuses, naming the binding
constraint).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from fairbench.analysis.intervals import Interval, declined
from fairbench.decide.advise.problem import Problem
from fairbench.decide.advise.search import Evaluation, Progress, Trial, run_blocks
from fairbench.decide.points import PointRunner

METHOD_SEEDS = "Student t over {k} independent seeds ({first}–{last}): mean ± t·s/√k"
METHOD_PAIRED = (
    "Student t over {k} paired seeds ({first}–{last}, the same plan for both): "
    "mean difference ± t·s/√k"
)


def seed_interval(
    values: Sequence[float],
    confidence: float,
    method: str,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> Interval:
    """Student t interval of the mean of independent replicates (one per seed)."""
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if len(x) < 2:
        return declined(confidence, method, f"{len(x)} seeds with a value; an interval needs 2")
    centre = float(x.mean())
    sd = float(x.std(ddof=1))
    if sd == 0:  # t·s/√k would be a zero-width interval: a promise the seeds cannot keep
        return declined(
            confidence,
            method,
            f"all {len(x)} seeds gave {centre:g}: no spread across seeds to build an interval "
            "on; more seeds or a longer run would show one",
        )
    half = float(sps.t.ppf(0.5 + confidence / 2, len(x) - 1)) * sd / math.sqrt(len(x))
    return Interval(
        max(bounds[0], centre - half), min(bounds[1], centre + half), confidence, method
    )


def bounds_of(name: str) -> tuple[float, float]:
    """Where a figure can lie: a share or an index (Jain's) within [0, 1], anything else
    unbounded. An interval is clipped to it, so it never claims an impossible value."""
    from fairbench.analysis.registry import of_name

    metric = of_name(name)
    if metric is not None and metric.unit in ("share", "index"):
        return (0.0, 1.0)
    return (-math.inf, math.inf)


@dataclass
class Verified:
    """One configuration on the verification seeds: its runs, each target's mean attainment
    with its interval, each objective's mean with its interval, the headroom of the means, the
    gain over the scenario's own configuration per target (paired), and whether it meets."""

    label: str
    block: dict[str, Any]
    trial: int | None  # None: the scenario's own configuration
    runs: list[Evaluation]
    attainment: dict[str, float] = field(default_factory=dict)
    attainment_ci: dict[str, Interval] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    values_ci: dict[str, Interval] = field(default_factory=dict)
    gain: dict[str, float] = field(default_factory=dict)
    gain_ci: dict[str, Interval] = field(default_factory=dict)
    headroom: float = -math.inf
    meets: bool = False
    confident: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def own(self) -> bool:
        return self.trial is None


def _judge(v: Verified, problem: Problem, own: Verified | None) -> None:
    seeds = problem.verify_seeds
    level = problem.ask.confidence
    fmt = {"k": len(seeds), "first": seeds[0], "last": seeds[-1]}
    v.errors = [r.error for r in v.runs if r.error is not None]
    for t in problem.targets:
        got = [r.attainment.get(t.cls, math.nan) for r in v.runs]
        v.attainment[t.cls] = float(np.mean(got)) if got else math.nan
        v.attainment_ci[t.cls] = seed_interval(got, level, METHOD_SEEDS.format(**fmt), (0.0, 1.0))
        if own is not None:
            diffs = [
                a - b
                for a, b in zip(
                    got, (r.attainment.get(t.cls, math.nan) for r in own.runs), strict=True
                )
            ]
            v.gain[t.cls] = float(np.mean(diffs)) if diffs else math.nan
            v.gain_ci[t.cls] = seed_interval(diffs, level, METHOD_PAIRED.format(**fmt), (-1.0, 1.0))
    for name in problem.names:
        got = [r.values.get(name, math.nan) for r in v.runs]
        v.values[name] = float(np.mean(got)) if got else math.nan
        v.values_ci[name] = seed_interval(got, level, METHOD_SEEDS.format(**fmt), bounds_of(name))
    margins = [v.attainment[t.cls] - t.share for t in problem.targets]
    v.headroom = min(m if math.isfinite(m) else -1.0 for m in margins)
    all_valid = all(r.valid for r in v.runs)
    v.meets = not v.errors and all_valid and v.headroom >= 0
    v.confident = v.meets and all(_clears(v, t.cls, t.share) for t in problem.targets)


def _clears(v: Verified, cls: str, share: float) -> bool:
    """The target holds beyond the seeds' noise: the interval's low end clears it, or, where
    every seed gave one value (no interval), that value does on two or more seeds."""
    ci = v.attainment_ci[cls]
    if not ci.declined:
        return ci.low >= share
    got = [r.attainment.get(cls, math.nan) for r in v.runs]
    finite = [g for g in got if math.isfinite(g)]
    return len(finite) >= 2 and len(finite) == len(got) and min(finite) >= share


def verify(
    problem: Problem,
    chosen: list[Trial],
    runner: PointRunner,
    base: Path,
    progress: Progress | None = None,
) -> list[Verified]:
    """The scenario's own configuration (first) and each candidate on every verification seed;
    one batch of runs, so a process pool runs them side by side."""
    configs: list[tuple[str, dict[str, Any], int | None]] = [
        ("own configuration", problem.setting.own, None),
        *((f"trial {t.number}", t.run.block, t.number) for t in chosen),
    ]
    items = []
    for label, block, trial in configs:
        name = "own" if trial is None else f"trial-{trial:03d}"
        items += [
            (f"{label} seed {seed}", block, seed, base / f"{name}-seed-{seed}")
            for seed in problem.verify_seeds
        ]
    if progress is not None:
        progress("verify", 0, len(items))
    runs = run_blocks(problem, items, runner)
    if progress is not None:
        progress("verify", len(items), len(items))
    k = len(problem.verify_seeds)
    out: list[Verified] = []
    for i, (label, block, trial) in enumerate(configs):
        out.append(Verified(label, block, trial, runs[i * k : (i + 1) * k]))
    own = out[0]
    for v in out:
        _judge(v, problem, None if v.own else own)
    return out


def recommend(verified: list[Verified]) -> Verified | None:
    """The configuration with the most headroom among those that meet every target (the
    scenario's own first, so it wins a tie: no change is advised for nothing)."""
    meeting = [v for v in verified if v.meets]
    if not meeting:
        return None
    return max(meeting, key=lambda v: v.headroom)
