"""Change points of a per-run series: where its level moved and stayed, with an interval on
each location.

Why a library: `ruptures` (PELT, an exact optimal segmentation under a penalty) is well kept and
tested; what fairbench adds is the penalty's criterion and the intervals.

Model: piecewise-constant mean with Gaussian noise (ruptures' `l2` cost), on the values as given
(the caller passes log values for a latency, so a step is a relative change).

Penalty, the stated criterion: `pen = σ̂² · c_n`, where σ̂ is a robust scale of the series
(the MAD of first differences / (0.6745·√2), unmoved by a step) and `c_n` is the 95th percentile,
over stationary Gaussian series of the same length n, of the smallest penalty at which PELT
finds no change, `max(G1, G2/2)`, divided by that series' own σ̂² (a studentized statistic, so
the noise of σ̂ at small n is counted); G_k is the best k-split l2 gain, and PELT adds k changes
exactly when G_k > k·pen. So a stationary Gaussian series of n points gets one or more change
points with probability ≈ 5% (`FALSE_ALARM`; k ≥ 3 splits are not counted, measured 4–6.5%);
a plain BIC penalty (2σ̂²·ln n) flags 25–28% of stationary 14- and 28-point series, and one
calibrated on single splits alone 7–7.5%, which is why neither is used. `c_n` is computed by
Monte Carlo (`NULL_SERIES` series, a fixed seed: deterministic).

Location interval (95%): the union of two. The likelihood-ratio profile: for a change between
its neighbours (the changes on either side, or the series' ends), every other split of that
stretch is scored by its l2 gain, and the region holds the splits whose gain is within
`σ̂²·χ²₁(0.95)` (3.84 σ̂²) of the best (Siegmund's likelihood-ratio region). And a residual
bootstrap: the stretch rebuilt as its two fitted levels plus residuals resampled from both
segments, the split re-estimated in each of `BOOTSTRAP` copies, the 2.5-97.5% range of those
splits. Either alone undercovers on short series (the χ²₁ threshold is asymptotic); the union's
coverage is measured in tests/test_history_changepoints.py, not assumed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

FALSE_ALARM = 0.05
NULL_SERIES = 4000
CHI2_1_95 = 3.841458820694124  # the 95th percentile of chi-square with one degree of freedom
MIN_SIZE = 2  # a segment is at least two points: one odd run is an outlier, not a level
MIN_POINTS = 6
BOOTSTRAP = 1000  # residual-bootstrap series per change point's location interval


@dataclass(frozen=True)
class ChangePoint:
    """A change before point `at` (the first point of the new level), with a 95% interval
    [low, high] on that index, and the relative shift of the level (exp(Δ) - 1 on log values)."""

    at: int
    low: int
    high: int
    shift: float


def robust_sigma(x: np.ndarray) -> float:
    """The noise scale from first differences (a step moves one difference, not the MAD)."""
    d = np.diff(np.asarray(x, dtype=float))
    if len(d) < 2:
        return 0.0
    return float(np.median(np.abs(d - np.median(d))) / 0.6744897501960817 / math.sqrt(2))


def _max_gain(x: np.ndarray) -> np.ndarray:
    """Rows of x -> the largest single-split l2 gain of each row (segments >= MIN_SIZE)."""
    n = x.shape[1]
    cs = np.cumsum(x, axis=1)
    total = cs[:, -1:]
    k = np.arange(MIN_SIZE, n - MIN_SIZE + 1)
    left = cs[:, k - 1] / k
    right = (total - cs[:, k - 1]) / (n - k)
    return (k * (n - k) / n * (left - right) ** 2).max(axis=1)


def _max_gain2(x: np.ndarray) -> np.ndarray:
    """Rows of x -> the largest two-split l2 gain of each row (segments >= MIN_SIZE), in chunks
    of rows so memory stays a few tens of MB."""
    rows, n = x.shape
    c = np.concatenate([np.zeros((rows, 1)), np.cumsum(x, axis=1)], axis=1)
    i, j = np.triu_indices(n + 1, k=MIN_SIZE)
    ok = (i >= MIN_SIZE) & (j <= n - MIN_SIZE)
    i, j = i[ok], j[ok]
    if not len(i):
        return np.zeros(rows)
    out = np.empty(rows)
    chunk = max(1, 4_000_000 // len(i))
    for a in range(0, rows, chunk):
        cc, tot = c[a : a + chunk], c[a : a + chunk, -1:]
        ci, cj = cc[:, i], cc[:, j]
        gain = ci**2 / i + (cj - ci) ** 2 / (j - i) + (tot - cj) ** 2 / (n - j) - tot**2 / n
        out[a : a + chunk] = gain.max(axis=1)
    return out


def _null_rows(n: int) -> int:
    """Null series for length n: NULL_SERIES, fewer past 300 points (the two-split search is
    quadratic in n), never under 500."""
    return int(min(NULL_SERIES, max(500, NULL_SERIES * (300 / n) ** 2)))


@functools.cache
def null_factor(n: int) -> float:
    """c_n: the (1 - FALSE_ALARM) quantile, over stationary Gaussian series of length n, of the
    smallest penalty (in units of σ̂²) at which PELT finds no change: max(G1, G2/2) / σ̂², with
    G_k the best k-split gain (PELT adds k changes iff G_k > k·pen; k ≥ 3 is left out, so the
    rate is a hair over FALSE_ALARM, measured in tests/test_history_changepoints.py)."""
    rng = np.random.default_rng(20261203)
    x = rng.standard_normal((_null_rows(n), n))
    d = np.diff(x, axis=1)
    med = np.median(d, axis=1, keepdims=True)
    sig2 = (np.median(np.abs(d - med), axis=1) / 0.6744897501960817 / math.sqrt(2)) ** 2
    crit = np.maximum(_max_gain(x), _max_gain2(x) / 2)
    ratio = crit / np.maximum(sig2, 1e-12)
    return float(np.quantile(ratio, 1 - FALSE_ALARM))


def penalty(x: np.ndarray) -> float:
    return robust_sigma(x) ** 2 * null_factor(len(x))


def _segment(x: np.ndarray, pen: float) -> list[int]:
    import ruptures as rpt

    if pen <= 0:
        return []
    algo = rpt.Pelt(model="l2", min_size=MIN_SIZE, jump=1).fit(x.reshape(-1, 1))
    return [int(b) for b in algo.predict(pen=pen)[:-1]]


def _gains(x: np.ndarray) -> np.ndarray:
    """The l2 gain of splitting x before each index k (NaN where a side is under MIN_SIZE)."""
    n = len(x)
    cs = np.cumsum(x)
    out = np.full(n, np.nan)
    k = np.arange(MIN_SIZE, n - MIN_SIZE + 1)
    if len(k):
        left = cs[k - 1] / k
        right = (cs[-1] - cs[k - 1]) / (n - k)
        out[k] = k * (n - k) / n * (left - right) ** 2
    return out


def change_points(values: list[float] | np.ndarray) -> list[ChangePoint]:
    """The change points of a series in order (none for fewer than MIN_POINTS points or a
    constant series), each with its 95% location interval and relative shift."""
    x = np.asarray(values, dtype=float)
    if len(x) < MIN_POINTS or not np.all(np.isfinite(x)):
        return []
    sigma2 = robust_sigma(x) ** 2
    cps = _segment(x, sigma2 * null_factor(len(x)))
    edges = [0, *cps, len(x)]
    out = []
    for j, cp in enumerate(cps):
        a, b = edges[j], edges[j + 2]
        gains = _gains(x[a:b])
        best = gains[cp - a]
        inside = np.flatnonzero(gains >= best - CHI2_1_95 * sigma2) + a
        before, after = x[a:cp].mean(), x[cp:b].mean()
        boot_low, boot_high = _bootstrap(x[a:b], cp - a, seed=j)
        out.append(
            ChangePoint(
                cp,
                int(min(inside.min(), cp, boot_low + a)),
                int(max(inside.max(), cp, boot_high + a)),
                math.expm1(after - before),
            )
        )
    return out


def _bootstrap(x: np.ndarray, cp: int, seed: int) -> tuple[int, int]:
    """The 95% percentile interval of the split re-estimated on BOOTSTRAP series made of the
    two fitted levels plus residuals resampled from both segments (fixed seed)."""
    fitted = np.where(np.arange(len(x)) < cp, x[:cp].mean(), x[cp:].mean())
    resid = x - fitted
    rng = np.random.default_rng(seed)
    star = fitted + rng.choice(resid, size=(BOOTSTRAP, len(x)))
    n = len(x)
    cs = np.cumsum(star, axis=1)
    k = np.arange(MIN_SIZE, n - MIN_SIZE + 1)
    left = cs[:, k - 1] / k
    right = (cs[:, -1:] - cs[:, k - 1]) / (n - k)
    at = k[np.argmax(k * (n - k) / n * (left - right) ** 2, axis=1)]
    low, high = np.quantile(at, [(1 - 0.95) / 2, 1 - (1 - 0.95) / 2], method="inverted_cdf")
    return int(low), int(high)
