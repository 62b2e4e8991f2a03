"""`bench_generator.py --ray`: the generator's keep-up rate and the TTFT it adds with 1 and 2 Ray
actors, against the truth server, and what Ray's start-up costs (issue #18, item 7).

Kept apart from bench_generator.py so that each can change without the other; it shares only the
truth server (benchmarks/sse_truth_server.py, its own process, pinned to the last core) and the
criteria: a rate is kept when achieved/planned is within 1%, send-lag p99 <= 1 ms and every
request succeeds. Poisson arrivals only (the harder case); every rate given is tried, and one
local process (no Ray) runs each too, as the baseline under the machine's load of the moment.

A loopback Ray cluster is started here (a head and a second node, one CPU and one custom
resource each), after this process gave the truth server's core away, so every Ray process
shares the other cores: with 2 actors on a small machine, the actors share them too, and the
row shows Ray's overhead, not the gain more machines bring. Start-up is reported three ways:
importing ray, bringing the cluster up, and per run (connect, place the actors, start their
generators: `ray.startup_s` in run.json), against the run's wall time.

    python benchmarks/bench_generator.py --ray [--seconds 4] [--rates 200,400,800]
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairbench.pipeline import run_scenario
from fairbench.run import RunOptions
from fairbench.workload.loading import parse_scenario
from fairbench.workload.models import Scenario

HERE = Path(__file__).resolve().parent
NODES = ("bench_gen_a", "bench_gen_b")
CORES = sorted(os.sched_getaffinity(0))


def scenario(rate: float, seconds: float) -> Scenario:
    return parse_scenario(
        {
            "name": f"gen-ray-{rate:g}",
            "workloads": {
                "c": {"endpoint": "completions", "prompt_tokens": 16, "output_tokens": 32}
            },
            "tenants": [{"id": "t", "mix": "c", "arrival": {"process": "poisson", "rate": rate}}],
            "run": {"duration": seconds, "seed": 1, "grace": "10s", "timeout": "30s"},
            "target": {"kind": "openai", "base_url": "http://127.0.0.1:1", "model": "m"},
            "health": {"max_send_lag_p99": "1ms"},
        }
    )


class TruthServer:
    """The truth server on the last core; this process (and what it starts) keeps the rest."""

    def __init__(self, workdir: Path) -> None:
        self.log = workdir / f"truth-{time.perf_counter_ns()}.csv"
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "sse_truth_server.py"), "--log", str(self.log)],
            stdout=subprocess.PIPE,
            text=True,
        )
        if len(CORES) > 1:
            os.sched_setaffinity(self.proc.pid, {CORES[-1]})
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def stop(self) -> pd.DataFrame:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        return pd.read_csv(self.log)


def trial(address: str, actors: int, rate: float, seconds: float, workdir: Path) -> dict[str, Any]:
    """One run from `actors` Ray actors at `rate` (0: one local process, no Ray, the baseline
    measured under the same load); keep-up figures and client-added TTFT."""
    server = TruthServer(workdir)
    out = workdir / f"ray-{actors}-{rate:g}"
    began = time.perf_counter()
    try:
        outcome = run_scenario(
            scenario(rate, seconds),
            RunOptions(
                out=out,
                workers=max(actors, 1),
                base_url=server.url,
                ray=address if actors else None,
                ray_resources=NODES[:actors],
                progress=False,
            ),
        )
    finally:
        truth = server.stop()
    wall = time.perf_counter() - began
    records = pd.read_parquet(out / "records.parquet")
    header = json.loads((out / "run.json").read_text())
    info = header.get("ray") or {"startup_s": math.nan, "actors": []}
    startup = float(info["startup_s"])
    bound = max((a["clock"]["uncertainty_ns"] for a in info["actors"]), default=math.nan) / 1e6
    shutil.rmtree(out, ignore_errors=True)
    sent = records["t_sent_ns"].dropna().to_numpy(dtype=np.int64)
    if len(sent) < 2:  # nothing measured: say why, rather than divide by nothing
        why = records["error_detail"].dropna().head(1).tolist()
        raise RuntimeError(f"{actors} actor(s) at {rate:g}/s sent {len(sent)} requests: {why}")
    intended = records["t_intended_ns"].to_numpy(dtype=np.int64)
    planned_rate = (len(intended) - 1) / ((intended.max() - intended.min()) / 1e9)
    achieved = (len(sent) - 1) / ((sent.max() - sent.min()) / 1e9)
    lag = (records["t_sent_ns"] - records["t_intended_ns"]).dropna().to_numpy() / 1e6
    ok = float((records["status"] == "ok").mean())
    # client TTFT (first token - sent, on the actor's clock) minus the server's (first token
    # written - request read, on its own): two durations, so no clock offset enters
    truth = truth[truth["request_id"].str.startswith("fb-")]  # not the pre-run check's GET
    truth = truth.assign(request_id=truth["request_id"].str.removeprefix("fb-").astype(int))
    joined = records.merge(truth, on="request_id")
    client = (joined["t_first_token_ns"] - joined["t_sent_ns"]).to_numpy(dtype=np.float64)
    served = (joined["t_first_written_ns"] - joined["t_read_ns"]).to_numpy(dtype=np.float64)
    added = (client - served) / 1e6
    ratio = achieved / planned_rate
    return {
        "actors": actors,
        "rate": rate,
        "achieved_ratio": ratio,
        "lag_p99_ms": float(np.percentile(lag, 99)),
        "ok": ok,
        "keeps_up": abs(ratio - 1) <= 0.01 and float(np.percentile(lag, 99)) <= 1.0 and ok == 1.0,
        "added_ttft_p50_ms": float(np.percentile(added, 50)) if len(added) else float("nan"),
        "added_ttft_p99_ms": float(np.percentile(added, 99)) if len(added) else float("nan"),
        "ray_startup_s": startup,
        "clock_bound_ms": bound,
        "wall_s": wall,
        "valid": bool(outcome.summary["valid"]),
    }


def ray_rows(rates: list[float], seconds: float) -> list[dict[str, Any]]:
    """Every rate for each generator (one local process as the baseline, 1 Ray actor, 2 actors
    on 2 nodes): on a loaded machine a rate can miss and a higher one hold. The last row
    (`kind: startup`) is the cost of importing ray and of starting the cluster."""
    began = time.perf_counter()
    import ray
    from ray.cluster_utils import Cluster

    imported = time.perf_counter() - began
    if len(CORES) > 1:  # the truth server gets the last core; Ray's processes inherit the rest
        os.sched_setaffinity(0, set(CORES[:-1]))
    began = time.perf_counter()
    local = {"node_ip_address": "127.0.0.1", "num_cpus": 1}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**local, "resources": {NODES[0]: 1}, "include_dashboard": False},
    )
    cluster.add_node(**local, resources={NODES[1]: 1})
    up = time.perf_counter() - began
    rows: list[dict[str, Any]] = []
    workdir = Path(tempfile.mkdtemp(prefix="fb-bench-ray-"))
    try:
        for actors in (0, 1, 2):
            for rate in rates:
                row = trial(cluster.address, actors, rate, seconds, workdir)
                rows.append({"kind": "keep-up", **row})
                print(
                    f"  {label(actors)}: rate={rate:>6g}: ratio {row['achieved_ratio']:.4f}, "
                    f"lag p99 {row['lag_p99_ms']:.3f} ms, added TTFT p99 "
                    f"{row['added_ttft_p99_ms']:.3f} ms -> "
                    f"{'keeps up' if row['keeps_up'] else 'falls behind'}",
                    flush=True,
                )
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    rows.append({"kind": "startup", "import_s": imported, "cluster_s": up})
    return rows


def label(actors: int) -> str:
    return "1 process, no Ray" if actors == 0 else f"{actors} Ray actor{'s' if actors > 1 else ''}"


def show_ray_rows(rows: list[dict[str, Any]]) -> None:
    """The tables: every trial, the highest rate kept per actor count, and Ray's start-up."""
    from _common import show

    trials = [r for r in rows if r["kind"] == "keep-up"]
    show(
        "Ray actors: keep-up (achieved/planned within 1%, send-lag p99 <= 1 ms) and client-added "
        "TTFT (client TTFT - server truth, per request), Poisson",
        [
            "generator",
            "req/s",
            "achieved/planned",
            "lag p99 ms",
            "ok share",
            "added TTFT p50 / p99 ms",
            "keeps up",
            "Ray start-up s",
            "clock bound ms",
            "wall s",
        ],
        [
            [
                label(r["actors"]),
                f"{r['rate']:g}",
                f"{r['achieved_ratio']:.4f}",
                f"{r['lag_p99_ms']:.3f}",
                f"{r['ok']:.3f}",
                f"{r['added_ttft_p50_ms']:.3f} / {r['added_ttft_p99_ms']:.3f}",
                "yes" if r["keeps_up"] else "no",
                "-" if math.isnan(r["ray_startup_s"]) else f"{r['ray_startup_s']:.2f}",
                "-" if math.isnan(r["clock_bound_ms"]) else f"{r['clock_bound_ms']:.2f}",
                f"{r['wall_s']:.1f}",
            ]
            for r in trials
        ],
    )
    best = {
        n: max((r["rate"] for r in trials if r["actors"] == n and r["keeps_up"]), default=0.0)
        for n in (0, 1, 2)
    }
    show(
        "highest rate kept (req/s)",
        ["generator", "poisson"],
        [[label(n), f"{best[n]:g}"] for n in (0, 1, 2)],
    )
    start = next(r for r in rows if r["kind"] == "startup")
    per_run = [r["ray_startup_s"] for r in trials if r["actors"]]
    print(
        f"import ray {start['import_s']:.2f} s; loopback cluster (head + 1 node) up "
        f"{start['cluster_s']:.2f} s; per run, connect + place + start the actors: "
        f"{min(per_run):.2f}-{max(per_run):.2f} s"
    )


def main_ray(rates: list[float], seconds: float) -> None:
    """What `bench_generator.py --ray` runs."""
    show_ray_rows(ray_rows(rates, seconds))
