"""Kaplan–Meier from any order by time (fairbench.analysis.censored._km, issue 35) is the
former stable sort and lexsort's, array for array and bit for bit: ties of events and
censorings in any mix, no ties, all censored, all observed, NaN times, one and none. Its
products and sums over the events alone, and `_events_first` over the tied runs alone, are
the former arrays of every position (`former_km`, `former_events_first`)."""

from __future__ import annotations

import numpy as np
import pytest

from fairbench.analysis.censored import Observations, _events_first, _km


def former_km(obs: Observations) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_km as it was: a stable argsort, a lexsort (events first) where times tie."""
    order = np.argsort(obs.time, kind="stable")
    t = obs.time[order]
    if len(t) > 1 and np.any(t[1:] == t[:-1]):
        order = np.lexsort((~obs.observed, obs.time))
        t = obs.time[order]
    d = obs.observed[order]
    n = len(t)
    at_risk = (n - np.arange(n)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(d, 1.0 - 1.0 / at_risk, 1.0)
        surv = np.cumprod(factor)
        green = np.cumsum(np.where(d & (at_risk > 1), 1.0 / (at_risk * (at_risk - 1.0)), 0.0))
    var = surv * surv * green
    return t[d], 1.0 - surv[d], var[d]


def _same(a: Observations, b: Observations) -> None:
    for x, y in zip(_km(a), former_km(b), strict=True):
        assert x.dtype == y.dtype
        assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("seed", range(60))
def test_km_is_the_former_to_the_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3000))
    levels = int(rng.choice([2, 10, 200, 10**9]))  # from heavy ties to none
    time = rng.integers(0, levels, n).astype(np.float64) * 1e6
    observed = rng.random(n) < rng.choice([0.0, 0.3, 0.9, 1.0])
    if seed % 7 == 3 and n:
        time[rng.random(n) < 0.05] = np.nan
    _same(Observations(time, observed), Observations(time.copy(), observed.copy()))
    # with the order by value already made (a group's percentiles made it first)
    first = Observations(time, observed)
    _ = first.sorted_time
    _same(first, Observations(time.copy(), observed.copy()))


def test_ties_put_events_before_censorings() -> None:
    obs = Observations(np.array([5.0, 5.0, 5.0, 1.0]), np.array([False, True, False, True]))
    times, cdf, _ = _km(obs)
    assert times.tolist() == [1.0, 5.0]
    assert cdf.tolist() == [0.25, 1 - 0.75 * (2 / 3)]


def former_events_first(d: np.ndarray, same: np.ndarray) -> np.ndarray:
    """_events_first as it was: the run start, length and position of every observation."""
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    events = np.add.reduceat(d.astype(np.int64), starts)
    lengths = np.diff(np.append(starts, len(d)))
    within = np.arange(len(d)) - np.repeat(starts, lengths)
    return within < np.repeat(events, lengths)


@pytest.mark.parametrize("seed", range(80))
def test_events_first_is_the_former(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 2000))
    levels = int(rng.choice([1, 2, 10, 200, n * 50]))  # every time tied … a few ties
    t = np.sort(rng.integers(0, levels, n).astype(np.float64))
    if seed % 5 == 0:  # a tie at both ends
        t[:2], t[-2:] = t[0], t[-1]
    same = t[1:] == t[:-1]
    if not same.any():
        same[int(rng.integers(0, n - 1))] = True  # as _km calls it: at least one tie
    d = rng.random(n) < rng.choice([0.0, 0.05, 0.5, 0.95, 1.0])
    found = _events_first(d, same)
    assert found.dtype == bool
    assert np.array_equal(found, former_events_first(d, same))
    assert found.sum() == d.sum()  # only the flags move
