"""Simulation speed end to end, and policy decision cost.

1. The fleet end to end, as a user runs it (`fairbench run scenarios/fleet-80.yaml`): 80
   replicas of h100-llama3-8b serving 3,200 req/s from four tenants, 10 simulated minutes
   (1.92M requests), one core. Each policy (FIFO, DWRR, VTC, tiers) runs in a fresh process
   so its peak RSS is its own; the table gives the whole run's wall (imports, plan, simulation,
   records, summary, report), its req/s, the engine alone (`simulate`, timed inside the same
   run), the ratio of end to end to the engine alone, and the CPU seconds of the whole run and
   of the engine (on a shared, loaded machine wall time counts the neighbours; CPU time is the
   steadier reading) with requests per CPU second, and the engine's CPU µs per iteration of one
   replica (its per-step Python cost: the floor of a step-by-step simulator). Isolation's solo
   arms are off, as `analysis.isolation: auto` has them at this size. Target (issue 35):
   >= 100,000 req/s end to end, peak RSS <= 2 GB; the first policy is the baseline the others
   are a ratio to.
2. Policy decision cost vs queue depth (10^2 … 10^6 waiting jobs): one enqueue + one dequeue at
   a steady depth, µs per decision. DWRR should stay flat, WFQ grow logarithmically.

    python benchmarks/bench_sim.py [--minutes 10] [--policies fifo,dwrr,vtc,three-tier]
                                   [--depth-max 1000000] [--skip-sim] [--stages]
                                   [--repeat N]

`--repeat N` runs each policy N times, in rounds whose order rotates, and shows each policy's
median run with its slowest and fastest (the verdict reads the median): one run per policy reads
this VM's drift in page-fault cost as a difference between policies.

`--stages` adds, per policy, the CPU seconds of each stage outside the engine (a CPU timer
wrapped around each function named in STAGES, no profiler: a profiler's per-call cost skews
Python-heavy stages against numpy ones). Timers are inclusive: a stage nested in another (the
summary's parts, marked ·) is counted in both. For each top-level stage it also prints the
kernel's part of that CPU (`kernel s of ...`: on the VMs measured, mostly page faults of
freshly touched memory, about 10-16 µs per 4 KiB page) and the peak RSS once it has run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import finish, peak_rss_mb, show, verdict

from reference_scheduler.core.job import Job
from reference_scheduler.policies import build_policy

CLASSES = ("interactive", "batch", "best-effort")
FLEET = Path(__file__).resolve().parent.parent / "scenarios" / "fleet-80.yaml"


# (label, module, attribute): the functions `--stages` times; "Class.method" for a classmethod
STAGES = (
    ("plan (materialize)", "fairbench.run.measure", "materialize"),
    ("jobs (plan_jobs)", "fairbench.targets.sim", "plan_jobs"),
    ("records: job fields", "fairbench.targets.sim", "job_fields"),
    ("records: fields_from", "fairbench.targets.sim", "fields_from"),
    ("records: columns", "fairbench.targets.sim", "columns_of"),
    ("records: Arrow table", "fairbench.run.measure", "records_table"),
    ("accounting", "fairbench.pipeline", "check_accounting"),
    ("records.parquet write", "fairbench.pipeline", "write_records"),
    ("records frame", "fairbench.pipeline", "records_frame"),
    ("generator health", "fairbench.pipeline", "generator_health"),
    ("summary", "fairbench.pipeline", "build_summary"),
    ("· Cols.of", "fairbench.analysis.columns", "Cols.of"),
    ("· unloaded_ns", "fairbench.analysis.summary", "unloaded_ns"),
    ("· latencies", "fairbench.analysis.summary", "_latencies"),
    ("· latency_cis", "fairbench.analysis.summary", "latency_cis"),
    ("· group_block", "fairbench.analysis.summary", "group_block"),
    ("· backlogged_fairness", "fairbench.analysis.summary", "backlogged_fairness"),
    ("· fairness_block", "fairbench.analysis.summary", "fairness_block"),
    ("· slowdown_block", "fairbench.analysis.summary", "slowdown_block"),
    ("· starvation_block", "fairbench.analysis.summary", "starvation_block"),
    ("· fairness_over_time", "fairbench.analysis.summary", "fairness_over_time"),
    ("· drift_block", "fairbench.analysis.summary", "drift_block"),
    ("· queue_depth_block", "fairbench.analysis.summary", "queue_depth_block"),
    ("· metrics_block", "fairbench.analysis.summary", "metrics_block"),
    ("· isolation detail", "fairbench.analysis.summary", "_isolation_detail"),
    ("· session_block", "fairbench.analysis.summary", "session_block"),
)
# the report's parts, shown under its row
REPORT_STAGES = (
    ("· report frame", "fairbench.report.run", "report_frame"),
    ("· unloaded_ns (report)", "fairbench.report.run", "unloaded_ns"),
    ("· latency CDFs", "fairbench.report.figures", "latency_cdfs"),
    ("· TTFT p99 over time", "fairbench.report.figures", "ttft_p99_over_time"),
    ("· queue depth", "fairbench.report.figures", "queue_depth"),
    ("· service shares", "fairbench.report.figures", "service_shares"),
    ("· Jain and slowdown windows", "fairbench.report.figures", "jain_and_slowdown_windows"),
)


def _kernel_s() -> float:
    """This process's CPU seconds in the kernel so far: on this VM mostly page faults (a
    freshly touched 4 KiB page costs about 10 µs), which allocation churn pays again and again."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def time_stages() -> dict[str, float]:
    """Wrap each STAGES function, where its caller looks it up, with a CPU timer; the returned
    dict fills in as the run goes (label -> CPU s; for a top-level stage also the kernel's
    part of it, `kernel s of <label>`)."""
    spent: dict[str, float] = {}
    for label, module_name, attr in (*STAGES, *REPORT_STAGES):
        owner: object = importlib.import_module(module_name)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        inner = getattr(owner, name)
        spent[label] = 0.0

        def timed(*args: object, _f: object = inner, _k: str = label, **kwargs: object) -> object:
            c, k = time.process_time(), _kernel_s()
            try:
                return _f(*args, **kwargs)  # type: ignore[operator]
            finally:
                spent[_k] += time.process_time() - c
                if not _k.startswith("·"):  # the high-water mark once this stage has run
                    key = f"kernel s of {_k}"
                    spent[key] = spent.get(key, 0.0) + _kernel_s() - k
                    spent[f"peak RSS MB after {_k}"] = peak_rss_mb()

        setattr(owner, name, staticmethod(timed) if path else timed)
    return spent


def one_run(policy: str, minutes: float, out: Path, stages: bool = False) -> dict[str, Any]:
    """One end-to-end fleet run in this process (a fresh one: the caller spawns it), timed by
    stage; the engine's own time is read by wrapping the `simulate` that run_sim calls."""
    start, cpu0 = time.perf_counter(), time.process_time()
    import yaml

    import fairbench.targets.sim as sim_target
    from fairbench.pipeline import run_scenario
    from fairbench.report import write_run_report
    from fairbench.run.rundir import RunOptions
    from fairbench.workload.loading import parse_scenario

    imported = time.perf_counter()
    data = yaml.safe_load(FLEET.read_text(encoding="utf-8"))
    data["run"].update(duration=minutes * 60, warmup=minutes * 3, cooldown=minutes * 3)
    data["scheduler"]["policy"] = policy
    data["analysis"] = {"isolation": "off"}
    scn = parse_scenario(data, str(FLEET), FLEET.parent)
    engine: dict[str, Any] = {"s": 0.0, "cpu_s": 0.0, "kernel_s": 0.0, "steps": 0, "ran": []}
    from reference_scheduler.drivers import compiled

    def wrap(owner: Any, name: str, label: str) -> None:
        """Time `owner.name`, the simulator's entry: the Python engine's `simulate` that
        run_sim calls, or the compiled driver's `simulate_columns`."""
        inner = getattr(owner, name)

        def timed(*args: object, **kwargs: object) -> object:
            t, c, k = time.perf_counter(), time.process_time(), _kernel_s()
            try:
                result = inner(*args, **kwargs)
                engine["steps"] += result.steps  # engine iterations over all replicas
                engine["ran"].append(label)
                return result
            finally:
                engine["s"] += time.perf_counter() - t
                engine["cpu_s"] += time.process_time() - c
                engine["kernel_s"] += _kernel_s() - k

        setattr(owner, name, timed)

    wrap(sim_target, "simulate", "python")
    wrap(compiled, "simulate_columns", "compiled")
    spent = time_stages() if stages else {}
    imported_cpu = time.process_time() - cpu0
    # as `fairbench run` does (cli/run.py): the records stay in memory for the report
    outcome = run_scenario(scn, RunOptions(out=out / policy, progress=False), keep_records=True)
    ran, ran_cpu, ran_kernel = time.perf_counter(), time.process_time(), _kernel_s()
    write_run_report(outcome.run_dir, outcome.records)
    outcome.records = None
    done = time.perf_counter()
    spent = {"imports": imported_cpu, **spent, "engine": engine["cpu_s"]}
    spent["kernel s of engine"] = engine["kernel_s"]
    spent["report"] = time.process_time() - ran_cpu
    parts = {label: spent.pop(label) for label, _, _ in REPORT_STAGES if label in spent}
    spent.update(parts)
    spent["kernel s of report"] = _kernel_s() - ran_kernel
    return {
        "stages": spent,
        "requests": outcome.summary["accounting"]["planned"],
        "wall_s": done - start,
        "import_s": imported - start,
        "engine_s": engine["s"],
        "run_s": ran - imported,
        "report_s": done - ran,
        # CPU seconds of this process (the solo arms' processes are off here): on a shared,
        # loaded machine wall time counts the neighbours, CPU time much less
        "cpu_s": time.process_time() - cpu0,
        "engine_cpu_s": engine["cpu_s"],
        "kernel_s": _kernel_s(),
        "steps": engine["steps"],
        "simulator": "+".join(dict.fromkeys(engine["ran"])),
        "rss_mb": peak_rss_mb(),
    }


def sim_speed(
    policies: list[str],
    minutes: float,
    stages: bool = False,
    engine: str = "auto",
    repeat: int = 1,
) -> None:
    """Each policy's run `repeat` times, in rounds: round k starts at the k-th policy, so none
    always runs last, and each run's directory is removed once read. With repeat > 1 a policy's
    row (and its stages) is its median run by req/s, and `req/s spread` its slowest and fastest.
    Why: on the VMs measured, the same run's kernel CPU (page faults) swung 0.4-3.4 s within one
    invocation, growing with each policy run before it; one run per policy in a fixed order
    read that drift as a difference between policies."""
    rows = []
    stage_cols: dict[str, dict[str, float]] = {}
    base = None
    # the runs' processes as `fairbench run` starts (fairbench.cli.main.allocator_settings)
    env = {
        "NUMPY_MADVISE_HUGEPAGE": "0",
        "ARROW_DEFAULT_MEMORY_POOL": "system",
        **os.environ,
        "FAIRBENCH_SIM_ENGINE": engine,
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in policies}
    with tempfile.TemporaryDirectory() as tmp:
        # The compiled simulator is machine code made by numba on its first use and cached on
        # disk (reference_scheduler/drivers/compiled.py): a short run first, untimed, so each
        # policy's run below measures the simulation, not a compiler that runs once per install.
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                policies[0],
                "--minutes",
                "0.05",
                "--out",
                f"{tmp}/warm",
            ],
            capture_output=True,
            check=True,
            env=env,
        )
        print(
            f"first use (a 3-second run; compiles the simulator if not cached): "
            f"{time.perf_counter() - started:.1f} s wall"
        )
        for k in range(repeat):
            for name in policies[k % len(policies) :] + policies[: k % len(policies)]:
                proc = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--one",
                        name,
                        "--minutes",
                        str(minutes),
                        "--out",
                        tmp,
                    ]
                    + (["--stages"] if stages else []),
                    capture_output=True,
                    text=True,
                    check=True,
                    env=env,
                )
                runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                shutil.rmtree(Path(tmp) / name, ignore_errors=True)
    for name in policies:
        done = sorted(runs[name], key=lambda r: r["requests"] / r["wall_s"])
        r = done[len(done) // 2]  # the median run (the upper one of an even count)
        stage_cols[name] = {
            **r["stages"],
            "whole run": r["cpu_s"],
            "kernel s of whole run": r["kernel_s"],
        }
        speed = r["requests"] / r["wall_s"]
        core = r["requests"] / r["engine_s"]
        base = base or speed
        low, high = (done[i]["requests"] / done[i]["wall_s"] for i in (0, -1))
        rows.append(
            [
                name,
                r["simulator"],
                f"{r['requests']:,}",
                f"{r['wall_s']:.1f}",
                f"{speed:,.0f}",
                f"{low:,.0f}–{high:,.0f}",
                f"{r['engine_s']:.1f}",
                f"{core:,.0f}",
                f"{speed / core:.2f}",
                f"{r['cpu_s']:.1f} / {r['engine_cpu_s']:.1f}",
                f"{r['requests'] / r['cpu_s']:,.0f}",
                f"{r['engine_cpu_s'] / max(r['steps'], 1) * 1e6:.1f}",
                f"{r['import_s']:.1f} / {r['run_s'] - r['engine_s']:.1f} / {r['report_s']:.1f}",
                f"{r['rss_mb']:,.0f}",
                f"{speed / base:.2f}",
            ]
        )
        rss = max(x["rss_mb"] for x in done)
        verdict(
            speed >= 100_000 and rss <= 2048,
            f"{name}: {speed:,.0f} req/s end to end (target 100,000)"
            + (
                f", the median of {len(done)} runs ({low:,.0f}–{high:,.0f})"
                if len(done) > 1
                else ""
            )
            + f", peak RSS {rss:,.0f} MB (target 2,048)",
        )
    show(
        f"fleet-80 end to end: {minutes:g} simulated min, 3,200 req/s, 80 replicas, one core",
        [
            "policy",
            "simulator",
            "requests",
            "wall s",
            "req/s",
            "req/s spread",
            "engine s",
            "engine req/s",
            "end to end ÷ engine",
            "CPU s: all / engine",
            "req/CPU s",
            "engine CPU µs/step",
            "import / plan+records+summary / report s",
            "peak RSS MB",
            "ratio to first",
        ],
        rows,
    )
    if stages:
        labels = list(dict.fromkeys(k for cols in stage_cols.values() for k in cols))
        show(
            "CPU s per stage (inclusive; · = within the stage above), peak RSS after each",
            ["stage", *stage_cols],
            [[k, *[f"{stage_cols[p].get(k, 0.0):.2f}" for p in stage_cols]] for k in labels],
        )


def decision_cost(policies: list[str], depths: list[int]) -> None:
    rng = np.random.default_rng(2)
    rows = []
    for name in policies:
        row = [name]
        base = None
        for depth in depths:
            policy = build_policy(name)
            policy.bind(1 << 30)
            seq = 0
            for _ in range(depth):
                job = Job(
                    seq,
                    f"t{seq % 16}",
                    CLASSES[seq % 3],
                    int(rng.integers(10, 4000)),
                    int(rng.integers(0, 500)),
                    seq,
                    seq=seq,
                    priority=seq % 3,
                )
                policy.enqueue(job, seq)
                seq += 1
            ops = 20_000
            pre = [
                Job(
                    seq + k,
                    f"t{(seq + k) % 16}",
                    CLASSES[k % 3],
                    500,
                    100,
                    seq + k,
                    seq=seq + k,
                    priority=k % 3,
                )
                for k in range(ops)
            ]
            start = time.perf_counter()
            for k, job in enumerate(pre):
                policy.enqueue(job, seq + k)
                got = policy.dequeue(seq + k)
                policy.release(got, seq + k)
            per = (time.perf_counter() - start) / ops * 1e6
            base = base or per
            row.append(f"{per:.2f} ({per / base:.1f}x)")
        rows.append(row)
    show(
        "policy decision cost: µs per enqueue+dequeue at steady depth (ratio to smallest depth)",
        ["policy", *[f"{d:,}" for d in depths]],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--policies", default="fifo,dwrr,vtc,three-tier")
    parser.add_argument("--depth-max", type=int, default=1_000_000)
    parser.add_argument("--skip-sim", action="store_true")
    parser.add_argument("--stages", action="store_true", help="CPU s per stage outside the engine")
    parser.add_argument(
        "--engine",
        choices=("auto", "python", "compiled"),
        default="auto",
        help="the simulator (FAIRBENCH_SIM_ENGINE): compiled where it applies, or one of the two",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per policy, in rounds of rotating order; the median run is shown",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one policy's run
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1 (runs per policy)")
    if args.one:
        print(json.dumps(one_run(args.one, args.minutes, args.out, args.stages)))
        return
    if not args.skip_sim:
        sim_speed(args.policies.split(","), args.minutes, args.stages, args.engine, args.repeat)
    depths = [d for d in (100, 1_000, 10_000, 100_000, 1_000_000) if d <= args.depth_max]
    decision_cost(["fifo", "dwrr", "wfq", "vtc", "sfq", "three-tier"], depths)
    finish()


if __name__ == "__main__":
    main()
