"""summary.json: what a run measured, per tenant, per SLO class and overall.

Schema history (`SUMMARY_SCHEMA_VERSION`):
  1 — schema_version, valid, invalid_reasons, plan_digest, seed, window_s, closed_loop,
      accounting, generator_health, overall / tenants / slo_classes blocks (counts by status,
      latency percentiles in ms — ttft, ttft_sent, tpot, itl_max, e2e, e2e_sent, queue —,
      throughput, goodput, slo_attainment), fairness (Jain over service ÷ fair share,
      slowdown Jain and worst ratio, service difference, windowed Jain, starvation), drift
      (TTFT p99 per rolling window, drift with CI and trend test, queue-depth variance), and
      latency_ci_ms in every group (exact bootstrap CIs of p50/p90/p99), and a per-workload
      block beside tenants and classes.

Requests are counted in the measurement window: intended time in [warmup, duration − cooldown].
Throughput divides by the window's length. A run marked INVALID stays INVALID in every output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from fairbench.analysis import metrics as m
from fairbench.analysis.blocks import (
    drift_block,
    fairness_over_time,
    latency_cis,
    queue_depth_block,
    slowdown_block,
    starvation_block,
)
from fairbench.run.records import STATUSES
from fairbench.workload.scenario import Scenario

SUMMARY_SCHEMA_VERSION = 1
_LATENCIES = {
    "ttft": m.ttft_ns,
    "ttft_sent": m.ttft_sent_ns,
    "tpot": m.tpot_ns,
    "itl_max": m.itl_max_ns,
    "e2e": m.e2e_ns,
    "e2e_sent": m.e2e_sent_ns,
}


def measurement_window(scn: Scenario, plan_span_s: float) -> tuple[float, float]:
    end = scn.run.duration if scn.run.duration is not None else plan_span_s
    return scn.run.warmup, max(end - scn.run.cooldown, scn.run.warmup)


def slo_table(scn: Scenario) -> dict[str, dict[str, float | None]]:
    return {
        name: {"ttft": c.ttft, "tpot": c.tpot, "e2e": c.e2e} for name, c in scn.slo_classes.items()
    }


def _ms(values: dict[str, float | None]) -> dict[str, float | None]:
    return {k: (None if v is None else round(v / 1e6, 4)) for k, v in values.items()}


def group_block(df: pd.DataFrame, met: np.ndarray, window_s: float) -> dict[str, Any]:
    counts = {s: int((df["status"] == s).sum()) for s in STATUSES}
    ok = (df["status"] == "ok").to_numpy()
    block: dict[str, Any] = {"requests": len(df), "counts": counts}
    ok_df = df[ok]
    block["latency_ms"] = {name: _ms(m.percentiles(fn(ok_df))) for name, fn in _LATENCIES.items()}
    queue = ok_df["queue_time_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    block["latency_ms"]["queue"] = _ms(m.percentiles(queue))
    out_tokens = float(ok_df["output_tokens"].sum())
    good = met.sum()
    block["throughput"] = {
        "requests_per_s": len(ok_df) / window_s if window_s > 0 else None,
        "output_tokens_per_s": out_tokens / window_s if window_s > 0 else None,
    }
    block["goodput"] = {
        "requests_per_s": float(good) / window_s if window_s > 0 else None,
        "output_tokens_per_s": float(df["output_tokens"].to_numpy()[met].sum()) / window_s
        if window_s > 0
        else None,
    }
    block["slo_attainment"] = float(good / len(df)) if len(df) else None
    return block


def fairness_block(df: pd.DataFrame, weights: Mapping[str, float]) -> dict[str, Any]:
    """Jain's index over tenants of service ÷ weighted max-min fair share given demand.

    Demand is the weighted tokens each tenant *offered* in the window; capacity is the service
    the system actually delivered; service counts only what was served."""
    tenants = sorted(weights)
    service = m.service_tokens(df)
    offered = df["prompt_tokens"].to_numpy(dtype=np.float64) + 2.0 * df["max_tokens"].to_numpy(
        dtype=np.float64
    )
    names = df["tenant"].to_numpy()
    got = np.array([service[names == t].sum() for t in tenants])
    demand = np.array([offered[names == t].sum() for t in tenants])
    w = np.array([weights[t] for t in tenants])
    fair = m.water_fill(demand, w, got.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(fair > 0, got / fair, np.nan)
    present = np.isfinite(ratio)
    return {
        "jain_service": m.jain(ratio[present]) if present.any() else None,
        "tenants": {
            t: {
                "service_tokens": float(g),
                "demand_tokens": float(d),
                "fair_share_tokens": float(f),
                "share_of_fair": None if not np.isfinite(r) else float(r),
            }
            for t, g, d, f, r in zip(tenants, got, demand, fair, ratio, strict=True)
        },
    }


def build_summary(
    records: pd.DataFrame,
    scn: Scenario,
    plan_digest: str,
    seed: int,
    plan_span_s: float,
    health: Mapping[str, Any],
    accounting: Mapping[str, Any],
    closed_loop: bool = False,
) -> dict[str, Any]:
    start, end = measurement_window(scn, plan_span_s)
    t = records["t_intended_ns"].to_numpy(dtype=np.float64) / 1e9
    df = records[(t >= start) & (t <= end)].reset_index(drop=True)
    window = end - start
    met = m.slo_met(df, slo_table(scn)) if len(df) else np.zeros(0, dtype=bool)
    reasons = list(health.get("invalid_reasons", []))
    if not accounting.get("holds", False):
        reasons.append(f"accounting broken: {accounting.get('line')}")
    summary: dict[str, Any] = {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "valid": not reasons,
        "invalid_reasons": reasons,
        "plan_digest": plan_digest,
        "seed": seed,
        "scenario": scn.name,
        "window_s": [start, end],
        "closed_loop": closed_loop,
        "accounting": dict(accounting),
        "generator_health": dict(health),
        "overall": group_block(df, met, window),
        "tenants": {},
        "slo_classes": {},
    }
    summary["workloads"] = {}
    for key, column in (
        ("tenants", "tenant"),
        ("slo_classes", "slo_class"),
        ("workloads", "workload"),
    ):
        values = df[column].to_numpy()
        for name in sorted(set(values)):
            rows = values == name
            group = df[rows].reset_index(drop=True)
            summary[key][name] = group_block(group, met[rows], window)
            summary[key][name]["latency_ci_ms"] = latency_cis(group)
    summary["fairness"] = fairness_block(df, {t.id: t.weight for t in scn.tenants})
    if len(df):
        summary["fairness"].update(slowdown_block(df, scn))
        summary["fairness"]["starvation"] = starvation_block(df, scn)
        window_s = max(10.0, min(60.0, window / 10)) if window > 0 else 10.0
        summary["fairness"].update(fairness_over_time(df, scn, window_s))
        summary["overall"]["latency_ci_ms"] = latency_cis(df)
        summary["drift"] = {
            "ttft_p99": drift_block(df, window_s, window_s / 2),
            "queue_depth": queue_depth_block(df),
        }
    return summary
