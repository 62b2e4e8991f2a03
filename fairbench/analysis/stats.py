"""Statistics for decisions: bootstrap confidence intervals that stay cheap at a million records.

Quantiles get an *exact* bootstrap. In a bootstrap resample of n values the number that fall at
or below the j-th order statistic x_(j) is Binomial(n, j/n), so the resampled q-quantile (the
ceil(q·n)-th order statistic) is ≤ x_(j) with probability P(Bin(n, j/n) ≥ ceil(q·n)). That is
the bootstrap distribution itself, without drawing a single resample: O(n log n) for the sort,
and the same answer as infinitely many resamples. Other statistics use the percentile bootstrap
with explicit resamples (scipy's `bootstrap` where the sample is small enough).

Heavy tails are the rule for latency, so nothing here assumes normality; comparisons use
bootstrap intervals and rank tests, never a t-test.
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


def quantile_distribution(sorted_x: np.ndarray, q: float) -> tuple[np.ndarray, np.ndarray]:
    """Support and probabilities of the bootstrap distribution of the sample q-quantile (the
    ceil(q·n)-th order statistic) — exact, no resampling."""
    n = len(sorted_x)
    k = max(1, math.ceil(q * n))
    j = np.arange(1, n + 1)
    cdf = sps.binom.sf(k - 1, n, j / n)  # P(quantile* <= x_(j)) = P(Bin(n, j/n) >= k)
    probs = np.diff(np.concatenate(([0.0], cdf)))
    return sorted_x, np.clip(probs, 0.0, None)


def quantile_ci(
    values: np.ndarray, q: float, confidence: float = 0.95, presorted: bool = False
) -> Estimate:
    """The sample q-quantile with its exact bootstrap percentile interval (`presorted`: the
    values are finite and sorted already)."""
    x = values if presorted else np.sort(values[np.isfinite(values)])
    n = len(x)
    if n == 0:
        return NAN_ESTIMATE
    point = float(x[max(1, math.ceil(q * n)) - 1])
    support, probs = quantile_distribution(x, q)
    cdf = np.cumsum(probs)
    alpha = (1 - confidence) / 2
    low = float(support[min(np.searchsorted(cdf, alpha), n - 1)])
    high = float(support[min(np.searchsorted(cdf, 1 - alpha), n - 1)])
    return Estimate(point, low, high, n)


def sample_quantile(
    values: np.ndarray, q: float, draws: int, rng: np.random.Generator
) -> np.ndarray:
    """`draws` samples from the exact bootstrap distribution of the q-quantile."""
    x = np.sort(values[np.isfinite(values)])
    if not len(x):
        return np.full(draws, np.nan)
    support, probs = quantile_distribution(x, q)
    return rng.choice(support, size=draws, p=probs / probs.sum())


def mean_ci(
    values: np.ndarray, confidence: float = 0.95, resamples: int = 1000, seed: int = 0
) -> Estimate:
    x = values[np.isfinite(values)]
    if len(x) == 0:
        return NAN_ESTIMATE
    if len(x) == 1:
        return Estimate(float(x[0]), float(x[0]), float(x[0]), 1)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for b in range(resamples):  # bounded memory even for a million values
        means[b] = x[rng.integers(0, len(x), len(x))].mean()
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return Estimate(float(x.mean()), float(low), float(high), len(x))


def proportion_ci(successes: int, n: int, confidence: float = 0.95) -> Estimate:
    """Wilson score interval (the bootstrap of a proportion, in closed form, good near 0 and 1)."""
    if n == 0:
        return NAN_ESTIMATE
    z = sps.norm.ppf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)


def trend_test(times: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """Mann–Kendall-style monotone trend: Kendall's tau of value on time, and its p-value."""
    ok = np.isfinite(values)
    if ok.sum() < 3:
        return math.nan, math.nan
    result = sps.kendalltau(times[ok], values[ok])
    return float(result.statistic), float(result.pvalue)
