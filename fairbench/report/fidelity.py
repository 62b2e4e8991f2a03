"""The fidelity page and its Markdown: how far the simulator is from the real engine.

Renders what `fairbench.decide.fidelity` computed — a table per group of real, simulated and
(with a second real run) the noise floor, the signed error and its judgement — and overlays
the latency CDFs of the real run (solid), the simulation (dotted) and the second real run
(dashed), per tenant and per class, so a reader sees where the curves part, not only where
two percentiles do. Built from the shared page pieces (`html`) and the one plotly copy; the
same rows make the command's terminal table (`fidelity_table`).
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from fairbench.analysis import registry
from fairbench.decide.fidelity import Fidelity, Row
from fairbench.report.figures import arm_cdfs
from fairbench.report.html import Colors, fig_html, page, table

ARMS = (("real", "solid"), ("sim", "dot"), ("real #2", "dash"))


def _show(row: Row, value: float) -> str:
    return registry.show(row.unit, value)


def _pct(v: float, signed: bool = True) -> str:
    if not math.isfinite(v):
        return "-"
    return f"{v:+.1f}%" if signed else f"{v:.1f}%"


def _group_title(group: str, key: str | None) -> str:
    return "overall" if group == "overall" else f"{group} {key}"


def row_cells(fid: Fidelity, row: Row) -> list[str]:
    cells = [row.figure, _show(row, row.real), _show(row, row.sim), _pct(row.error_pct)]
    if fid.noise is not None:
        cells += [_show(row, row.noise_run), _pct(row.noise_pct, signed=False)]
    return [*cells, row.judged(fid.factor)]


def head(fid: Fidelity) -> list[str]:
    cols = ["figure", "real", "sim", "error (sim − real)"]
    if fid.noise is not None:
        cols += ["real #2", "noise floor |real #2 − real|"]
    return [*cols, "judgement"]


def intro(fid: Fidelity) -> str:
    noise = (
        f"Noise floor: a second real run of the same plan; an error is within noise when "
        f"|error| ≤ {fid.factor:g} × the floor."
        if fid.noise is not None
        else "No second real run (--noise RUN2): errors are not judged against a noise floor."
    )
    return (
        f"Plan {fid.plan_digest[:19]}…; errors are (sim − real) ÷ real. MAPE over every figure: "
        f"{_pct(fid.mape(), signed=False)}. {noise}"
    )


def fidelity_markdown(fid: Fidelity) -> str:
    """fidelity.md: the intro, then a table per group."""
    lines = ["# Simulator fidelity", "", f"Real: `{fid.real}`; simulated: `{fid.sim}`."]
    if fid.noise is not None:
        lines[-1] += f" Second real run: `{fid.noise}`."
    lines += ["", intro(fid), ""]
    for group, key in fid.groups():
        mape = _pct(fid.mape(group, key), signed=False)
        lines += [f"## {_group_title(group, key)} (MAPE {mape})", ""]
        cols = head(fid)
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for row in fid.rows:
            if (row.group, row.key) == (group, key):
                lines.append("| " + " | ".join(row_cells(fid, row)) + " |")
        lines.append("")
    return "\n".join(lines)


def fidelity_table(fid: Fidelity) -> Any:
    """The terminal's table (rich) of `fairbench fidelity`: the page's rows, each judgement in
    its colour, the intro as the caption."""
    from rich.table import Table

    out = Table(title="sim vs real", caption=intro(fid), title_justify="left")
    for col in ["group", *head(fid)]:
        out.add_column(col, justify="left" if col in ("group", "figure", "judgement") else "right")
    colour = {"within noise": "green", "beyond noise": "red"}
    for row in fid.rows:
        cells = row_cells(fid, row)
        cells[-1] = f"[{colour.get(cells[-1], 'white')}]{cells[-1]}[/]"
        out.add_row(_group_title(row.group, row.key), *cells)
    return out


def _window(run: Path) -> pd.DataFrame:
    df = pd.read_parquet(run / "records.parquet")
    try:
        lo, hi = json.loads((run / "summary.json").read_text(encoding="utf-8"))["window_s"]
    except (OSError, ValueError, KeyError):
        return df
    t = df["t_intended_ns"] / 1e9
    return df[(t >= lo) & (t <= hi)]


def fidelity_report(fid: Fidelity, title: str = "Simulator fidelity") -> str:
    """The fidelity page: tables per group and overlaid CDFs of real, sim (and real #2)."""
    body = [f"<h1>{html.escape(title)}</h1>", f"<p class='note'>{html.escape(intro(fid))}</p>"]
    for group, key in fid.groups():
        rows = [
            [html.escape(c) for c in row_cells(fid, row)]
            for row in fid.rows
            if (row.group, row.key) == (group, key)
        ]
        mape = _pct(fid.mape(group, key), signed=False)
        body.append(table(head(fid), rows, caption=f"{_group_title(group, key)} — MAPE {mape}"))
    runs = [("real", fid.real), ("sim", fid.sim)]
    if fid.noise is not None:
        runs.append(("real #2", fid.noise))
    present = [(arm, d) for arm, d in runs if (d / "records.parquet").is_file()]
    frames = {arm: _window(d) for arm, d in present}
    scenarios = []
    for _, d in present:
        try:
            scenarios.append(yaml.safe_load((d / "scenario.yaml").read_text(encoding="utf-8")))
        except OSError:
            continue
    colors = Colors.of_runs([s for s in scenarios if isinstance(s, dict)], frames.values())
    dash = dict(ARMS)
    for by, prefix in (("tenant", "tenant"), ("slo_class", "class")):
        for metric in ("TTFT", "TPOT", "E2E"):
            cdf_title = (
                f"{metric} CDF by {prefix}: real solid, sim dotted"
                + (", real #2 dashed" if fid.noise is not None else "")
                + " (ok requests, measurement window)"
            )
            fig = arm_cdfs(frames, by, prefix, metric, dash, colors, cdf_title)
            body.append(fig_html(fig, f"fid-cdf-{by}-{metric.lower()}"))
    return page(title, body)
