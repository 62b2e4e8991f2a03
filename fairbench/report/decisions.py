"""Pages for decisions across runs: the A/B document, a metric's history, a sweep's Pareto front.

Values come from the comparison (fairbench.decide.compare) and the runs' summaries; the pages
format them (units, colours, labels) and compute nothing of their own.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import yaml

from fairbench.analysis import registry, series
from fairbench.decide.compare import Comparison, Verdict
from fairbench.report.figures import arm_cdfs
from fairbench.report.html import ARM_DASH, Colors, fig_html, figure, page, swatch, table

_LATENCY = re.compile(r"^(ttft|e2e|tpot)_p\d+(\.|$)")


def unit_of(metric: str) -> str:
    """The unit of a metric name: the registry's, or for a summary path, read from the path."""
    known = registry.of_name(metric)
    if known is not None:
        return {"share": "fraction 0–1", "index": "index 0–1, 1 = fair", "ratio": "×"}.get(
            known.unit, known.unit
        )
    if _LATENCY.match(metric) or "latency_ms" in metric:
        return "ms"
    if "tokens_per_s" in metric:
        return "tokens/s"
    if metric in ("goodput", "throughput") or "requests_per_s" in metric:
        return "req/s"
    if "attainment" in metric or metric.endswith("share"):
        return "fraction 0–1"
    if "jain" in metric:
        return "index 0–1, 1 = fair"
    if "ratio" in metric:
        return "×"
    if "drift" in metric:
        return "relative change"
    return "as in summary.json"


def axis_title(metric: str, extra: str = "") -> str:
    return f"{metric} ({unit_of(metric)}{', ' + extra if extra else ''})"


def arm_value(v: Verdict, x: float, bound: bool = False) -> str:
    """One arm's value of a compared metric, by the registry's unit (≥ for a lower bound)."""
    if x is None or not math.isfinite(x):
        return "-"
    return registry.show(v.unit, x, bound)


def change_text(v: Verdict, x: float) -> str:
    return registry.show_change(registry.of_name(v.metric), x)


def verdict_rows(comparison: Comparison) -> list[list[str]]:
    rows = []
    for v in comparison.verdicts:
        ci = (
            "-"
            if not math.isfinite(v.ci_low)
            else f"[{change_text(v, v.ci_low)}, {change_text(v, v.ci_high)}]"
        )
        css = {"better": "better", "worse": "worse", "cannot evaluate": "cannot"}.get(v.verdict, "")
        rows.append(
            [
                html.escape(v.metric),
                arm_value(v, v.a, v.a_bound),
                arm_value(v, v.b, v.b_bound),
                change_text(v, v.diff),
                ci,
                "±" + change_text(v, v.threshold).lstrip("+"),
                "-" if not math.isfinite(v.p_value) else f"{v.p_value:.3f}",
                f"<span class='{css}'>{html.escape(v.verdict)}</span>"
                + (f"<br><small>{html.escape(v.reason)}</small>" if v.reason else ""),
            ]
        )
    return rows


def _link(run: Path, out_dir: Path | None, text: str) -> str:
    """A link to a run's report, relative to the page so the pair of directories can move."""
    if out_dir is None:
        return html.escape(text)
    try:
        href = os.path.relpath(run / "report.html", out_dir)
    except ValueError:  # another drive (Windows)
        return html.escape(text)
    return f"<a href='{html.escape(Path(href).as_posix())}'>{html.escape(text)}</a>"


def _summary(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def comparison_report(
    comparison: Comparison,
    a_dirs: list[Path],
    b_dirs: list[Path],
    title: str,
    what_changed: str = "",
    out_dir: Path | None = None,
) -> str:
    """The A/B document: what changed, both arms' values with the change, CI and verdict, the
    runs behind it, and overlaid latency CDFs. `out_dir`: where the page is written (run links
    are made relative to it)."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    if what_changed:
        body.append(f"<h2>What changed</h2><pre>{html.escape(what_changed)}</pre>")
    body += [
        "<h2>Verdicts (B vs A)</h2>",
        f"<p class='note'>{html.escape(comparison.design)}. A and B are means over the "
        f"{comparison.pairs} pair(s), in the measurement window; the change is relative "
        "(%) or, for fractions, absolute (percentage points).</p>",
        table(
            ["metric", "A", "B", "change (B − A)", "95% CI", "threshold", "p", "verdict"],
            verdict_rows(comparison),
        ),
    ]
    windows = {}
    for arm, dirs in (("A", a_dirs), ("B", b_dirs)):
        parts = []
        for d in dirs:
            df = pd.read_parquet(d / "records.parquet")
            lo, hi = _summary(d).get("window_s") or (-math.inf, math.inf)  # as compare reads
            t = df["t_intended_ns"] / 1e9
            parts.append(df[(t >= lo) & (t <= hi)])
        windows[arm] = pd.concat(parts)
    scenarios = [
        yaml.safe_load((d / "scenario.yaml").read_text(encoding="utf-8"))
        for d in [*a_dirs, *b_dirs]
    ]
    colors = Colors.of_runs(scenarios, windows.values())
    for by, prefix in (("slo_class", "class"), ("tenant", "tenant")):
        for metric in ("TTFT", "E2E"):
            cdf_title = f"{metric} CDF by {prefix}: A solid, B dotted (measurement window)"
            fig = arm_cdfs(
                {arm: windows[arm] for arm in ("A", "B")},
                by,
                prefix,
                metric,
                ARM_DASH,
                colors,
                cdf_title,
            )
            suffix = "" if metric == "TTFT" else "-e2e"
            body.append(fig_html(fig, f"ab-cdf-{by}{suffix}"))
    rows = []
    for arm, dirs in (("A", a_dirs), ("B", b_dirs)):
        for d in dirs:
            s = _summary(d)
            rows.append(
                [
                    arm,
                    _link(d, out_dir, d.name),
                    "VALID" if s.get("valid") else "INVALID",
                    str(s.get("seed", "-")),
                    html.escape(str(s.get("plan_digest", "-"))[:19]) + "…",
                    html.escape(str(s.get("accounting", {}).get("line", "-"))),
                ]
            )
    body += [
        "<h2>Runs</h2>",
        table(["arm", "run", "verdict", "seed", "plan", "accounting"], rows, left=(0, 1, 5)),
        "<p class='note'>Colours: "
        + ", ".join(swatch(c) + html.escape(f"tenant {n}") for n, c in colors.tenants.items())
        + "; "
        + ", ".join(swatch(c) + html.escape(f"class {n}") for n, c in colors.classes.items())
        + ".</p>",
    ]
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
        fig = figure(go.Scatter(x=labels, y=values, mode="lines+markers", name=name))
        step = series.detect_step(values)
        if step:
            fig.add_vline(
                x=step["at"] - 0.5,
                line_dash="dash",
                line_color="red",
                annotation_text=f"step {step['shift']:+.1%} (p={step['p']:.3f})",
            )
            found.append(f"{name}: {step['shift']:+.1%} from run {labels[step['at']]}")
        fig.update_layout(
            title=f"{name} per run",
            xaxis_title="run (in start order)",
            yaxis_title=axis_title(name),
            xaxis_type="category",
        )
        body.append(fig_html(fig, f"history-{k}"))
    body.insert(1, "<p>" + (html.escape("; ".join(found)) if found else "no lasting step") + "</p>")
    return page("fairbench history", body)


def pareto_report(
    labels: list[str],
    summaries: list[dict[str, Any]],
    x: str,
    y: str,
    senses: tuple[str, str],
    params: list[dict[str, Any]] | None = None,
    links: list[str] | None = None,
    more: list[tuple[str, str]] | None = None,
) -> str:
    """A sweep's points on two objectives, the front highlighted and dominated points greyed.

    Each point is numbered on the plot, and the table below says which configuration each
    number is: the swept parameters (`params`, one mapping per point; else its label), every
    objective's value, and a link to its run report (`links`, relative to the page). `more`:
    further (name, sense) objectives: the front is over all of them, as the terminal's table
    is, and they get a column each."""
    import numpy as np

    from fairbench.analysis.registry import metric_value
    from fairbench.decide.sweep import pareto_front

    objectives = [(x, senses[0]), (y, senses[1]), *(more or [])]
    values = np.array([[metric_value(s, n) for n, _ in objectives] for s in summaries])
    front = pareto_front(values, [sense for _, sense in objectives])
    tags = [f"#{k}" for k in range(len(labels))]
    scales = (_scale(values[:, 0]), _scale(values[:, 1]))
    shown = _cluster_labels(values[:, :2], scales, front)
    traces = []
    for on, name, color, size in (
        (False, "dominated", "#9e9e9e", 9),
        (True, "on the front", "#d62728", 11),
    ):
        keep = np.flatnonzero(front == on)
        traces.append(
            go.Scatter(
                x=values[keep, 0],
                y=values[keep, 1],
                mode="markers+text",
                name=f"{name} ({len(keep)} points)",
                marker={"color": color, "size": size},
                text=[shown[k] for k in keep],
                textposition="top center",
                hovertext=[f"{tags[k]}: {labels[k]}" for k in keep],
                hoverinfo="text+x+y",
            )
        )
    fig = figure(traces)
    over = " and ".join(n for n, _ in objectives)
    fig.update_layout(
        xaxis_type=scales[0],
        yaxis_type=scales[1],
        title=f"Pareto front over {over}; each number is a sweep point (see the table)",
        xaxis_title=axis_title(x, "higher is better" if senses[0] == "max" else "lower is better"),
        yaxis_title=axis_title(y, "higher is better" if senses[1] == "max" else "lower is better"),
    )
    keys: list[str] = sorted({k for p in params or [] for k in p})
    head = ["point", *(keys or ["configuration"]), *(axis_title(n) for n, _ in objectives), "front"]
    rows = []
    for k, label in enumerate(labels):
        cells = (
            [html.escape(str(params[k].get(key, "-"))) for key in keys]
            if params
            else [html.escape(label)]
        )
        rows.append(
            [
                _point_link(tags[k], links[k] if links else None),
                *cells,
                *(_num(v) for v in values[k]),
                "<b>yes</b>" if front[k] else "dominated",
            ]
        )
    goals = ", ".join(f"{html.escape(n)} ({sense})" for n, sense in objectives)
    return page(
        "fairbench sweep",
        [
            "<h1>Sweep: Pareto front</h1>",
            f"<p class='note'>{len(labels)} points; objectives {goals}, from each point's "
            "summary.json (measurement window). The plot shows the first two.</p>",
            fig_html(fig, "pareto", height=480),
            "<h2>Points</h2>",
            table(head, rows, left=tuple(range(1 + max(1, len(keys))))),
        ],
    )


def _cluster_labels(xy: Any, scales: tuple[str, str], front: Any) -> list[str]:
    """The number each point shows: points that would sit on top of one another (within 2 %
    of the axis span, on the axis' scale) share one label, "#1 #3 #5", drawn on a front point
    where there is one; the others show none."""
    import numpy as np

    pos = np.array(xy, dtype=float)
    for axis, scale in enumerate(scales):
        col = pos[:, axis]
        if scale == "log":
            col = np.log10(col)
        span = np.nanmax(col) - np.nanmin(col) if np.isfinite(col).any() else 0.0
        pos[:, axis] = (col - np.nanmin(col)) / span if span > 0 else 0.0
    shown = [""] * len(pos)
    done: set[int] = set()
    for k in sorted(range(len(pos)), key=lambda i: (not front[i], i)):
        if k in done:
            continue
        near = [
            j for j in range(len(pos)) if j not in done and np.all(np.abs(pos[j] - pos[k]) <= 0.02)
        ]
        done.update(near)
        shown[k] = " ".join(f"#{j}" for j in sorted(near))
    return shown


def _scale(values: Any) -> str:
    """A log axis where positive values span more than 20×: a latency objective of an
    overloaded point would otherwise flatten every other point onto one line."""
    import numpy as np

    v = values[np.isfinite(values)]
    return "log" if len(v) and v.min() > 0 and v.max() / v.min() > 20 else "linear"


def _num(v: float) -> str:
    if not math.isfinite(v):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _point_link(tag: str, href: str | None) -> str:
    if not href:
        return html.escape(tag)
    return f"<a href='{html.escape(href)}'>{html.escape(tag)}</a>"
