"""build_timeline (fairbench.analysis.timeline) against the version it replaced, kept here as
the oracle: the fleet-speed rewrite (issue 35: the events sorted by time then tenant, the grid
merged from their distinct times, no np.unique of every time) must give every array to the bit,
so the summary's figures stay byte for byte. Random small runs on coarse grids (many events at
one time, of one tenant and of several), no-span and unserved requests, NaNs, requests with no
tenant (code -1), weights, and both ways of naming the tenants."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from fairbench.analysis.timeline import Timeline, build_timeline

_FIELDS = ("grid", "times", "key", "service", "rate", "offsets")
_WAITS = ("wait_lo", "wait_hi", "wait_key", "wait_offsets")


def former_build_timeline(
    client: np.ndarray,
    weights: dict[str, float],
    arrival_s: np.ndarray,
    wait_end_s: np.ndarray,
    start_s: np.ndarray,
    end_s: np.ndarray,
    cost: np.ndarray,
    names: Sequence[str] | None = None,
) -> Timeline:
    """build_timeline before issue 35: np.unique of every time, then one argsort of the
    events by tenant × stride + rank."""
    if names is None:
        names = tuple(sorted(str(c) for c in set(client.tolist())))
        code = np.searchsorted(np.array(names), client.astype(str)).astype(np.int64)
    else:
        names, code = tuple(names), np.asarray(client, dtype=np.int64)
    n_t, n = len(names), len(code)
    # every time's rank (1 + its index in the grid, what searchsorted(grid, t, "right") gives
    # a time of the grid) from the grid's own sort: searching 3.5M times in the grid cost as
    # much as the sort (a 10-minute fleet run, issue 35); 0 for NaN, never read
    allv = np.concatenate([arrival_s, wait_end_s, start_s, end_s])
    finite = np.isfinite(allv)
    grid, where = np.unique(allv[finite], return_inverse=True)
    del allv
    ranks = np.zeros(4 * n, dtype=np.int32 if len(grid) < 2**31 - 1 else np.int64)
    ranks[finite] = where + 1
    del where, finite
    stride = len(grid) + 1
    weight = np.array([float(weights.get(name, 1.0)) for name in names])

    served = (cost > 0) & np.isfinite(start_s) & np.isfinite(end_s)
    c, s, e, w = code[served], start_s[served], end_s[served], cost[served] / weight[code[served]]
    s_rank, e_rank = ranks[2 * n : 3 * n][served], ranks[3 * n :][served]
    spread = (e - s) > 0
    r = np.where(spread, w / np.where(spread, e - s, 1.0), 0.0)
    cs, ss, es, rs = c[spread], s[spread], e[spread], r[spread]
    ev_c = np.concatenate([cs, cs, c[~spread]])
    ev_t = np.concatenate([ss, es, e[~spread]])
    ev_rank = np.concatenate([s_rank[spread], e_rank[spread], e_rank[~spread]])
    del s_rank, e_rank
    ev_rate = np.concatenate([rs, -rs, np.zeros(int((~spread).sum()))])
    ev_count = np.concatenate([np.ones(len(cs)), -np.ones(len(cs)), np.zeros(int((~spread).sum()))])
    ev_jump = np.concatenate([np.zeros(2 * len(cs)), w[~spread]])
    ev_key = ev_c * stride + ev_rank
    del ev_rank
    order = np.argsort(ev_key, kind="stable")
    ev_key = ev_key[order]
    first = (
        np.flatnonzero(np.concatenate([[True], ev_key[1:] != ev_key[:-1]]))
        if len(order)
        else (np.zeros(0, dtype=np.int64))
    )
    key = ev_key[first]
    tenant_of = key // stride
    times = ev_t[order][first]
    sum_at = lambda v: np.add.reduceat(v[order], first) if len(first) else np.zeros(0)  # noqa: E731
    drate, dcount, jump = sum_at(ev_rate), sum_at(ev_count), sum_at(ev_jump)
    active = np.rint(np.cumsum(dcount))  # every tenant starts and ends with none active
    cumrate = np.cumsum(drate)
    idle = active <= 0
    last_idle = np.maximum.accumulate(np.where(idle, np.arange(len(idle)), -1))
    rate = np.where(
        idle, 0.0, cumrate - np.where(last_idle >= 0, cumrate[np.maximum(last_idle, 0)], 0.0)
    )
    rate = np.maximum(rate, 0.0)  # the service rate on the segment after each breakpoint
    offsets = np.searchsorted(tenant_of, np.arange(n_t + 1), side="left")
    service = np.empty(len(times))
    for i in range(n_t):  # a cumulative sum per tenant, so no tenant carries another's rounding
        a, b = offsets[i], offsets[i + 1]
        if a == b:
            continue
        inc = np.zeros(b - a)
        inc[1:] = rate[a : b - 1] * np.diff(times[a:b])
        service[a:b] = np.cumsum(inc) + np.cumsum(jump[a:b])

    waits = np.isfinite(wait_end_s) & np.isfinite(arrival_s) & (wait_end_s > arrival_s)
    wc, wa, wb = code[waits], arrival_s[waits], wait_end_s[waits]
    a_key, b_key = wc * stride + ranks[:n][waits], wc * stride + ranks[n : 2 * n][waits]
    del ranks
    order = np.argsort(a_key, kind="stable")
    a_key, b_key, wa, wb = a_key[order], b_key[order], wa[order], wb[order]
    reach = np.maximum.accumulate(b_key) if len(b_key) else b_key
    # a period starts where a wait begins after every earlier one of its tenant ended (touching
    # waits merge: the tenant never stopped waiting)
    starts = (
        np.flatnonzero(np.concatenate([[True], a_key[1:] > reach[:-1]]))
        if len(a_key)
        else (np.zeros(0, dtype=np.int64))
    )
    ends = np.concatenate([starts[1:] - 1, [len(a_key) - 1]]) if len(starts) else starts
    wait_lo = wa[starts]
    wait_hi = grid[reach[ends] - reach[ends] // stride * stride - 1] if len(ends) else wb[:0]
    wait_key = a_key[starts]
    wait_offsets = np.searchsorted(wait_key // stride, np.arange(n_t + 1), side="left")
    return Timeline(
        names, grid, times, key, service, rate, offsets, wait_lo, wait_hi, wait_key, wait_offsets
    )


def _same(a: Timeline, b: Timeline) -> None:
    """Every array equal to the bit (floats compared as their bytes); a no-tenant request's
    service rows are never written (np.empty) nor read, so they are left out."""
    assert a.tenants == b.tenants
    for name in _FIELDS + _WAITS:
        x, y = getattr(a, name), getattr(b, name)
        if name == "service":
            x, y = x[a.offsets[0] : a.offsets[-1]], y[b.offsets[0] : b.offsets[-1]]
        assert x.shape == y.shape, name
        if x.dtype.kind == "f":
            assert x.tobytes() == y.tobytes(), name
        else:
            assert np.array_equal(x, y), name


def _run(rng: np.random.Generator, no_tenant: bool) -> tuple[np.ndarray, ...]:
    """A random small run on a coarse grid (ties), with NaNs, no-span and zero-cost requests."""
    n, tenants = int(rng.integers(0, 300)), int(rng.integers(1, 6))
    step = float(rng.choice([0.5, 0.1, 1e-3]))
    client = rng.integers(-1 if no_tenant else 0, tenants, n)
    arrival = np.round(rng.uniform(0, 50, n) / step) * step
    wait_end = arrival + np.round(rng.exponential(2, n) / step) * step * (rng.random(n) < 0.8)
    start = np.round((arrival + rng.exponential(3, n)) / step) * step
    end = start + np.round(rng.exponential(3, n) / step) * step * (rng.random(n) < 0.7)
    for values, share in ((arrival, 0.3), (wait_end, 0.2), (start, 0.1), (end, 0.1)):
        values[rng.random(n) < share] = np.nan
    cost = rng.integers(0, 40, n).astype(float) * (rng.random(n) < 0.9)
    return client, arrival, wait_end, start, end, cost, np.arange(tenants)


@pytest.mark.parametrize("seed", range(8))
def test_the_timeline_is_the_former_one_to_the_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for trial in range(150):
        client, arrival, wait_end, start, end, cost, tenants = _run(rng, trial % 5 == 0)
        weights = {f"t{i}": float(rng.choice([1.0, 2.0, 0.5])) for i in tenants}
        names: Sequence[str] = [f"t{i}" for i in tenants]
        if trial % 2:  # the summary's way: codes into the sorted names
            args = (client, weights, arrival, wait_end, start, end, cost)
            _same(former_build_timeline(*args, names=names), build_timeline(*args, names=names))
        else:  # a name per request
            label = np.array([f"t{i}" for i in np.maximum(client, 0)], dtype=str)
            args = (label, weights, arrival, wait_end, start, end, cost)
            _same(former_build_timeline(*args), build_timeline(*args))


def test_no_served_request_and_no_time() -> None:
    """Nothing served (the grid only the waits'), then nothing at all: the same empty arrays."""
    nan = np.full(3, np.nan)
    client, cost = np.array([0, 1, 0]), np.array([5.0, 0.0, 3.0])
    arrival, wait_end = np.array([1.0, 2.0, np.nan]), np.array([4.0, 3.0, np.nan])
    for args in (
        (client, {}, arrival, wait_end, nan, nan, cost),
        (client, {}, nan, nan, nan, nan, cost),
    ):
        _same(
            former_build_timeline(*args, names=["a", "b"]), build_timeline(*args, names=["a", "b"])
        )
