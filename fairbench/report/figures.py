"""One function per figure of the run report: data in, an HTML fragment out.

Each figure reads the run's summary, records or scraped series and computes nothing of its own
beyond downsampling for drawing (fairbench.analysis.series). Every figure colours a tenant or
class by the page's `Colors`, names its axes with units, and shows a legend; every time axis is
the run clock (seconds since t0) with warm-up and cool-down shaded, so figures line up with one
another and with the measurement window the tables cover. To add a figure, write a function
here and add it to the list in `fairbench.report.run.run_report`.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fairbench.analysis import series
from fairbench.report.html import Colors, fig_html, figure, ms

RUN_CLOCK = "time since run start (s)"
INTENDED_CLOCK = "intended send time (s since run start)"
STATUS_COLORS = {"rejected": "#cf222e", "error": "#bc4c00", "timeout": "#8250df"}
METRIC_KEY = {"TTFT": "ttft", "TPOT": "tpot", "E2E": "e2e"}


def shade_window(fig: go.Figure, window: tuple[float, float], t_end: float | None) -> None:
    """Grey out warm-up and cool-down: what lies there is outside the tables' window."""
    lo, hi = window
    if lo > 0:
        fig.add_vrect(x0=0, x1=lo, fillcolor="#888", opacity=0.12, line_width=0, layer="below")
        fig.add_annotation(
            x=lo / 2, y=1, yref="paper", text="warm-up", showarrow=False, font={"size": 10}
        )
    if t_end is not None and t_end > hi:
        fig.add_vrect(x0=hi, x1=t_end, fillcolor="#888", opacity=0.12, line_width=0, layer="below")
        fig.add_annotation(
            x=(hi + t_end) / 2,
            y=1,
            yref="paper",
            text="cool-down",
            showarrow=False,
            font={"size": 10},
        )


def latency_cdfs(
    df: pd.DataFrame, slos: Mapping[str, Any], by: str, prefix: str, colors: Colors
) -> list[str]:
    """TTFT, TPOT and E2E CDFs, a line per group, with each class's SLO as a dashed line in
    that class's colour."""
    out = []
    palette = colors.by(by)
    for metric, groups in series.latency_cdfs(df, by).items():
        fig = figure()
        for name, (x, y) in groups.items():
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    name=f"{prefix} {name}",
                    mode="lines",
                    line={"color": palette.get(name, "#444")},
                )
            )
        key = METRIC_KEY[metric]
        for cls, slo in slos.items():
            if slo.get(key):  # a trace, not add_vline: on a log axis vlines take log10(x)
                fig.add_trace(
                    go.Scatter(
                        x=[slo[key] * 1e3] * 2,
                        y=[0, 1],
                        mode="lines",
                        name=f"class {cls} {metric} SLO ({slo[key] * 1e3:g} ms)",
                        line={"dash": "dash", "color": colors.cls(cls), "width": 1.5},
                    )
                )
        fig.update_layout(
            title=f"{metric} CDF by {prefix} (ok requests in the measurement window)",
            xaxis_title=f"{metric} (ms, log scale)",
            yaxis_title="fraction of requests (0–1)",
            xaxis_type="log",
        )
        out.append(fig_html(fig, f"cdf-{prefix}-{metric.lower()}"))
    return out


def ttft_p99_over_time(
    summary: Mapping[str, Any], window: tuple[float, float], t_end: float
) -> list[str]:
    """The rolling-window TTFT p99 behind the drift figure, each window with its 95% interval as
    a vertical bar (to the top of the plot where n cannot bound p99; none where the window is
    too short for its own correlation), and the drift with its interval or the reason it has
    none."""
    drift = summary.get("drift", {}).get("ttft_p99", {})
    windows = drift.get("windows") or []
    if not windows:
        return []
    width = drift.get("window_s")
    values = [w["p99_ms"] for w in windows]
    tops = [w.get("ci_high_ms") for w in windows]
    ceiling = max([v for v in [*values, *tops] if v is not None] or [1.0]) * 1.1
    bar_x: list[float | None] = []
    bar_y: list[float | None] = []
    for w in windows:
        if w.get("ci_low_ms") is None:
            continue
        top = w.get("ci_high_ms")
        bar_x += [w["start_s"], w["start_s"], None]
        bar_y += [w["ci_low_ms"], ceiling if top is None else top, None]
    fig = figure()
    if bar_x:
        fig.add_trace(
            go.Scatter(
                x=bar_x,
                y=bar_y,
                mode="lines",
                line={"width": 6, "color": "rgba(31,119,180,0.25)"},
                hoverinfo="skip",
                name="95% interval (to the top: n cannot bound p99; none: window too short)",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=[w["start_s"] for w in windows],
            y=values,
            mode="lines+markers",
            name=f"TTFT p99 per {width:g} s window" if width else "TTFT p99 per window",
        )
    )
    d = drift.get("drift")
    title = "TTFT p99 over time (rolling windows)"
    note = ""
    if d and d.get("relative") is not None:
        bound = "≥ " if d.get("lower_bound") else ""
        if d.get("ci_low") is not None and d.get("ci_high") is not None:
            test = f", p = {d['trend_p']:.2f}" if d.get("trend_p") is not None else ""
            ci = f" [{d['ci_low']:+.1%}, {d['ci_high']:+.1%}] at 95%{test}"
        else:
            ci = " (no interval: see below)"
            note = "drift has no interval: " + (d.get("ci_reason") or "a window has none")
        title += f" — drift {bound}{d['relative']:+.1%}{ci}"
    shade_window(fig, window, t_end)
    fig.update_layout(
        title=title, xaxis_title=f"window start, {INTENDED_CLOCK}", yaxis_title="TTFT p99 (ms)"
    )
    page = fig_html(fig, "ttft-p99-time")
    if note:
        page += f"<p class='note'>{html.escape(note)}</p>"
    return [page]


def queue_depth(
    df: pd.DataFrame, server: pd.DataFrame | None, window: tuple[float, float], t_end: float
) -> list[str]:
    """The server's queue depth where it reports one, else the waiting count from records."""
    qs = series.server_series(server, ("scheduler_queue_depth",))
    fig = figure()
    if qs:
        fig.add_trace(
            go.Scatter(
                x=qs["scheduler_queue_depth"]["t"],
                y=qs["scheduler_queue_depth"]["v"],
                name="server queue depth (scraped)",
            )
        )
    else:
        q = series.queue_depth(df)
        fig.add_trace(
            go.Scatter(x=q["t"], y=q["depth"], name="waiting: arrived, not yet admitted (records)")
        )
    shade_window(fig, window, t_end)
    fig.update_layout(
        title="Queue depth",
        xaxis_title=RUN_CLOCK,
        yaxis_title="requests waiting (count)",
        yaxis_rangemode="tozero",
    )
    return [fig_html(fig, "queue-depth")]


def service_shares(
    window_df: pd.DataFrame,
    weights: Mapping[str, float],
    window: tuple[float, float],
    colors: Colors,
) -> list[str]:
    """Each tenant's service share per window beside its weighted max-min fair share (service
    counted as the summary's fairness block counts it)."""
    lo, hi = window
    step = max(5.0, (hi - lo) / 30)
    shares = series.shares_over_time(window_df, dict(weights), step, start_s=lo, end_s=hi)
    fig = figure()
    for tenant in sorted(weights):
        color = colors.tenant(tenant)
        fig.add_trace(
            go.Scatter(
                x=shares["t"],
                y=shares["service"].get(tenant, []),
                name=f"tenant {tenant}: service",
                mode="lines+markers",
                marker={"size": 4},
                line={"color": color},
                legendgroup=tenant,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=shares["t"],
                y=shares["fair"].get(tenant, []),
                name=f"tenant {tenant}: fair share",
                mode="lines",
                line={"color": color, "dash": "dot"},
                legendgroup=tenant,
            )
        )
    fig.update_layout(
        title=f"Service share vs weighted max-min fair share, per {step:g} s window "
        "(requests in the measurement window; service = prompt + 2 × output tokens)",
        xaxis_title=f"window start, {RUN_CLOCK}",
        yaxis_title="share of service delivered (0–1)",
        yaxis_range=[0, 1.02],
    )
    return [fig_html(fig, "shares", height=420)]


def jain_and_slowdown_windows(
    window_df: pd.DataFrame, fair: Mapping[str, Any], unloaded: Any, timeout_s: float | None
) -> list[str]:
    """Jain's index per window and the worst-case slowdown ratio per window, one above the
    other on the same time axis."""
    jw = fair.get("jain_windows") or {}
    step = float(jw.get("window_s") or 1.0)
    first_send = float(window_df["t_intended_ns"].min()) / 1e9 if len(window_df) else 0.0
    t0 = float(jw.get("start_s", first_send))  # the windows' own grid (summary's jain_windows)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, figure=figure())
    fig.add_trace(
        go.Scatter(
            x=[t0 + k * step for k in range(len(jw.get("values", [])))],
            y=jw.get("values", []),
            mode="lines+markers",
            name="Jain's index of weighted service among the backlogged",
            line={"color": "#1f6feb"},
        ),
        row=1,
        col=1,
    )
    ws, worst = series.worst_slowdown_windows(window_df, unloaded, step, t0, timeout_s)
    fig.add_trace(
        go.Scatter(
            x=ws,
            y=worst,
            mode="lines+markers",
            name="worst ÷ best tenant mean slowdown",
            line={"color": "#bc4c00"},
        ),
        row=2,
        col=1,
    )
    if not any(v is not None for v in jw.get("values", [])):
        fig.add_annotation(  # an empty panel would read as a missing plot
            text=jw.get("reason") or "no contended window",
            xref="x domain",
            yref="y domain",
            x=0.5,
            y=0.5,
            showarrow=False,
            row=1,
            col=1,
        )
    fig.update_yaxes(title_text="Jain's index (0–1, 1 = fair)", range=[0, 1.05], row=1, col=1)
    # a starved tenant's windows reach hundreds: on a log axis 1.2 and 200 both read
    fig.update_yaxes(title_text="slowdown ratio (×, 1 = even, log)", type="log", row=2, col=1)
    fig.update_xaxes(title_text=f"window start, {RUN_CLOCK}", row=2, col=1)
    fig.update_layout(title=f"Jain's index and worst-case slowdown ratio per {step:g} s window")
    return [fig_html(fig, "jain-windows", height=520)]


def attainment_and_goodput(summary: Mapping[str, Any], colors: Colors) -> list[str]:
    """SLO attainment (a fraction) and goodput (req/s) per class and per tenant: two panels,
    so neither scale is read against the other's axis."""
    groups = [  # class bars hatched: their palette is not the tenants'
        *((f"class {k}", v, colors.cls(k), "/") for k, v in summary["slo_classes"].items()),
        *((f"tenant {k}", v, colors.tenant(k), "") for k, v in summary["tenants"].items()),
    ]
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("SLO attainment", "goodput (requests meeting their SLO)"),
        horizontal_spacing=0.1,
        figure=figure(),
    )
    for label, g, color, hatch in groups:
        att, good = g["slo_attainment"], g["goodput"]["requests_per_s"]
        for col, value, text in (
            (1, att, "-" if att is None else f"{att:.1%}"),
            (2, good, "-" if good is None else f"{good:.2f}"),
        ):
            fig.add_trace(
                go.Bar(
                    x=[label],
                    y=[value or 0],
                    name=label,
                    marker={"color": color, "pattern": {"shape": hatch}},
                    legendgroup=label,
                    showlegend=col == 1,
                    text=[text],
                    textposition="outside",
                ),
                row=1,
                col=col,
            )
    fig.update_yaxes(title_text="attainment (fraction of requests, 0–1)", range=[0, 1.1], col=1)
    fig.update_yaxes(title_text="goodput (req/s)", col=2)
    fig.update_xaxes(title_text="group (SLO class or tenant)")
    fig.update_layout(title="SLO attainment and goodput, measurement window")
    return [fig_html(fig, "attainment", height=460, top=90)]


def events(
    df: pd.DataFrame, server: pd.DataFrame | None, window: tuple[float, float], t_end: float
) -> list[str]:
    """Rejections, errors and timeouts per second (and the server's preemptions if scraped)."""
    ev = series.events_over_time(df)
    srv = series.server_series(
        server, ("scheduler_preempt_count_total", "scheduler_demotions_total")
    )
    fig = figure(
        [
            go.Scatter(x=ev["t"], y=ev[s], name=f"{s} (req/s)", line={"color": STATUS_COLORS[s]})
            for s in ("rejected", "error", "timeout")
        ]
    )
    for name, s in srv.items():
        label = name.replace("scheduler_", "").removesuffix("_total")
        fig.add_trace(go.Scatter(x=s["t"], y=s["v"], name=f"server {label} (/s)"))
    shade_window(fig, window, t_end)
    quiet = not any(any(ev[s]) for s in STATUS_COLORS) and not any(
        any(v["v"]) for v in srv.values()
    )
    fig.update_layout(
        title="Rejections, errors, timeouts by intended send time (and preemptions where "
        "reported)" + (" — none in this run" if quiet else ""),
        xaxis_title=RUN_CLOCK,
        yaxis_title="events per second (/s)",
        yaxis_rangemode="tozero",
    )
    return [fig_html(fig, "events")]


def send_lag(
    df: pd.DataFrame, health: Mapping[str, Any], window: tuple[float, float], t_end: float
) -> list[str]:
    """The generator's send lag and receive delay per request, with their INVALID lines."""
    lag = series.send_lag(df)
    fig = figure(
        go.Scattergl(
            x=lag["t"],
            y=lag["lag_ms"],
            mode="markers",
            marker={"size": 3},
            name="send lag per request",
        )
    )
    limit = health["send_lag_threshold_ms"]
    fig.add_trace(
        go.Scatter(
            x=[0, t_end],
            y=[limit, limit],
            mode="lines",
            name=f"INVALID if p99 above {limit:g} ms",
            line={"dash": "dash", "color": "red"},
        )
    )
    shade_window(fig, window, t_end)
    rx = series.receive_delay(df)
    if rx["t"]:
        fig.add_trace(
            go.Scattergl(
                x=rx["t"],
                y=rx["delay_ms"],
                mode="markers",
                marker={"size": 3},
                name="receive delay per request (kernel stamp to read)",
            )
        )
    title = f"Generator send lag (p99 {ms(health['send_lag_ms'].get('p99'))} ms)"
    delay = health.get("receive_delay_ms")
    if delay:
        title += f" and receive delay (p99 {ms(delay.get('p99'))} ms)"
    if health.get("virtual_time"):
        title += " — virtual time: requests are sent exactly on time"
    fig.update_layout(
        title=title,
        xaxis_title=INTENDED_CLOCK,
        yaxis_title="send lag, receive delay (ms)",
        yaxis_rangemode="tozero",
    )
    return [fig_html(fig, "send-lag")]


def arm_cdfs(
    frames: Mapping[str, pd.DataFrame],
    by: str,
    prefix: str,
    metric: str,
    dashes: Mapping[str, str],
    colors: Colors,
    title: str,
) -> go.Figure:
    """One latency's CDF per group (`by`), one line style per arm (A/B, real/sim), one colour
    per group across the arms: the A/B and fidelity pages' overlay."""
    fig = figure()
    palette = colors.by(by)
    for arm, df in frames.items():
        for name, (x, y) in series.latency_cdfs(df, by)[metric].items():
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    name=f"{arm}: {prefix} {name}",
                    mode="lines",
                    legendgroup=str(name),
                    line={"dash": dashes[arm], "color": palette.get(name)},
                )
            )
    fig.update_layout(
        title=title,
        xaxis_type="log",
        xaxis_title=f"{metric} (ms, log scale)",
        yaxis_title="fraction of requests (0–1)",
    )
    return fig
