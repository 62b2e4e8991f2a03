"""The pieces every report page is built from: the page shell, a lazily drawn figure, a table,
number formats, the colour of each tenant and class, and the one shared copy of plotly.js.

Pages open offline and repeat nothing per run: each page loads `plotly.min.js` from its own
directory, and a run directory's copy is a hard link to the one in the directory above it (the
reports directory, a sweep's or an A/B's directory), so an 18-point sweep stores plotly.js once,
and a run directory moved elsewhere still carries its copy (`install_plotly`). A small loader
draws each figure as it nears the viewport (plotly.js alone takes over a second to start on a
small machine: drawing every figure up front would keep a long report from opening).
"""

from __future__ import annotations

import datetime as dt
import functools
import html
import math
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.offline

PLOTLY_JS = "plotly.min.js"

# Tenants and classes draw from different palettes, so a bar for "tenant x" and one for
# "class y" on the same figure are never mistaken for one another.
TENANT_PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
]
CLASS_PALETTE = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d"]
ARM_DASH = {"A": "solid", "B": "dot"}


@dataclass(frozen=True)
class Colors:
    """One colour per tenant and per class, from the sorted names: the same tenant has the same
    colour on every figure of a page, and on every page built from the same names."""

    tenants: Mapping[str, str]
    classes: Mapping[str, str]

    @classmethod
    def of(cls, tenants: Iterable[str], classes: Iterable[str]) -> Colors:
        def assign(names: Iterable[str], palette: list[str]) -> dict[str, str]:
            return {n: palette[k % len(palette)] for k, n in enumerate(sorted(set(names)))}

        return cls(assign(tenants, TENANT_PALETTE), assign(classes, CLASS_PALETTE))

    @classmethod
    def of_runs(cls, scenarios: Iterable[Mapping[str, Any]], records: Iterable[Any]) -> Colors:
        """The colours of the tenants and classes the runs' scenarios declare (the resolved
        scenario.yaml, default classes included) and their records hold: the run page and the
        A/B page of the same runs agree."""
        tenants: set[str] = set()
        classes: set[str] = set()
        for scn in scenarios:
            tenants |= {str(t["id"]) for t in scn.get("tenants", [])}
            classes |= {str(c) for c in scn.get("slo_classes") or {}}
        for df in records:  # the distinct names, not a Python str per record (issue 35)
            tenants |= set(df["tenant"].unique())
            classes |= set(df["slo_class"].unique())
        return cls.of(tenants, classes)

    def tenant(self, name: str) -> str:
        return self.tenants.get(name, "#444444")

    def cls(self, name: str) -> str:
        return self.classes.get(name, "#444444")

    def by(self, column: str) -> Mapping[str, str]:
        """The mapping for a records column: `tenant` or `slo_class`."""
        return self.tenants if column == "tenant" else self.classes


CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{margin-bottom:.2em} .valid{color:#1a7f37} .invalid{color:#cf222e}
table{border-collapse:collapse;margin:1em 0} td,th{border:1px solid #ccc;padding:.3em .6em;
text-align:right} th{background:#f6f8fa} td:first-child,th:first-child{text-align:left}
td.l,th.l{text-align:left} caption{caption-side:top;text-align:left;color:#555;padding:.3em 0}
.better{color:#1a7f37;font-weight:600} .worse{color:#cf222e;font-weight:600}
.cannot{color:#9a6700;font-weight:600} .swatch{display:inline-block;width:.8em;height:.8em;
margin-right:.4em;border-radius:2px;vertical-align:baseline}
pre{background:#f6f8fa;padding:1em;overflow:auto;font-size:12px} .plot{margin:1em 0}
details{margin:1em 0} summary{cursor:pointer;color:#0969da} .note{color:#555}
#no-plotly{display:none;background:#fff8c5;border:1px solid #d4a72c;padding:.6em}
"""


# The stand-in template a figure holds until `fig_html` writes the page's template in its place:
# it keeps `template` the layout's first key, where plotly's default puts it. It must be `{}`:
# plotly keeps an empty template as an explicit one, but drops one that validates to nothing
# (`{"layout": {}}`) and copies its default template in after all.
_NO_TEMPLATE: dict[str, Any] = {}


def figure(*args: Any, **kwargs: Any) -> go.Figure:
    """`go.Figure(...)` without plotly's default template.

    Why: a new figure copies and validates the default template (a few hundred nested
    properties), and setting `plotly_white` copies and validates it again; on a run report
    that was about 60 ms a figure, most of the report's fixed cost (issue 35). `fig_html`
    writes the template's JSON into the figure's JSON instead, so the page is the same byte
    for byte. For `make_subplots`, pass `figure=figure()`."""
    layout = kwargs.pop("layout", None) or {}
    if isinstance(layout, dict) and "template" not in layout:
        layout = {"template": _NO_TEMPLATE, **layout}
    return go.Figure(*args, layout=layout, **kwargs)


@functools.cache
def _white_template() -> dict[str, Any]:
    """`plotly_white` as a figure's JSON holds it (read once; never modified)."""
    return go.Figure(layout={"template": "plotly_white"}).to_dict()["layout"]["template"]


def fig_json(fig: go.Figure) -> str:
    """`fig.to_json()` with the `plotly_white` template, without setting it on the figure:
    the same JSON as `fig.update_layout(template="plotly_white").to_json()` at a fraction of
    the cost (see `figure`)."""
    import plotly.io as pio

    data = fig.to_dict()
    for trace in data.get("data", []):  # as to_json's remove_uids
        trace.pop("uid", None)
    data["layout"]["template"] = _white_template()
    return pio.json.to_json_plotly(data)


def fig_html(fig: go.Figure, fid: str, height: int = 380, top: int = 50) -> str:
    """A placeholder and the figure's JSON; the page's loader draws it when it nears the viewport.

    Every figure shows its legend, even with one trace: a reader should never have to guess
    what a line is. `top`: the top margin (more where subplot titles sit under the title)."""
    fig.update_layout(
        height=height,
        margin={"l": 70, "r": 20, "t": top, "b": 55},
        showlegend=True,
    )
    data = fig_json(fig).replace("</", "<\\/")
    return (
        f'<div class="plot js-plotly-lazy" id="{fid}" style="height:{height}px"></div>'
        f'<script type="application/json" id="{fid}-data">{data}</script>'
    )


LOADER = """
if (!window.Plotly) { document.getElementById('no-plotly').style.display = 'block'; } else {
const draw = d => { const f = JSON.parse(document.getElementById(d.id + '-data').textContent);
  Plotly.newPlot(d, f.data, f.layout, {displaylogo: false, responsive: true}); };
const seen = new IntersectionObserver(es => es.forEach(e => { if (e.isIntersecting) {
  seen.unobserve(e.target); draw(e.target); } }), {rootMargin: '600px'});
document.querySelectorAll('.js-plotly-lazy').forEach(d => seen.observe(d)); }
"""


def page(title: str, body: list[str]) -> str:
    """The page shell: it loads plotly.js from `plotly.min.js` beside the page (write the page
    with `write_page`, which puts the file there)."""
    missing = (
        f"<p id='no-plotly'>The figures need <code>{PLOTLY_JS}</code> beside this page. Copy it "
        "from the reports directory, or run <code>fairbench report RUN_DIR</code> again.</p>"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{CSS}</style></head><body>{missing}{''.join(body)}"
        f"<p><small>fairbench report, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC</small>"
        f"</p><script src='{PLOTLY_JS}'></script><script>{LOADER}</script>"
        "</body></html>"
    )


@functools.cache
def plotly_js() -> bytes:
    return plotly.offline.get_plotlyjs().encode("utf-8")


def _holds(path: Path, data: bytes) -> bool:
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _share(shared: Path, data: bytes) -> None:
    """Make `shared` hold plotly.js. Created with a hard link, which fails if another process
    (a parallel sweep point) got there first: then its complete copy is used."""
    if _holds(shared, data):
        return
    tmp = _tmp(shared)
    tmp.write_bytes(data)
    try:
        os.link(tmp, shared)
    except FileExistsError:
        if not _holds(shared, data):  # another plotly version's copy: replace it
            os.replace(tmp, shared)
            return
    tmp.unlink(missing_ok=True)


def install_plotly(directory: Path, share: Path | None = None) -> Path:
    """Put `plotly.min.js` in `directory` for its pages, and return its path.

    With `share` (a run page passes the directory above the run), the file is a hard link to
    `share/plotly.min.js`: one copy on disk however many runs link it, and still a whole file
    in each run directory, so `mv RUN elsewhere` (or copying a single run) keeps its report
    working. Where a hard link cannot be made (another file system, no write access above),
    the directory gets a copy of its own."""
    data = plotly_js()
    target = directory / PLOTLY_JS
    if share is not None and share.resolve() != directory.resolve():
        shared = share / PLOTLY_JS
        try:
            _share(shared, data)
            if target.exists() and os.path.samefile(target, shared):
                return target
            tmp = _tmp(target)
            os.link(shared, tmp)
            os.replace(tmp, target)
            return target
        except OSError:
            pass
    if not _holds(target, data):
        tmp = _tmp(target)
        tmp.write_bytes(data)
        os.replace(tmp, target)
    return target


def write_page(path: Path, text: str, share: Path | None = None) -> Path:
    """Write a page and the plotly.js it loads beside it (hard-linked to `share`'s copy)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    install_plotly(path.parent, share)
    path.write_text(text, encoding="utf-8")
    return path


def ms(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"


def num(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def swatch(color: str) -> str:
    return f"<span class='swatch' style='background:{color}'></span>"


def table(
    head: list[str], rows: list[list[str]], caption: str = "", left: tuple[int, ...] = ()
) -> str:
    """An HTML table; cells are HTML (escape text first). `left`: columns aligned left."""

    def cell(tag: str, k: int, c: str) -> str:
        return f"<{tag} class='l'>{c}</{tag}>" if k in left else f"<{tag}>{c}</{tag}>"

    th = "".join(cell("th", k, html.escape(h)) for k, h in enumerate(head))
    trs = "".join(
        "<tr>" + "".join(cell("td", k, c) for k, c in enumerate(row)) + "</tr>" for row in rows
    )
    cap = f"<caption>{caption}</caption>" if caption else ""
    return f"<table>{cap}<tr>{th}</tr>{trs}</table>"


def flatten(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested mappings as (dotted key, leaf value) pairs, for a readable key/value table."""
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out += flatten(value, name + ".")
        else:
            out.append((name, value))
    return out


def text_of(value: Any) -> str:
    """A header value as a reader wants it: lists joined, None as '-', floats trimmed."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | tuple):
        return ", ".join(text_of(v) for v in value) if value else "none"
    if isinstance(value, Mapping):
        return "none" if not value else ", ".join(f"{k}={text_of(v)}" for k, v in value.items())
    return str(value)
