"""Drift of a percentile between two windows of one run, with an interval and a test that agree.

Why: the drift figure used to take its interval from bootstrap draws of each window's quantile
as if requests were independent, and its trend test (Kendall's tau over overlapping rolling
windows) counted the same requests many times. Stationary runs then "drifted" in 23–27 of 30
seeds, and the interval and the test disagreed.

Here drift = p_last / p_first − 1. Each window's percentile gets its own interval
(fairbench.analysis.intervals: order statistics, widened for the window's serial correlation)
at 68.27% (± one standard error), read as se = (log high − log low) / 2 in log space; the
windows are far apart in time, so their errors are taken as independent:

    log(1 + drift) ± z·√(se_first² + se_last²),   p = 2·(1 − Φ(|log(1 + drift)| / √(…)))

The interval excludes 0 exactly when p < 1 − confidence: one statistic gives both. Where a
window's percentile has no two-sided interval (too few requests to bound the tail, or too short
for its correlation) the drift has none either, and the reason says what window size would do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats as sps

from fairbench.analysis import censored
from fairbench.analysis import intervals as iv

ONE_SE = float(sps.norm.cdf(1.0) - sps.norm.cdf(-1.0))  # 0.6827
METHOD = "log ratio of two windows' order-statistic intervals (delta method, independent windows)"


@dataclass(frozen=True)
class Drift:
    value: float  # relative change, NaN when the first window has no positive value
    lower_bound: bool  # the last window's value is only a lower bound
    interval: iv.Interval
    p_value: float  # the same statistic as the interval (NaN where it is declined)


def drift(
    first: censored.Observations,
    last: censored.Observations,
    q: float = 0.99,
    confidence: float = 0.95,
) -> Drift:
    # Each window's standard error from its central 68.27% interval (±1 se): the 95% one of a
    # tail percentile is skewed in log space and overstated the se by 12% (97% coverage).
    a = censored.quantile_estimate(first, q, ONE_SE)
    b = censored.quantile_estimate(last, q, ONE_SE)
    if not a.value > 0 or a.bound:
        why = "the first window has no finished value" if a.bound else "the first window is empty"
        return Drift(math.nan, False, iv.declined(confidence, METHOD, why), math.nan)
    value = b.value / a.value - 1.0
    se = [_log_se(e) for e in (a, b)]
    missing = [
        f"{name} window: {_why(e)}"
        for name, e, s in zip(("first", "last"), (a, b), se, strict=True)
        if s is None
    ]
    if missing:
        reason = "no two-sided interval of p" + iv._pct(q) + " in the " + "; ".join(missing)
        return Drift(value, b.bound, iv.declined(confidence, METHOD, reason), math.nan)
    z = float(sps.norm.ppf(0.5 + confidence / 2))
    total = math.sqrt(se[0] ** 2 + se[1] ** 2)  # type: ignore[operator]
    centre = math.log(b.value / a.value)
    low, high = math.expm1(centre - z * total), math.expm1(centre + z * total)
    p = 2.0 * float(sps.norm.sf(abs(centre) / total)) if total > 0 else math.nan
    return Drift(value, b.bound, iv.Interval(low, high, confidence, METHOD), p)


def _log_se(est: censored.QuantileEstimate, confidence: float = ONE_SE) -> float | None:
    if est.bound or not (math.isfinite(est.low) and math.isfinite(est.high)) or est.low <= 0:
        return None
    z = float(sps.norm.ppf(0.5 + confidence / 2))
    return (math.log(est.high) - math.log(est.low)) / (2 * z)


def _why(est: censored.QuantileEstimate) -> str:
    if est.interval is not None and est.interval.reason:
        return est.interval.reason
    return f"{est.n} requests"
