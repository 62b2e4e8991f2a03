"""Analysis of 1,000,000 records: every summary figure — censored percentiles with intervals,
the registry's metrics per group, the backlogged fairness figures — in under 30 s and 1.5 GB,
for a run of 1,000 s and for one spanning 24 simulated hours (no figure may cost more than
O(n log n) in requests plus O(windows)).

The records are censored as an overloaded run's are: 3% time out, 1% are cancelled at the end,
1% are rejected. The summary's quantile CIs are order statistics (binomial ranks, widened by
batch means for dependence) where nothing is censored (fairbench.analysis.intervals) and
Brookmeyer–Crowley otherwise. The baseline, measured in the same
run, is the explicit percentile bootstrap with 1,000 resamples of one quantile (timed on 50
resamples and scaled, labelled as such). Each span runs in a process of its own, so its peak
RSS is its own.

    python benchmarks/bench_analysis.py [--records 1000000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
import pandas as pd
from _common import finish, peak_rss_mb, show, verdict

from fairbench.analysis.stats import quantile_ci
from fairbench.analysis.summary import build_summary
from fairbench.workload.loading import parse_scenario


def scenario(span_s: float):  # type: ignore[no-untyped-def]
    return parse_scenario(
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
            "run": {
                "duration": f"{span_s:g}s",
                "warmup": "10s",
                "cooldown": "10s",
                "timeout": "30s",
            },
            "target": {"kind": "sim"},
        }
    )


def records(n: int, span_s: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, span_s * 1e9, n)).astype(np.int64)
    tenant = rng.integers(0, 8, n)
    ttft = rng.lognormal(np.log(80e6), 1.0, n).astype(np.int64)
    out = rng.integers(1, 400, n)
    tpot = rng.lognormal(np.log(12e6), 0.3, n)
    done = t + ttft + (tpot * (out - 1)).astype(np.int64)
    fate = rng.random(n)
    status = np.select(
        [fate < 0.03, fate < 0.04, fate < 0.05, fate < 0.06],
        ["timeout", "cancelled", "rejected", "error"],
        "ok",
    )
    unfinished = (status == "timeout") | (status == "cancelled")
    end = np.where(status == "timeout", t + 30_000_000_000, done)
    end = np.where(status == "cancelled", t + ttft // 2, end)
    first = np.where(unfinished | (status == "rejected"), -1, t + ttft)
    frame = pd.DataFrame(
        {
            "request_id": np.arange(n),
            "tenant": [f"t{k}" for k in tenant],
            "slo_class": np.array(["interactive", "batch", "best-effort"])[tenant % 3],
            "workload": "chat",
            "endpoint": "chat",
            "t_intended_ns": t,
            "t_sent_ns": np.where(status == "rejected", t + 50_000, t + 50_000),
            "t_first_byte_ns": first,
            "t_first_token_ns": first,
            "t_last_token_ns": np.where(first < 0, -1, done),
            "t_done_ns": np.where(first < 0, -1, done),
            "t_end_ns": end,
            "prompt_tokens": rng.integers(10, 4000, n),
            "max_tokens": out,
            "output_tokens": np.where(status == "ok", out, 0),
            "n_chunks": out,
            "itl_max_ns": tpot * 3,
            "status": status,
            "queue_time_ns": rng.exponential(20e6, n).astype(np.int64),
        }
    )
    for col in ("t_first_byte_ns", "t_first_token_ns", "t_last_token_ns", "t_done_ns"):
        frame[col] = frame[col].astype("Int64").mask(frame[col] < 0)
    return frame


def one_span(n: int, span_s: float) -> dict[str, float]:
    """Summarise n records over span_s seconds in this process: seconds and peak RSS."""
    df = records(n, span_s)
    health = {"invalid_reasons": [], "valid": True, "send_lag_ms": {}}
    acc = {"holds": True, "line": "bench"}
    start = time.perf_counter()
    summary = build_summary(df, scenario(span_s), "sha256:bench", 0, span_s, health, acc)
    seconds = time.perf_counter() - start
    p99 = summary["metrics"]["overall"]["ttft_p99"]
    return {
        "seconds": seconds,
        "rss_mb": peak_rss_mb(),
        "unfinished": summary["completion"]["unfinished"],
        "p99_ms": p99["value"],
        "windows": len(summary["fairness"]["jain_windows"]["values"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--span", type=float, help=argparse.SUPPRESS)  # one span, as a child
    args = parser.parse_args()
    if args.span:
        print(json.dumps(one_span(args.records, args.span)))
        return
    spans = {}
    for label, span in (("1,000 s", 1000.0), ("24 h", 86_400.0)):
        child = subprocess.run(
            [sys.executable, __file__, "--records", str(args.records), "--span", str(span)],
            capture_output=True,
            text=True,
            check=True,
        )
        spans[label] = json.loads(child.stdout.strip().splitlines()[-1])
    df = records(args.records, 1000.0)
    ttft = (df["t_first_token_ns"] - df["t_intended_ns"]).to_numpy(dtype=float, na_value=np.nan)
    ttft = ttft[np.isfinite(ttft)]
    start = time.perf_counter()
    exact = quantile_ci(ttft, 0.99)
    exact_s = time.perf_counter() - start
    rng = np.random.default_rng(1)
    start = time.perf_counter()
    draws = [np.quantile(ttft[rng.integers(0, len(ttft), len(ttft))], 0.99) for _ in range(50)]
    naive = (time.perf_counter() - start) * 20
    low, high = np.quantile(draws, [0.025, 0.975])
    rows = [
        [
            "explicit bootstrap, 1,000 resamples of one p99 (baseline; 50 timed, x20)",
            f"{naive:.1f}",
            "-",
            "1.0",
        ],
        ["order-statistic interval of one p99", f"{exact_s:.2f}", "-", f"{exact_s / naive:.4f}"],
    ]
    for label, r in spans.items():
        rows.append(
            [
                f"whole summary, {label} span ({r['unfinished']:,} unfinished, "
                f"{r['windows']} fairness windows)",
                f"{r['seconds']:.1f}",
                f"{r['rss_mb']:.0f}",
                f"{r['seconds'] / naive:.3f}",
            ]
        )
    show(
        f"analysis of {args.records:,} records",
        ["what", "seconds", "peak RSS MB", "ratio to baseline"],
        rows,
    )
    show(
        "the two bootstraps agree (TTFT p99 of the finished requests, ms, 95% CI)",
        ["method", "low", "high"],
        [
            ["exact", f"{exact.low / 1e6:.2f}", f"{exact.high / 1e6:.2f}"],
            ["explicit (50 resamples)", f"{low / 1e6:.2f}", f"{high / 1e6:.2f}"],
        ],
    )
    for label, r in spans.items():
        verdict(
            r["seconds"] < 30, f"{label}: whole summary in {r['seconds']:.1f} s (target < 30 s)"
        )
        verdict(r["rss_mb"] < 1536, f"{label}: peak RSS {r['rss_mb']:.0f} MB (target < 1.5 GB)")
    finish()


if __name__ == "__main__":
    main()
