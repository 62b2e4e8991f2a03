"""The run report: one self-contained HTML page per run directory, and its Markdown summary.

The report computes nothing: figures come from `summary.json` and from plot series
(fairbench.analysis.series) that are downsampled for drawing only. The verdict and tables come
first and paint at once; figures (fairbench.report.figures) are drawn as they near the viewport.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import yaml

from fairbench.analysis import frame_memo, registry
from fairbench.analysis import server_metrics as sm
from fairbench.analysis.blocks import unloaded_ns
from fairbench.report import figures
from fairbench.report.headline import headline_html
from fairbench.report.html import (
    Colors,
    fig_html,
    figure,
    flatten,
    ms,
    num,
    page,
    swatch,
    table,
    text_of,
    write_page,
)
from fairbench.report.markdown import figure_text, markdown_summary
from fairbench.workload.loading import parse_scenario

if TYPE_CHECKING:
    import pyarrow as pa

    from fairbench.workload.models import Scenario


def completion_html(summary: dict[str, Any]) -> str:
    """Beside VALID/INVALID: whether the tail is honest about the requests that never finished."""
    comp = summary.get("completion")
    if not comp:
        return ""
    css = "valid" if comp["ok"] else "invalid"
    head = (
        "all finished"
        if not comp["unfinished"]
        else ("tail within the unfinished limit" if comp["ok"] else "TAIL CENSORED")
    )
    return f"<p class='{css}'><b>{head}</b>: {html.escape(comp['line'])}</p>"


def verdict_html(summary: dict[str, Any]) -> str:
    if summary["valid"]:
        return "<h2 class='valid'>VALID</h2>" + completion_html(summary)
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in summary["invalid_reasons"])
    return f"<h2 class='invalid'>INVALID</h2><ul>{reasons}</ul>" + completion_html(summary)


def lat_cell(lat: dict[str, Any], kind: str, key: str) -> str:
    """A percentile in ms, `≥` when it is only a lower bound (it falls in censored mass)."""
    block = lat.get(kind) or {}
    value = block.get(key)
    return ("≥ " if key in (block.get("lower_bound") or []) else "") + ms(value)


def window_counts(df: pd.DataFrame, window: tuple[float, float]) -> dict[str, int]:
    """How many records the measurement window holds and how many warm-up and cool-down left
    out (by intended send time, as the summary selects them)."""
    t = df["t_intended_ns"].to_numpy(dtype=float) / 1e9
    lo, hi = window
    return {
        "records": len(df),
        "window": int(((t >= lo) & (t <= hi)).sum()),
        "warmup": int((t < lo).sum()),
        "cooldown": int((t > hi).sum()),
    }


def window_note(counts: dict[str, int], window: tuple[float, float]) -> str:
    lo, hi = window
    return (
        f"The tables and figures cover the measurement window: requests whose intended send "
        f"time is in [{lo:g} s, {hi:g} s] — {counts['window']} of {counts['records']} planned. "
        f"Warm-up (before {lo:g} s) excluded {counts['warmup']}, cool-down (after {hi:g} s) "
        f"excluded {counts['cooldown']}; the accounting line above counts all of them."
    )


def key_table(summary: dict[str, Any], colors: Colors, caption: str = "") -> str:
    rows = []
    for label, block, color in [
        ("overall", summary["overall"], None),
        *((f"tenant {k}", v, colors.tenant(k)) for k, v in summary["tenants"].items()),
        *((f"class {k}", v, colors.cls(k)) for k, v in summary["slo_classes"].items()),
    ]:
        lat, c = block["latency_ms"], block["counts"]
        att = block["slo_attainment"]
        rows.append(
            [
                (swatch(color) if color else "") + html.escape(label),
                f"{c['ok']}/{block['requests']}",
                str(c.get("timeout", 0) + c.get("cancelled", 0)),
                str(c.get("rejected", 0)),
                lat_cell(lat, "ttft", "p50"),
                lat_cell(lat, "ttft", "p99"),
                lat_cell(lat, "tpot", "p50"),
                lat_cell(lat, "e2e", "p99"),
                "-" if att is None else f"{att:.1%}",
                f"{block['goodput']['requests_per_s'] or 0:.2f}",
            ]
        )
    return table(
        [
            "group",
            "ok / in window",
            "unfinished",
            "rejected",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "TPOT p50 ms",
            "E2E p99 ms",
            "SLO attainment",
            "goodput req/s",
        ],
        rows,
        caption=html.escape(caption),
    )


FAIRNESS_ROWS = (
    ("service_difference", "backlogged service difference (largest, any tenant pair)"),
    ("jain_backlogged", "Jain's index among backlogged tenants (mean over contended windows)"),
    ("jain_backlogged_min", "… its worst window"),
    ("isolation", "isolation: worst tenant's TTFT p99 in the mix ÷ alone"),
    ("starved_share", "starved: first response > 10 × the TTFT SLO, or never"),
    ("worst_slowdown_ratio", "worst ÷ best tenant mean slowdown (not a fairness headline)"),
    ("jain_slowdown", "Jain over tenant slowdowns"),
)


def fairness_table(summary: dict[str, Any]) -> str:
    """The headline fairness figures (each can fail: FIFO and a fair policy differ on them),
    then the others, with their definitions one click away in docs/metrics.md."""
    overall = summary.get("metrics", {}).get("overall", {})
    fair = summary.get("fairness", {})
    rows = []
    for name, label in FAIRNESS_ROWS:
        entry = overall.get(name) or {}
        metric = registry.get(name)
        value = registry.show(metric.unit, entry.get("value"), bool(entry.get("lower_bound")))
        if entry.get("value") is None or "ci_method" in entry or name == "isolation":
            value = figure_text(summary, name)  # with its interval, or words where none
        if name == "service_difference" and (fair.get("service_difference") or {}).get("pair"):
            value += " (" + " vs ".join(fair["service_difference"]["pair"]) + ")"
        if name == "isolation":
            iso = {k: v for k, v in (fair.get("isolation") or {}).items() if v is not None}
            if iso and not fair.get("isolation_detail"):  # the detail names the tenant
                worst = max(iso, key=lambda k: iso[k])
                value += f" ({worst})"
            elif not iso:
                value = "no solo arm (simulated for sim targets)"
        rows.append([html.escape(label), html.escape(value)])
    rows.append(
        [
            "Jain over service ÷ fair share, whole run (demand-blind: 1 whenever all is served)",
            num(fair.get("jain_service")),
        ]
    )
    rows.append(["slowdown basis", html.escape(str(fair.get("slowdown_basis", "-")))])
    return table(["fairness (measurement window)", "value"], rows)


def share_table(summary: dict[str, Any], colors: Colors) -> str:
    """Each tenant's service beside its fair share over the whole window (the summary's)."""
    tenants = summary.get("fairness", {}).get("tenants") or {}
    rows = [
        [
            swatch(colors.tenant(t)) + html.escape(t),
            f"{v['service_tokens']:.0f}",
            f"{v['demand_tokens']:.0f}",
            f"{v['fair_share_tokens']:.0f}",
            num(v["share_of_fair"]),
        ]
        for t, v in tenants.items()
    ]
    if not rows:
        return ""
    return table(
        ["tenant", "service (tokens)", "demand (tokens)", "fair share (tokens)", "share of fair"],
        rows,
        caption="service = prompt + 2 × output tokens served; fair share = weighted max-min "
        "given demand",
    )


def target_text(target: dict[str, Any]) -> str:
    kind = target.get("kind", "?")
    rest = ", ".join(f"{k} {text_of(v)}" for k, v in target.items() if k != "kind")
    return f"{kind} ({rest})" if rest else str(kind)


def header_section(header: dict[str, Any], scenario_text: str) -> list[str]:
    """run.json as a key/value table (the raw JSON and the scenario collapsed below it)."""
    skip = ("generator_health.tenants", "generator_health.invalid_reasons")
    rows = [
        [html.escape(k), html.escape(text_of(v))]
        for k, v in flatten(header)
        if not k.startswith(skip)
    ]
    return [
        "<h2>Run header</h2>",
        table(["field (run.json)", "value"], rows, left=(0, 1)),
        "<details><summary>run.json (raw)</summary><pre>"
        + html.escape(json.dumps(header, indent=2, default=str))
        + "</pre></details>",
        "<details><summary>scenario.yaml (as run, keys redacted)</summary><pre>"
        + html.escape(scenario_text)
        + "</pre></details>",
    ]


# The records' columns the page's figures and tables read (figures, analysis.series): a
# fleet run's records.parquet has 38 columns of 1.9M rows, and reading them all cost 2.7 CPU s
# and the run's peak memory (issue 35). A figure that reads another column adds it here.
REPORT_COLUMNS = (
    "tenant",
    "slo_class",
    "status",
    "t_intended_ns",
    "t_sent_ns",
    "t_first_byte_ns",  # with t_end_ns: when an unfinished request was last seen (censored)
    "t_first_token_ns",
    "t_last_token_ns",
    "t_done_ns",
    "prompt_tokens",
    "max_tokens",
    "output_tokens",
    "queue_time_ns",
    "rx_delay_ns",
    "t_end_ns",
)


def report_records(path: Path) -> pd.DataFrame:
    """The records as the report reads them from a run directory: `report_frame` of the file's
    table (only the `REPORT_COLUMNS` it has: an older schema lacks some)."""
    import pyarrow.parquet as pq

    present = set(pq.read_schema(str(path)).names)
    # one thread, no pre-buffering: the same table for less CPU (a 10-minute fleet run's 15
    # columns: 0.5-1.3 against 0.8-2.3 CPU s, most of it the kernel's, on 2 loaded cores)
    table = pq.read_table(
        str(path),
        columns=[c for c in REPORT_COLUMNS if c in present],
        use_threads=False,
        pre_buffer=False,
    )
    return report_frame(table)


def report_frame(records: pa.Table) -> pd.DataFrame:
    """The report's frame of a records table: its `REPORT_COLUMNS`, with pandas' default
    types. `fairbench run` hands it the run's table (`pipeline.run_scenario(keep_records=True)`)
    and `report_records` the file's, so a report drawn at the end of the run and one drawn
    later from the directory read one conversion (tests/test_report_from_memory.py); from
    memory it skips the read and decompression (the 10-minute fleet: 0.03-0.06 CPU s against
    0.36-0.74)."""
    present = set(records.column_names)
    return records.select([c for c in REPORT_COLUMNS if c in present]).to_pandas(use_threads=False)


def _window(df: pd.DataFrame, t: pd.Series, lo: float, hi: float) -> pd.DataFrame:
    """The rows intended in [lo, hi], their index labels kept, as `df[(t >= lo) & (t <= hi)]`
    gives them: a slice where the records are in time order (a run's are), not a copy of every
    column through a mask (0.5 CPU s at 1.9M records, issue 35)."""
    v = t.to_numpy(dtype=np.float64, na_value=np.nan)
    if len(v) and not np.isnan(v).any() and np.all(v[1:] >= v[:-1]):
        a, b = np.searchsorted(v, lo, side="left"), np.searchsorted(v, hi, side="right")
        return df.iloc[a:b]
    return df[(t >= lo) & (t <= hi)]


def run_report(run_dir: Path, records: pa.Table | None = None) -> tuple[str, str]:
    """(HTML, Markdown) for one run directory; `records`, where the caller still holds them
    (`RunOutcome.records`), instead of reading records.parquet back."""
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    header = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    scenario_text = (run_dir / "scenario.yaml").read_text(encoding="utf-8")
    scenario = yaml.safe_load(scenario_text)
    df = report_records(run_dir / "records.parquet") if records is None else report_frame(records)
    lo, hi = summary["window_s"]
    window = _window(df, df["t_intended_ns"] / 1e9, lo, hi)
    metrics_path = run_dir / "server_metrics.parquet"
    server = pd.read_parquet(metrics_path) if metrics_path.is_file() else None
    scn = parse_scenario(scenario)
    # the window's columns converted once for every figure that reads them (its groups' codes:
    # a pass over the strings each, issue 35); the figures only read the frame
    counts = window_counts(df, (lo, hi))
    with frame_memo.converted_once(window):
        body = _body(summary, header, scenario, scenario_text, df, window, server, scn, counts)
    md = markdown_summary(summary, (counts["warmup"], counts["cooldown"]))
    return page(f"fairbench: {summary['scenario']}", body), md


def _body(
    summary: dict[str, Any],
    header: dict[str, Any],
    scenario: dict[str, Any],
    scenario_text: str,
    df: pd.DataFrame,
    window: pd.DataFrame,
    server: pd.DataFrame | None,
    scn: Scenario,
    counts: dict[str, int],
) -> list[str]:
    """The report page's sections, in order (`counts`: `window_counts` of the records)."""
    lo, hi = summary["window_s"]
    span = (lo, hi)
    t_end = float((df["t_intended_ns"] / 1e9).max()) if len(df) else hi
    slos = {k: v for k, v in scenario.get("slo_classes", {}).items()}
    weights = {tn["id"]: tn.get("weight", 1.0) for tn in scenario["tenants"]}
    unloaded, _ = unloaded_ns(window, scn)
    colors = Colors.of_runs([scenario], [df])
    target = header.get("target", {})
    body = [
        f"<h1>{html.escape(summary['scenario'])}</h1>",
        verdict_html(summary),
        f"<p>plan {summary['plan_digest'][:23]}…, seed {summary['seed']}, target "
        f"{html.escape(target_text(target))}</p>",
        f"<p>{html.escape(summary['accounting']['line'])}</p>",
        key_table(summary, colors, window_note(counts, span)),
        headline_html(summary),
        fairness_table(summary),
        share_table(summary, colors),
        "<h2>Latency</h2>",
        *figures.latency_cdfs(window, slos, "tenant", "tenant", colors),
        *figures.latency_cdfs(window, slos, "slo_class", "class", colors),
        *figures.ttft_p99_over_time(summary, span, t_end),
        "<h2>Queues and fairness over time</h2>",
        *figures.queue_depth(df, server, span, t_end),
        *figures.service_shares(window, weights, span, colors),
        *figures.jain_and_slowdown_windows(
            window, summary.get("fairness", {}), unloaded, scn.run.timeout
        ),
        *figures.attainment_and_goodput(summary, colors),
        *figures.events(df, server, span, t_end),
        *figures.send_lag(df, summary["generator_health"], span, t_end),
    ]
    if server is not None and len(server):
        body += server_metrics_section(server, str(target.get("kind", "")))
    body += header_section(header, scenario_text)
    return body


def server_metrics_section(server: pd.DataFrame, kind: str) -> list[str]:
    """The engine's own view of the run: a table of its headline series, gauges over time,
    counter rates, and histogram quantiles per window (fairbench.analysis.server_metrics)."""
    # here, not at import: the engines' table loads the HTTP client (asyncio), which a
    # simulated run's report, having no server metrics, never needs
    from fairbench.targets.engines import engine

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
    gauges = figure()
    rates = figure()
    quant = figure()
    for k, r in enumerate(rows):
        family = r["metric"].removesuffix("_total")
        color = SERIES_PALETTE[k % len(SERIES_PALETTE)]  # a series keeps its colour
        if r["type"] == "gauge":
            t, v = sm.gauge(server, family)
            gauges.add_trace(go.Scatter(x=t, y=v, name=r["metric"], line={"color": color}))
        elif r["type"] == "counter":
            t, v = sm.counter_rate(server, family)
            rates.add_trace(go.Scatter(x=t, y=v, name=f"{r['metric']} /s", line={"color": color}))
        elif r["type"] == "histogram":
            h = sm.histogram_over_time(server, family)
            for q, dash in (("p50", "dot"), ("p99", "solid")):
                quant.add_trace(
                    go.Scatter(
                        x=h["t"],
                        y=h[q],
                        name=f"{r['metric']} {q}",
                        line={"dash": dash, "color": color},
                    )
                )
    gauges.update_layout(
        title="Gauges (summed over labels)",
        xaxis_title=figures.RUN_CLOCK,
        yaxis_title="value (in each series' own unit)",
    )
    rates.update_layout(
        title="Counters as rates",
        xaxis_title=figures.RUN_CLOCK,
        yaxis_title="increase per second (/s)",
    )
    quant.update_layout(
        title="Histogram quantiles per 5-scrape window",
        xaxis_title=figures.RUN_CLOCK,
        yaxis_title="quantile (series' unit: s for *_seconds)",
    )
    for fig, fid in ((gauges, "srv-gauges"), (rates, "srv-rates"), (quant, "srv-quantiles")):
        if fig.data:
            out.append(fig_html(fig, fid))
    return out


SERIES_PALETTE = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#6e7781"]


def write_run_report(run_dir: Path, records: pa.Table | None = None) -> None:
    """report.html and summary.md in the run directory; plotly.min.js beside them, hard-linked
    to the copy in the directory above (fairbench.report.html.install_plotly). `records`: the
    run's records table where the caller kept it (`run_report`)."""
    text, md = run_report(run_dir, records)
    write_page(run_dir / "report.html", text, share=run_dir.parent)
    (run_dir / "summary.md").write_text(md, encoding="utf-8")
