"""Statistics for decisions: small estimators that stay cheap at a million records.

Quantile intervals are order statistics with binomial ranks (fairbench.analysis.intervals,
which also handles serial correlation and censoring; shares there are Clopper–Pearson's);
trends Kendall's tau.

Heavy tails are the rule for latency, so nothing here assumes normality of the latencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float
    n: int

    @property
    def half_width_rel(self) -> float:
        """CI half-width relative to the value (Netperf-style confidence target)."""
        if not self.value or not math.isfinite(self.value):
            return math.inf
        return (self.high - self.low) / 2 / abs(self.value)

    def as_dict(self, scale: float = 1.0) -> dict[str, float | int | None]:
        f = lambda v: None if not math.isfinite(v) else round(v * scale, 6)  # noqa: E731
        return {"value": f(self.value), "ci_low": f(self.low), "ci_high": f(self.high), "n": self.n}


NAN_ESTIMATE = Estimate(math.nan, math.nan, math.nan, 0)


def quantile_ci(
    values: np.ndarray, q: float, confidence: float = 0.95, presorted: bool = False
) -> Estimate:
    """The sample q-quantile (the ceil(q·n)-th order statistic) with its order-statistic
    interval for i.i.d. values (fairbench.analysis.intervals; `high` is inf where n cannot
    bound the tail). It replaced an exact bootstrap whose upper end could never pass the sample
    maximum (62% coverage of a p99 at n = 100)."""
    from fairbench.analysis.intervals import percentile_interval

    x = values if presorted else np.sort(values[np.isfinite(values)])
    n = len(x)
    if n == 0:
        return NAN_ESTIMATE
    point = float(x[max(1, math.ceil(q * n)) - 1])
    it = percentile_interval(x, q, confidence)
    return Estimate(point, min(it.low, point), max(it.high, point), n)


def trend_test(times: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """Mann–Kendall-style monotone trend: Kendall's tau of value on time, and its p-value."""
    ok = np.isfinite(values)
    if ok.sum() < 3:
        return math.nan, math.nan
    result = sps.kendalltau(times[ok], values[ok])
    return float(result.statistic), float(result.pvalue)
