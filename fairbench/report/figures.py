"""One function per figure of the run report: data in, an HTML fragment out.

Each figure reads the run's summary, records or scraped series and computes nothing of its own
beyond downsampling for drawing (fairbench.analysis.series). To add a figure, write a function
here and add it to the list in `fairbench.report.run.run_report`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from fairbench.analysis import series
from fairbench.report.html import COLORS, fig_html, ms


def latency_cdfs(df: pd.DataFrame, slos: Mapping[str, Any], by: str, prefix: str) -> list[str]:
    """TTFT, TPOT and E2E CDFs, a line per group, with each class's SLO as a dashed line."""
    out = []
    for metric, groups in series.latency_cdfs(df, by).items():
        fig = go.Figure()
        for k, (name, (x, y)) in enumerate(groups.items()):
            fig.add_trace(
                go.Scatter(
                    x=x, y=y, name=str(name), mode="lines", line={"color": COLORS[k % len(COLORS)]}
                )
            )
        key = {"TTFT": "ttft", "TPOT": "tpot", "E2E": "e2e"}[metric]
        for cls, slo in slos.items():
            if slo.get(key):  # a trace, not add_vline: on a log axis vlines take log10(x)
                fig.add_trace(
                    go.Scatter(
                        x=[slo[key] * 1e3] * 2,
                        y=[0, 1],
                        mode="lines",
                        name=f"{cls} {metric} SLO",
                        line={"dash": "dash", "color": "grey", "width": 1},
                    )
                )
        fig.update_layout(
            title=f"{metric} CDF by {prefix}",
            xaxis_title=f"{metric} (ms)",
            yaxis_title="fraction of requests",
            xaxis_type="log",
        )
        out.append(fig_html(fig, f"cdf-{prefix}-{metric.lower()}"))
    return out


def ttft_p99_over_time(summary: Mapping[str, Any]) -> list[str]:
    """The rolling-window TTFT p99 behind the drift figure, with the drift and trend test."""
    drift = summary.get("drift", {}).get("ttft_p99", {})
    if not drift.get("windows"):
        return []
    fig = go.Figure(
        go.Scatter(
            x=[w["start_s"] for w in drift["windows"]],
            y=[w["p99_ms"] for w in drift["windows"]],
            mode="lines+markers",
            name="TTFT p99",
        )
    )
    d = drift.get("drift")
    title = "TTFT p99 over time (rolling windows)"
    if d:
        title += (
            f" — drift {d['relative']:+.1%} [{d['ci_low']:+.1%}, {d['ci_high']:+.1%}],"
            f" trend p={d['trend_p']:.2f}"
        )
    fig.update_layout(title=title, xaxis_title="intended time (s)", yaxis_title="ms")
    return [fig_html(fig, "ttft-p99-time")]


def queue_depth(df: pd.DataFrame, server: pd.DataFrame | None) -> list[str]:
    """The server's queue depth where it reports one, else the waiting count from records."""
    qs = series.server_series(server, ("scheduler_queue_depth",))
    fig = go.Figure()
    if qs:
        fig.add_trace(
            go.Scatter(
                x=qs["scheduler_queue_depth"]["t"],
                y=qs["scheduler_queue_depth"]["v"],
                name="server queue depth",
            )
        )
    else:
        q = series.queue_depth(df)
        fig.add_trace(go.Scatter(x=q["t"], y=q["depth"], name="waiting (from records)"))
    fig.update_layout(title="Queue depth", xaxis_title="time (s)", yaxis_title="waiting")
    return [fig_html(fig, "queue-depth")]


def service_shares(
    window: pd.DataFrame, weights: Mapping[str, float], lo: float, hi: float
) -> list[str]:
    """Each tenant's service share per window beside its weighted max-min fair share."""
    shares = series.shares_over_time(window, weights, max(5.0, (hi - lo) / 30))
    fig = go.Figure()
    for k, tenant in enumerate(sorted(weights)):
        color = COLORS[k % len(COLORS)]
        fig.add_trace(
            go.Scatter(
                x=shares["t"],
                y=shares["service"].get(tenant, []),
                name=f"{tenant} service",
                line={"color": color},
            )
        )
        fig.add_trace(
            go.Scatter(
                x=shares["t"],
                y=shares["fair"].get(tenant, []),
                name=f"{tenant} fair share",
                line={"color": color, "dash": "dot"},
            )
        )
    fig.update_layout(
        title="Service share vs weighted max-min fair share, per window",
        xaxis_title="time (s)",
        yaxis_title="share",
    )
    return [fig_html(fig, "shares")]


def jain_and_slowdown_windows(
    window: pd.DataFrame, fair: Mapping[str, Any], unloaded: Any
) -> list[str]:
    """Jain's index per window and the worst-case slowdown ratio per window, on two axes."""
    jw = fair.get("jain_windows") or {}
    step = float(jw.get("window_s") or 1.0)
    fig = go.Figure(
        go.Scatter(
            x=[k * step for k in range(len(jw.get("values", [])))],
            y=jw.get("values", []),
            mode="lines+markers",
            name="Jain",
        )
    )
    ws, worst = series.worst_slowdown_windows(window, unloaded, step)
    fig.add_trace(
        go.Scatter(x=ws, y=worst, mode="lines+markers", name="worst slowdown ratio", yaxis="y2")
    )
    fig.update_layout(
        title=f"Jain's index and worst-case slowdown ratio per {step:g} s window",
        xaxis_title="time (s)",
        yaxis={"title": "Jain", "range": [0, 1.05]},
        yaxis2={"title": "worst ÷ best tenant slowdown", "overlaying": "y", "side": "right"},
    )
    return [fig_html(fig, "jain-windows")]


def attainment_and_goodput(summary: Mapping[str, Any]) -> list[str]:
    """SLO attainment and goodput per class and per tenant."""
    groups = {
        **{f"class {k}": v for k, v in summary["slo_classes"].items()},
        **{f"tenant {k}": v for k, v in summary["tenants"].items()},
    }
    fig = go.Figure(
        [
            go.Bar(
                x=list(groups),
                y=[g["slo_attainment"] or 0 for g in groups.values()],
                offsetgroup=0,
                name="SLO attainment",
            ),
            go.Bar(
                x=list(groups),
                y=[g["goodput"]["requests_per_s"] or 0 for g in groups.values()],
                offsetgroup=1,
                name="goodput req/s",
                yaxis="y2",
            ),
        ]
    )
    fig.update_layout(
        title="SLO attainment and goodput",
        barmode="group",
        yaxis={"title": "attainment", "range": [0, 1.05]},
        yaxis2={"title": "req/s", "overlaying": "y", "side": "right"},
    )
    return [fig_html(fig, "attainment")]


def events(df: pd.DataFrame, server: pd.DataFrame | None) -> list[str]:
    """Rejections, errors and timeouts per second (and the server's preemptions if scraped)."""
    ev = series.events_over_time(df)
    srv = series.server_series(
        server, ("scheduler_preempt_count_total", "scheduler_demotions_total")
    )
    fig = go.Figure(
        [go.Scatter(x=ev["t"], y=ev[s], name=f"{s} /s") for s in ("rejected", "error", "timeout")]
    )
    for name, s in srv.items():
        fig.add_trace(go.Scatter(x=s["t"], y=s["v"], name=name.replace("scheduler_", "")))
    fig.update_layout(
        title="Rejections, errors, timeouts (and preemptions where reported)",
        xaxis_title="time (s)",
        yaxis_title="per second",
    )
    return [fig_html(fig, "events")]


def send_lag(df: pd.DataFrame, health: Mapping[str, Any]) -> list[str]:
    """The generator's send lag per request, with the INVALID line."""
    lag = series.send_lag(df)
    fig = go.Figure(
        go.Scattergl(
            x=lag["t"], y=lag["lag_ms"], mode="markers", marker={"size": 3}, name="send lag"
        )
    )
    fig.add_hline(
        y=health["send_lag_threshold_ms"],
        line_dash="dash",
        line_color="red",
        annotation_text="INVALID above (p99)",
    )
    fig.update_layout(
        title=f"Generator send lag (p99 {ms(health['send_lag_ms'].get('p99'))} ms)",
        xaxis_title="intended time (s)",
        yaxis_title="ms",
    )
    return [fig_html(fig, "send-lag")]
