"""Pages for decisions across runs: the A/B document, a metric's history, a sweep's Pareto front."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from fairbench.analysis import series
from fairbench.decide.compare import Comparison
from fairbench.report.html import COLORS, fig_html, page, table


def comparison_report(
    comparison: Comparison,
    a_dirs: list[Path],
    b_dirs: list[Path],
    title: str,
    what_changed: str = "",
) -> str:
    """The A/B document: what changed, verdicts with CIs, and overlaid latency CDFs."""
    rows = []
    for v in comparison.verdicts:
        fmt = (lambda x: f"{x:+.3f}") if v.absolute else (lambda x: f"{x:+.1%}")
        ci = "-" if math.isnan(v.ci_low) else f"[{fmt(v.ci_low)}, {fmt(v.ci_high)}]"
        css = {"better": "better", "worse": "worse"}.get(v.verdict, "")
        rows.append(
            [
                html.escape(v.metric),
                "-" if math.isnan(v.diff) else fmt(v.diff),
                ci,
                "-" if math.isnan(v.p_value) else f"{v.p_value:.3f}",
                f"<span class='{css}'>{v.verdict}</span>",
            ]
        )
    body = [f"<h1>{html.escape(title)}</h1>"]
    if what_changed:
        body.append(f"<h2>What changed</h2><pre>{html.escape(what_changed)}</pre>")
    body += [
        "<h2>Verdicts (B vs A)</h2>",
        f"<p>{html.escape(comparison.design)}</p>",
        table(["metric", "change", "95% CI", "p", "verdict"], rows),
    ]
    frames = {
        arm: pd.concat([pd.read_parquet(d / "records.parquet") for d in dirs])
        for arm, dirs in (("A", a_dirs), ("B", b_dirs))
    }
    for by in ("slo_class", "tenant"):
        fig = go.Figure()
        for arm, dash in (("A", "solid"), ("B", "dot")):
            groups = series.latency_cdfs(frames[arm], by)["TTFT"]
            for k, (name, (x, y)) in enumerate(groups.items()):
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=y,
                        name=f"{arm}: {name}",
                        mode="lines",
                        line={"dash": dash, "color": COLORS[k % len(COLORS)]},
                    )
                )
        fig.update_layout(
            title=f"TTFT CDF by {by}: A solid, B dotted",
            xaxis_type="log",
            xaxis_title="TTFT (ms)",
            yaxis_title="fraction",
        )
        body.append(fig_html(fig, f"ab-cdf-{by}"))
    runs = "".join(
        f"<li>A: {html.escape(str(a))} — B: {html.escape(str(b))}</li>"
        for a, b in zip(a_dirs, b_dirs, strict=False)
    )
    body.append(f"<h2>Runs</h2><ul>{runs}</ul>")
    return page(title, body)


def history_report(
    summaries: list[dict[str, Any]], labels: list[str], metric_names: list[str]
) -> str:
    """Each metric per run, in order, with a lasting step (if any) marked."""
    from fairbench.analysis.registry import metric_value

    body = ["<h1>fairbench history</h1>"]
    found = []
    for k, name in enumerate(metric_names):
        values = [metric_value(s, name) for s in summaries]
        fig = go.Figure(go.Scatter(x=labels, y=values, mode="lines+markers", name=name))
        step = series.detect_step(values)
        if step:
            fig.add_vline(
                x=step["at"] - 0.5,
                line_dash="dash",
                line_color="red",
                annotation_text=f"step {step['shift']:+.1%} (p={step['p']:.3f})",
            )
            found.append(f"{name}: {step['shift']:+.1%} from run {labels[step['at']]}")
        fig.update_layout(title=name, xaxis_title="run", yaxis_title=name)
        body.append(fig_html(fig, f"history-{k}"))
    body.insert(1, "<p>" + (html.escape("; ".join(found)) if found else "no lasting step") + "</p>")
    return page("fairbench history", body)


def pareto_report(
    labels: list[str], summaries: list[dict[str, Any]], x: str, y: str, senses: tuple[str, str]
) -> str:
    """Two objectives of a sweep, the front highlighted and dominated points greyed."""
    import numpy as np

    from fairbench.analysis.registry import metric_value
    from fairbench.decide.sweep import pareto_front

    values = np.array([[metric_value(s, x), metric_value(s, y)] for s in summaries])
    front = pareto_front(values, list(senses))
    fig = go.Figure(
        [
            go.Scatter(
                x=values[~front, 0],
                y=values[~front, 1],
                mode="markers",
                name="dominated",
                marker={"color": "lightgrey", "size": 9},
                text=[lbl for lbl, f in zip(labels, front, strict=True) if not f],
            ),
            go.Scatter(
                x=values[front, 0],
                y=values[front, 1],
                mode="markers+lines",
                name="front",
                marker={"color": "#d62728", "size": 11},
                text=[lbl for lbl, f in zip(labels, front, strict=True) if f],
            ),
        ]
    )
    fig.update_layout(
        title="Pareto front", xaxis_title=f"{x} ({senses[0]})", yaxis_title=f"{y} ({senses[1]})"
    )
    return page("fairbench sweep", ["<h1>Sweep: Pareto front</h1>", fig_html(fig, "pareto")])
