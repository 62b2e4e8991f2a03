"""`summary.md`: the run's verdict and key table as Markdown, for a PR comment or a chat message."""

from __future__ import annotations

from typing import Any

from fairbench.analysis import registry
from fairbench.report.headline import headline_markdown
from fairbench.report.html import ms


def markdown_summary(summary: dict[str, Any], excluded: tuple[int, int] | None = None) -> str:
    """The verdict, the accounting line and the key table. `excluded`: how many requests
    warm-up and cool-down left out of the window (counted from the records by the caller)."""
    state = "VALID" if summary["valid"] else "INVALID: " + "; ".join(summary["invalid_reasons"])
    lo, hi = summary["window_s"]
    scope = f"Measurement window [{lo:g} s, {hi:g} s] by intended send time: " + (
        f"{summary['overall']['requests']} requests; warm-up excluded {excluded[0]}, "
        f"cool-down excluded {excluded[1]}."
        if excluded is not None
        else f"{summary['overall']['requests']} requests."
    )
    lines = [
        f"## fairbench: {summary['scenario']} — {state}",
        "",
        f"{summary['accounting']['line']}",
        "",
        scope,
        "",
        "| group | ok / in window | TTFT p50 ms | TTFT p99 ms | E2E p99 ms | SLO attainment |",
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
            f"| {label} | {block['counts']['ok']}/{block['requests']} | "
            f"{_lat(lat, 'ttft', 'p50')} | {_lat(lat, 'ttft', 'p99')} | {_lat(lat, 'e2e', 'p99')} "
            f"| {'-' if att is None else f'{att:.1%}'} |"
        )
    lines += ["", "### Headline figures with their intervals", "", headline_markdown(summary)]
    lines += ["", fairness_line(summary)]
    comp = summary.get("completion")
    if comp and comp["unfinished"]:
        lines += ["", ("" if comp["ok"] else "**TAIL CENSORED**: ") + comp["line"] + "."]
    return "\n".join(lines) + "\n"


def _lat(lat: dict[str, Any], kind: str, key: str) -> str:
    block = lat.get(kind) or {}
    return ("≥ " if key in (block.get("lower_bound") or []) else "") + ms(block.get(key))


def fairness_line(summary: dict[str, Any]) -> str:
    """The headline fairness figures in one line (fairbench.analysis.registry)."""
    overall = summary.get("metrics", {}).get("overall", {})
    parts = []
    for name, label in (
        ("service_difference", "backlogged service difference"),
        ("jain_backlogged", "Jain among the backlogged"),
        ("isolation", "worst isolation"),
    ):
        entry = overall.get(name) or {}
        value = registry.show(
            registry.get(name).unit, entry.get("value"), bool(entry.get("lower_bound"))
        )
        parts.append(f"{label} {value}")
    return "Fairness: " + ", ".join(parts) + "."
