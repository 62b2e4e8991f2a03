"""Metric names: the one place that maps a metric's name to where its value lives in a summary.

Every command that takes a metric name — sweep and pareto objectives, gate rules, history —
reads it here: goodput, throughput, slo_attainment, jain, jain_slowdown, worst_slowdown_ratio,
ttft_p50, ttft_p99, e2e_p99, tpot_p50, per class `ttft_p99.<class>` and
`slo_attainment.<class>`, or any dotted path into summary.json.
"""

from __future__ import annotations

import math
from typing import Any

ALIASES = {
    "goodput": "overall.goodput.requests_per_s",
    "throughput": "overall.throughput.requests_per_s",
    "slo_attainment": "overall.slo_attainment",
    "jain": "fairness.jain_service",
    "jain_slowdown": "fairness.jain_slowdown",
    "worst_slowdown_ratio": "fairness.worst_slowdown_ratio",
    "ttft_p50": "overall.latency_ms.ttft.p50",
    "ttft_p99": "overall.latency_ms.ttft.p99",
    "e2e_p99": "overall.latency_ms.e2e.p99",
    "tpot_p50": "overall.latency_ms.tpot.p50",
}


def metric_value(summary: dict[str, Any], name: str) -> float:
    """A figure from a summary by alias or dotted path; NaN when absent."""
    if name.startswith("ttft_p99."):
        path = f"slo_classes.{name.split('.', 1)[1]}.latency_ms.ttft.p99"
    elif name.startswith("slo_attainment."):
        path = f"slo_classes.{name.split('.', 1)[1]}.slo_attainment"
    else:
        path = ALIASES.get(name, name)
    node: Any = summary
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return math.nan
        node = node[key]
    return float(node) if isinstance(node, int | float) and not isinstance(node, bool) else math.nan
