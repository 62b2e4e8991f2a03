"""The history store's page: one metric per run over time with its intervals, the rolling
figure and its band, and the change points with their location intervals. Renders the dict
fairbench.history.view computes; computes nothing. Offline: plotly.js beside the page."""

from __future__ import annotations

import html as html_mod
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from fairbench.report.html import fig_html, figure, page, write_page


def history_page(view: dict[str, Any]) -> str:
    pts, roll = view["points"], view["rolling"]
    x = [p["time"] for p in pts]
    fig = figure()
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[p["value"] for p in pts],
            mode="markers",
            name="per run (95% CI)",
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [(p["ci_high"] or p["value"]) - p["value"] for p in pts],
                "arrayminus": [p["value"] - (p["ci_low"] or p["value"]) for p in pts],
            },
        )
    )
    fig.add_trace(go.Scatter(x=x, y=[r["value"] for r in roll], mode="lines", name="rolling mean"))
    fig.add_trace(
        go.Scatter(
            x=x + x[::-1],
            y=[r["ci_high"] for r in roll] + [r["ci_low"] for r in roll][::-1],
            fill="toself",
            line={"width": 0},
            opacity=0.2,
            name="rolling 95% CI",
        )
    )
    for c in view["change_points"]:
        fig.add_vrect(x0=c["ci"][0], x1=c["ci"][1], fillcolor="red", opacity=0.12, line_width=0)
        fig.add_vline(x=c["time"], line_dash="dash", line_color="red")
    fig.update_layout(
        title=f"{view['metric']} ({view['group']}) over time",
        xaxis_title="run start (UTC)",
        yaxis_title=view["metric"],
    )
    d = view["drift"]
    drift = (
        f"drift {d['relative']:+.1%} (95% CI {d['ci_low']:+.1%}..{d['ci_high']:+.1%}; "
        f"{d['method']})"
        if d["status"] == "ok"
        else f"drift: cannot evaluate: {d['reason']}"
    )
    body = [
        f"<h1>fairbench history: {html_mod.escape(view['metric'])}</h1>",
        f"<p>{html_mod.escape(view['scenario'])}, {len(pts)} runs. {html_mod.escape(drift)}</p>",
        f"<p class='note'>{html_mod.escape(view['change_point_method'])}</p>",
        fig_html(fig, "history-0"),
    ]
    return page(f"fairbench history {view['metric']}", body)


def write_history_page(path: Path, view: dict[str, Any]) -> Path:
    return write_page(path, history_page(view))
