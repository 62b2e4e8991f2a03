"""The metric registry: every figure fairbench reports, declared once.

Each `Metric` has its name, unit, direction, formula, population (which records), quantile and
interval methods, the groups it exists for, and the practical threshold a change must exceed to
count in an A/B verdict. summary.json (`metrics`), compare, ab, gate, sweep, pareto, knee, the
reports and `fairbench metrics` all read it, and request-level figures are computed by the one
`compute` function here — on a run's columns in the summary, on resamples of them in compare.

Names: `ttft_p99` is the overall figure; `ttft_p99.tenant.<id>`, `ttft_p99.class.<name>`,
`ttft_p99.workload.<name>` the group's; `ttft_p99.<class>` is kept as the class's. Any other
dotted path reads summary.json directly (`tenants.a.latency_ms.ttft.p99`). An unknown name is
an error with a did-you-mean, never a silent NaN.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fairbench.analysis.definitions import METRICS
from fairbench.analysis.metric import GROUPS, SUMMARY_GROUPS, Metric, MetricError
from fairbench.analysis.metrics_block import metrics_block
from fairbench.analysis.metrics_doc import reference_markdown

__all__ = [
    "ALIASES",
    "BY_NAME",
    "FAIRNESS_HEADLINE",
    "GROUPS",
    "HEADLINE",
    "METRICS",
    "SUMMARY_GROUPS",
    "Metric",
    "MetricError",
    "Name",
    "get",
    "is_lower_bound",
    "known_names",
    "metric_entry",
    "metric_value",
    "metrics_block",
    "of_name",
    "parse_name",
    "reference_markdown",
    "show",
    "show_change",
]

BY_NAME: dict[str, Metric] = {metric.name: metric for metric in METRICS}
HEADLINE = tuple(metric for metric in METRICS if metric.headline)
# Fairness figures the one-line headline uses (each can fail: FIFO and fair policies differ).
FAIRNESS_HEADLINE = ("service_difference", "jain_backlogged", "isolation", "worst_slowdown_ratio")
# Names of the first wave, kept readable: what each now means.
ALIASES = {"jain_service": "fairness.jain_service"}


def get(name: str) -> Metric:
    metric = BY_NAME.get(name)
    if metric is None:
        raise MetricError(f"unknown metric {name!r}{_did_you_mean(name, list(BY_NAME))}")
    return metric


def _did_you_mean(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    if close:
        return "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "; `fairbench metrics` lists them"


@dataclass(frozen=True)
class Name:
    """A parsed metric name: the metric, and the group (`overall` or a dimension and a key)."""

    metric: Metric
    group: str = "overall"
    key: str | None = None

    def __str__(self) -> str:
        if self.group == "overall":
            return self.metric.name
        return f"{self.metric.name}.{self.group}.{self.key}"


def parse_name(name: str, classes: list[str] | None = None) -> Name | None:
    """The metric name as registry terms; None for a dotted path into summary.json. Raises
    MetricError for a name that is neither."""
    head, _, rest = name.partition(".")
    if head not in BY_NAME:
        if rest and head in _SUMMARY_KEYS:
            return None
        raise MetricError(f"unknown metric {name!r}{_did_you_mean(head, list(BY_NAME))}")
    metric = BY_NAME[head]
    if not rest:
        return Name(metric)
    dim, _, key = rest.partition(".")
    if dim in SUMMARY_GROUPS and key:
        group = dim
    else:  # `ttft_p99.<class>`: the first wave's form
        group, key = "class", rest
    if group not in metric.groups:
        raise MetricError(
            f"{name!r}: {metric.name} exists for {', '.join(metric.groups)}, not per {group}"
        )
    return Name(metric, group, key)


_SUMMARY_KEYS = {
    "overall",
    "tenants",
    "slo_classes",
    "workloads",
    "fairness",
    "generator_health",
    "accounting",
    "drift",
    "metrics",
    "completion",
    "valid",
}


def metric_entry(summary: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The summary's entry for a registry name ({value, ci_low, ci_high, lower_bound, ...}), or
    None where the summary has no such group (a tenant that sent nothing in the window)."""
    parsed = parse_name(name)
    if parsed is None:
        return None
    block = summary.get("metrics", {})
    if parsed.group == "overall":
        entry = block.get("overall", {}).get(parsed.metric.name)
    else:
        entry = block.get(parsed.group, {}).get(parsed.key or "", {}).get(parsed.metric.name)
    return entry if isinstance(entry, dict) else None


def metric_value(summary: Mapping[str, Any], name: str) -> float:
    """A figure from a summary by registry name or dotted path; NaN when the run has no value
    for it. An unknown name raises MetricError."""
    parsed = parse_name(name)
    if parsed is not None:
        entry = metric_entry(summary, name)
        value = None if entry is None else entry.get("value")
        return float(value) if isinstance(value, int | float) else math.nan
    node: Any = summary
    for key in name.split("."):
        if not isinstance(node, dict) or key not in node:
            return math.nan
        node = node[key]
    return float(node) if isinstance(node, int | float) and not isinstance(node, bool) else math.nan


def is_lower_bound(summary: Mapping[str, Any], name: str) -> bool:
    entry = metric_entry(summary, name) if parse_name(name) is not None else None
    return bool(entry and entry.get("lower_bound"))


def known_names(summary: Mapping[str, Any]) -> list[str]:
    """Every registry name this summary has a value for, groups spelled out."""
    out = []
    block = summary.get("metrics", {})
    for name, entry in block.get("overall", {}).items():
        if isinstance(entry, dict) and entry.get("value") is not None:
            out.append(name)
    for group in ("class", "tenant", "workload"):
        for key, entries in block.get(group, {}).items():
            for name, entry in entries.items():
                if isinstance(entry, dict) and entry.get("value") is not None:
                    out.append(f"{name}.{group}.{key}")
    return out


def show(unit: str, value: float | None, bound: bool = False) -> str:
    """A value as people read it, by its unit; `≥` marks a lower bound. One formatter for the
    terminal, the pages and summary.md."""
    if value is None or not math.isfinite(value):
        return "-"
    prefix = "≥ " if bound else ""
    if unit == "ms":
        text = f"{value:,.1f} ms"
    elif unit == "share":
        text = f"{value:.1%}"
    elif unit == "ratio":
        text = f"{value:,.2f}×"
    elif unit == "tokens":
        text = f"{value:,.0f} tokens"
    elif unit in ("req/s", "tokens/s"):
        text = f"{value:,.2f} {unit}"
    else:
        text = f"{value:.3f}"
    return prefix + text


def show_change(metric: Metric | None, change: float) -> str:
    if not math.isfinite(change):
        return "-"
    if metric is None or not metric.absolute:
        return f"{change:+.1%}"
    if metric.unit == "share":
        return f"{change * 100:+.1f} pts"
    return f"{change:+.3f}"


def of_name(name: str) -> Metric | None:
    """The registry metric a (grouped) name refers to, or None for a summary path."""
    try:
        parsed = parse_name(name)
    except MetricError:
        return None
    return None if parsed is None else parsed.metric
