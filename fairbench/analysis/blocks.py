"""The analysis blocks of a summary: confidence intervals, drift, slowdown, starvation.

Pure functions of a records frame (measurement window only) and the scenario.

Slowdown is a request's latency ÷ the latency it would have had alone. For the reference
scheduler (targets `sim` and `reference`) the unloaded latency comes from the cost model:
prefill of the prompt, then one single-sequence decode step per further token. For other
targets no model exists, and the basis is latency per token of prompt + output (stated in
`slowdown_basis`): a solo calibration run would be better, and is the documented next step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from fairbench.analysis import censored, frame_memo
from fairbench.analysis import metrics as m
from fairbench.analysis.drift import drift
from fairbench.analysis.fairness import service_difference
from fairbench.analysis.stats import trend_test
from fairbench.workload.models import Scenario


def unloaded_ns(df: pd.DataFrame, scn: Scenario) -> tuple[np.ndarray, str]:
    """Each request's latency alone on the engine, and the basis used."""
    return frame_memo.memo(df, ("unloaded_ns", id(scn)), lambda: _unloaded_ns(df, scn))


def _unloaded_ns(df: pd.DataFrame, scn: Scenario) -> tuple[np.ndarray, str]:
    prompt = df["prompt_tokens"].to_numpy(dtype=float)
    output = df["output_tokens"].to_numpy(dtype=float)
    if scn.target.kind in ("sim", "reference"):
        from reference_scheduler.scheduler.config import parse_scheduler_config

        p = parse_scheduler_config(scn.scheduler).profile
        if p.constant_step_ms is not None:
            ms = p.constant_step_ms * np.maximum(output, 1)
        else:
            chunk = float(p.max_num_batched_tokens)
            full, rest = np.floor(prompt / chunk), np.mod(prompt, chunk)
            prefill = full * p.step_ms(int(chunk), 0, 0) + np.where(
                rest > 0, np.maximum(p.floor, p.a + p.b * rest + p.c * rest * rest), 0.0
            )
            decode_one = np.maximum(p.d + p.e, p.a + p.b) + p.f * (prompt + output / 2)
            ms = prefill + np.maximum(output - 1, 0) * decode_one
        if scn.target.kind == "sim":  # a request alone pays the front end's overhead too
            ms = ms + p.request_overhead_ms
        return ms * 1e6, "cost model of the reference scheduler"
    return np.maximum(prompt + output, 1.0) * 1e6, "latency per token (no cost model)"


def slowdown_block(df: pd.DataFrame, scn: Scenario) -> dict[str, Any]:
    """Mean slowdown per tenant (E2E ÷ E2E alone; an unfinished request enters with its E2E so
    far) and, per class, the slowest tenant's mean E2E ÷ the fastest's. The run's
    worst_slowdown_ratio and jain_slowdown come from the registry, on the same definition."""
    obs = censored.e2e_rows(df, scn.run.timeout)
    base, basis = unloaded_ns(df, scn)
    slow = obs.time / np.maximum(base, 1.0)
    # codes, sorted by name: the same groups in the same order as sorted(set(names))
    tenants, tenant_names = frame_memo.codes(df, "tenant")
    classes, class_names = frame_memo.codes(df, "slo_class")
    sel = obs.eligible
    per = {
        tenant_names[t]: float(slow[sel & (tenants == t)].mean())
        for t in m.distinct(tenants[sel]).tolist()
        if (sel & (tenants == t)).any()
    }
    within_class: dict[str, float | None] = {}
    for c in m.distinct(classes[sel]).tolist():
        cls = class_names[c]
        rows = sel & (classes == c)
        # a set's order before: any order gives the same max and min
        means = [obs.time[rows & (tenants == t)].mean() for t in m.distinct(tenants[rows])]
        means = [x for x in means if math.isfinite(x) and x > 0]
        within_class[cls] = float(max(means) / min(means)) if len(means) > 1 else None
    return {
        "slowdown_basis": basis,
        "mean_slowdown": per,
        "worst_latency_ratio_within_class": within_class,
    }


def starvation_block(df: pd.DataFrame, scn: Scenario, k: float = 10.0) -> dict[str, Any]:
    """Per tenant, admitted requests of classes with a TTFT SLO whose first response took over
    k × that SLO (`starved`) or never came (`never_served`: timed out, cancelled, failed).
    Rejected requests are not here: they are the rejected share."""
    obs = censored.ttft_rows(df, scn.run.timeout)
    names = list(scn.slo_classes)
    table = np.array([scn.slo_classes[c].ttft or np.nan for c in names] + [np.nan], dtype=float)
    slo = table[frame_memo.name_codes(df, "slo_class", names)]  # −1: no class, NaN

    has = obs.eligible & np.isfinite(slo)
    out: dict[str, dict[str, int]] = {}
    tenants, tenant_names = frame_memo.codes(df, "tenant")
    for code, tenant in enumerate(tenant_names):
        rows = has & (tenants == code)
        never = int((rows & ~obs.observed).sum())
        late = int((rows & obs.observed & (obs.time > k * slo * 1e9)).sum())
        out[tenant] = {"starved": late, "never_served": never}
    return {"k_times_slo": k, "tenants": out}


def drift_block(df: pd.DataFrame, window_s: float, step_s: float) -> dict[str, Any]:
    """TTFT p99 per rolling window (censored: unfinished requests count) with each window's
    interval; drift of the last window against the first with its interval and the p-value of
    the same statistic (fairbench.analysis.drift: they agree by construction). Kendall's tau over
    non-overlapping windows is kept as a description of the series' direction, not as a test
    (rolling windows share requests). Each window is a slice of the requests sorted by intended
    time: O(n log n)."""
    obs = censored.ttft_rows(df, None)
    sel = obs.eligible
    intended = frame_memo.floats(df, "t_intended_ns")[sel]  # converted once (frame_memo)
    order = np.argsort(intended, kind="stable")
    t_ns = intended[order]
    t = t_ns / 1e9
    times, seen = obs.time[sel][order], obs.observed[sel][order]
    if not len(t):
        return {"windows": [], "drift": None}
    starts = np.arange(t[0], max(t[-1] - window_s, t[0]) + 1e-9, step_s)
    lo_idx = np.searchsorted(t, starts, side="left")
    hi_idx = np.searchsorted(t, starts + window_s, side="left")
    series = []
    windows = []
    for lo, a, b in zip(starts, lo_idx, hi_idx, strict=True):
        w = censored.Observations(times[a:b], seen[a:b], t_ns[a:b], ranked=True)
        windows.append(w)
        est = censored.quantile_estimate(w, 0.99)
        series.append(
            {
                "start_s": round(float(lo), 3),
                "n": int(b - a),
                "p99_ms": None if not len(w) else round(est.value / 1e6, 4),
                "lower_bound": est.bound,
                "ci_low_ms": None if not math.isfinite(est.low) else round(est.low / 1e6, 4),
                "ci_high_ms": None if not math.isfinite(est.high) else round(est.high / 1e6, 4),
            }
        )
    out: dict[str, Any] = {"window_s": window_s, "step_s": step_s, "windows": series}
    first, last = (windows[0], windows[-1]) if len(windows) >= 2 else (None, None)
    if first is not None and last is not None and len(first) >= 20 and len(last) >= 20:
        found = drift(first, last, q=0.99)
        stride = max(1, round(window_s / step_s)) if step_s > 0 else 1
        apart = np.array([s["p99_ms"] or np.nan for s in series], dtype=float)[::stride]
        tau, _ = trend_test(starts[::stride], apart)
        fields = found.interval.fields()
        drift_out: dict[str, Any] = {
            "relative": None if not math.isfinite(found.value) else float(found.value),
            "lower_bound": found.lower_bound,
            **fields,
            "trend_tau": tau if math.isfinite(tau) else None,  # under 3 windows: none, not NaN
            "trend_p": None if not math.isfinite(found.p_value) else found.p_value,
            "trend_method": "two-sided z test of the drift's log ratio (the interval's statistic)",
        }
        out["drift"] = drift_out if math.isfinite(found.value) else None
    else:
        out["drift"] = None
    return out


def queue_depth_block(df: pd.DataFrame, step_s: float = 1.0) -> dict[str, Any]:
    """Waiting requests over time, from the records (arrived, not yet admitted), and the ratio of
    its variance in the second half of the run to the first — the field's early warning: mean
    unchanged, variance up."""
    queued = df["queue_time_ns"].notna().to_numpy()
    if not queued.any():
        return {"variance_ratio": None, "basis": "no queue times reported by the target"}
    arrive = frame_memo.floats(df, "t_intended_ns")[queued] / 1e9  # converted once
    admit = arrive + frame_memo.floats(df, "queue_time_ns")[queued] / 1e9
    grid = np.arange(arrive.min(), arrive.max(), step_s)
    if len(grid) < 4:
        return {"variance_ratio": None, "basis": "run too short"}
    # arrivals come in plan order, already sorted: their sort is skipped (0.1 CPU s at 1.9M)
    depth = np.searchsorted(
        arrive if m.nondecreasing(arrive) else np.sort(arrive), grid, side="right"
    )
    depth -= np.searchsorted(np.sort(admit), grid, side="right")
    half = len(depth) // 2
    v1, v2 = float(np.var(depth[:half])), float(np.var(depth[half:]))
    return {
        "mean_first_half": float(depth[:half].mean()),
        "mean_second_half": float(depth[half:].mean()),
        "variance_first_half": v1,
        "variance_second_half": v2,
        "variance_ratio": v2 / v1 if v1 > 0 else None,
    }


def fairness_over_time(df: pd.DataFrame, scn: Scenario, window_s: float) -> dict[str, Any]:
    """The VTC artifact's service-difference table (max / mean / variance over 19 ticks), for
    comparison with the paper. It spreads service over each served request and compares it with
    demand in the same window; the headline `service_difference` counts only backlogged time."""
    col = lambda name: frame_memo.floats(df, name)  # noqa: E731
    first = col("t_first_token_ns")
    keep = frame_memo.equals(df, "status", "ok") & np.isfinite(first)  # arrays, not a copy
    t0 = df["t_intended_ns"].min() / 1e9 if len(df) else 0.0
    if not keep.any():
        return {"vtc_service_difference": None}
    arrival = col("t_intended_ns")[keep] / 1e9 - t0
    start = first[keep] / 1e9 - t0
    end = col("t_done_ns")[keep] / 1e9 - t0
    cost = m.service_tokens(df)[keep]
    # codes in sorted-name order: service_difference's np.unique orders clients the same
    client = frame_memo.codes(df, "tenant")[0][keep]
    span = float(end.max()) if len(end) else 0.0
    if span <= 2 * window_s:
        return {"vtc_service_difference": None}
    sd = service_difference(
        client, arrival, start, end, cost, span, warmup_s=0.0, window_s=window_s, min_end_s=0.0
    )
    return {
        "vtc_service_difference": {
            "max": sd.max,
            "mean": sd.mean,
            "var": sd.var,
            "window_s": window_s,
        }
    }


def latency_cis(latencies: Mapping[str, Any], rows: np.ndarray | None) -> dict[str, Any]:
    """p50/p90/p99 of TTFT, TPOT and E2E with 95% intervals, in ms, on the censored
    definition (fairbench.analysis.censored): the point always lies inside its interval."""
    out: dict[str, Any] = {}
    for name in ("ttft", "tpot", "e2e"):
        source = latencies[name]
        if hasattr(source, "estimate"):  # the run's columns: estimates kept for `metrics`
            estimates = [source.estimate(rows, q) for q in (0.5, 0.9, 0.99)]
        else:
            obs = source.select(rows)
            estimates = [censored.quantile_estimate(obs, q) for q in (0.5, 0.9, 0.99)]
        out[name] = {
            f"p{int(q * 100)}": est.as_dict(scale=1e-6)
            for q, est in zip((0.5, 0.9, 0.99), estimates, strict=True)
        }
    return out
