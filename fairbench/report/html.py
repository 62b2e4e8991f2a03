"""The pieces every report page is built from: the page shell, a lazily drawn figure, a table,
number formats and the colour of each group.

Pages are self-contained HTML files that open offline: plotly.js is embedded in the page, and a
small loader draws each figure as it nears the viewport (plotly.js alone takes over a second to
start on a small machine: drawing every figure up front would keep a long report from opening).
"""

from __future__ import annotations

import datetime as dt
import html
import math
from typing import Any

import plotly.graph_objects as go
import plotly.offline

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]


CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
h1{margin-bottom:.2em} .valid{color:#1a7f37} .invalid{color:#cf222e}
table{border-collapse:collapse;margin:1em 0} td,th{border:1px solid #ccc;padding:.3em .6em;
text-align:right} th{background:#f6f8fa} td:first-child,th:first-child{text-align:left}
.better{color:#1a7f37;font-weight:600} .worse{color:#cf222e;font-weight:600}
pre{background:#f6f8fa;padding:1em;overflow:auto;font-size:12px} .plot{margin:1em 0}
"""


def fig_html(fig: go.Figure, fid: str) -> str:
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


LOADER = """
const draw = d => { const f = JSON.parse(document.getElementById(d.id + '-data').textContent);
  Plotly.newPlot(d, f.data, f.layout, {displaylogo: false, responsive: true}); };
const seen = new IntersectionObserver(es => es.forEach(e => { if (e.isIntersecting) {
  seen.unobserve(e.target); draw(e.target); } }), {rootMargin: '600px'});
document.querySelectorAll('.js-plotly-lazy').forEach(d => seen.observe(d));
"""


def page(title: str, body: list[str]) -> str:
    js = plotly.offline.get_plotlyjs()
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{CSS}</style></head><body>{''.join(body)}"
        f"<p><small>fairbench report, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC</small>"
        f"</p><script type='text/javascript'>{js}</script><script>{LOADER}</script>"
        "</body></html>"
    )


def ms(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"


def num(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


def table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{th}</tr>{trs}</table>"
