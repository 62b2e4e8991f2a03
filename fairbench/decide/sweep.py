"""Sweeps over scenario fields, Pareto fronts, and the knee (the highest load meeting the SLOs).

The sweep file format (`scenario`, `grid` or `points`, `seeds`, `parallel`) is documented, with
examples that tests/test_docs_commands.py runs, in docs/sweeps.md. Objectives and tables name
metrics as fairbench.analysis.registry does.
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing as mp
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fairbench.workload.scenario import ScenarioError, parse_scenario, read_yaml


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


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    keys = dotted.split(".")
    for key in keys[:-1]:
        nxt = node.setdefault(key, {})
        if not isinstance(nxt, dict):
            raise ScenarioError([f"{dotted}: {key} is not a mapping"])
        node = nxt
    node[keys[-1]] = value


def apply(raw: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
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


AfterRun = Callable[[Path], None]  # e.g. the report writer; module-level, so a pool can pickle it


def _run_point(
    args: tuple[dict[str, Any], str, str, int | None, AfterRun | None],
) -> dict[str, Any]:
    data, source, out, seed, after = args
    from fairbench.pipeline import run_scenario
    from fairbench.run import RunOptions

    scn = parse_scenario(data, source, Path(source).parent)
    outcome = run_scenario(scn, RunOptions(out=Path(out), seed=seed))
    if after is not None:
        after(outcome.run_dir)
    return outcome.summary


def run_sweep(
    sweep_file: Path,
    out_dir: Path,
    progress: Callable[[int, int], None] | None = None,
    after_run: AfterRun | None = None,
) -> list[dict[str, Any]]:
    """Run every point of the sweep file; `after_run(run_dir)` is called on each point's run
    directory (the CLI passes the report writer, which sits above this layer)."""
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
            (
                data,
                str(scenario_path),
                str(out_dir / f"point-{point.index:03d}"),
                point.seed,
                after_run,
            )
        )
    simulated = all(job[0].get("target", {}).get("kind") == "sim" for job in jobs)
    workers = int(spec.get("parallel", 1)) if simulated else 1
    summaries: list[dict[str, Any]] = [{}] * len(jobs)
    if workers > 1:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            for k, summary in enumerate(pool.map(_run_point, jobs)):
                summaries[k] = summary
                if progress:
                    progress(k + 1, len(jobs))
    else:
        for k, job in enumerate(jobs):
            summaries[k] = _run_point(job)
            if progress:
                progress(k + 1, len(jobs))
    rows = []
    for point, job, summary in zip(points, jobs, summaries, strict=True):
        rows.append(
            {
                "point": point.index,
                "params": point.params,
                "seed": point.seed,
                "run_dir": job[2],
                "valid": summary.get("valid"),
                "summary": summary,
            }
        )
    (out_dir / "sweep.json").write_text(
        json.dumps(
            [{k: v for k, v in r.items() if k != "summary"} for r in rows], indent=2, default=str
        )
    )
    return rows


def knee(
    evaluate: Callable[[float], bool],
    low: float,
    high: float,
    tolerance: float = 0.05,
    max_steps: int = 20,
) -> tuple[float | None, list[tuple[float, bool]]]:
    """The highest load multiplier at which `evaluate` (SLOs hold) is true, by bisection between
    `low` (must hold) and `high` (must not), to a relative `tolerance`. Like an SLA search; the
    trail of (multiplier, held) is returned for the report."""
    trail = []
    ok_low = evaluate(low)
    trail.append((low, ok_low))
    if not ok_low:
        return None, trail
    ok_high = evaluate(high)
    trail.append((high, ok_high))
    if ok_high:
        return high, trail
    for _ in range(max_steps):
        if (high - low) / low <= tolerance:
            break
        mid = math.sqrt(low * high)  # load spans orders of magnitude: bisect in log space
        held = evaluate(mid)
        trail.append((mid, held))
        low, high = (mid, high) if held else (low, mid)
    return low, trail


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
