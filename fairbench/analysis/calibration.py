"""Coverage of fairbench's intervals, measured against known truth.

Why this exists: an interval is a promise, and the only proof it keeps it is a table — many
replications at the sample sizes users have, against a value known exactly. This module draws
the replications and counts; `benchmarks/bench_calibration.py` prints the full table (and
docs/metrics.md quotes it), `tests/test_interval_calibration.py` checks a seeded subset fast
enough for CI. Pure: numpy in, counts out (the simulator cases live in the benchmark and test,
which run scenarios).

Truths: i.i.d. lognormal(0, 1) (p_q = exp(Φ⁻¹(q))), i.i.d. Pareto(α = 2.5)
(p_q = (1 − q)^(−1/α)), and exp of a Gaussian AR(1) with unit marginal variance (the lognormal's
p_q, at every φ). A case counts an interval as covering when low ≤ truth ≤ high (high = ∞ for a
one-sided interval); declined intervals are counted apart and never as covering.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import signal
from scipy import stats as sps

from fairbench.analysis import censored
from fairbench.analysis import intervals as iv
from fairbench.analysis.drift import drift


@dataclass(frozen=True)
class Coverage:
    """How often a case's intervals covered the truth, of those given."""

    case: str
    n: int
    q: float
    reps: int
    covered: int
    two_sided: int
    one_sided: int
    declined: int

    @property
    def given(self) -> int:
        return self.two_sided + self.one_sided

    @property
    def rate(self) -> float:
        return self.covered / self.given if self.given else math.nan

    def row(self) -> dict[str, object]:
        return {
            "case": self.case,
            "n": self.n,
            "q": self.q,
            "reps": self.reps,
            "coverage": None if math.isnan(self.rate) else round(self.rate, 4),
            "two_sided": round(self.two_sided / self.reps, 3),
            "one_sided": round(self.one_sided / self.reps, 3),
            "declined": round(self.declined / self.reps, 3),
        }


def lognormal(n: int, rng: np.random.Generator) -> np.ndarray:
    return np.exp(rng.standard_normal(n))


def pareto(n: int, rng: np.random.Generator, alpha: float = 2.5) -> np.ndarray:
    return (1.0 - rng.random(n)) ** (-1.0 / alpha)


def ar1_lognormal(n: int, rng: np.random.Generator, phi: float) -> np.ndarray:
    """exp(Z) with Z a stationary Gaussian AR(1) of unit variance (started in stationarity)."""
    e = rng.standard_normal(n) * math.sqrt(1.0 - phi * phi)
    e[0] = rng.standard_normal()
    return np.exp(signal.lfilter([1.0], [1.0, -phi], e))


def truth(kind: str, q: float) -> float:
    if kind == "pareto":
        return (1.0 - q) ** (-1.0 / 2.5)
    return math.exp(float(sps.norm.ppf(q)))


def sampler(kind: str) -> Callable[[int, np.random.Generator], np.ndarray]:
    if kind == "lognormal":
        return lognormal
    if kind == "pareto":
        return pareto
    if kind.startswith("ar1-"):
        phi = float(kind.removeprefix("ar1-"))
        return lambda n, rng: ar1_lognormal(n, rng, phi)
    raise ValueError(f"unknown case {kind!r}: lognormal, pareto or ar1-PHI")


def percentile_coverage(
    kind: str, n: int, q: float, reps: int, seed: int = 0, confidence: float = 0.95
) -> Coverage:
    """The percentile interval fairbench prints (censored.quantile_estimate, with the series'
    time order, so dependence is measured as in a run) against the known p_q."""
    draw, true = sampler(kind), truth(kind, q)
    rng = np.random.default_rng(seed)
    covered = two = one = dec = 0
    order = np.arange(n, dtype=np.float64)
    for _ in range(reps):
        x = draw(n, rng)
        est = censored.quantile_estimate(
            censored.Observations(x, np.ones(n, dtype=bool), order), q, confidence
        )
        if est.interval is None or est.interval.declined:
            dec += 1
            continue
        if math.isfinite(est.high):
            two += 1
        else:
            one += 1
        covered += int(est.low <= true <= est.high)
    return Coverage(kind, n, q, reps, covered, two, one, dec)


def share_coverage(
    kind: str, n: int, p: float, reps: int, seed: int = 0, confidence: float = 0.95
) -> Coverage:
    """The share interval fairbench prints for an SLO attainment (iv.share_interval with the
    score it thresholds, in time order) of requests whose latency is within the kind's p-th
    quantile: the long-run share is p exactly. The serially correlated kinds make a run's misses
    come in bursts, as a queue's do."""
    draw, limit = sampler(kind), truth(kind, p)
    rng = np.random.default_rng(seed)
    covered = two = dec = 0
    for _ in range(reps):
        x = draw(n, rng)
        it = iv.share_interval(x <= limit, confidence, scores=x)
        if it.declined:
            dec += 1
            continue
        two += 1
        covered += int(it.low <= p <= it.high)
    return Coverage(f"share {kind}", n, p, reps, covered, two, 0, dec)


def drift_coverage(
    kind: str, n: int, reps: int, seed: int = 0, q: float = 0.99, confidence: float = 0.95
) -> Coverage:
    """The drift interval of a stationary series (first fifth against last fifth): it should
    contain 0 at its nominal rate. `n` is the whole series; each window has n / 5."""
    draw = sampler(kind)
    rng = np.random.default_rng(seed)
    covered = two = dec = 0
    w = n // 5
    for _ in range(reps):
        x = draw(n, rng)
        t = np.arange(n, dtype=np.float64)
        first = censored.Observations(x[:w], np.ones(w, dtype=bool), t[:w])
        last = censored.Observations(x[-w:], np.ones(w, dtype=bool), t[-w:])
        found = drift(first, last, q, confidence)
        if found.interval.declined:
            dec += 1
            continue
        two += 1
        covered += int(found.interval.low <= 0.0 <= found.interval.high)
    return Coverage(f"drift {kind}", n, q, reps, covered, two, 0, dec)


def run_coverage(
    case: str, truth: float, lows: list[float], highs: list[float], q: float = 0.99
) -> Coverage:
    """Run-to-run: each run's interval against the long-run value (`truth`, pooled over every
    run by the caller); `q` the quantile it is of (0 for a mean)."""
    true = truth
    covered = two = one = dec = 0
    for low, high in zip(lows, highs, strict=True):
        if math.isnan(low) and math.isnan(high):
            dec += 1
            continue
        if math.isfinite(high):
            two += 1
        else:
            one += 1
        covered += int(low <= true <= high)
    return Coverage(case, 0, q, len(lows), covered, two, one, dec)
