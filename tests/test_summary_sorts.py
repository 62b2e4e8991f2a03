"""One argsort per summary group gives its sorted latencies and its normal scores' ranks
(issue 35): the same values, bit for bit, as np.sort and scipy's rankdata, ties included."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from fairbench.analysis import censored
from fairbench.analysis import intervals as iv


@pytest.mark.parametrize("ties", [False, True])
def test_average_ranks_is_rankdata(ties: bool) -> None:
    rng = np.random.default_rng(11)
    x = rng.lognormal(3, 1, 5_000)
    if ties:
        x = np.round(x)  # many ties
    for order in (np.argsort(x), np.argsort(x, kind="stable"), np.argsort(-x)[::-1]):
        got = censored.average_ranks(x[order], order)
        assert np.array_equal(got, sps.rankdata(x, method="average"))
    assert len(censored.average_ranks(np.zeros(0), np.zeros(0, dtype=np.int64))) == 0


def test_ranked_observations_give_the_same_figures() -> None:
    rng = np.random.default_rng(12)
    n = 4_000
    ar = np.empty(n)
    ar[0] = 0.0
    for i in range(1, n):  # serially correlated, as a queue's latencies are
        ar[i] = 0.8 * ar[i - 1] + rng.normal()
    time = np.round(np.exp(ar) * 1e6)
    seen = np.ones(n, dtype=bool)
    t = np.sort(rng.uniform(0, 1e10, n))
    plain = censored.Observations(time, seen, t)
    ranked = censored.Observations(time, seen, t, ranked=True)
    assert np.array_equal(ranked.sorted_time, np.sort(time))
    lags = iv.copula_lags(n, plain.dependence)
    old = iv.normal_scores_acf(time[np.argsort(t, kind="stable")], lags)  # rankdata's scores
    assert np.array_equal(ranked.score_acf, old)
    assert np.array_equal(plain.score_acf, old)
    for q in (0.5, 0.9, 0.99):
        assert censored.quantile_estimate(ranked, q) == censored.quantile_estimate(plain, q)
