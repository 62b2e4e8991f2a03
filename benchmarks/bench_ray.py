"""Ray's start-up cost and keep-up: one plan from 1 local process, 1 Ray actor and 2 Ray actors.

    python benchmarks/bench_ray.py [--rate 100] [--duration 10]

A loopback Ray cluster (a head and a second node, one custom resource each) is started here; the
same scenario (reference target, streamed chats at --rate req/s in all) runs three ways. Reported:
the cluster's start-up, the run's Ray start-up (connect + place actors), the clock offsets' bound,
and the generator's keep-up (send lag p50/p99, worst tenant rate ratio, event-loop lag p99).
On a machine with few cores the actors, the server and the driver share them, so two actors
cannot beat one here; what this shows is the overhead and that the figures are comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import show

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fairbench.pipeline import run_scenario
from fairbench.run import RunOptions
from fairbench.workload.loading import parse_scenario

NODES = ("bench_node_a", "bench_node_b")


def scenario(rate: float, duration: float) -> dict[str, object]:
    return {
        "name": "bench-ray",
        "workloads": {"chat": {"endpoint": "chat", "prompt_tokens": 64, "output_tokens": 16}},
        "tenants": [
            {
                "id": t,
                "mix": "chat",
                "arrival": {"process": "poisson", "rate": f"{rate / 2:g}/s"},
            }
            for t in ("alpha", "beta")
        ],
        "run": {"duration": f"{duration:g}s", "seed": 1, "grace": "10s", "timeout": "30s"},
        "target": {"kind": "reference"},
        "scheduler": {"policy": "vtc", "profile": "h100-llama3-8b"},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    began = time.perf_counter()
    import ray
    from ray.cluster_utils import Cluster

    imported = time.perf_counter() - began
    began = time.perf_counter()
    local = {"node_ip_address": "127.0.0.1", "num_cpus": 1}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**local, "resources": {NODES[0]: 1}, "include_dashboard": False},
    )
    cluster.add_node(**local, resources={NODES[1]: 1})
    started = time.perf_counter() - began
    scn = parse_scenario(scenario(args.rate, args.duration))
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for label, ray_address, workers in (
                ("1 process (no Ray)", None, 1),
                ("1 Ray actor", cluster.address, 1),
                ("2 Ray actors, 2 nodes", cluster.address, 2),
            ):
                out = Path(tmp) / label.replace(" ", "-").replace(",", "")
                options = RunOptions(
                    out=out,
                    workers=workers,
                    ray=ray_address,
                    ray_resources=NODES if ray_address else (),
                    progress=False,
                )
                t = time.perf_counter()
                outcome = run_scenario(scn, options)
                wall = time.perf_counter() - t
                health = outcome.summary["generator_health"]
                ratios = [v["rate_ratio"] or 0 for v in health["tenants"].values()]
                header = json.loads((out / "run.json").read_text())
                info = header.get("ray", {})
                bound = max(
                    (a["clock"]["uncertainty_ns"] for a in info.get("actors", [])), default=None
                )
                loop = health["event_loop_lag_ms"] or {}
                rows.append(
                    [
                        label,
                        f"{health['send_lag_ms']['p50']:.2f}",
                        f"{health['send_lag_ms']['p99']:.2f}",
                        f"{min(ratios):.3f}",
                        f"{loop.get('p99') or 0:.2f}",
                        "-" if not info else f"{info['startup_s']:.2f}",
                        "-" if bound is None else f"{bound / 1e6:.2f}",
                        f"{wall:.1f}",
                        "VALID" if outcome.summary["valid"] else "INVALID",
                    ]
                )
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    print(f"import ray: {imported:.2f} s; loopback cluster (head + 1 node) up: {started:.2f} s")
    show(
        f"{args.rate:g} req/s for {args.duration:g} s, reference target, {os.cpu_count()} cores",
        [
            "generators",
            "send lag p50 ms",
            "p99 ms",
            "worst rate ratio",
            "loop lag p99 ms",
            "Ray start-up s",
            "clock bound ms",
            "wall s",
            "verdict",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
