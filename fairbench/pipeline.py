"""Scenario → measured run directory → summary: the one path every command takes to a result.

`fairbench run`, `ab`, `sweep` and `knee` all call `run_scenario`; a crashed run is finished by
`load_partial_run` the same way. It sits above `run/` (measurement) and `analysis/` (figures)
and below `decide/`, which runs scenarios through it. Writing the HTML report is left to the
caller (the CLI), because the report layer sits above the decisions it also renders.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fairbench.analysis import censored
from fairbench.analysis.actors import actor_health
from fairbench.analysis.health import MachineLoad, generator_health
from fairbench.analysis.isolation import skip_reason
from fairbench.analysis.summary import build_summary, measurement_window
from fairbench.plan.model import Plan
from fairbench.run.exec_types import Progress
from fairbench.run.measure import Measurement, measure
from fairbench.run.memory import release_freed_memory
from fairbench.run.records import (
    check_accounting,
    records_frame,
    records_table,
    sorted_table,
    write_records,
)
from fairbench.run.recovery import read_partial
from fairbench.run.rundir import RunOptions, write_json
from fairbench.workload.models import Scenario

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class RunOutcome:
    run_dir: Path
    summary: dict[str, Any]
    stopped: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    # the records as written to records.parquet, kept only when the caller asked
    # (`run_scenario(keep_records=True)`): its report takes them from memory, not back from
    # the file (issue 35: 0.36-0.74 CPU s to read the 10-minute fleet's 15 columns back)
    records: pa.Table | None = None

    @property
    def exit_code(self) -> int:
        if self.stopped:
            return 130
        return 0 if self.summary["valid"] else 1


def run_scenario(
    scn: Scenario,
    options: RunOptions | None = None,
    progress: Progress | None = None,
    keep_records: bool = False,
) -> RunOutcome:
    """Execute the scenario and write its records, summary.json and final run.json.
    `keep_records`: the outcome keeps the records' Arrow table for the caller's report
    (`report.write_run_report(run_dir, outcome.records)`); otherwise they are freed here and
    a report reads them back from records.parquet.

    A simulated run records no machine load: in virtual time the machine cannot make it late,
    and leaving the wall-clock figures out keeps its summary.json the same byte for byte
    wherever it ran (a sweep's point in this process, a pool's or a Ray task's)."""
    wall, cpu = time.monotonic(), os.times()
    m = measure(scn, options, progress)
    machine = None if scn.target.kind == "sim" else _machine_load(wall, cpu)
    outcome = finish(m, machine, keep_records)
    del m  # the plan and the records (but the table the outcome keeps)
    release_freed_memory()
    return outcome


def _machine_load(wall: float, cpu: os.times_result) -> MachineLoad:
    """What the machine did since (wall, cpu): a late generator's reason quotes it."""
    now = os.times()
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this platform
        load = None
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return MachineLoad(
        cpus=len(cores) if cores else os.cpu_count() or 1,
        load_1m=load,
        wall_s=time.monotonic() - wall,
        generator_cpu_s=(now.user - cpu.user) + (now.system - cpu.system),
        children_cpu_s=(now.children_user - cpu.children_user)
        + (now.children_system - cpu.children_system),
    )


def load_partial_run(run_dir: Path) -> RunOutcome:
    """Recover a run whose generator died (kill -9): journals become records, marked incomplete."""
    return finish(read_partial(run_dir))


def finish(
    m: Measurement, machine: MachineLoad | None = None, keep_records: bool = False
) -> RunOutcome:
    """Consolidate the records, check the accounting, summarise, and close run.json.
    `machine`: what the machine did during the run, when the caller watched it;
    `keep_records`: the outcome keeps the records' table (`RunOutcome.records`)."""
    scn, plan, rows, header = m.scn, m.plan, m.rows, m.header
    accounting = check_accounting(len(plan), rows)
    table = sorted_table(rows)  # once: written, framed, and kept if asked
    write_records(table, m.run_dir / "records.parquet")
    frame = records_frame(table)
    health = generator_health(
        frame,
        scn,
        m.loop_lags,
        stopped=m.stopped,
        virtual=scn.target.kind == "sim",
        machine=machine,
    )
    if m.actors is not None:  # a Ray run: health per actor, a late one named
        health["actors"], late = actor_health(
            frame, scn, m.actors, m.worker_loop_lags, stopped=m.stopped
        )
        health["invalid_reasons"] += late
    health["invalid_reasons"] += m.invalid_reasons
    if not m.complete:
        health["invalid_reasons"].append(
            m.incomplete_reason
            or f"incomplete run: the process died; {accounting.missing} planned requests have no "
            "record (at most the last second before the crash)"
        )
    health["valid"] = not health["invalid_reasons"]
    acc = {
        "planned": accounting.planned,
        "counts": accounting.counts,
        "missing": accounting.missing,
        "duplicates": accounting.duplicates,
        "holds": accounting.holds,
        "line": accounting.line(),
    }
    skipped = skip_reason(scn.analysis.isolation, len(plan), scn.target.kind == "sim")
    arms = None if skipped or scn.target.kind != "sim" else solo_arms(plan, scn)
    summary = build_summary(
        frame,
        scn,
        plan.digest,
        plan.seed,
        plan.duration_ns / 1e9,
        health,
        acc,
        closed_loop=scn.run.concurrency_cap is not None,
        solo_ttft_p99_ns=None if arms is None else {t: v for t, (v, _) in arms.items()},
        solo_ttft_p99_log_se=None if arms is None else {t: se for t, (_, se) in arms.items()},
    )
    if skipped:  # said where the figure would be, and why_none reads it
        summary["fairness"]["isolation_skipped"] = skipped
    summary["incomplete"] = not m.complete
    summary["warnings"] = target_warnings(m.info)
    write_json(m.run_dir / "summary.json", summary)
    header.update(
        status="complete" if m.complete else "incomplete",
        finished_at=dt.datetime.now(dt.UTC).isoformat(),
        target=m.info,
        workers=m.workers,
        valid=summary["valid"],
        invalid_reasons=summary["invalid_reasons"],
        generator_health=health,
    )
    write_json(m.run_dir / "run.json", header)
    return RunOutcome(m.run_dir, summary, m.stopped, m.info, table if keep_records else None)


def solo_ttft_p99(plan: Plan, scn: Scenario, workers: int | None = None) -> dict[str, float]:
    """Each tenant's TTFT p99 (ns) when the same plan runs with only that tenant (`solo_arms`
    without the standard errors)."""
    return {t: v for t, (v, _) in solo_arms(plan, scn, workers).items()}


def solo_arms(
    plan: Plan, scn: Scenario, workers: int | None = None
) -> dict[str, tuple[float, float | None]]:
    """Each tenant's TTFT p99 (ns) when the same plan runs with only that tenant: the solo arm
    of the isolation figure, simulated (the simulator is deterministic, so it is exact for the
    plan), with the standard error of its log (fairbench.analysis.fairness_ci.log_se: as an
    estimate of the tenant's long-run p99 alone, the isolation interval's solo side; None where
    it has none). A tenant whose solo p99 is itself censored gets none.

    The arms are independent, so with more than one tenant, a plan large enough that a fresh
    process pays for itself (`PARALLEL_MIN_REQUESTS`) and more than one core, they run in
    parallel processes; the answer is the same either way (each arm is a pure function of its
    plan)."""
    codes = plan.columns["tenant"]
    arms = [
        (tenant, plan.subset(rows))
        for k, tenant in enumerate(plan.tenants)
        if len(rows := np.flatnonzero(codes == k))
    ]
    lo, hi = measurement_window(scn, plan.duration_ns / 1e9)  # the mix's window, for every arm
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = min(len(arms), workers or cores or 1)
    nested = mp.parent_process() is not None  # a sweep's pool worker: its siblings hold the cores
    if n > 1 and len(plan) >= PARALLEL_MIN_REQUESTS and not nested:
        # spawn, as the sweep's pool does: a forked copy of a process with threads can hang
        with ProcessPoolExecutor(n, mp_context=mp.get_context("spawn")) as pool:
            k = len(arms)
            values = list(pool.map(_solo_arm, [a for _, a in arms], [scn] * k, [lo] * k, [hi] * k))
    else:
        values = [_solo_arm(arm, scn, lo, hi) for _, arm in arms]
    return {tenant: v for (tenant, _), v in zip(arms, values, strict=True) if v is not None}


# A spawned process imports fairbench and numpy first (about 1-3 s); below this many planned
# requests the arms run here, one after another, faster than that start.
PARALLEL_MIN_REQUESTS = 20_000


def _solo_arm(plan: Plan, scn: Scenario, lo: float, hi: float) -> tuple[float, float | None] | None:
    """One tenant's requests alone: its TTFT p99 (ns) among those intended in [lo, hi] s and
    the standard error of its log, or None where that p99 is censored (a lower bound is no
    denominator)."""
    from fairbench.analysis.fairness_ci import log_se
    from fairbench.targets.sim import run_sim

    records, _ = run_sim(plan, scn, columns=True)
    frame = records_frame(
        records if isinstance(records, list) else records_table(records, len(plan))
    )
    t = frame["t_intended_ns"].to_numpy(dtype=np.float64) / 1e9
    frame = frame[(t >= lo) & (t <= hi)].reset_index(drop=True)
    obs = censored.ttft_rows(frame, scn.run.timeout).select()
    value, bound = censored.quantile(obs, 0.99)
    return (value, log_se(obs, 0.99)) if np.isfinite(value) and not bound else None


def target_warnings(info: dict[str, Any]) -> list[str]:
    """What a reader of the results must know about the target's set-up: prompt-length
    calibration, the scheduler's own warnings (a setting that makes its policy degenerate), and
    anything the run learned on the way (a metrics scraper that failed)."""
    out: list[str] = []
    cal = info.get("calibration")
    if isinstance(cal, dict) and cal.get("note"):
        out.append(f"prompt lengths: {cal['note']}")
    elif isinstance(cal, dict) and not cal.get("exact", True):
        bad = [c for c in cal.get("checks", []) if c.get("server") != c.get("planned")]
        out.append(f"prompt lengths: {len(bad)} calibration checks differ from the plan: {bad[:3]}")
    for key in ("warnings", "scrape_warnings"):
        extra = info.get(key)
        if isinstance(extra, list | tuple):
            out.extend(str(w) for w in extra)
    return out
