"""Known-truth audit of the share intervals (fairbench.analysis.intervals.share_interval).

A share's indicator from a two-state Markov chain (each request repeats the last one's outcome
with probability `stay`, else draws afresh with the share p): the long-run variance factor is
known, τ = (1 + stay) / (1 − stay), and so is the truth, p. Coverage is judged with binomial
bounds on seeded draws.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from fairbench.analysis import calibration as cal
from fairbench.analysis import intervals as iv


def _markov(rng: np.random.Generator, n: int, p: float, stay: float) -> np.ndarray:
    """A 0/1 series with P(1) = p whose lag-k correlation is stay^k (vectorized: each request
    takes the outcome of the last fresh draw)."""
    fresh = rng.random(n) >= stay
    fresh[0] = True
    last = np.maximum.accumulate(np.where(fresh, np.arange(n), 0))
    return (rng.random(n) < p)[last]


def test_a_serially_correlated_share_covers_at_its_level() -> None:
    """Bug fixed here: τ̂ from 10–30 batch means is noisy and biased low (mean 15.8 for
    τ = 19), and Wilson's normal z took it as exact: a share of 0.98 with τ = 19 over 5,000
    requests covered 1,349 of these 1,500 runs (89.9%) at a claimed 95%. With z replaced by
    Student t at the batch means' effective degrees of freedom (as the percentiles' ranks
    are) it covers 1,423 (94.9%). The floor is the 0.1% quantile of Binomial(1,500, 0.95),
    1,398: the old count is 4 SD below it."""
    rng = np.random.default_rng(5)
    covered = 0
    for _ in range(1500):
        it = iv.share_interval(_markov(rng, 5000, 0.98, 0.9))
        assert not it.declined
        covered += it.low <= 0.98 <= it.high
    assert covered >= int(sps.binom.ppf(0.001, 1500, 0.95)), covered


def test_an_independent_share_is_clopper_pearson() -> None:
    """Without dependence the interval is the exact binomial's, by name and by value."""
    x = np.random.default_rng(6).random(2000) < 0.9
    it = iv.share_interval(x)
    assert it.method == iv.METHOD_SHARE
    assert (it.low, it.high) == iv.clopper_pearson(float(x.sum()), 2000)


@pytest.mark.parametrize("n", [20, 50, 200])
def test_an_independent_share_covers_at_every_p(n: int) -> None:
    """The promise, computed exactly rather than sampled: for each true p on a grid that holds
    the attainments SLOs are set at, the probability (binomial, over every possible count)
    that the interval holds p is at least 95%. Wilson's fell to 91.1% at p = 0.99, n = 50,
    and 92.0% at p = 0.995, n = 200."""
    k = np.arange(n + 1)
    ends = [iv.clopper_pearson(float(j), n) for j in k]
    low, high = np.array([e[0] for e in ends]), np.array([e[1] for e in ends])
    for p in (0.5, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999, 0.01, 0.05):
        coverage = float(sps.binom.pmf(k, n, p)[(low <= p) & (p <= high)].sum())
        assert coverage >= 0.95, (n, p, coverage)


def test_an_attainment_whose_misses_come_in_bursts_covers() -> None:
    """Bug fixed here: an SLO attainment's τ came from its 0/1 series alone, and a run whose
    misses came in one burst, or in none, read τ = 1: requests whose latency is a Gaussian
    AR(1) (φ = 0.9, n = 1,000) within its 99th percentile covered 85.9% of 397 runs at a
    claimed 95%. With τ also read off the latency's normal scores (the Gaussian copula at the
    share's level, `share_dependence`) the given intervals cover at their level, and a run
    too short for its bursts declines."""
    found = cal.share_coverage("ar1-0.9", 1000, 0.99, 400, seed=11)
    assert found.given >= 150, found
    assert found.covered >= int(sps.binom.ppf(0.001, found.given, 0.95)), found


def test_a_run_without_a_miss_still_reads_its_correlation() -> None:
    """Every request met its SLO, but the latencies are correlated (φ = 0.9): the interval is
    read on n / τ with τ from the latency's copula, wider than the i.i.d. one, and says so."""
    rng = np.random.default_rng(12)
    runs = (cal.ar1_lognormal(5000, rng, 0.9) for _ in range(200))
    x = next(x for x in runs if x.max() <= cal.truth("ar1-0.9", 0.999))
    met = np.ones(len(x), dtype=bool)
    it = iv.share_interval(met, scores=x)
    plain = iv.share_interval(met)
    assert "Gaussian copula" in it.method, it
    assert it.high == 1.0 and it.low < plain.low


def test_a_share_without_a_score_is_read_on_its_indicator() -> None:
    """The rejected and unfinished shares threshold no latency: their τ is the batch means'
    of the 0/1 series, as before, and the method says so."""
    x = _markov(np.random.default_rng(13), 5000, 0.95, 0.9)
    it = iv.share_interval(x)
    assert it.method.endswith("(batch means)") and "batch means) on" not in it.method, it
