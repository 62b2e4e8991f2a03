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


def window_note(summary: dict[str, Any]) -> str:
    """What the results table counts, when that is fewer requests than the run planned (the
    progress bar counts every one): warm-up and cool-down are outside the measurement window."""
    planned = (summary.get("accounting") or {}).get("planned")
    n = summary["overall"]["requests"]
    if not isinstance(planned, int) or n >= planned:
        return ""
    lo, hi = summary["window_s"]
    return (
        f"counts {n} of {planned} requests: those due in the measurement window [{lo:g} s, "
        f"{hi:g} s]; warm-up and cool-down excluded {planned - n}"
    )


def why_none(summary: dict[str, Any], name: str) -> str:
    """Why a fairness figure has no value (or a value that means nothing happened), in words:
    the terminal, summary.md and the report say this instead of a dash."""
    fair = summary.get("fairness", {})
    if name == "service_difference":
        return (fair.get("service_difference") or {}).get("reason") or "no contention"
    if name in ("jain_backlogged", "jain_backlogged_min"):
        return (fair.get("jain_windows") or {}).get("reason") or "no contended window"
    if name == "isolation":
        return fair.get("isolation_skipped") or "no solo arm"
    if name in ("worst_slowdown_ratio", "jain_slowdown"):
        return "fewer than two tenants"
    return "no value"


def figure_text(summary: dict[str, Any], name: str) -> str:
    """A fairness figure as people read it, with its 95% interval or why it has none; or why
    the figure itself has none."""
    entry = summary.get("metrics", {}).get("overall", {}).get(name) or {}
    value = entry.get("value")
    reason = (summary.get("fairness", {}).get(name) or {}) if name == "service_difference" else {}
    if value is None:
        return why_none(summary, name)
    unit = registry.get(name).unit
    text = registry.show(unit, value, bool(entry.get("lower_bound")))
    if isinstance(reason, dict) and reason.get("reason"):
        text += f" ({reason['reason']})"  # no contention: nothing to put an interval on
    else:
        text += interval_suffix(entry, unit)
    if name == "isolation":
        text += _isolation_note(summary)
    return text


SHORT_REASONS = {
    # a reason too long for one line of figures, said in full in summary.json and docs/metrics.md
    "none: a maximum over the run": "a maximum over this run, not an estimate",
}


def interval_suffix(entry: dict[str, Any], unit: str) -> str:
    """` [low, high]` (`∞)` where open), or ` (no interval: why)`; nothing for an entry that
    carries no interval fields."""
    if "ci_method" not in entry:
        return ""
    low, high = entry.get("ci_low"), entry.get("ci_high")
    if low is None and high is None:
        why = SHORT_REASONS.get(str(entry.get("ci_method"))) or entry.get("ci_reason") or "none"
        return f" (no interval: {why})"
    lo = registry.show(unit, low) if low is not None else "-∞"
    hi = registry.show(unit, high) if high is not None else "∞"
    return f" [{lo}, {hi}{']' if high is not None else ')'}"


def _isolation_note(summary: dict[str, Any]) -> str:
    """The worst tenant's absolute change beside the ratio, and whether it is flagged."""
    detail = summary.get("fairness", {}).get("isolation_detail") or {}
    if not detail:
        return ""
    worst = max(detail, key=lambda t: detail[t]["ratio"])
    d = detail[worst]
    flag = "flagged" if d["flagged"] else "not flagged"
    return f" ({worst}: {d['difference_ms']:+,.1f} ms; {flag}: {d['why']})"


def fairness_line(summary: dict[str, Any]) -> str:
    """The headline fairness figures in one line (fairbench.analysis.registry)."""
    parts = []
    for name, label in (
        ("service_difference", "backlogged service difference"),
        ("jain_backlogged", "Jain among the backlogged"),
        ("isolation", "worst isolation"),
        ("worst_slowdown_ratio", "worst ÷ best slowdown"),
    ):
        parts.append(f"{label} {figure_text(summary, name)}")
    return "Fairness: " + ", ".join(parts) + "."
