"""Observations already in send order (a summary's groups: the records window comes in plan
order) skip the stable argsort by time and its gathers (issue 35); their series, normal-score
autocorrelations and dependence are those of going through the argsort, and shuffled
observations still come back in time order."""

from __future__ import annotations

import numpy as np

from fairbench.analysis.censored import Observations


def _series(n: int = 4_000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(10)
    t = np.sort(rng.uniform(0, 1e12, n))
    ar = np.zeros(n)
    for i in range(1, n):  # serially correlated, as a queue's latencies are
        ar[i] = 0.8 * ar[i - 1] + rng.normal()
    return np.exp(ar) * 1e6, t


def test_in_order_equals_going_through_the_argsort() -> None:
    time, t = _series()
    fast = Observations(time, np.ones(len(time), dtype=bool), t, ranked=True)
    slow = Observations(time, np.ones(len(time), dtype=bool), t, ranked=True)
    slow.__dict__["_time_order"] = np.argsort(t, kind="stable")  # the path before
    assert fast._time_order is None
    assert np.array_equal(fast.in_time_order, slow.in_time_order)
    assert np.array_equal(fast.score_acf, slow.score_acf)
    for q in (0.5, 0.9, 0.99):
        value = float(np.quantile(time, q))
        assert fast.dependence_at(value) == slow.dependence_at(value)


def test_shuffled_comes_back_in_time_order() -> None:
    time, t = _series()
    perm = np.random.default_rng(11).permutation(len(t))
    ordered = Observations(time, np.ones(len(time), dtype=bool), t, ranked=True)
    shuffled = Observations(time[perm], np.ones(len(time), dtype=bool), t[perm], ranked=True)
    assert shuffled._time_order is not None
    assert np.array_equal(shuffled.in_time_order, ordered.in_time_order)
    assert np.array_equal(shuffled.score_acf, ordered.score_acf)


def test_nondecreasing_is_the_one_order_check() -> None:
    from fairbench.analysis.metrics import nondecreasing

    assert nondecreasing(np.array([])) and nondecreasing(np.array([3.0]))
    assert nondecreasing(np.array([1.0, 1.0, 2.0]))  # ties are in order
    assert not nondecreasing(np.array([1.0, 3.0, 2.0]))
    assert not nondecreasing(np.array([1.0, np.nan, 2.0]))  # NaN: sort it, do not assume
