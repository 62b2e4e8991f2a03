"""Reports people read: one self-contained HTML file (plotly, works offline) and a Markdown summary.

The report computes nothing: figures come from `summary.json` and from plot series
(fairbench.series) that are downsampled for drawing only. plotly.js is embedded once per file, so
a report opens without a network (tested in a browser that blocks every fetch). The verdict and
tables come first and paint at once; figures are drawn as they near the viewport.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import plotly.offline
import yaml

from fairbench import series
from fairbench.compare import Comparison

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
h1{margin-bottom:.2em} .valid{color:#1a7f37} .invalid{color:#cf222e}
table{border-collapse:collapse;margin:1em 0} td,th{border:1px solid #ccc;padding:.3em .6em;
text-align:right} th{background:#f6f8fa} td:first-child,th:first-child{text-align:left}
.better{color:#1a7f37;font-weight:600} .worse{color:#cf222e;font-weight:600}
pre{background:#f6f8fa;padding:1em;overflow:auto;font-size:12px} .plot{margin:1em 0}
"""


def _fig_html(fig: go.Figure, fid: str) -> str:
    """A placeholder and the figure's JSON; the page's loader draws it when it nears the viewport
    (plotly.js alone takes over a second to start on a small machine: drawing every figure up
    front would keep a long report from opening quickly)."""
    fig.update_layout(
        template="plotly_white", height=380, margin={"l": 60, "r": 20, "t": 50, "b": 50}
    )
    data = fig.to_json().replace("</", "<\\/")
    return (
        f'<div class="plot js-plotly-lazy" id="{fid}" style="height:380px"></div>'
        f'<script type="application/json" id="{fid}-data">{data}</script>'
    )


_LOADER = """
const draw = d => { const f = JSON.parse(document.getElementById(d.id + '-data').textContent);
  Plotly.newPlot(d, f.data, f.layout, {displaylogo: false, responsive: true}); };
const seen = new IntersectionObserver(es => es.forEach(e => { if (e.isIntersecting) {
  seen.unobserve(e.target); draw(e.target); } }), {rootMargin: '600px'});
document.querySelectorAll('.js-plotly-lazy').forEach(d => seen.observe(d));
"""


def _page(title: str, body: list[str]) -> str:
    js = plotly.offline.get_plotlyjs()
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{CSS}</style></head><body>{''.join(body)}"
        f"<p><small>fairbench report, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC</small>"
        f"</p><script type='text/javascript'>{js}</script><script>{_LOADER}</script>"
        "</body></html>"
    )


def _ms(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{th}</tr>{trs}</table>"


def verdict_html(summary: dict[str, Any]) -> str:
    if summary["valid"]:
        return "<h2 class='valid'>VALID</h2>"
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in summary["invalid_reasons"])
    return f"<h2 class='invalid'>INVALID</h2><ul>{reasons}</ul>"


def key_table(summary: dict[str, Any]) -> str:
    rows = []
    for label, block in [
        ("overall", summary["overall"]),
        *((f"tenant {k}", v) for k, v in summary["tenants"].items()),
        *((f"class {k}", v) for k, v in summary["slo_classes"].items()),
    ]:
        lat, c = block["latency_ms"], block["counts"]
        att = block["slo_attainment"]
        rows.append(
            [
                html.escape(label),
                f"{c['ok']}/{block['requests']}",
                _ms(lat["ttft"]["p50"]),
                _ms(lat["ttft"]["p99"]),
                _ms(lat["tpot"]["p50"]),
                _ms(lat["e2e"]["p99"]),
                "-" if att is None else f"{att:.1%}",
                f"{block['goodput']['requests_per_s'] or 0:.2f}",
            ]
        )
    return _table(
        [
            "group",
            "ok/planned",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "TPOT p50 ms",
            "E2E p99 ms",
            "SLO attainment",
            "goodput req/s",
        ],
        rows,
    )


def _cdf_figs(df: pd.DataFrame, slos: dict[str, Any], by: str, prefix: str) -> list[str]:
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
        out.append(_fig_html(fig, f"cdf-{prefix}-{metric.lower()}"))
    return out


def run_report(run_dir: Path) -> tuple[str, str]:
    """(HTML, Markdown) for one run directory."""
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    header = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    scenario_text = (run_dir / "scenario.yaml").read_text(encoding="utf-8")
    scenario = yaml.safe_load(scenario_text)
    df = pd.read_parquet(run_dir / "records.parquet")
    lo, hi = summary["window_s"]
    t = df["t_intended_ns"] / 1e9
    window = df[(t >= lo) & (t <= hi)]
    metrics_path = run_dir / "server_metrics.parquet"
    server = pd.read_parquet(metrics_path) if metrics_path.is_file() else None
    slos = {k: v for k, v in scenario.get("slo_classes", {}).items()}
    weights = {tn["id"]: tn.get("weight", 1.0) for tn in scenario["tenants"]}
    body = [
        f"<h1>{html.escape(summary['scenario'])}</h1>",
        verdict_html(summary),
        f"<p>plan {summary['plan_digest'][:23]}…, seed {summary['seed']}, target "
        f"{html.escape(str(header.get('target', {})))}</p>",
        f"<p>{html.escape(summary['accounting']['line'])}</p>",
        key_table(summary),
    ]
    fair = summary.get("fairness", {})
    sd = fair.get("service_difference")
    sd_text = "-" if not sd else f"{sd['max']:.1f} / {sd['mean']:.1f}"
    body.append(
        _table(
            ["fairness", "value"],
            [
                ["Jain over service ÷ fair share (run)", _num(fair.get("jain_service"))],
                ["Jain over tenant slowdowns", _num(fair.get("jain_slowdown"))],
                ["worst-case slowdown ratio", _num(fair.get("worst_slowdown_ratio"))],
                ["slowdown basis", html.escape(str(fair.get("slowdown_basis", "-")))],
                [
                    "service difference max / mean",
                    sd_text,
                ],
            ],
        )
    )
    body.append("<h2>Latency</h2>")
    body += _cdf_figs(window, slos, "tenant", "tenant")
    body += _cdf_figs(window, slos, "slo_class", "class")
    drift = summary.get("drift", {}).get("ttft_p99", {})
    if drift.get("windows"):
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
        body.append(_fig_html(fig, "ttft-p99-time"))
    body.append("<h2>Queues and fairness over time</h2>")
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
    body.append(_fig_html(fig, "queue-depth"))
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
    body.append(_fig_html(fig, "shares"))
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
    from fairbench.analysis import unloaded_ns
    from fairbench.scenario import parse_scenario

    base, _ = unloaded_ns(window, parse_scenario(scenario))
    ws, worst = series.worst_slowdown_windows(window, base, step)
    fig.add_trace(
        go.Scatter(x=ws, y=worst, mode="lines+markers", name="worst slowdown ratio", yaxis="y2")
    )
    fig.update_layout(
        title=f"Jain's index and worst-case slowdown ratio per {step:g} s window",
        xaxis_title="time (s)",
        yaxis={"title": "Jain", "range": [0, 1.05]},
        yaxis2={"title": "worst ÷ best tenant slowdown", "overlaying": "y", "side": "right"},
    )
    body.append(_fig_html(fig, "jain-windows"))
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
    body.append(_fig_html(fig, "attainment"))
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
    body.append(_fig_html(fig, "events"))
    lag = series.send_lag(df)
    health = summary["generator_health"]
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
        title=f"Generator send lag (p99 {_ms(health['send_lag_ms'].get('p99'))} ms)",
        xaxis_title="intended time (s)",
        yaxis_title="ms",
    )
    body.append(_fig_html(fig, "send-lag"))
    if server is not None and len(server):
        body += server_metrics_section(server, str(header.get("target", {}).get("kind", "")))
    body.append("<h2>Scenario and run header</h2><pre>" + html.escape(scenario_text) + "</pre>")
    body.append("<pre>" + html.escape(json.dumps(header, indent=2, default=str)) + "</pre>")
    return _page(f"fairbench: {summary['scenario']}", body), markdown_summary(summary)


def server_metrics_section(server: pd.DataFrame, kind: str) -> list[str]:
    """The engine's own view of the run: a table of its headline series, gauges over time,
    counter rates, and histogram quantiles per window (fairbench.server_metrics)."""
    from fairbench import server_metrics as sm
    from fairbench.targets.engines import engine

    headline = engine(kind).headline_metrics
    rows = sm.overview(server, headline)
    out = [f"<h2>Server metrics ({html.escape(kind)}, scraped during the run)</h2>"]
    if not rows:
        return [*out, "<p>none of this engine's headline series were exported</p>"]

    def describe(r: dict[str, Any]) -> str:
        if r["type"] == "histogram":
            return (
                f"{r['count']:.0f} observed; mean {_num(r['mean'])}, p50 {_num(r['p50'])}, "
                f"p99 {_num(r['p99'])} (bucket interpolation)"
            )
        if r["type"] == "counter":
            return (
                f"+{r['increase']:.6g} over the run; {r['rate_mean']:.4g}/s mean, "
                f"{r['rate_max']:.4g}/s peak"
            )
        return f"mean {r['mean']:.4g}, max {r['max']:.4g}, last {r['last']:.4g}"

    out.append(
        _table(
            ["series", "type", "during the run"],
            [[html.escape(r["metric"]), r["type"], html.escape(describe(r))] for r in rows],
        )
    )
    gauges = go.Figure()
    rates = go.Figure()
    quant = go.Figure()
    for r in rows:
        family = r["metric"].removesuffix("_total")
        if r["type"] == "gauge":
            t, v = sm.gauge(server, family)
            gauges.add_trace(go.Scatter(x=t, y=v, name=r["metric"]))
        elif r["type"] == "counter":
            t, v = sm.counter_rate(server, family)
            rates.add_trace(go.Scatter(x=t, y=v, name=f"{r['metric']} /s"))
        elif r["type"] == "histogram":
            h = sm.histogram_over_time(server, family)
            for q, dash in (("p50", "dot"), ("p99", "solid")):
                quant.add_trace(
                    go.Scatter(x=h["t"], y=h[q], name=f"{r['metric']} {q}", line={"dash": dash})
                )
    gauges.update_layout(title="Gauges", xaxis_title="time (s)")
    rates.update_layout(title="Counters as rates", xaxis_title="time (s)", yaxis_title="per s")
    quant.update_layout(
        title="Histogram quantiles per 5-scrape window", xaxis_title="time (s)", yaxis_title="s"
    )
    for fig, fid in ((gauges, "srv-gauges"), (rates, "srv-rates"), (quant, "srv-quantiles")):
        if fig.data:
            out.append(_fig_html(fig, fid))
    return out


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


def markdown_summary(summary: dict[str, Any]) -> str:
    state = "VALID" if summary["valid"] else "INVALID: " + "; ".join(summary["invalid_reasons"])
    lines = [
        f"## fairbench: {summary['scenario']} — {state}",
        "",
        f"{summary['accounting']['line']}",
        "",
        "| group | ok | TTFT p50 ms | TTFT p99 ms | E2E p99 ms | SLO attainment |",
        "|---|---|---|---|---|---|",
    ]
    for label, block in [
        ("overall", summary["overall"]),
        *((f"tenant {k}", v) for k, v in summary["tenants"].items()),
        *((f"class {k}", v) for k, v in summary["slo_classes"].items()),
    ]:
        lat = block["latency_ms"]
        att = block["slo_attainment"]
        lines.append(
            f"| {label} | {block['counts']['ok']} | {_ms(lat['ttft']['p50'])} | "
            f"{_ms(lat['ttft']['p99'])} | {_ms(lat['e2e']['p99'])} | "
            f"{'-' if att is None else f'{att:.1%}'} |"
        )
    fair = summary.get("fairness", {})
    lines += [
        "",
        f"Fairness: Jain (service ÷ fair share) {_num(fair.get('jain_service'))}, "
        f"Jain (slowdown) {_num(fair.get('jain_slowdown'))}, worst slowdown ratio "
        f"{_num(fair.get('worst_slowdown_ratio'))}.",
    ]
    return "\n".join(lines) + "\n"


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
        _table(["metric", "change", "95% CI", "p", "verdict"], rows),
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
        body.append(_fig_html(fig, f"ab-cdf-{by}"))
    runs = "".join(
        f"<li>A: {html.escape(str(a))} — B: {html.escape(str(b))}</li>"
        for a, b in zip(a_dirs, b_dirs, strict=False)
    )
    body.append(f"<h2>Runs</h2><ul>{runs}</ul>")
    return _page(title, body)


def history_report(
    summaries: list[dict[str, Any]], labels: list[str], metric_names: list[str]
) -> str:
    """Each metric per run, in order, with a lasting step (if any) marked."""
    from fairbench.sweep import metric_value

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
        body.append(_fig_html(fig, f"history-{k}"))
    body.insert(1, "<p>" + (html.escape("; ".join(found)) if found else "no lasting step") + "</p>")
    return _page("fairbench history", body)


def pareto_report(
    labels: list[str], summaries: list[dict[str, Any]], x: str, y: str, senses: tuple[str, str]
) -> str:
    """Two objectives of a sweep, the front highlighted and dominated points greyed."""
    import numpy as np

    from fairbench.sweep import metric_value, pareto_front

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
    return _page("fairbench sweep", ["<h1>Sweep: Pareto front</h1>", _fig_html(fig, "pareto")])


def write_run_report(run_dir: Path) -> None:
    page, md = run_report(run_dir)
    (run_dir / "report.html").write_text(page, encoding="utf-8")
    (run_dir / "summary.md").write_text(md, encoding="utf-8")
