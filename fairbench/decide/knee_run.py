"""The knee search as `fairbench knee` runs it: each load a point run (scaled rates, the next
seed on a re-check), judged by every SLO class's attainment, bisected by
`decide.sweep.search_knee`, and the trail written to knee.json.

It exists so that what the command computes is importable and tested without the command
line: the CLI checks flags and prints. It imports `decide.sweep`, `decide.points`, `workload`
and `run` (for writing JSON); the report writer a run gets is passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairbench.decide.points import PointJob, PointRunner, PointsFailed
from fairbench.decide.sweep import KneeResult, scale_load, search_knee
from fairbench.workload.loading import parse_scenario
from fairbench.workload.models import Scenario


@dataclass(frozen=True)
class KneeAsk:
    """What a knee search looks for: the load multipliers that bracket it, the attainment
    every class with an SLO must reach, and the relative precision of the answer."""

    low: float
    high: float
    attainment: float
    tolerance: float


def run_knee(
    file: Path,
    raw: dict[str, Any],
    scn0: Scenario,
    ask: KneeAsk,
    base: Path,
    runner: PointRunner,
    write_report: Callable[[Path], Any],
    show: Callable[[str], None],
) -> KneeResult:
    """Search the knee of scenario `raw` (from `file`, validated as `scn0`), one load a run in
    `base`; `show` gets one line per load. knee.json holds the answer and the trail. Raises
    PointsFailed when a load's run fails (knee.json then holds the error and the loads that
    ran, which keep their run directories)."""
    from fairbench.run import write_json

    seen: dict[float, int] = {}
    details: list[dict[str, Any]] = []

    def holds(factor: float) -> bool:
        repeat = seen.get(factor, 0)
        seen[factor] = repeat + 1
        seed = scn0.run.seed + repeat  # a re-check is an independent run, not a replay
        data = scale_load(raw, factor)
        scn = parse_scenario(data, str(file), file.parent)
        run_out = base / f"{len(details):02d}-x{factor:.4g}"
        label = f"load x{factor:.4g} (seed {seed})"
        job = PointJob(label, data, str(file), str(run_out), seed, write_report)
        (point,) = runner.run([job])
        if point.failed:
            raise PointsFailed.of([point])
        summary = point.summary
        with_slo = [c for c, slo in scn.slo_classes.items() if slo.ttft or slo.tpot or slo.e2e]
        got = {c: summary["slo_classes"].get(c, {}).get("slo_attainment") for c in with_slo}
        ok = summary["valid"] and all(g is None or g >= ask.attainment for g in got.values())
        details.append(
            {
                "load": factor,
                "seed": seed,
                "held": ok,
                "valid": summary["valid"],
                "attainment": got,
                "run_dir": str(run_out),
            }
        )
        shown = ", ".join(f"{c} {'-' if g is None else f'{g:.2%}'}" for c, g in got.items())
        show(f"load x{factor:.4g} (seed {seed}): {'holds' if ok else 'misses'} ({shown})")
        return ok

    try:
        result = search_knee(holds, ask.low, ask.high, ask.tolerance)
    except PointsFailed as failure:  # the loads that ran keep their run directories
        base.mkdir(parents=True, exist_ok=True)
        write_json(base / "knee.json", {"knee": None, "error": failure.lines[0], "trail": details})
        raise
    for row, role in zip(details, result.roles, strict=True):
        row["role"] = role
    write_json(
        base / "knee.json",
        {
            "knee": result.best,
            "monotone": result.monotone,
            "verified": result.verified,
            "highest_held": result.highest_held,
            "note": result.note,
            "attainment": ask.attainment,
            "tolerance": ask.tolerance,
            "trail": details,
        },
    )
    return result
