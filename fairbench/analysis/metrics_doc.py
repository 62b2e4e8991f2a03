"""docs/metrics.md, generated from the metric definitions (`fairbench metrics --markdown`)."""

from __future__ import annotations

from fairbench.analysis.definitions import METRICS


def reference_markdown() -> str:
    """docs/metrics.md, generated from the registry (tests/test_metrics_registry.py keeps the
    committed page equal to this)."""
    lines = [
        "# Metrics",
        "",
        "Generated from `fairbench/analysis/registry.py` by `fairbench metrics --markdown`; do "
        "not edit by hand. Every command that names a metric — `compare`, `ab`, `gate`, `sweep "
        "--objective`, `pareto`, `knee`, `report --history` — uses these names and these "
        "definitions.",
        "",
        "Names: `NAME` is the run's overall figure; `NAME.tenant.ID`, `NAME.class.CLASS` and "
        "`NAME.workload.WORKLOAD` the group's (`NAME.CLASS` also reads a class). **Headline** "
        "figures get a row per tenant and class in every A/B.",
        "",
        "Latency under overload: every admitted request counts. A request that timed out, was "
        "cancelled or failed after it was sent is right-censored at the time it was last seen; "
        "percentiles are Kaplan–Meier estimates, and a percentile that falls in censored mass is "
        "reported as a lower bound (`p99 ≥ 3,000 ms, 52 of 60 unfinished`). Rejected requests "
        "(429/503) are not latencies: they are `rejected_share`.",
        "",
    ]
    for metric in METRICS:
        head = " (headline)" if metric.headline else ""
        change = "absolute" if metric.absolute else "relative"
        lines += [
            f"## `{metric.name}`{head}",
            "",
            f"- **Definition**: {metric.formula}",
            f"- **Unit**: {metric.unit}; **better**: {metric.better}",
            f"- **Population**: {metric.population}",
            f"- **Groups**: {', '.join(metric.groups)}",
        ]
        if metric.quantile:
            lines.append(f"- **Quantile**: {metric.quantile}")
        lines += [
            f"- **Interval**: {metric.ci}",
            f"- **A/B threshold**: {change} change of {metric.threshold:g}",
            f"- **Computed**: {'per request (resampled in compare)' if metric.kind == 'request' else 'from the run timeline (compared across pairs)'}",  # noqa: E501
            "",
        ]
    return "\n".join(lines)
