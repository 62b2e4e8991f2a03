"""The headline figures with their intervals, as the terminal, summary.md and report.html show them.

Why: summary.json carried every interval, and nothing a person reads showed one, so a p99 of
one run read as a fact. Every headline figure here is printed with its 95% interval, or with
the reason it has none (one-sided because n cannot bound the tail, declined because the run is
too short for its own correlation), numbered as footnotes so the table stays narrow. One
function makes the rows; three small ones render them.
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

from fairbench.analysis import registry

HEADLINE_FIGURES = ("ttft_p99", "e2e_p99", "slo_attainment")
OVERALL_ONLY = ("ttft_p99_drift",)


def _num(unit: str, value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "∞"
    if unit == "ms":
        return f"{value:,.1f}"
    if unit == "share":
        return f"{value:.1%}"
    if unit == "ratio":
        return f"{value:+.1%}"
    return f"{value:,.3g}"


def interval_text(name: str, entry: dict[str, Any] | None, notes: list[str]) -> str:
    """`value [low, high]`, `value [low, ∞)`, or `value (no interval¹)`; a reason becomes a
    numbered note (shared between cells that give the same one)."""
    if not entry or entry.get("value") is None:
        return "no value"
    metric = registry.get(name)
    if name == "ttft_p99_drift":
        value = f"{entry['value']:+.1%}"
    else:
        value = registry.show(metric.unit, entry["value"], bool(entry.get("lower_bound")))
    low, high, reason = entry.get("ci_low"), entry.get("ci_high"), entry.get("ci_reason")
    mark = ""
    if reason:
        if reason not in notes:
            notes.append(reason)
        mark = f" [{notes.index(reason) + 1}]"
    if low is None and high is None:
        return f"{value} (no interval{mark})"
    unit = "ratio" if name == "ttft_p99_drift" else metric.unit
    return f"{value} [{_num(unit, low)}, {_num(unit, high)}{']' if high is not None else ')'}{mark}"


def headline_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]], list[str]]:
    """(columns, rows, notes): overall, each tenant and each class; drift overall only."""
    metrics = summary.get("metrics", {})
    notes: list[str] = []
    columns = ["group", *HEADLINE_FIGURES, *OVERALL_ONLY]
    rows = []
    groups = [("overall", metrics.get("overall", {}))]
    groups += [(f"tenant {k}", v) for k, v in metrics.get("tenant", {}).items()]
    groups += [(f"class {k}", v) for k, v in metrics.get("class", {}).items()]
    for label, block in groups:
        cells = [label]
        cells += [interval_text(name, block.get(name), notes) for name in HEADLINE_FIGURES]
        cells += [
            interval_text(name, block.get(name), notes) if label == "overall" else ""
            for name in OVERALL_ONLY
        ]
        rows.append(cells)
    return columns, rows, notes


def confidence_line(summary: dict[str, Any]) -> str:
    methods = sorted(
        {
            re.sub(
                r"\s*(\([^)]*batch[^)]*\)|on n / [0-9.]+ \(batch means\)|, × [0-9.]+ .*)",
                "",
                str(entry.get("ci_method")),
            )
            for entry in summary.get("metrics", {}).get("overall", {}).values()
            if isinstance(entry, dict) and entry.get("ci_method")
        }
    )
    return "95% intervals; methods: " + "; ".join(methods) + " (docs/metrics.md)."


def headline_markdown(summary: dict[str, Any]) -> str:
    columns, rows, notes = headline_rows(summary)
    lines = [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        confidence_line(summary),
    ]
    lines += [f"[{i}] {note}" for i, note in enumerate(notes, 1)]
    return "\n".join(lines)


def headline_html(summary: dict[str, Any]) -> str:
    columns, rows, notes = headline_rows(summary)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    foot = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (
        f"<table><caption>Headline figures with their intervals</caption><thead><tr>{head}"
        f"</tr></thead><tbody>{body}</tbody></table>"
        f"<p class='note'>{html.escape(confidence_line(summary))}</p>"
        + (f"<ol class='note'>{foot}</ol>" if notes else "")
    )


def headline_table(summary: dict[str, Any]) -> Any:
    """The terminal's table (rich), with the notes as its caption."""
    from rich.table import Table

    columns, rows, notes = headline_rows(summary)
    table = Table(
        title="headline figures, 95% intervals", title_justify="left", caption_justify="left"
    )
    for col in columns:
        table.add_column(col, justify="left" if col == "group" else "right")
    for r in rows:
        table.add_row(*r)
    table.caption = "\n".join(
        [confidence_line(summary), *(f"[{i}] {n}" for i, n in enumerate(notes, 1))]
    )
    return table
