"""Analysis of 1,000,000 records: every summary metric, with bootstrap CIs. Target: under 30 s.

The summary's quantile CIs use the exact bootstrap (fairbench.analysis.stats): the resampling
distribution of a sample quantile in closed form — the limit of infinitely many resamples. The
baseline, measured in the same run, is the explicit percentile bootstrap with 1,000 resamples of
one quantile (timed on 50 resamples and scaled, labelled as such).

    python benchmarks/bench_analysis.py [--records 1000000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from _common import finish, peak_rss_mb, show, verdict

from fairbench.analysis.stats import quantile_ci
from fairbench.analysis.summary import build_summary
from fairbench.workload.scenario import parse_scenario

SCENARIO = parse_scenario(
    {
        "name": "bench",
        "workloads": {"chat": {"prompt_tokens": 100}, "doc": {"prompt_tokens": 4000}},
        "tenants": [
            {
                "id": f"t{k}",
                "weight": 1 + k % 3,
                "slo_class": ["interactive", "batch", "best-effort"][k % 3],
                "mix": "chat",
                "arrival": {"process": "poisson", "rate": 100},
            }
            for k in range(8)
        ],
        "run": {"duration": "1000s", "warmup": "10s", "cooldown": "10s"},
        "target": {"kind": "sim"},
    }
)


def records(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, 1000e9, n)).astype(np.int64)
    tenant = rng.integers(0, 8, n)
    ttft = rng.lognormal(np.log(80e6), 1.0, n).astype(np.int64)
    out = rng.integers(1, 400, n)
    tpot = rng.lognormal(np.log(12e6), 0.3, n)
    done = t + ttft + (tpot * (out - 1)).astype(np.int64)
    status = np.where(rng.random(n) < 0.98, "ok", "error")
    return pd.DataFrame(
        {
            "request_id": np.arange(n),
            "tenant": [f"t{k}" for k in tenant],
            "slo_class": np.array(["interactive", "batch", "best-effort"])[tenant % 3],
            "workload": "chat",
            "endpoint": "chat",
            "t_intended_ns": t,
            "t_sent_ns": t + 50_000,
            "t_first_byte_ns": t + ttft,
            "t_first_token_ns": t + ttft,
            "t_last_token_ns": done,
            "t_done_ns": done,
            "prompt_tokens": rng.integers(10, 4000, n),
            "max_tokens": out,
            "output_tokens": out,
            "n_chunks": out,
            "itl_max_ns": tpot * 3,
            "status": status,
            "queue_time_ns": rng.exponential(20e6, n).astype(np.int64),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    df = records(args.records)
    health = {"invalid_reasons": [], "valid": True, "send_lag_ms": {}}
    acc = {"holds": True, "line": "bench"}
    start = time.perf_counter()
    summary = build_summary(df, SCENARIO, "sha256:bench", 0, 1000.0, health, acc)
    ours = time.perf_counter() - start
    ttft = (df["t_first_token_ns"] - df["t_intended_ns"]).to_numpy(dtype=float)
    start = time.perf_counter()
    exact = quantile_ci(ttft, 0.99)
    exact_s = time.perf_counter() - start
    rng = np.random.default_rng(1)
    start = time.perf_counter()
    draws = [np.quantile(ttft[rng.integers(0, len(ttft), len(ttft))], 0.99) for _ in range(50)]
    naive_50 = time.perf_counter() - start
    naive = naive_50 * 20
    low, high = np.quantile(draws, [0.025, 0.975])
    show(
        f"analysis of {args.records:,} records",
        ["what", "seconds", "ratio to baseline"],
        [
            [
                "explicit bootstrap, 1,000 resamples of one p99 (baseline; 50 timed, x20)",
                f"{naive:.1f}",
                "1.0",
            ],
            ["exact bootstrap of one p99", f"{exact_s:.2f}", f"{exact_s / naive:.4f}"],
            [
                "whole summary: all metrics, CIs, drift, fairness",
                f"{ours:.1f}",
                f"{ours / naive:.3f}",
            ],
        ],
    )
    show(
        "the two bootstraps agree (TTFT p99 ms, 95% CI)",
        ["method", "low", "high"],
        [
            ["exact", f"{exact.low / 1e6:.2f}", f"{exact.high / 1e6:.2f}"],
            ["explicit (50 resamples)", f"{low / 1e6:.2f}", f"{high / 1e6:.2f}"],
        ],
    )
    print(
        f"peak RSS {peak_rss_mb():.0f} MB; groups: {len(summary['tenants'])} tenants, "
        f"{len(summary['slo_classes'])} classes; drift windows "
        f"{len(summary['drift']['ttft_p99']['windows'])}"
    )
    verdict(ours < 30, f"whole analysis in {ours:.1f} s (target < 30 s)")
    finish()


if __name__ == "__main__":
    main()
