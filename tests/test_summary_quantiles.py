"""A group's percentiles without an interval (ITL max, queue time) come from one np.partition
instead of a sort (censored.quantiles, issue 35): the values and bounds of `quantile` at every
percentile, finished, censored in the bound's way or in Kaplan–Meier's, ranked or not."""

from __future__ import annotations

import numpy as np
import pytest

from fairbench.analysis import censored
from fairbench.analysis.censored import Observations

QS = (0.50, 0.90, 0.95, 0.99, 0.999)


def _cases() -> list[Observations]:
    rng = np.random.default_rng(12)
    x = rng.lognormal(size=3_001) * 1e6
    ties = np.round(x, -6)  # many equal values
    n = len(x)
    few = rng.random(n) > 0.001  # a few unfinished: Kaplan–Meier
    some = rng.random(n) > 0.2  # lower bounds above p90, Kaplan–Meier at p50
    most = rng.random(n) > 0.6  # more unfinished than every tail: all lower bounds
    return [
        Observations(x, np.ones(n, dtype=bool)),
        Observations(ties, np.ones(n, dtype=bool)),
        Observations(x, few),
        Observations(x, some),
        Observations(x, most),
        Observations(x[:1], np.ones(1, dtype=bool)),
        Observations(x[:0], np.ones(0, dtype=bool)),
        Observations(x, np.ones(n, dtype=bool), np.arange(n, dtype=float), ranked=True),
    ]


@pytest.mark.parametrize("k", range(8))
def test_quantiles_equal_quantile(k: int) -> None:
    obs, fresh = _cases()[k], _cases()[k]
    got = censored.quantiles(obs, QS)
    want = [censored.quantile(fresh, q) for q in QS]
    assert np.array_equal(np.array(got, dtype=float), np.array(want, dtype=float), equal_nan=True)
    assert [b for _, b in got] == [b for _, b in want]


def test_no_sort_where_no_interval_needs_one() -> None:
    obs = _cases()[0]
    censored.quantiles(obs, QS)
    assert "sorted_time" not in obs.__dict__ and "_by_value" not in obs.__dict__
