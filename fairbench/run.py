"""`fairbench run`: plan, execute (live or simulated), consolidate, summarize — the I/O edge.

Run directory (`reports/<scenario>-<UTC timestamp>/` or `--out`):
    scenario.yaml          the resolved scenario (API keys redacted)
    plan.parquet           the plan, with its digest
    run.json               header: versions, plan digest, seed, target, host, health, validity
                           (written first with status "running", so a killed run has a header)
    journal*.jsonl         records as they complete (one journal per worker process)
    records.parquet        all records, consolidated at the end
    server_metrics.parquet Prometheus samples scraped during live runs
    summary.json           the summary (see fairbench.summary)

`load_partial_run` reads a run directory whose process was killed: the journals are read back,
planned requests without a record are counted as lost, and the run is marked incomplete.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import multiprocessing as mp
import os
import platform
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

import fairbench
from fairbench.engine_setup import ENGINE_KINDS, engine_setup
from fairbench.executor import ExecOptions, ExecResult, Executor, LiveCounters
from fairbench.health import generator_health
from fairbench.materialize import materialize
from fairbench.plan import Plan, load_plan
from fairbench.records import (
    JournalWriter,
    check_accounting,
    read_journal,
    records_frame,
    write_records,
)
from fairbench.scenario import Scenario, parse_scenario
from fairbench.scrape import ScraperProcess
from fairbench.summary import build_summary
from fairbench.targets.base import Target

RUN_SCHEMA_VERSION = 1
REDACTED = "***redacted***"
PER_WORKER_RATE = 800.0  # req/s one generator process keeps with margin (see benchmarks)


@dataclass
class RunOptions:
    out: Path | None = None
    seed: int | None = None
    workers: int | None = None
    reports_dir: Path = Path("reports")
    progress: bool = True
    base_url: str | None = None  # override the target's URL
    report: bool = True  # write report.html and summary.md into the run directory


@dataclass
class RunOutcome:
    run_dir: Path
    summary: dict[str, Any]
    stopped: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        if self.stopped:
            return 130
        return 0 if self.summary["valid"] else 1


def redacted(scn: Scenario) -> dict[str, Any]:
    data = scn.model_dump(mode="json")
    for tenant in data["tenants"]:
        if tenant.get("api_key"):
            tenant["api_key"] = REDACTED
    if data["target"].get("api_key"):
        data["target"]["api_key"] = REDACTED
    for key in list(data["target"].get("headers", {})):
        if key.lower() in ("authorization", "x-api-key", "api-key"):
            data["target"]["headers"][key] = REDACTED
    return data


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }


def default_workers(plan: Plan) -> int:
    """Enough generator processes for the plan's busiest second, no more than the cores."""
    if len(plan) < 2:
        return 1
    seconds = plan.columns["offset_ns"] // 1_000_000_000
    peak = int(np.bincount(seconds).max())
    return max(1, min(os.cpu_count() or 1, math.ceil(peak / PER_WORKER_RATE)))


def new_run_dir(scn: Scenario, options: RunOptions) -> Path:
    if options.out is not None:
        path = options.out
        if (path / "run.json").exists() or any(path.glob("journal*.jsonl")):
            # Appending to another run's journal would merge two runs into one broken one.
            raise FileExistsError(
                f"--out {path} already holds a run; choose a new directory or remove it"
            )
    else:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        path = options.reports_dir / f"{scn.name}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = options.reports_dir / f"{scn.name}-{stamp}-{n}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


# ---------------------------------------------------------------- targets


def make_target(
    scn: Scenario,
    base_url: str | None = None,
    tenant_keys: dict[str, str] | None = None,
    setup: dict[str, Any] | None = None,
) -> Target:
    """The scenario's target. With `base_url` for a reference target, the server was started by
    the parent process and `tenant_keys` are the keys it issued; `setup` is what
    fairbench.engine_setup learned of a real engine (model, version, calibration)."""
    spec = scn.target
    keys = {t.id: t.api_key for t in scn.tenants if t.api_key}
    keys.update(tenant_keys or {})
    if spec.kind == "reference" and base_url is None:
        from fairbench.targets.reference import ReferenceTarget

        return ReferenceTarget(scn)
    from fairbench.targets.openai import OpenAITarget, Priority, plan_prompt

    url = base_url or spec.base_url
    if not url:
        raise ValueError(f"target.base_url: a {spec.kind} target needs the server's URL")
    reference = spec.kind == "reference"
    setup = setup or {}
    priority = None
    if spec.priority is not None:
        priority = Priority(spec.priority.by, spec.priority.values, spec.priority.default)
    calibration = setup.get("calibration")
    renderer = plan_prompt
    if calibration:
        from fairbench.calibrate import Calibration

        renderer = Calibration.from_json(calibration).renderer()
    target = OpenAITarget(
        url,
        spec.model or setup.get("model") or ("reference" if reference else "default"),
        spec.api_key,
        keys,
        spec.headers,
        spec.extra_body,
        spec.class_extra_body,
        spec.ignore_eos,
        spec.kind,
        class_header="X-SLO-Class" if reference else None,
        tenant_headers={t.id: t.headers for t in scn.tenants if t.headers},
        tenant_extra_body={t.id: t.extra_body for t in scn.tenants if t.extra_body},
        api=spec.api,
        priority=priority,
        renderer=renderer,
    )
    target.server_version = setup.get("server_version")
    if calibration:
        target.calibration = {k: v for k, v in calibration.items() if k != "words"}
    elif "calibration_note" in setup:
        target.calibration = {"note": setup["calibration_note"]}
    return target


def metrics_url(scn: Scenario, base_url: str | None) -> str | None:
    """Where the server's Prometheus metrics are: the scenario's own `metrics_url`, else the
    server's `/metrics` (not guessed for a generic OpenAI-compatible server)."""
    if scn.target.metrics_url:
        return scn.target.metrics_url
    base = base_url or scn.target.base_url
    return f"{base.rstrip('/')}/metrics" if base and scn.target.kind != "openai" else None


# ---------------------------------------------------------------- live execution


Progress = Callable[[LiveCounters], None]


async def _live(
    plan: Plan,
    scn: Scenario,
    journal: Path,
    exec_options: ExecOptions,
    indices: np.ndarray | None,
    worker: int,
    t0_source: Callable[[], Awaitable[int]] | None,
    base_url: str | None,
    progress: Progress | None,
    run_dir: Path | None,
    tenant_keys: dict[str, str] | None = None,
    setup: dict[str, Any] | None = None,
) -> tuple[ExecResult, dict[str, Any]]:
    target = make_target(scn, base_url, tenant_keys, setup)
    await target.open()
    writer = JournalWriter(journal)
    executor = Executor(plan, target, writer, exec_options, indices, worker)
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    hits = {"n": 0}

    def on_signal() -> None:
        hits["n"] += 1
        executor.stop.set()
        if hits["n"] > 1:
            executor.options.grace_s = 0.0

    for sig in signals:
        loop.add_signal_handler(sig, on_signal)
    scraper = None
    t0 = 0
    ticker = None
    # the target knows its URL once open (the reference target starts its own server)
    url = metrics_url(scn, getattr(target, "base_url", None)) if run_dir is not None else None
    if url and run_dir is not None:  # launched now: its interpreter starts during warm-up
        scraper = ScraperProcess(
            url, run_dir / "server_metrics.parquet", scn.target.scrape_interval
        )
    try:
        warm = getattr(target, "warm", None)
        if warm is not None:  # connections open before t0, not on the first requests' clock
            await warm(executor.warm_connections())
        if scraper is not None:
            await asyncio.to_thread(scraper.wait_ready)
        if t0_source is not None:  # a shard: the parent sets t0 once every shard is ready
            t0 = await t0_source()
        else:
            t0 = time.perf_counter_ns() + int(exec_options.lead_s * 1e9)
        if scraper is not None:
            scraper.start(t0)
        if progress is not None:

            async def tick() -> None:
                while True:
                    progress(executor.counters)
                    await asyncio.sleep(0.2)

            ticker = asyncio.create_task(tick())
        result = await executor.run(t0)
        if progress is not None:
            progress(executor.counters)
    finally:
        if ticker is not None:
            ticker.cancel()
        if scraper is not None:
            await scraper.stop(t0)
        for sig in signals:
            loop.remove_signal_handler(sig)
        writer.close()
        info = dict(target.info())
        await target.close()
    return result, info


def _uvloop_run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        return asyncio.run(coro)


def _worker_main(args: dict[str, Any], shared: Any) -> None:
    """One generator process: its shard of the plan, its own journal, the shared t0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into SIGTERM
    plan = load_plan(args["plan"])
    scn = parse_scenario(args["scenario"])
    k, n = args["worker"], args["workers"]
    indices = np.arange(k, len(plan), n)

    def progress(c: LiveCounters) -> None:
        shared[4 * k : 4 * k + 4] = [c.sent, c.done, c.errors, c.last_lag_ns]

    async def t0_source() -> int:
        shared[4 * n + k] = 1  # this shard is loaded, connected and warm
        while not shared[5 * n]:
            await asyncio.sleep(0.005)
        return int(shared[5 * n])

    exec_options = ExecOptions(**args["exec"])
    if n > len(os.sched_getaffinity(0)):
        exec_options.spin_s = 0.0  # spinners sharing a core only slow each other down
    result, _ = _uvloop_run(
        _live(
            plan,
            scn,
            Path(args["journal"]),
            exec_options,
            indices,
            k,
            t0_source,
            args["base_url"],
            progress,
            None,
            args["tenant_keys"],
            args["setup"],
        )
    )
    np.save(args["lags"], result.loop_lag_ns)


def _run_sharded(
    tenant_keys: dict[str, str] | None,
    plan_path: Path,
    plan: Plan,
    scn: Scenario,
    run_dir: Path,
    n: int,
    exec_options: ExecOptions,
    base_url: str | None,
    progress: Progress | None,
    setup: dict[str, Any] | None = None,
) -> tuple[bool, np.ndarray, int]:
    ctx = mp.get_context("spawn")
    # Per shard: sent, done, errors, last lag (4n); then a ready flag per shard (n); then t0.
    shared = ctx.Array("q", 5 * n + 1, lock=False)
    t0 = 0
    url = metrics_url(scn, base_url)
    scraper = (
        ScraperProcess(url, run_dir / "server_metrics.parquet", scn.target.scrape_interval)
        if url
        else None
    )
    procs = []
    for k in range(n):
        args = {
            "plan": str(plan_path),
            "scenario": scn.model_dump(mode="json"),
            "worker": k,
            "workers": n,
            "journal": str(run_dir / f"journal-{k}.jsonl"),
            "exec": exec_options.__dict__,
            "base_url": base_url,
            "tenant_keys": tenant_keys,
            "setup": setup,
            "lags": str(run_dir / f".loop-lag-{k}.npy"),
        }
        proc = ctx.Process(target=_worker_main, args=(args, shared), daemon=True)
        proc.start()
        procs.append(proc)
    stopped = False
    counters = LiveCounters(planned=len(plan))
    try:
        while any(p.is_alive() for p in procs):
            ready = all(shared[4 * n + k] for k in range(n))
            if not t0 and (ready or not all(p.is_alive() for p in procs)):
                # Every shard has loaded its plan and warmed its connections (or one died, and
                # the rest must not wait forever: its requests will show up as missing).
                if scraper is not None:
                    scraper.wait_ready()  # its baseline scrape must come before t0
                t0 = time.perf_counter_ns() + int(exec_options.lead_s * 1e9)
                shared[5 * n] = t0
                if scraper is not None:
                    scraper.start(t0)
            try:
                time.sleep(0.2)
            except KeyboardInterrupt:
                stopped = True
                for p in procs:
                    if p.is_alive() and p.pid:
                        os.kill(p.pid, signal.SIGTERM)
            values = list(shared[: 4 * n])
            counters.sent = sum(values[0::4])
            counters.done = sum(values[1::4])
            counters.errors = sum(values[2::4])
            counters.last_lag_ns = max(values[3::4]) if values else 0
            if progress is not None:
                progress(counters)
    finally:
        for p in procs:
            p.join()
        if scraper is not None:
            scraper.stop_sync(t0)
    lags = [
        np.load(run_dir / f".loop-lag-{k}.npy")
        for k in range(n)
        if (run_dir / f".loop-lag-{k}.npy").exists()
    ]
    for k in range(n):
        (run_dir / f".loop-lag-{k}.npy").unlink(missing_ok=True)
    return stopped, np.concatenate(lags) if lags else np.empty(0, dtype=np.int64), t0


# ---------------------------------------------------------------- the run


def execute_run(
    scn: Scenario, options: RunOptions | None = None, progress: Progress | None = None
) -> RunOutcome:
    options = options or RunOptions()
    plan = materialize(scn, options.seed)
    run_dir = new_run_dir(scn, options)
    (run_dir / "scenario.yaml").write_text(
        yaml.safe_dump(redacted(scn), sort_keys=False), encoding="utf-8"
    )
    plan_path = run_dir / "plan.parquet"
    plan.save(plan_path)
    header: dict[str, Any] = {
        "schema_version": RUN_SCHEMA_VERSION,
        "status": "running",
        "fairbench_version": fairbench.__version__,
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
        timeout_s=scn.run.timeout, grace_s=scn.run.grace, concurrency_cap=scn.run.concurrency_cap
    )
    stopped = False
    loop_lags: np.ndarray | None = None
    workers = 1
    if scn.target.kind == "sim":
        from fairbench.targets.sim import run_sim

        rows, info = run_sim(plan, scn)
        with (run_dir / "journal.jsonl").open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, separators=(",", ":")) + "\n")
    else:
        workers = options.workers or default_workers(plan)
        setup: dict[str, Any] = {}
        if scn.target.kind in ENGINE_KINDS:
            setup = _uvloop_run(engine_setup(scn, plan, options.base_url))
        if workers <= 1:
            result, info = _uvloop_run(
                _live(
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
            header["clock"] = {
                "source": "time.perf_counter_ns (CLOCK_MONOTONIC)",
                "t0_ns": result.t0_ns,
            }
        else:
            info, base_url = {"kind": scn.target.kind}, options.base_url
            if setup:
                info = dict(make_target(scn, base_url, None, setup).info())
            server = None
            if scn.target.kind == "reference" and base_url is None:
                from fairbench.targets.reference import ReferenceServer

                server = ReferenceServer(scn)
                base_url = server.start()
                info = server.info()
            try:
                stopped, loop_lags, t0 = _run_sharded(
                    server.keys if server is not None else None,
                    plan_path,
                    plan,
                    scn,
                    run_dir,
                    workers,
                    exec_options,
                    base_url,
                    progress,
                    setup,
                )
                header["clock"] = {"source": "time.perf_counter_ns (CLOCK_MONOTONIC)", "t0_ns": t0}
            finally:
                if server is not None:
                    server.stop(run_dir / "server_metrics.prom")
        rows = []
        for journal in sorted(run_dir.glob("journal*.jsonl")):
            rows.extend(read_journal(journal))
    outcome = _finish(run_dir, scn, plan, rows, header, info, stopped, loop_lags, workers)
    if options.report:
        from fairbench.report import write_run_report

        write_run_report(run_dir)
    return outcome


def _finish(
    run_dir: Path,
    scn: Scenario,
    plan: Plan,
    rows: list[dict[str, Any]],
    header: dict[str, Any],
    info: dict[str, Any],
    stopped: bool,
    loop_lags: np.ndarray | None,
    workers: int,
    complete: bool = True,
) -> RunOutcome:
    accounting = check_accounting(len(plan), rows)
    write_records(rows, run_dir / "records.parquet")
    frame = records_frame(rows)
    health = generator_health(
        frame, scn, loop_lags, stopped=stopped, virtual=scn.target.kind == "sim"
    )
    if not complete:
        health["invalid_reasons"].append(
            f"incomplete run: the process died; {accounting.missing} planned requests have no "
            "record (at most the last second before the crash)"
        )
        health["valid"] = False
    acc = {
        "planned": accounting.planned,
        "counts": accounting.counts,
        "missing": accounting.missing,
        "duplicates": accounting.duplicates,
        "holds": accounting.holds,
        "line": accounting.line(),
    }
    summary = build_summary(
        frame,
        scn,
        plan.digest,
        plan.seed,
        plan.duration_ns / 1e9,
        health,
        acc,
        closed_loop=scn.run.concurrency_cap is not None,
    )
    summary["incomplete"] = not complete
    summary["warnings"] = target_warnings(info)
    write_json(run_dir / "summary.json", summary)
    header.update(
        status="complete" if complete else "incomplete",
        finished_at=dt.datetime.now(dt.UTC).isoformat(),
        target=info,
        workers=workers,
        valid=summary["valid"],
        invalid_reasons=summary["invalid_reasons"],
        generator_health=health,
    )
    write_json(run_dir / "run.json", header)
    return RunOutcome(run_dir, summary, stopped, info)


def target_warnings(info: dict[str, Any]) -> list[str]:
    """What a reader of the results must know about the target's set-up."""
    cal = info.get("calibration")
    if isinstance(cal, dict) and cal.get("note"):
        return [f"prompt lengths: {cal['note']}"]
    if isinstance(cal, dict) and not cal.get("exact", True):
        bad = [c for c in cal.get("checks", []) if c.get("server") != c.get("planned")]
        return [f"prompt lengths: {len(bad)} calibration checks differ from the plan: {bad[:3]}"]
    return []


def load_partial_run(run_dir: Path) -> RunOutcome:
    """Recover a run whose generator died (kill -9): journals become records, marked incomplete."""
    header = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    scn = parse_scenario(yaml.safe_load((run_dir / "scenario.yaml").read_text(encoding="utf-8")))
    plan = load_plan(run_dir / "plan.parquet")
    rows = []
    for journal in sorted(run_dir.glob("journal*.jsonl")):
        rows.extend(read_journal(journal))
    return _finish(
        run_dir,
        scn,
        plan,
        rows,
        header,
        dict(header.get("target", {})),
        True,
        None,
        int(header.get("workers", 1)),
        complete=False,
    )
