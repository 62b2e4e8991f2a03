"""`summary.md`: the run's verdict and key table as Markdown, for a PR comment or a chat message."""

from __future__ import annotations

from typing import Any

from fairbench.report.html import ms, num


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
            f"| {label} | {block['counts']['ok']}/{block['requests']} | {ms(lat['ttft']['p50'])} | "
            f"{ms(lat['ttft']['p99'])} | {ms(lat['e2e']['p99'])} | "
            f"{'-' if att is None else f'{att:.1%}'} |"
        )
    fair = summary.get("fairness", {})
    lines += [
        "",
        f"Fairness: Jain (service ÷ fair share) {num(fair.get('jain_service'))}, "
        f"Jain (slowdown) {num(fair.get('jain_slowdown'))}, worst slowdown ratio "
        f"{num(fair.get('worst_slowdown_ratio'))}.",
    ]
    return "\n".join(lines) + "\n"
