"""Fairness figures at scale: the timeline, the backlogged service difference and Jain's index
among the backlogged, on 10k, 100k and 1M synthetic records of 1,000 tenants (issue 33's goal:
1M records in < 10 s). The baseline, in the same run, is a sort of the same records' times
(what any O(n log n) pass must pay at least): each figure's time is shown as a multiple of it;
at 10k records the service difference by every pair (the O(tenants² · n) search the pruned one
replaced) is timed too.

The timeline is sparse (each tenant on its own breakpoints, fairbench.analysis.timeline), so
its memory is O(n) whatever the number of tenants; the peak traced memory of the figures is
printed beside their time.

    python benchmarks/bench_fairness.py [--sizes 10000,100000,1000000] [--tenants 1000]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np
from _common import finish, show, verdict

from fairbench.analysis.fairness import (
    backlogged_jain,
    backlogged_service_difference,
    backlogged_service_difference_all_pairs,
    build_timeline,
)


def records(n: int, tenants: int, seed: int = 1) -> dict[str, np.ndarray]:
    """n requests over n / 1,000 s (1,000 req/s), Zipf-ish tenant popularity; a third of them
    passed over, waiting up to 200 ms; service from the end of the wait for 50–500 ms."""
    rng = np.random.default_rng(seed)
    span = n / 1000.0
    arrival = np.sort(rng.uniform(0, span, n))
    popularity = 1.0 / np.arange(1, tenants + 1)
    client = rng.choice(tenants, n, p=popularity / popularity.sum()).astype(str)
    wait = np.where(rng.random(n) < 1 / 3, rng.uniform(0, 0.2, n), np.nan)
    start = arrival + np.nan_to_num(wait)
    end = start + rng.uniform(0.05, 0.5, n)
    cost = rng.integers(64, 2048, n).astype(float)
    return {"client": client, "wait_from": np.where(np.isnan(wait), np.nan, arrival),
            "wait_to": np.where(np.isnan(wait), np.nan, start), "start": start, "end": end,
            "cost": cost, "span": np.array([span])}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--tenants", type=int, default=1000)
    args = ap.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        r = records(n, args.tenants)
        t = time.perf_counter()
        np.argsort(np.concatenate([r["start"], r["end"], r["wait_from"], r["wait_to"]]))
        base = time.perf_counter() - t
        weights = {str(k): 1.0 for k in range(args.tenants)}
        tracemalloc.start()
        t = time.perf_counter()
        tl = build_timeline(r["client"], weights, r["wait_from"], r["wait_to"], r["start"],
                            r["end"], r["cost"])  # fmt: skip
        t_tl = time.perf_counter() - t
        t = time.perf_counter()
        backlogged_service_difference(tl)
        t_sd = time.perf_counter() - t
        t = time.perf_counter()
        backlogged_jain(tl, 0.0, float(r["span"][0]), 10.0)
        t_j = time.perf_counter() - t
        total = t_tl + t_sd + t_j
        peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
        if n <= 10_000:
            t = time.perf_counter()
            backlogged_service_difference_all_pairs(tl)
            t_all = time.perf_counter() - t
            rows.append([f"{n:,}", "", "every pair", f"difference {t_all:.2f} "
                         f"({t_all / max(t_sd, 1e-9):,.0f}× the pruned search)"])  # fmt: skip
        rows.append([f"{n:,}", f"{base:.3f}", f"{total:.2f} ({total / base:,.0f}× the sort)",
                     f"timeline {t_tl:.2f}, difference {t_sd:.2f}, Jain {t_j:.2f}; "
                     f"peak {peak_mb:,.0f} MB"])  # fmt: skip
        if n >= 1_000_000:
            verdict(total < 10.0, f"1M records of {args.tenants} tenants in {total:.1f} s (< 10)")
    show(f"fairness figures, {args.tenants} tenants", ["records", "sort s", "figures s", "parts s"], rows)  # fmt: skip  # noqa: E501
    finish()


if __name__ == "__main__":
    main()
