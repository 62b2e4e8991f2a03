"""The run report: one self-contained HTML page per run directory, and its Markdown summary.

The report computes nothing: figures come from `summary.json` and from plot series
(fairbench.analysis.series) that are downsampled for drawing only. The verdict and tables come
first and paint at once; figures (fairbench.report.figures) are drawn as they near the viewport.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import yaml

from fairbench.analysis import server_metrics as sm
from fairbench.analysis.blocks import unloaded_ns
from fairbench.report import figures
from fairbench.report.html import fig_html, ms, num, page, table
from fairbench.report.markdown import markdown_summary
from fairbench.targets.engines import engine
from fairbench.workload.scenario import parse_scenario


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
                ms(lat["ttft"]["p50"]),
                ms(lat["ttft"]["p99"]),
                ms(lat["tpot"]["p50"]),
                ms(lat["e2e"]["p99"]),
                "-" if att is None else f"{att:.1%}",
                f"{block['goodput']['requests_per_s'] or 0:.2f}",
            ]
        )
    return table(
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


def fairness_table(summary: dict[str, Any]) -> str:
    fair = summary.get("fairness", {})
    sd = fair.get("service_difference")
    sd_text = "-" if not sd or sd.get("max") is None else f"{sd['max']:,.0f} tokens"
    return table(
        ["fairness", "value"],
        [
            ["Jain over service ÷ fair share (run)", num(fair.get("jain_service"))],
            ["Jain over tenant slowdowns", num(fair.get("jain_slowdown"))],
            ["worst-case slowdown ratio", num(fair.get("worst_slowdown_ratio"))],
            ["slowdown basis", html.escape(str(fair.get("slowdown_basis", "-")))],
            [
                "service difference max / mean",
                sd_text,
            ],
        ],
    )


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
    unloaded, _ = unloaded_ns(window, parse_scenario(scenario))
    body = [
        f"<h1>{html.escape(summary['scenario'])}</h1>",
        verdict_html(summary),
        f"<p>plan {summary['plan_digest'][:23]}…, seed {summary['seed']}, target "
        f"{html.escape(str(header.get('target', {})))}</p>",
        f"<p>{html.escape(summary['accounting']['line'])}</p>",
        key_table(summary),
        fairness_table(summary),
        "<h2>Latency</h2>",
        *figures.latency_cdfs(window, slos, "tenant", "tenant"),
        *figures.latency_cdfs(window, slos, "slo_class", "class"),
        *figures.ttft_p99_over_time(summary),
        "<h2>Queues and fairness over time</h2>",
        *figures.queue_depth(df, server),
        *figures.service_shares(window, weights, lo, hi),
        *figures.jain_and_slowdown_windows(window, summary.get("fairness", {}), unloaded),
        *figures.attainment_and_goodput(summary),
        *figures.events(df, server),
        *figures.send_lag(df, summary["generator_health"]),
    ]
    if server is not None and len(server):
        body += server_metrics_section(server, str(header.get("target", {}).get("kind", "")))
    body.append("<h2>Scenario and run header</h2><pre>" + html.escape(scenario_text) + "</pre>")
    body.append("<pre>" + html.escape(json.dumps(header, indent=2, default=str)) + "</pre>")
    return page(f"fairbench: {summary['scenario']}", body), markdown_summary(summary)


def server_metrics_section(server: pd.DataFrame, kind: str) -> list[str]:
    """The engine's own view of the run: a table of its headline series, gauges over time,
    counter rates, and histogram quantiles per window (fairbench.analysis.server_metrics)."""
    headline = engine(kind).headline_metrics
    rows = sm.overview(server, headline)
    out = [f"<h2>Server metrics ({html.escape(kind)}, scraped during the run)</h2>"]
    if not rows:
        return [*out, "<p>none of this engine's headline series were exported</p>"]

    def describe(r: dict[str, Any]) -> str:
        if r["type"] == "histogram":
            return (
                f"{r['count']:.0f} observed; mean {num(r['mean'])}, p50 {num(r['p50'])}, "
                f"p99 {num(r['p99'])} (bucket interpolation)"
            )
        if r["type"] == "counter":
            return (
                f"+{r['increase']:.6g} over the run; {r['rate_mean']:.4g}/s mean, "
                f"{r['rate_max']:.4g}/s peak"
            )
        return f"mean {r['mean']:.4g}, max {r['max']:.4g}, last {r['last']:.4g}"

    out.append(
        table(
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
            out.append(fig_html(fig, fid))
    return out


def write_run_report(run_dir: Path) -> None:
    page, md = run_report(run_dir)
    (run_dir / "report.html").write_text(page, encoding="utf-8")
    (run_dir / "summary.md").write_text(md, encoding="utf-8")
