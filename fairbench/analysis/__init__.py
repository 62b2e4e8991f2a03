"""Figures from records: per-request metrics, quantiles and their intervals, fairness, generator
health, the summary blocks and summary.json, plot series and the server's scraped metrics.

Pure functions over a records frame (no I/O, no clock). `registry` names every metric. Imports
`workload` and `run` (the record schema); `pipeline`, `decide`, `report` and `cli` may import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairbench._lazy import lazy_exports

_API = {
    "ALIASES": "fairbench.analysis.registry",
    "SUMMARY_SCHEMA_VERSION": "fairbench.analysis.summary",
    "build_summary": "fairbench.analysis.summary",
    "generator_health": "fairbench.analysis.health",
    "metric_value": "fairbench.analysis.registry",
}

__all__ = [
    "ALIASES",
    "SUMMARY_SCHEMA_VERSION",
    "build_summary",
    "generator_health",
    "metric_value",
]

if TYPE_CHECKING:  # pragma: no cover
    from fairbench.analysis.health import generator_health
    from fairbench.analysis.registry import ALIASES, metric_value
    from fairbench.analysis.summary import SUMMARY_SCHEMA_VERSION, build_summary

__getattr__, __dir__ = lazy_exports(__name__, _API, globals())
