"""What a metric is: the `Metric` declaration every reported figure is made of.

A leaf module (numpy and the columns' type only), so the definitions, the registry's lookups and
the summary block can all import it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fairbench.analysis.columns import Cols
from fairbench.analysis.intervals import Interval

GROUPS = ("overall", "class", "tenant", "workload")
SUMMARY_GROUPS = {"class": "slo_classes", "tenant": "tenants", "workload": "workloads"}

Value = tuple[float, bool]  # (value, is a lower bound)
Compute = Callable[[Cols, "np.ndarray | None"], Value]


class MetricError(ValueError):
    """An unknown metric or group name; the message has a did-you-mean."""


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    better: Literal["lower", "higher"]
    formula: str
    population: str
    groups: tuple[str, ...]
    threshold: float  # practical significance of a change: relative, or absolute if `absolute`
    absolute: bool = False
    headline: bool = False
    quantile: str | None = None
    ci: str = "none in the summary; compare bootstraps it"
    compute: Compute | None = None  # request-level figures; None for timeline figures
    scale: float = 1.0  # summary unit per computed unit (ns → ms: 1e-6)
    latency: tuple[str, float] | None = None  # a percentile: (which latency, q)
    share_of: Callable[[Cols], np.ndarray] | None = None  # a share's population (its CI)
    indicator: Callable[[Cols], np.ndarray] | None = None  # a share's 0/1 per request
    # the continuous per-request score a share's indicator thresholds (its CI's τ), or None
    score: Callable[[Cols], np.ndarray] | None = None
    interval: Callable[[Cols, np.ndarray | None], Interval] | None = None  # any other figure's

    @property
    def kind(self) -> str:
        return "request" if self.compute is not None else "timeline"
