"""Execute a scenario into a run directory: the measurement, with no analysis in it.

A scenario is materialized once, its plan and redacted scenario written first, then executed in
one of four ways — simulated in virtual time (`target: sim`), one live generator process,
several live shards on this machine, or shards on Ray actors across machines (`--ray`,
fairbench.run.ray_shards) — and every way ends in the same `Measurement`: the journal's records
and what the run learned about its target and its generator. Summarising is the next stage's
job (fairbench.pipeline).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fairbench._version import __version__
from fairbench.plan.materialize import materialize
from fairbench.plan.model import Plan
from fairbench.run.exec_types import ExecOptions, LiveCounters, Progress
from fairbench.run.records import Records, records_table, release_arrow_memory
from fairbench.run.rundir import (
    RUN_SCHEMA_VERSION,
    RunOptions,
    host_info,
    new_run_dir,
    read_journals,
    redacted,
    write_json,
)
from fairbench.targets.factory import make_target
from fairbench.workload.models import Scenario
from fairbench.workload.sessions import agent_workloads

CLOCK_SOURCE = "time.perf_counter_ns (CLOCK_MONOTONIC)"


@dataclass
class Measurement:
    """What one execution of a plan left behind, before any analysis."""

    run_dir: Path
    scn: Scenario
    plan: Plan
    rows: Records  # dicts (a live run's journal) or one Arrow table (a simulated run)
    header: dict[str, Any]  # run.json as written at the start (updated when finished)
    info: dict[str, Any]  # what the target says about itself
    stopped: bool
    loop_lags: np.ndarray | None
    workers: int
    complete: bool = True
    # what the measurement itself found wrong (a Ray actor's clock bound past the budget) and,
    # for an incomplete run, why; per-actor details for the per-actor health (Ray runs)
    invalid_reasons: list[str] = field(default_factory=list)
    incomplete_reason: str | None = None
    actors: list[dict[str, Any]] | None = None
    worker_loop_lags: dict[int, np.ndarray] | None = None


@dataclass
class SimCounters(LiveCounters):
    """A simulated run's progress: requests ended (finished, rejected, cancelled) of those
    planned, the virtual seconds simulated of the plan's span, and an ETA: the wall time so
    far scaled by the virtual time still to simulate (the engine's cost per virtual second is
    steady under a steady load)."""

    virtual_s: float = 0.0
    span_s: float = 0.0
    eta_s: float | None = None
    phase: str = "simulating"

    @property
    def line(self) -> str:
        """What the progress bar says beside the count."""
        if self.phase != "simulating":
            return self.phase
        if self.virtual_s > self.span_s:  # the sends are over; what is in flight finishes
            return (
                f"simulating · virtual {self.virtual_s:,.1f} s · draining past the plan's "
                f"{self.span_s:,.1f} s"
            )
        eta = "" if self.eta_s is None else f" · ETA {self.eta_s:,.0f} s"
        return f"simulating · virtual {self.virtual_s:,.1f} of {self.span_s:,.1f} s{eta}"


def _sim_progress(
    plan: Plan, progress: Progress | None
) -> tuple[SimCounters, Callable[[int, int], None] | None]:
    """The simulator's callback, feeding the CLI's progress bar (None when nobody watches)."""
    counters = SimCounters(planned=len(plan), span_s=plan.duration_ns / 1e9)
    if progress is None:
        return counters, None
    start = time.monotonic()

    def tell(ended: int, now_ns: int) -> None:
        counters.done = counters.sent = ended
        counters.virtual_s = now_ns / 1e9
        done = min(counters.virtual_s, counters.span_s)
        if done > 0:
            counters.eta_s = (time.monotonic() - start) * (counters.span_s - done) / done
        progress(counters)

    return counters, tell


def measure(
    scn: Scenario, options: RunOptions | None = None, progress: Progress | None = None
) -> Measurement:
    options = options or RunOptions()
    if scn.target.kind != "sim":  # before anything is planned or written: a dead target, one line
        # the live path's HTTP modules load here, not at import: a simulated run never needs
        # aiohttp (about 0.3 s of a fleet run's imports, issue 35)
        from fairbench.run.live import uvloop_run
        from fairbench.targets.precheck import precheck

        uvloop_run(precheck(scn, options.base_url))
    plan = materialize(scn, options.seed)
    run_dir = new_run_dir(scn, options)
    (run_dir / "scenario.yaml").write_text(
        yaml.safe_dump(redacted(scn), sort_keys=False), encoding="utf-8"
    )
    plan_path = run_dir / "plan.parquet"
    plan.save(plan_path)
    release_arrow_memory()  # the plan's Arrow copy: 76 MB of a 192k-request fleet run kept
    header: dict[str, Any] = {
        "schema_version": RUN_SCHEMA_VERSION,
        "status": "running",
        "fairbench_version": __version__,
        "scenario": scn.name,
        "plan_digest": plan.digest,
        "seed": plan.seed,
        "planned": len(plan),
        "started_at": dt.datetime.now(dt.UTC).isoformat(),
        "host": host_info(),
        "target": {"kind": scn.target.kind},
    }
    write_json(run_dir / "run.json", header)
    exec_options = ExecOptions(
        timeout_s=scn.run.timeout,
        grace_s=scn.run.grace,
        concurrency_cap=scn.run.concurrency_cap,
        pacing=scn.run.pacing,
        agent_workloads=agent_workloads(scn),
    )
    stopped = False
    loop_lags: np.ndarray | None = None
    workers = 1
    if scn.target.kind == "sim":
        from fairbench.targets.sim import run_sim

        # no journal: it exists so a live run's crash loses at most a second, and nothing can
        # crash mid-request in virtual time (a killed simulation is rerun, exactly); at fleet
        # size it was 92 MB of JSON written and never read (issue 35). Records go straight to
        # records.parquet (pipeline.finish).
        counters, tell = _sim_progress(plan, progress)
        records, info = run_sim(plan, scn, tell, columns=True)
        # the records as one Arrow table, made of columns with no object per record (issue 35)
        rows = records if isinstance(records, list) else records_table(records, len(plan))
        del records
        if progress is not None:
            counters.phase = "summarising"
            progress(counters)
        return Measurement(run_dir, scn, plan, rows, header, info, stopped, loop_lags, workers)
    # the live path's modules (asyncio, the executor, the scraper, the shard pool) load here,
    # not at import: a simulated run never needs them (fairbench.run.exec_types)
    from fairbench.run.live import live, uvloop_run
    from fairbench.run.scrape import scrape_report
    from fairbench.run.shards import default_workers
    from fairbench.targets.engine_setup import ENGINE_KINDS, engine_setup

    workers = options.workers or default_workers(plan)

    setup: dict[str, Any] = {}
    if scn.target.kind in ENGINE_KINDS:
        setup = uvloop_run(engine_setup(scn, plan, options.base_url))
    if options.ray is not None or workers > 1:
        return _measure_shards(
            scn, options, plan, plan_path, run_dir, header, exec_options, workers, setup, progress
        )
    result, info = uvloop_run(
        live(
            plan,
            scn,
            run_dir / "journal.jsonl",
            exec_options,
            None,
            0,
            None,
            options.base_url,
            progress,
            run_dir,
            None,
            setup,
        )
    )
    stopped, loop_lags = result.stopped, result.loop_lag_ns
    header["clock"] = live_clock(result.t0_ns, scn.run.pacing)
    header["clock"]["pacing"] = result.pacing  # what ran (timerfd falls back to spin)
    # what the schedule cost this process, from the first send to the end of the drain
    header["clock"]["generator_cpu_s"] = round(result.cpu_s, 4)
    info = {**info, **scrape_report(run_dir)}  # a failing scraper is reported, not swallowed
    rows = read_journals(run_dir)
    return Measurement(run_dir, scn, plan, rows, header, info, stopped, loop_lags, workers)


def live_clock(t0_ns: int, pacing: str = "auto", **extra: str) -> dict[str, Any]:
    """run.json's `clock` of a live run: the timeline, t0, and which stamps the transport took
    (kernel receive stamps or user space; the send's last byte)."""
    from fairbench.run.pacer import resolve as resolve_pacing
    from fairbench.targets.http.stamped import describe as stamps_info

    return {
        "source": CLOCK_SOURCE,
        "t0_ns": t0_ns,
        **extra,
        "stamps": stamps_info(),
        "pacing": resolve_pacing(pacing),
    }


@contextmanager
def shared_target(
    scn: Scenario, options: RunOptions, setup: dict[str, Any], run_dir: Path
) -> Iterator[tuple[dict[str, Any], str | None, dict[str, str] | None]]:
    """The one target every generator process shares: (info, base URL, tenant keys). For a
    `reference` target without a URL, the server is started here and stopped (its last
    /metrics saved into the run directory) when the block ends."""
    info, base_url = {"kind": scn.target.kind}, options.base_url
    if setup:
        info = dict(make_target(scn, base_url, None, setup).info())
    if scn.target.kind != "reference" or base_url is not None:
        yield info, base_url, None
        return
    from fairbench.targets.reference import ReferenceServer

    server = ReferenceServer(scn)
    base_url = server.start()
    try:
        yield server.info(), base_url, server.keys
    finally:
        server.stop(run_dir / "server_metrics.prom")


def _measure_shards(
    scn: Scenario,
    options: RunOptions,
    plan: Plan,
    plan_path: Path,
    run_dir: Path,
    header: dict[str, Any],
    exec_options: ExecOptions,
    workers: int,
    setup: dict[str, Any],
    progress: Progress | None,
) -> Measurement:
    """The plan's shards on generator processes here (fairbench.run.shards) or on Ray actors
    (fairbench.run.ray_shards, with --ray); one target, one server, one scraper, here."""
    from fairbench.run.scrape import scrape_report
    from fairbench.run.shards import Shards, run_sharded

    with shared_target(scn, options, setup, run_dir) as (info, base_url, keys):
        shards = Shards(
            keys, plan_path, plan, scn, run_dir, workers, exec_options, base_url, progress, setup
        )
        if options.ray is None:
            stopped, loop_lags, t0 = run_sharded(shards)
            header["clock"] = live_clock(t0, scn.run.pacing)
        else:
            from fairbench.run.ray_shards import run_ray

            result = run_ray(options.ray or "auto", shards, options.ray_resources)
    info = {**info, **scrape_report(run_dir)}  # a failing scraper is reported, Ray's too
    if options.ray is None:
        rows = read_journals(run_dir)
        return Measurement(run_dir, scn, plan, rows, header, info, stopped, loop_lags, workers)
    header["clock"] = live_clock(
        result.t0,
        scn.run.pacing,
        timeline="the driver's: each actor's t0 is the driver's t0 in its own clock",
    )
    header["ray"] = {**result.info, "actors": result.actors}
    lags = [v for v in result.loop_lags.values() if len(v)]
    return Measurement(
        run_dir,
        scn,
        plan,
        read_journals(run_dir),
        header,
        info,
        result.stopped,
        np.concatenate(lags) if lags else np.empty(0, dtype=np.int64),
        workers,
        complete=result.incomplete_reason is None,
        invalid_reasons=result.invalid_reasons,
        incomplete_reason=result.incomplete_reason,
        actors=result.actors,
        worker_loop_lags=result.loop_lags,
    )
