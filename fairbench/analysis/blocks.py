"""The analysis blocks of a summary: confidence intervals, drift, slowdown fairness, starvation.

Pure functions of a records frame (measurement window only) and the scenario.

Slowdown is a request's latency ÷ the latency it would have had alone. For the reference
scheduler (targets `sim` and `reference`) the unloaded latency comes from the cost model:
prefill of the prompt, then one single-sequence decode step per further token. For other
targets no model exists, and the basis is latency per token of prompt + output (stated in
`slowdown_basis`): a solo calibration run would be better, and is the documented next step.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from fairbench.analysis import metrics as m
from fairbench.analysis.fairness import service_difference, windowed_jain
from fairbench.analysis.stats import quantile_ci, sample_quantile, trend_test
from fairbench.workload.scenario import Scenario


def unloaded_ns(df: pd.DataFrame, scn: Scenario) -> tuple[np.ndarray, str]:
    """Each request's latency alone on the engine, and the basis used."""
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
        return ms * 1e6, "cost model of the reference scheduler"
    return np.maximum(prompt + output, 1.0) * 1e6, "latency per token (no cost model)"


def slowdown_block(df: pd.DataFrame, scn: Scenario) -> dict[str, Any]:
    ok = df[df["status"] == "ok"]
    base, basis = unloaded_ns(ok, scn)
    slow = m.e2e_ns(ok) / base
    tenants = ok["tenant"].to_numpy()
    per = {t: float(np.nanmean(slow[tenants == t])) for t in sorted(set(tenants))}
    values = np.array([v for v in per.values() if math.isfinite(v)])
    within_class: dict[str, float | None] = {}
    classes = ok["slo_class"].to_numpy()
    e2e = m.e2e_ns(ok)
    for cls in sorted(set(classes)):
        rows = classes == cls
        means = [np.nanmean(e2e[rows & (tenants == t)]) for t in set(tenants[rows])]
        means = [x for x in means if math.isfinite(x) and x > 0]
        within_class[cls] = float(max(means) / min(means)) if len(means) > 1 else None
    return {
        "slowdown_basis": basis,
        "mean_slowdown": per,
        "jain_slowdown": m.jain(values) if len(values) else None,
        "worst_slowdown_ratio": float(values.max() / values.min())
        if len(values) > 1 and values.min() > 0
        else None,
        "worst_latency_ratio_within_class": within_class,
    }


def starvation_block(df: pd.DataFrame, scn: Scenario, k: float = 10.0) -> dict[str, Any]:
    """Requests whose first response took over k × their class's TTFT SLO, or never came."""
    ttft = m.ttft_ns(df)
    out: dict[str, dict[str, int]] = {}
    for tenant in sorted(set(df["tenant"])):
        rows = (df["tenant"] == tenant).to_numpy()
        never = int(((df["status"] != "ok") & (df["status"] != "rejected")).to_numpy()[rows].sum())
        late = 0
        for cls, slo in scn.slo_classes.items():
            if slo.ttft is None:
                continue
            sel = rows & (df["slo_class"] == cls).to_numpy()
            late += int((ttft[sel] > k * slo.ttft * 1e9).sum())
        out[tenant] = {"starved": late, "never_served": never}
    return {"k_times_slo": k, "tenants": out}


def drift_block(df: pd.DataFrame, window_s: float, step_s: float, seed: int = 0) -> dict[str, Any]:
    """TTFT p99 per rolling window; drift of the last window against the first, with a CI from
    the exact bootstrap distributions of both quantiles; Kendall's trend test over the series."""
    ok = df[df["status"] == "ok"]
    t = ok["t_intended_ns"].to_numpy(dtype=float) / 1e9
    ttft = m.ttft_ns(ok)
    if not len(t):
        return {"windows": [], "drift": None}
    starts = np.arange(t.min(), max(t.max() - window_s, t.min()) + 1e-9, step_s)
    series = []
    samples = []
    for lo in starts:
        sel = (t >= lo) & (t < lo + window_s) & np.isfinite(ttft)
        samples.append(ttft[sel])
        est = quantile_ci(ttft[sel], 0.99)
        series.append(
            {
                "start_s": round(float(lo), 3),
                "n": int(sel.sum()),
                "p99_ms": None if est.n == 0 else round(est.value / 1e6, 4),
            }
        )
    out: dict[str, Any] = {"window_s": window_s, "step_s": step_s, "windows": series}
    if len(samples) >= 2 and len(samples[0]) >= 20 and len(samples[-1]) >= 20:
        rng = np.random.default_rng(seed)
        first = sample_quantile(samples[0], 0.99, 2000, rng)
        last = sample_quantile(samples[-1], 0.99, 2000, rng)
        point = np.quantile(samples[-1], 0.99) / np.quantile(samples[0], 0.99) - 1
        ratio = last / first - 1
        tau, p = trend_test(starts, np.array([s["p99_ms"] or np.nan for s in series], dtype=float))
        out["drift"] = {
            "relative": float(point),
            "ci_low": float(np.quantile(ratio, 0.025)),
            "ci_high": float(np.quantile(ratio, 0.975)),
            "trend_tau": tau,
            "trend_p": p,
        }
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
    arrive = df["t_intended_ns"].to_numpy(dtype=float)[queued] / 1e9
    admit = arrive + df["queue_time_ns"].to_numpy(dtype=float)[queued] / 1e9
    grid = np.arange(arrive.min(), arrive.max(), step_s)
    if len(grid) < 4:
        return {"variance_ratio": None, "basis": "run too short"}
    depth = np.searchsorted(np.sort(arrive), grid, side="right") - np.searchsorted(
        np.sort(admit), grid, side="right"
    )
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
    served = df[(df["status"] == "ok") & df["t_first_token_ns"].notna()]
    t0 = df["t_intended_ns"].min() / 1e9 if len(df) else 0.0
    if not len(served):
        return {"service_difference": None, "jain_windows": None}
    arrival = served["t_intended_ns"].to_numpy(dtype=float) / 1e9 - t0
    start = served["t_first_token_ns"].to_numpy(dtype=float) / 1e9 - t0
    end = served["t_done_ns"].to_numpy(dtype=float) / 1e9 - t0
    cost = m.service_tokens(served)
    client = served["tenant"].to_numpy()
    span = float(end.max()) if len(end) else 0.0
    weights = {t.id: t.weight for t in scn.tenants}
    out: dict[str, Any] = {}
    if span > 2 * window_s:
        sd = service_difference(
            client, arrival, start, end, cost, span, warmup_s=0.0, window_s=window_s, min_end_s=0.0
        )
        out["service_difference"] = {
            "max": sd.max,
            "mean": sd.mean,
            "var": sd.var,
            "window_s": window_s,
        }
    else:
        out["service_difference"] = None
    out["max_service_gap"] = accumulated_service_gap(client, start, end, cost, weights, span)
    _, jw = windowed_jain(client, start, end, cost, weights, 0.0, span, window_s)
    finite = jw[np.isfinite(jw)]
    out["jain_windows"] = {
        "window_s": window_s,
        "min": float(finite.min()) if len(finite) else None,
        "median": float(np.median(finite)) if len(finite) else None,
        "values": [None if not math.isfinite(x) else round(float(x), 4) for x in jw],
    }
    return out


def accumulated_service_gap(
    client: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    cost: np.ndarray,
    weights: dict[str, float],
    span: float,
    step_s: float = 1.0,
) -> float | None:
    """VTC's accumulated gap: the largest, over time, of max − min cumulative weighted service
    among tenants (cost units). Service is spread uniformly over each request's service
    interval; sampled every `step_s`."""
    names, code = np.unique(client, return_inverse=True)
    if len(names) < 2 or span <= 0:
        return None
    weight = np.array([weights.get(str(n), 1.0) for n in names])
    grid = np.arange(0.0, span + step_s, step_s)
    rate = cost / np.maximum(end - start, 1e-9)
    cumulative = np.zeros((len(grid), len(names)))
    for k, t in enumerate(grid):
        done = np.clip(np.minimum(end, t) - start, 0.0, None) * rate
        cumulative[k] = np.bincount(code, done, minlength=len(names)) / weight
    return float((cumulative.max(axis=1) - cumulative.min(axis=1)).max())


def latency_cis(df: pd.DataFrame) -> dict[str, Any]:
    """p50/p90/p99 of TTFT, TPOT and E2E with exact bootstrap 95% intervals, in ms."""
    ok = df[df["status"] == "ok"]
    out: dict[str, Any] = {}
    for name, fn in (("ttft", m.ttft_ns), ("tpot", m.tpot_ns), ("e2e", m.e2e_ns)):
        values = fn(ok)
        out[name] = {
            f"p{int(q * 100)}": quantile_ci(values, q).as_dict(scale=1e-6) for q in (0.5, 0.9, 0.99)
        }
    return out
