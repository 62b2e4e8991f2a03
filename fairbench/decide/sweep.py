"""Sweeps over scenario fields, Pareto fronts, and the knee (the highest load meeting the SLOs).

The sweep file format (`scenario`, `grid` or `points`, `seeds`, `parallel`) is documented, with
examples that tests/test_docs_commands.py runs, in docs/sweeps.md. Objectives and tables name
metrics as fairbench.analysis.registry does.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fairbench.decide.points import AfterRun, LocalRunner, PointJob, PointRunner
from fairbench.workload.errors import ScenarioError
from fairbench.workload.loading import parse_scenario, read_yaml
from fairbench.workload.paths import set_path


def pareto_front(values: np.ndarray, senses: list[str]) -> np.ndarray:
    """Mask of non-dominated rows. `values` is points × objectives; senses 'max' or 'min'. A row
    with a NaN objective is never on the front (it cannot be judged)."""
    signed = values * np.array([1.0 if s == "max" else -1.0 for s in senses])
    ok = np.all(np.isfinite(signed), axis=1)
    front = ok.copy()
    for i in np.flatnonzero(ok):
        others = signed[ok]
        dominated = np.any(np.all(others >= signed[i], axis=1) & np.any(others > signed[i], axis=1))
        front[i] = not dominated
    return front


def apply(raw: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A copy of the scenario document with each `path: value` of `params` set."""
    data = json.loads(json.dumps(raw))
    for path, value in params.items():
        set_path(data, path, value)
    return data


@dataclass(frozen=True)
class Point:
    index: int
    params: dict[str, Any]
    seed: int | None


def expand(spec: dict[str, Any]) -> list[Point]:
    if "grid" in spec and "points" in spec:
        raise ScenarioError(["sweep: give grid or points, not both"])
    if "grid" in spec:
        grid = spec["grid"]
        if (
            not isinstance(grid, dict)
            or not grid
            or not all(isinstance(v, list) and v for v in grid.values())
        ):
            raise ScenarioError(["grid: a mapping of field path -> non-empty list of values"])
        combos = [dict(zip(grid, vals, strict=True)) for vals in itertools.product(*grid.values())]
    elif "points" in spec:
        combos = spec["points"]
        if not isinstance(combos, list) or not all(isinstance(p, dict) for p in combos):
            raise ScenarioError(["points: a list of {field path: value} mappings"])
    else:
        raise ScenarioError(["sweep: needs grid or points"])
    seeds = spec.get("seeds") or [None]
    return [Point(i, dict(c), s) for i, (c, s) in enumerate(itertools.product(combos, seeds))]


def run_sweep(
    sweep_file: Path,
    out_dir: Path,
    progress: Callable[[int, int], None] | None = None,
    after_run: AfterRun | None = None,
    runner: PointRunner | None = None,
) -> list[dict[str, Any]]:
    """Run every point of the sweep file; `after_run(run_dir)` is called on each point's run
    directory (the CLI passes the report writer, which sits above this layer). `runner` says
    where the points run (default: this machine, simulated points in `parallel` processes).

    A point that fails is a row with `error` (one line naming it) and an empty summary; the
    other points still run, and sweep.json lists them all."""
    spec = read_yaml(sweep_file.read_text(encoding="utf-8"))
    if not isinstance(spec, dict) or "scenario" not in spec:
        raise ScenarioError(
            ["sweep: needs scenario: (a scenario file, relative to the sweep)"], str(sweep_file)
        )
    scenario_path = (sweep_file.parent / spec["scenario"]).resolve()
    raw = read_yaml(scenario_path.read_text(encoding="utf-8"))
    points = expand(spec)
    jobs = []
    for point in points:
        data = apply(raw, point.params)
        parse_scenario(data, str(scenario_path), scenario_path.parent)  # fail before running
        jobs.append(
            PointJob(
                point_label(point),
                data,
                str(scenario_path),
                str(out_dir / f"point-{point.index:03d}"),
                point.seed,
                after_run,
            )
        )
    results = (runner or LocalRunner()).run(
        jobs,
        parallelism(spec.get("parallel", 1), str(sweep_file)),
        None if progress is None else lambda _, done, total: progress(done, total),
    )
    rows = []
    for point, result in zip(points, results, strict=True):
        row = {
            "point": point.index,
            "params": point.params,
            "seed": point.seed,
            "run_dir": result.job.out,
            "valid": result.valid,
            "summary": result.summary,
        }
        if result.failed:
            row.update(error=result.error, bad_input=result.bad_input)
        rows.append(row)
    shown = [{k: v for k, v in r.items() if k not in ("summary", "bad_input")} for r in rows]
    (out_dir / "sweep.json").write_text(json.dumps(shown, indent=2, default=str))
    return rows


def parallelism(value: Any, source: str) -> int:
    """The sweep file's `parallel`: a count of processes, or `auto` for every core this process
    may run on (a sweep of fleet points is CPU-bound, one core a point: issue 35)."""
    if value == "auto":
        import os

        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        return len(cores) if cores else os.cpu_count() or 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScenarioError(
            [f"parallel: {value!r} is not a count of processes; give an integer >= 1 or auto"],
            source,
        )
    return value


def point_label(point: Point) -> str:
    """How progress and error lines name a point: `point 2 (scheduler.policy=vtc seed=1)`."""
    shown = [
        f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in point.params.items()
    ]
    if point.seed is not None:
        shown.append(f"seed={point.seed}")
    return f"point {point.index}" + (f" ({' '.join(shown)})" if shown else "")


@dataclass
class KneeResult:
    """What the knee search found: the answer, every evaluation, and whether they agree.

    `best` is the highest load that held below the lowest load that missed (None when even the
    lowest missed). `monotone` is False when some load held above one that missed, or one load
    gave two answers: attainment then does not fall steadily with load, and `best` is only the
    first edge the search met (`note` says which loads disagree; `highest_held` is the highest
    load that held anywhere)."""

    best: float | None
    trail: list[tuple[float, bool]]
    monotone: bool = True
    verified: bool = False
    highest_held: float | None = None
    note: str | None = None
    roles: list[str] = field(default_factory=list)


def search_knee(
    evaluate: Callable[[float], bool],
    low: float,
    high: float,
    tolerance: float = 0.05,
    max_steps: int = 20,
) -> KneeResult:
    """Bisect (in log space) between `low` (must hold) and `high` (must not) to a relative
    `tolerance`, then verify: evaluate the answer again and one tolerance step above it.

    Bisection alone assumes attainment falls monotonically with load; when it does not, it
    reports whichever edge it meets first and says nothing. The two extra evaluations catch
    the usual case (a load just above the answer that holds after all, or an answer that does
    not hold twice); any held-above-missed pair in the trail marks the result not monotone.
    `evaluate` is called again for a load it has already seen only for the re-check of the
    answer (a caller with a noisy target can use a fresh seed for it)."""
    trail: list[tuple[float, bool]] = []
    roles: list[str] = []

    def at(x: float, role: str) -> bool:
        held = evaluate(x)
        trail.append((x, held))
        roles.append(role)
        return held

    if not at(low, "low"):
        return _judge(trail, roles, None)
    if at(high, "high"):
        result = _judge(trail, roles, high)
        result.verified = False  # nothing above --high was tried
        result.note = result.note or f"x{high:.4g} (--high) still holds; raise --high"
        return result
    lo, hi = low, high
    for _ in range(max_steps):
        if (hi - lo) / lo <= tolerance:
            break
        mid = math.sqrt(lo * hi)  # load spans orders of magnitude: bisect in log space
        if at(mid, "bisect"):
            lo = mid
        else:
            hi = mid
    at(lo, "verify")
    above = lo * (1 + tolerance)
    if not math.isclose(above, hi, rel_tol=1e-9):
        at(above, "verify")
    return _judge(trail, roles, lo)


def _judge(trail: list[tuple[float, bool]], roles: list[str], answer: float | None) -> KneeResult:
    """The answer the whole trail supports, and whether the trail is consistent with a single
    threshold (every load that held lies below every load that missed)."""
    held = [x for x, ok in trail if ok]
    missed = [x for x, ok in trail if not ok]
    first_miss = min(missed) if missed else math.inf
    below = [x for x in held if x < first_miss]
    best = max(below) if below else None
    highest = max(held) if held else None
    note = None
    monotone = True
    contrary = [x for x in held if x >= first_miss]
    if contrary:
        monotone = False
        worst = max(contrary)
        clash = (
            f"x{worst:.4g} held on one run and missed on another"
            if worst == first_miss
            else f"x{worst:.4g} held although x{first_miss:.4g} missed"
        )
        note = f"attainment is not monotone in load: {clash}" + (
            f"; the knee reported is the first edge below it, x{best:.4g}"
            if best is not None
            else ""
        )
    verified = answer is not None and best == answer and monotone
    return KneeResult(best, trail, monotone, verified, highest, note, list(roles))


def knee(
    evaluate: Callable[[float], bool],
    low: float,
    high: float,
    tolerance: float = 0.05,
    max_steps: int = 20,
) -> tuple[float | None, list[tuple[float, bool]]]:
    """`search_knee`, as (best, trail): the highest load multiplier at which `evaluate` (the
    SLOs hold) is true, and every (multiplier, held) evaluated on the way."""
    result = search_knee(evaluate, low, high, tolerance, max_steps)
    return result.best, result.trail


def scale_load(raw: dict[str, Any], factor: float) -> dict[str, Any]:
    """Every tenant's offered rate × factor (trace replays run 1/factor times slower)."""
    data = json.loads(json.dumps(raw))
    for tenant in data.get("tenants", []):
        arrival = tenant.get("arrival", {})
        for key in ("rate", "start_rate", "end_rate"):
            if key in arrival:
                from fairbench.workload.units import parse_rate

                arrival[key] = parse_rate(arrival[key]) * factor
    for trace in data.get("traces", {}).values():
        trace["time_scale"] = float(trace.get("time_scale", 1.0)) / factor
    return data
